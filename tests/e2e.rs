//! The stream as a subscriber on a real SUB socket sees it, decoded with rmpv.

use kv_events_testing as common;

use common::{assert_silent, config, connected, read_events};
use mooncake_kv_events::subscriber::{Batch, Continuity};
use mooncake_kv_events::wire::field;
use mooncake_kv_events::{Config, CreateError, Medium, MediumSet, Publisher};
use rmpv::Value;
use std::collections::BTreeSet;

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const DISK: MediumSet = MediumSet::EMPTY.with(Medium::Disk);
const BOTH: MediumSet = CPU.with(Medium::Disk);

fn events(batches: &[Batch]) -> Vec<Value> {
    batches.iter().flat_map(|b| b.events.clone()).collect()
}

fn keys(event: &Value) -> BTreeSet<&str> {
    event
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_str().expect("str keys"))
        .collect()
}

fn text<'v>(event: &'v Value, key: &str) -> &'v str {
    field(event, key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{key} is not a str in {event}"))
}

/// (event_type, medium or "-", object_key or "-") of each event.
fn summary(events: &[Value]) -> Vec<(String, String, String)> {
    events
        .iter()
        .map(|e| {
            let opt = |k| {
                field(e, k)
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned()
            };
            (
                text(e, "event_type").to_owned(),
                opt("medium"),
                opt("object_key"),
            )
        })
        .collect()
}

fn row(kind: &str, medium: &str, key: &str) -> (String, String, String) {
    (kind.to_owned(), medium.to_owned(), key.to_owned())
}

const COMMON: [&str; 11] = [
    "event_id",
    "timestamp",
    "event_type",
    "model_name",
    "block_size",
    "additional_salt",
    "lora_name",
    "tenant_id",
    "backend_id",
    "medium",
    "dp_rank",
];

fn expected_keys(kind: &str, legacy: bool) -> BTreeSet<&'static str> {
    let mut keys: BTreeSet<_> = COMMON.into_iter().collect();
    let mut add = |more: &[&'static str]| keys.extend(more.iter().copied());
    if legacy {
        add(&["type"]);
    }
    if kind != "cleared" {
        add(&["group_id", "object_key", "seq_hashes", "base_block_idx"]);
        if legacy {
            add(&["block_hashes"]);
        }
    }
    if kind == "stored" {
        add(&["token_ids", "parent_hash"]);
        if legacy {
            add(&["parent_block_hash"]);
        }
    }
    keys
}

#[test]
fn each_event_type_carries_exactly_its_keys_in_both_modes() {
    for legacy in [false, true] {
        let (publisher, mut sub) = connected(Config {
            emit_legacy_compat: legacy,
            ..config("")
        });
        let scan = publisher.begin_remove_all();
        publisher.on_put_commit("t", "k", "g", CPU);
        publisher.on_medium_delta("t", "k", "g", CPU, MediumSet::EMPTY);
        publisher.on_remove_all(&scan, "other", 1, 0);
        let got = events(&read_events(&publisher, &mut sub, 3));
        let sizes: Vec<usize> = got.iter().map(|e| keys(e).len()).collect();
        assert_eq!(sizes, if legacy { [20, 17, 12] } else { [17, 15, 11] });
        for event in &got {
            let kind = text(event, "event_type");
            assert_eq!(
                keys(event),
                expected_keys(kind, legacy),
                "{kind} legacy={legacy}"
            );
            if legacy {
                let legacy_type = match kind {
                    "stored" => "BlockStored",
                    "removed" => "BlockRemoved",
                    _ => "AllBlocksCleared",
                };
                assert_eq!(text(event, "type"), legacy_type);
            }
        }
    }
}

#[test]
fn nil_fields_are_nil_and_context_fields_carry_the_config() {
    let (publisher, mut sub) = connected(Config {
        model_name: "llama-3".into(),
        block_size: 16,
        lora_name: String::new(),
        additional_salt: "salt".into(),
        dp_rank: 3,
        ..config("")
    });
    publisher.on_put_commit("", "k", "", CPU);
    publisher.on_medium_delta("t", "k", "g", CPU, MediumSet::EMPTY);
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "t", 1, 0);
    let got = events(&read_events(&publisher, &mut sub, 3));
    let (stored, removed, cleared) = (&got[0], &got[1], &got[2]);
    for event in &got {
        assert_eq!(text(event, "model_name"), "llama-3");
        assert_eq!(field(event, "block_size"), Some(&Value::from(16u64)));
        assert_eq!(text(event, "additional_salt"), "salt");
        assert_eq!(field(event, "lora_name"), Some(&Value::Nil));
        assert_eq!(text(event, "backend_id"), "store-a");
        assert_eq!(field(event, "dp_rank"), Some(&Value::from(3u64)));
    }
    assert_eq!(text(stored, "tenant_id"), "default");
    assert_eq!(field(stored, "group_id"), Some(&Value::Nil));
    for nil_key in [
        "token_ids",
        "parent_hash",
        "parent_block_hash",
        "base_block_idx",
    ] {
        assert_eq!(field(stored, nil_key), Some(&Value::Nil), "{nil_key}");
    }
    assert_eq!(field(stored, "seq_hashes"), Some(&Value::Array(vec![])));
    assert_eq!(field(stored, "block_hashes"), Some(&Value::Array(vec![])));
    assert_eq!(text(removed, "group_id"), "g");
    assert_eq!(field(removed, "token_ids"), None);
    assert_eq!(field(cleared, "medium"), Some(&Value::Nil));
    assert_eq!(field(cleared, "object_key"), None);
}

#[test]
fn a_plain_config_sends_nil_for_every_unset_name() {
    let (publisher, mut sub) = connected(config(""));
    publisher.on_put_commit("t", "k", "g", DISK);
    let got = events(&read_events(&publisher, &mut sub, 1));
    for key in ["model_name", "block_size", "additional_salt", "lora_name"] {
        assert_eq!(field(&got[0], key), Some(&Value::Nil), "{key}");
    }
    assert_eq!(field(&got[0], "dp_rank"), Some(&Value::from(0u64)));
}

#[test]
fn sequences_event_ids_and_timestamps_follow_the_wire_rules() {
    let (publisher, mut sub) = connected(Config {
        dp_rank: 2,
        ..config("")
    });
    let calls = 200; // two media each: 400 events, at least 7 batches of at most 64
    for i in 0..calls {
        publisher.on_put_commit("t", format!("key-{i}"), "g", BOTH);
    }
    let batches = read_events(&publisher, &mut sub, 2 * calls);
    assert!(batches.len() >= 7);
    let mut next_id = 1u64;
    for (n, batch) in batches.iter().enumerate() {
        assert_eq!(batch.sequence, n as u64, "sequence: the first is 0");
        let expected = if n == 0 {
            Continuity::First { missed: 0 }
        } else {
            Continuity::Next
        };
        assert_eq!(batch.continuity, expected);
        assert!((1..=64).contains(&batch.events.len()));
        assert_eq!(batch.dp_rank, 2);
        for event in &batch.events {
            assert_eq!(
                field(event, "event_id").and_then(Value::as_u64),
                Some(next_id)
            );
            assert_eq!(
                field(event, "timestamp").and_then(Value::as_u64),
                Some(batch.timestamp_ms)
            );
            assert_eq!(field(event, "dp_rank").and_then(Value::as_u64), Some(2));
            next_id += 1;
        }
        assert!(batch.timestamp_ms > 1_600_000_000_000, "Unix milliseconds");
    }
    // A call's two events are never split across batches.
    let all = events(&batches);
    for pair in all.chunks(2) {
        assert_eq!(summary(pair)[0].2, summary(pair)[1].2);
    }
    let stats = publisher.stats();
    assert_eq!(
        (stats.published_events, stats.published_batches),
        (400, batches.len() as u64)
    );
    assert_eq!(stats.next_sequence, batches.len() as u64);
}

#[test]
fn integers_and_strings_take_their_smallest_encoding() {
    // A key that is not UTF-8 goes out as `bin` or as a `str` of its raw bytes, each in its
    // smallest form too.
    for non_utf8 in ["bin", "str"] {
        smallest_encoding_with(non_utf8);
    }
}

fn smallest_encoding_with(non_utf8: &str) {
    // Re-encoding what rmpv decoded writes every integer, string and container header in its
    // smallest form; the bytes on the wire must already be exactly that.
    let endpoint = common::endpoint();
    let publisher = Publisher::create(&Config {
        non_utf8: non_utf8.into(),
        ..config(&endpoint)
    })
    .unwrap();
    let context = zmq::Context::new();
    let socket = context.socket(zmq::SUB).unwrap();
    socket.set_subscribe(b"").unwrap();
    socket.connect(&endpoint).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    publisher.on_put_commit("t", "k".repeat(40), "g", CPU);
    publisher.on_medium_delta("t", [0xffu8, 0], "", DISK, CPU);
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "t", u64::MAX, 0);
    assert!(publisher.flush(std::time::Duration::from_secs(10)));
    // The publishing thread may split the four events over several batches; every message
    // must already be in its smallest encoding.
    socket.set_rcvtimeo(10_000).unwrap();
    let mut events = Vec::new();
    // The first message is 0.
    let mut sequence = 0u64;
    while events.len() < 4 {
        let frames = socket.recv_multipart(0).unwrap();
        assert_eq!(frames.len(), 3);
        assert!(frames[0].is_empty());
        assert_eq!(frames[1], sequence.to_be_bytes());
        sequence += 1;
        let value = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
        let mut reencoded = Vec::new();
        rmpv::encode::write_value(&mut reencoded, &value).unwrap();
        if non_utf8 == "str" {
            // rmpv writes a str that is not UTF-8 as a bin; the wire has the smallest str.
            reencoded = replaced(&reencoded, b"\xc4\x02\xff\x00", b"\xa2\xff\x00");
        }
        assert_eq!(reencoded, frames[2]);
        assert!(value[0].is_u64() && value[2].is_u64());
        events.extend(value[1].as_array().unwrap().iter().cloned());
    }
    assert_eq!(events.len(), 4);
    let key = field(&events[1], "object_key");
    match non_utf8 {
        "bin" => assert_eq!(key, Some(&Value::Binary(vec![0xff, 0]))),
        _ => assert!(
            matches!(key, Some(Value::String(s)) if s.as_bytes() == [0xff, 0] && s.as_str().is_none()),
            "{key:?}"
        ),
    }
}

/// `bytes` with each occurrence of `from` replaced by `to`.
fn replaced(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.starts_with(from) {
            out.extend_from_slice(to);
            rest = &rest[from.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

#[test]
fn deltas_emit_removed_then_stored_cpu_before_disk() {
    let sets = [MediumSet::EMPTY, CPU, DISK, BOTH];
    let (publisher, mut sub) = connected(config(""));
    let mut expected = Vec::new();
    for (i, before) in sets.iter().enumerate() {
        for (j, after) in sets.iter().enumerate() {
            let key = format!("{i}{j}");
            publisher.on_medium_delta("t", &key, "g", *before, *after);
            for m in before.minus(*after).iter() {
                expected.push(row("removed", m.as_str(), &key));
            }
            for m in after.minus(*before).iter() {
                expected.push(row("stored", m.as_str(), &key));
            }
        }
    }
    // Spelled out for the two crossings: removed first, whatever the media.
    assert!(expected.contains(&row("removed", "disk", "21")));
    let crossing: Vec<_> = expected.iter().filter(|r| r.2 == "21").cloned().collect();
    assert_eq!(
        crossing,
        [row("removed", "disk", "21"), row("stored", "cpu", "21")]
    );
    let got = events(&read_events(&publisher, &mut sub, expected.len()));
    assert_eq!(summary(&got), expected);
    assert_silent(&mut sub);
}

#[test]
fn a_commit_announces_every_medium_every_time() {
    let (publisher, mut sub) = connected(config(""));
    publisher.on_put_commit("t", "k", "g", BOTH);
    publisher.on_put_commit("t", "k", "g", CPU);
    publisher.on_put_commit("t", "k", "g", MediumSet::EMPTY);
    let got = events(&read_events(&publisher, &mut sub, 3));
    assert_eq!(
        summary(&got),
        [
            row("stored", "cpu", "k"),
            row("stored", "disk", "k"),
            row("stored", "cpu", "k")
        ]
    );
    assert_silent(&mut sub);
}

#[test]
fn remove_all_clears_only_a_clean_scan_of_a_quiet_tenant() {
    let (publisher, mut sub) = connected(config(""));
    publisher.on_put_commit("early", "k", "", CPU); // before the scan: no obstacle
    let scan = publisher.begin_remove_all();
    publisher.on_medium_delta("busy", "old", "", CPU, MediumSet::EMPTY); // a removal: no obstacle
    publisher.on_medium_delta("busy", "k", "", CPU, BOTH); // adds disk during the scan
    publisher.on_remove_all(&scan, "busy", 5, 0); // suppressed: a medium was added
    publisher.on_remove_all(&scan, "skipped", 5, 1); // suppressed: an object was skipped
    publisher.on_remove_all(&scan, "empty", 0, 0); // suppressed: nothing was removed
    publisher.on_remove_all(&scan, "early", 2, 0); // cleared
    publisher.on_remove_all(&scan, "", 1, 0); // cleared, as "default"
    let got = events(&read_events(&publisher, &mut sub, 5));
    let cleared: Vec<&str> = got
        .iter()
        .filter(|e| text(e, "event_type") == "cleared")
        .map(|e| text(e, "tenant_id"))
        .collect();
    assert_eq!(cleared, ["early", "default"]);
    assert_silent(&mut sub);
    assert_eq!(publisher.stats().cleared_suppressed, 3);

    // The next scan starts clean for the busy tenant.
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "busy", 1, 0);
    let got = events(&read_events(&publisher, &mut sub, 1));
    assert_eq!(text(&got[0], "tenant_id"), "busy");
}

#[test]
fn keyless_calls_are_counted_not_sent_and_cleared_still_goes_out() {
    let (publisher, mut sub) = connected(Config {
        emit_object_key: false,
        ..config("")
    });
    publisher.on_put_commit("t", "k", "g", BOTH);
    publisher.on_medium_delta("t", "k", "g", BOTH, MediumSet::EMPTY);
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "t", 1, 0);
    let got = events(&read_events(&publisher, &mut sub, 1));
    assert_eq!(text(&got[0], "event_type"), "cleared");
    assert_eq!(publisher.stats().skipped_keyless_events, 4);

    let (publisher, mut sub) = connected(config(""));
    publisher.on_put_commit("t", "", "g", CPU);
    publisher.on_put_commit("t", "k", "g", CPU);
    let got = events(&read_events(&publisher, &mut sub, 1));
    assert_eq!(text(&got[0], "object_key"), "k");
    assert_eq!(publisher.stats().skipped_keyless_events, 1);
}

#[test]
fn bytes_that_are_not_utf8_arrive_unchanged_as_bin() {
    let (publisher, mut sub) = connected(Config {
        non_utf8: "bin".into(),
        ..config("")
    });
    let key = b"k\0\xff\xfe".to_vec();
    let tenant = b"t\xc3".to_vec();
    let group = b"\x80g".to_vec();
    publisher.on_put_commit(&tenant, &key, &group, CPU);
    publisher.on_put_commit("t", "caf\u{e9}\0", "g", CPU);
    let got = events(&read_events(&publisher, &mut sub, 2));
    assert_eq!(field(&got[0], "object_key"), Some(&Value::Binary(key)));
    assert_eq!(field(&got[0], "tenant_id"), Some(&Value::Binary(tenant)));
    assert_eq!(field(&got[0], "group_id"), Some(&Value::Binary(group)));
    assert_eq!(text(&got[1], "object_key"), "caf\u{e9}\0");
}

#[test]
fn strings_on_either_side_of_what_a_queue_slot_holds_arrive_unchanged() {
    // A call's strings ride inside its queue record up to 104 bytes in all, in a pooled block
    // up to 256 and in a heap block beyond (1 KiB keys among them); the wire must not tell
    // them apart. Most groups are not UTF-8: they arrive byte for byte as `bin`, or as a
    // `str` of the raw bytes.
    for non_utf8 in ["bin", "str"] {
        strings_around_a_queue_slot_with(non_utf8);
    }
}

fn strings_around_a_queue_slot_with(non_utf8: &str) {
    let (publisher, mut sub) = connected(Config {
        non_utf8: non_utf8.into(),
        ..config("")
    });
    let calls: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (0..=24)
        .map(|i| (i, 92 + i))
        .chain((0..=24).map(|i| (i, 244 + i)))
        .chain([(25, 1024), (26, 1025)])
        .map(|(i, key_len)| {
            let tenant = vec![b't'; i % 5];
            let group = vec![0xff; i % 3];
            let key = (0..key_len).map(|b| (b * 7 + i) as u8).collect();
            (tenant, key, group)
        })
        .collect();
    for (tenant, key, group) in &calls {
        publisher.on_medium_delta(tenant, key, group, MediumSet::EMPTY, CPU);
    }
    let got = events(&read_events(&publisher, &mut sub, calls.len()));
    // The bytes of a field, checked to be a `str` when they are UTF-8 or the mode is `str`,
    // a `bin` otherwise.
    let bytes = |event: &Value, name: &str| {
        let (bytes, is_str) = match field(event, name) {
            Some(Value::String(s)) => (s.as_bytes().to_vec(), true),
            Some(Value::Binary(b)) => (b.clone(), false),
            other => panic!("{name}: {other:?}"),
        };
        let utf8 = std::str::from_utf8(&bytes).is_ok();
        assert_eq!(is_str, utf8 || non_utf8 == "str", "{name} as {non_utf8}");
        bytes
    };
    for ((tenant, key, group), event) in calls.iter().zip(&got) {
        assert_eq!(bytes(event, "object_key"), *key);
        let expected_tenant = if tenant.is_empty() {
            &b"default"[..]
        } else {
            tenant
        };
        assert_eq!(bytes(event, "tenant_id"), expected_tenant);
        if group.is_empty() {
            assert_eq!(field(event, "group_id"), Some(&Value::Nil));
        } else {
            assert_eq!(bytes(event, "group_id"), *group);
        }
    }
}

#[test]
fn dropping_the_publisher_sends_what_is_queued() {
    let (publisher, mut sub) = connected(config(""));
    for i in 0..1000 {
        publisher.on_put_commit("t", format!("k{i}"), "", CPU);
    }
    drop(publisher);
    let mut seen = 0;
    while let Some(batch) = sub.recv(std::time::Duration::from_secs(5)).unwrap() {
        seen += batch.events.len();
        if seen == 1000 {
            break;
        }
    }
    assert_eq!(seen, 1000);
}

#[test]
fn calls_after_shutdown_are_counted_as_dropped() {
    let (publisher, _sub) = connected(config(""));
    publisher.shutdown();
    publisher.on_put_commit("t", "k", "", BOTH);
    assert_eq!(publisher.stats().dropped_events, 2);
    assert!(!publisher.flush(std::time::Duration::from_millis(10)));
    publisher.shutdown();
}

#[test]
fn a_disabled_publisher_does_nothing() {
    let publisher = Publisher::create(&Config::default()).unwrap();
    assert!(!publisher.is_enabled());
    publisher.on_put_commit("t", "k", "", BOTH);
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "t", 1, 0);
    assert!(publisher.flush(std::time::Duration::ZERO));
    assert_eq!(publisher.stats(), Default::default());
    assert!(publisher.status_json().contains("\"enabled\":false"));
}

#[test]
fn creation_errors_name_the_endpoint_and_the_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = format!("tcp://127.0.0.1:{}", taken.local_addr().unwrap().port());
    for (endpoint, reason) in [
        (busy.as_str(), "in use"),
        ("tcp://no-port", "Invalid argument"),
        ("bogus://x", "Protocol not supported"),
        (
            "ipc:///nonexistent-dir/kv.sock",
            "No such file or directory",
        ),
    ] {
        let err = Publisher::create(&config(endpoint)).unwrap_err();
        assert!(matches!(err, CreateError::Bind { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.contains(endpoint) && message.contains(reason),
            "{message}"
        );
    }
    let err = Publisher::create(&Config {
        backend_id: String::new(),
        ..config("tcp://127.0.0.1:1")
    });
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("kv_events_backend_id"));
}

#[test]
fn an_ipc_publisher_removes_its_socket_file_when_dropped() {
    let endpoint = common::endpoint();
    let path = endpoint.strip_prefix("ipc://").unwrap().to_owned();
    let publisher = Publisher::create(&config(&endpoint)).unwrap();
    assert!(std::path::Path::new(&path).exists());
    drop(publisher);
    assert!(!std::path::Path::new(&path).exists());
}
