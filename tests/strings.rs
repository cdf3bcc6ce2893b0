//! Tenants, keys and groups that are not UTF-8, as `kv_events_non_utf8` says (docs/spec.md
//! section 3): by default (`skip`) such a call publishes nothing, takes no sequence number and
//! is counted per event, and snapshots leave such objects out, so a follower ends exact
//! against the truth without them; with `str` the raw bytes go out as a msgpack `str`, alone
//! in their message; with `bin` or `str` a follower holds them. The stream and the replay
//! socket are read on real sockets and decoded with rmpv; `bin` byte for byte is covered by
//! e2e.rs, typed.rs and faults.rs.

use kv_events_testing as common;
use kv_events_testing::model;

use common::{assert_silent, connected, dealer, raw_messages, raw_subscriber, read_events};
use model::{Model, Rng};
use mooncake_kv_events::subscriber::{Continuity, FollowOptions, Follower, Index, Upstream};
use mooncake_kv_events::wire::{field, Event, Message};
use mooncake_kv_events::{Config, CreateError, Medium, MediumSet, Publisher, Snapshot};
use rmpv::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const DISK: MediumSet = MediumSet::EMPTY.with(Medium::Disk);
const BOTH: MediumSet = CPU.with(Medium::Disk);

/// An enabled config on a fresh endpoint whose strings that are not UTF-8 go out as
/// `non_utf8` says.
fn config(non_utf8: &str) -> Config {
    Config {
        non_utf8: non_utf8.into(),
        ..common::config(&common::endpoint())
    }
}

fn utf8(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok()
}

/// The bytes of a `str` or `bin` field, and whether it was a `str`.
fn bytes(event: &Value, name: &str) -> (Vec<u8>, bool) {
    match field(event, name) {
        Some(Value::String(s)) => (s.as_bytes().to_vec(), true),
        Some(Value::Binary(b)) => (b.clone(), false),
        other => panic!("{name} is not a string: {other:?} in {event}"),
    }
}

/// "stored cpu <key>", "cleared <tenant>": one line per event.
fn summary(event: &Value) -> String {
    let text = |name| field(event, name).and_then(Value::as_str).unwrap_or("-");
    let lossy = |name| String::from_utf8_lossy(&bytes(event, name).0).into_owned();
    match text("event_type") {
        "cleared" => format!("cleared {}", lossy("tenant_id")),
        kind => format!("{kind} {} {}", text("medium"), lossy("object_key")),
    }
}

#[test]
fn skip_is_the_default() {
    assert_eq!(Config::default().non_utf8, "skip");
    assert!(!Config::default().reannounce_remaining);
}

#[test]
fn by_default_a_call_with_a_string_that_is_not_utf8_publishes_nothing_and_takes_no_sequence() {
    let (publisher, mut sub) = connected(common::config(""));
    let flushed = |publisher: &Publisher| assert!(publisher.flush(Duration::from_secs(10)));
    // Each call flushed on its own: a call that were published would be a message of its own.
    publisher.on_put_commit("t", "a", "g", CPU);
    flushed(&publisher);
    publisher.on_put_commit("t", b"k\xff", "g", BOTH); // a key: 2 events
    flushed(&publisher);
    publisher.on_medium_delta(b"t\xc3", "k", "g", CPU, DISK); // a tenant: removed and stored
    flushed(&publisher);
    publisher.on_medium_delta("t", "k", b"g\x80", MediumSet::EMPTY, CPU); // a group: 1
    flushed(&publisher);
    publisher.on_put_commit("t", "b", "g", CPU);
    let batches = read_events(&publisher, &mut sub, 2);
    let got: Vec<(u64, Continuity, Vec<String>)> = batches
        .iter()
        .map(|b| {
            (
                b.sequence,
                b.continuity,
                b.events.iter().map(summary).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                0,
                Continuity::First { missed: 0 },
                vec!["stored cpu a".to_owned()]
            ),
            (1, Continuity::Next, vec!["stored cpu b".to_owned()]),
        ],
        "the skipped calls took no sequence number: no gap"
    );
    assert_silent(&mut sub);
    let stats = publisher.stats();
    assert_eq!(stats.skipped_non_utf8_events, 5, "one per event: {stats:?}");
    assert_eq!(
        (
            stats.published_events,
            stats.published_batches,
            stats.next_sequence
        ),
        (2, 2, 2)
    );
    assert_eq!(
        (
            stats.dropped_events,
            stats.skipped_keyless_events,
            stats.invalid_media_calls
        ),
        (0, 0, 0)
    );
}

#[test]
fn by_default_a_remove_all_of_a_tenant_that_is_not_utf8_publishes_no_cleared() {
    let (publisher, mut sub) = connected(common::config(""));
    publisher.on_put_commit("u", "k", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)));
    let scan = publisher.begin_remove_all();
    // A Put whose key is not UTF-8 during the scan: skipped, it adds nothing a reader holds,
    // so it does not keep tenant u's `cleared` from going out.
    publisher.on_put_commit("u", b"late\xff", "", CPU);
    publisher.on_remove_all(&scan, b"t\xfe", 3, 0);
    assert!(publisher.flush(Duration::from_secs(10)));
    publisher.on_remove_all(&scan, "u", 1, 0);
    let batches = read_events(&publisher, &mut sub, 2);
    let got: Vec<(u64, Continuity, Vec<String>)> = batches
        .iter()
        .map(|b| {
            (
                b.sequence,
                b.continuity,
                b.events.iter().map(summary).collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                0,
                Continuity::First { missed: 0 },
                vec!["stored cpu k".to_owned()]
            ),
            (1, Continuity::Next, vec!["cleared u".to_owned()]),
        ]
    );
    assert_silent(&mut sub);
    let stats = publisher.stats();
    // The skipped `cleared` is counted as skipped, not as suppressed.
    assert_eq!(
        (stats.skipped_non_utf8_events, stats.cleared_suppressed),
        (2, 0),
        "{stats:?}"
    );
    assert_eq!(stats.next_sequence, 2);
}

#[test]
fn as_str_a_string_that_is_not_utf8_arrives_as_a_str_of_its_raw_bytes_alone_in_its_message() {
    let (publisher, endpoint) = common::publish(config("str"));
    let socket = raw_subscriber(&endpoint, None);
    // ZeroMQ's slow joiner, as in common::subscribe: setup, not an assertion.
    std::thread::sleep(Duration::from_millis(300));
    // As fast as they come, so that the publishing thread would batch them together.
    let (tenant, key, group) = (
        b"t\xc3".as_slice(),
        b"k\0\xff".as_slice(),
        b"\x80".as_slice(),
    );
    publisher.on_put_commit("t", "a", "g", CPU);
    publisher.on_put_commit(tenant, key, group, BOTH);
    publisher.on_put_commit("t", "b", "g", CPU);
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, b"u\xfe", 1, 0);
    publisher.on_put_commit("t", "c", "g", CPU);
    assert!(publisher.flush(Duration::from_secs(10)));
    let frames = raw_messages(&socket, Duration::from_millis(500));

    let mut all = Vec::new();
    for (n, message) in frames.iter().enumerate() {
        assert_eq!(message.len(), 3);
        assert_eq!(message[1], (n as u64).to_be_bytes(), "from 0, no gap");
        let batch = rmpv::decode::read_value(&mut &message[2][..]).expect("msgpack");
        let events = batch[1].as_array().expect("events").clone();
        // A string that is not UTF-8 is a `str` of its raw bytes, never a `bin`.
        let odd = |event: &Value| {
            ["tenant_id", "object_key", "group_id"].iter().any(
                |name| matches!(field(event, name), Some(Value::String(s)) if s.as_str().is_none()),
            )
        };
        for event in &events {
            assert!(
                event
                    .as_map()
                    .unwrap()
                    .iter()
                    .all(|(_, v)| !matches!(v, Value::Binary(_))),
                "{event}"
            );
        }
        if events.iter().any(odd) {
            // Alone: that call's events only.
            assert!(events.iter().all(odd), "message {n}: {events:?}");
            let typed = Message::<Event>::decode(message).expect("Event takes a raw str");
            assert_eq!(typed.events.len(), events.len());
            if field(&events[0], "event_type").and_then(Value::as_str) == Some("cleared") {
                assert_eq!(events.len(), 1, "message {n}");
                assert_eq!(bytes(&events[0], "tenant_id"), (b"u\xfe".to_vec(), true));
                assert_eq!(typed.events[0].tenant_id.as_bytes(), b"u\xfe");
            } else {
                assert_eq!(events.len(), 2, "message {n}: both media of one call");
                for (event, typed) in events.iter().zip(&typed.events) {
                    assert_eq!(bytes(event, "object_key"), (key.to_vec(), true));
                    assert_eq!(bytes(event, "tenant_id"), (tenant.to_vec(), true));
                    assert_eq!(bytes(event, "group_id"), (group.to_vec(), true));
                    assert_eq!(typed.object_key.as_ref().unwrap().as_bytes(), key);
                }
            }
        }
        all.extend(events);
    }
    let summaries: Vec<String> = all.iter().map(summary).collect();
    assert_eq!(
        summaries,
        [
            "stored cpu a",
            "stored cpu k\0\u{fffd}",
            "stored disk k\0\u{fffd}",
            "stored cpu b",
            "cleared u\u{fffd}",
            "stored cpu c"
        ]
    );
    let stats = publisher.stats();
    assert_eq!(stats.skipped_non_utf8_events, 0);
    assert_eq!(stats.published_events, 6);
    assert_eq!(stats.next_sequence, frames.len() as u64);
}

/// The events of a snapshot of everything, and its end map's fields by name.
fn snapshot(replay: &zmq::Socket, tenant: Option<&[u8]>) -> (Vec<Value>, BTreeMap<String, Value>) {
    let mut request: Vec<&[u8]> = vec![b"", b"snapshot"];
    request.extend(tenant);
    replay.send_multipart(request, 0).unwrap();
    let mut events = Vec::new();
    loop {
        let frames = replay.recv_multipart(0).expect("a reply within 20 s");
        assert_eq!(frames.len(), 3, "{frames:?}");
        let body = rmpv::decode::read_value(&mut &frames[2][..]).expect("msgpack");
        match &frames[1][..] {
            b"snapshot" => events.extend(body[1].as_array().unwrap().iter().cloned()),
            b"snapshot-end" => {
                let end = body
                    .as_map()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
                    .collect();
                return (events, end);
            }
            other => panic!("{:?}: {body}", String::from_utf8_lossy(other)),
        }
    }
}

/// A master's object: tenant, key, group, media.
type Object = (&'static [u8], &'static [u8], &'static [u8], MediumSet);

#[test]
fn a_snapshot_leaves_out_objects_that_are_not_utf8_by_default_and_holds_them_as_bin_or_str() {
    let objects: [Object; 5] = [
        (b"t", b"a", b"g", BOTH),
        (b"t", b"k\xff", b"g", CPU),
        (b"t\xc3", b"b", b"g", DISK),
        (b"t", b"c", b"\x80", CPU),
        (b"", b"d", b"", CPU),
    ];
    for non_utf8 in ["skip", "bin", "str"] {
        let (pub_endpoint, replay_endpoint) = (common::endpoint(), common::endpoint());
        let publisher = Publisher::create(&Config {
            non_utf8: non_utf8.into(),
            ..model::config(&pub_endpoint, &replay_endpoint)
        })
        .expect("the publisher binds");
        publisher.set_object_source(move |_: Option<&[u8]>, out: &mut Snapshot| {
            for (tenant, key, group, media) in objects {
                out.add(tenant, key, group, media)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        // A message, then a call that is skipped or not: the snapshot starts after both.
        publisher.on_put_commit("t", "a", "g", BOTH);
        publisher.on_put_commit("t", b"k\xff", "g", CPU);
        assert!(publisher.flush(Duration::from_secs(10)));
        let replay = dealer(&replay_endpoint);
        let (events, end) = snapshot(&replay, None);

        let kept: Vec<_> = objects
            .iter()
            .filter(|(t, k, g, _)| non_utf8 != "skip" || (utf8(t) && utf8(k) && utf8(g)))
            .collect();
        let expected: Vec<(Vec<u8>, Vec<u8>, &str)> = kept
            .iter()
            .flat_map(|(t, k, _, media)| {
                let tenant = if t.is_empty() { b"default" } else { *t };
                media
                    .iter()
                    .map(move |m| (tenant.to_vec(), k.to_vec(), m.as_str()))
            })
            .collect();
        let got: Vec<(Vec<u8>, Vec<u8>, &str)> = events
            .iter()
            .map(|e| {
                assert_eq!(
                    field(e, "event_type").and_then(Value::as_str),
                    Some("stored")
                );
                for name in ["tenant_id", "object_key"] {
                    let (value, is_str) = bytes(e, name);
                    assert_eq!(is_str, utf8(&value) || non_utf8 == "str", "{non_utf8}: {e}");
                }
                (
                    bytes(e, "tenant_id").0,
                    bytes(e, "object_key").0,
                    field(e, "medium").and_then(Value::as_str).unwrap(),
                )
            })
            .collect();
        assert_eq!(got, expected, "{non_utf8}");
        assert_eq!(
            end["objects"].as_u64(),
            Some(kept.len() as u64),
            "{non_utf8}"
        );
        assert_eq!(end["events"].as_u64(), Some(expected.len() as u64));
        let stats = publisher.stats();
        assert_eq!(
            end["next_sequence"].as_u64(),
            Some(stats.next_sequence),
            "{non_utf8}: {stats:?}"
        );
        let (messages, skipped) = if non_utf8 == "skip" { (1, 1) } else { (2, 0) };
        assert_eq!(
            (stats.next_sequence, stats.skipped_non_utf8_events),
            (messages, skipped),
            "{non_utf8}"
        );
        // A tenant's snapshot of one that is not UTF-8 holds its objects or nothing.
        let (events, end) = snapshot(&replay, Some(b"t\xc3"));
        let held = if non_utf8 == "skip" { 0 } else { 1 };
        assert_eq!(
            (events.len(), end["objects"].as_u64()),
            (held, Some(held as u64)),
            "{non_utf8}"
        );
    }
}

/// Options that retry quickly, for tests.
fn quick() -> FollowOptions {
    FollowOptions {
        request_timeout: Duration::from_secs(2),
        retry_after: Duration::from_millis(200),
        quiet_check: Duration::from_millis(300),
        ..FollowOptions::default()
    }
}

/// `changes` random changes over 200 objects of three tenants (one not UTF-8), a tenth of
/// their keys not UTF-8 and some groups not UTF-8 either, then a RemoveAll of each tenant
/// now and then.
fn churn(model: &Model, publisher: &Publisher, seed: u64, changes: usize) {
    let tenants: [&[u8]; 3] = [b"tenant-a", b"tenant-b", b"tenant-\xff"];
    let mut rng = Rng::new(seed);
    for i in 0..changes {
        let tenant = tenants[rng.below(3) as usize];
        let n = rng.below(200);
        let mut key = format!("key-{n}").into_bytes();
        if n % 10 == 3 {
            key.extend_from_slice(b"\xfe\x00");
        }
        let media = MediumSet::from_bits(rng.below(4) as u8);
        model.set(publisher, tenant, &key, media);
        if i % 997 == 996 {
            model.remove_all(publisher, tenants[rng.below(3) as usize]);
        }
    }
}

/// Polls `follower` until its index is in sync and equal to `truth()`, and stays so for a
/// moment; panics with what it holds if not within 30 s.
fn converge(follower: &mut Follower, truth: impl Fn() -> Index) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        follower.poll(Duration::from_millis(20));
        if follower.status(0).in_sync && *follower.index(0) == truth() {
            let settle = Instant::now() + Duration::from_millis(300);
            while Instant::now() < settle {
                follower.poll(Duration::from_millis(20));
            }
            if *follower.index(0) == truth() {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no convergence: {} objects held, {} true; status {:?}, counters {:?}",
            follower.index(0).objects(),
            truth().objects(),
            follower.status(0),
            follower.counters()
        );
    }
}

/// A follower that joins a master with objects not UTF-8 among its own, by a snapshot, then
/// follows more changes and RemoveAlls: it ends with the master's objects, less those not
/// UTF-8 under `skip`.
fn follower_ends_exact(non_utf8: &str) {
    let model = Model::new();
    let (pub_endpoint, replay_endpoint) = (common::endpoint(), common::endpoint());
    let publisher = Publisher::create(&Config {
        non_utf8: non_utf8.into(),
        ..model::config(&pub_endpoint, &replay_endpoint)
    })
    .expect("the publisher binds");
    model.serve(&publisher);
    churn(&model, &publisher, 1, 3000);
    assert!(publisher.flush(Duration::from_secs(10)));
    let mut follower =
        Follower::new(vec![Upstream::new(pub_endpoint, replay_endpoint)], quick()).unwrap();
    let truth = || -> Index {
        let all = model.truth();
        all.iter()
            .filter(|(t, k, _)| non_utf8 != "skip" || (utf8(t) && utf8(k)))
            .collect()
    };
    converge(&mut follower, truth);
    churn(&model, &publisher, 2, 3000);
    assert!(publisher.flush(Duration::from_secs(10)));
    converge(&mut follower, truth);

    let held = follower.index(0);
    let odd = held.iter().filter(|(t, k, _)| !utf8(t) || !utf8(k)).count();
    let counters = follower.counters();
    let stats = publisher.stats();
    assert_eq!(counters.malformed, 0, "{counters:?}");
    assert_eq!(
        counters.snapshots, 1,
        "one snapshot to join, no gap after: {counters:?}"
    );
    if non_utf8 == "skip" {
        assert_eq!(odd, 0);
        assert!(stats.skipped_non_utf8_events > 0, "{stats:?}");
    } else {
        assert!(odd > 0, "the follower holds objects that are not UTF-8");
        assert_eq!(stats.skipped_non_utf8_events, 0, "{stats:?}");
    }
    eprintln!(
        "{non_utf8}: {} objects held ({odd} not UTF-8) of {} true; {stats:?}",
        held.objects(),
        model.truth().objects()
    );
}

#[test]
fn by_default_a_follower_ends_exact_against_the_truth_without_the_objects_that_are_not_utf8() {
    follower_ends_exact("skip");
}

#[test]
fn as_bin_a_follower_ends_exact_with_the_objects_that_are_not_utf8() {
    follower_ends_exact("bin");
}

#[test]
fn as_str_a_follower_ends_exact_with_the_objects_that_are_not_utf8() {
    follower_ends_exact("str");
}

#[test]
fn a_non_utf8_mode_other_than_skip_bin_or_str_is_refused_naming_the_flag() {
    for mode in ["latin1", "BIN", "skip ", "utf8"] {
        let err = Publisher::create(&config(mode)).unwrap_err();
        assert!(
            matches!(
                err,
                CreateError::InvalidConfig {
                    field: "kv_events_non_utf8",
                    ..
                }
            ),
            "{mode:?}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("kv_events_non_utf8") && message.contains(mode),
            "{message}"
        );
    }
    // The three modes are taken, and empty is the default; a disabled config is never
    // refused.
    for mode in ["skip", "bin", "str", ""] {
        assert!(Publisher::create(&config(mode)).is_ok(), "{mode}");
    }
    let disabled = Config {
        non_utf8: "latin1".into(),
        ..Config::default()
    };
    assert!(!Publisher::create(&disabled).unwrap().is_enabled());
}
