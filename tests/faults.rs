//! Faults around the publisher: absent, stalled, reconnecting and many subscribers, floods,
//! shutdown under load, failed creation and hostile input. The master must never wait and
//! every loss must be counted or visible as a gap.

mod common;

use common::{config, connected, endpoint, gaps, publish, read_events, subscribe};
use mooncake_kv_events::watch::{field, Batch, Continuity};
use mooncake_kv_events::{Medium, MediumSet, Publisher};
use rmpv::Value;
use std::time::{Duration, Instant};

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const BOTH: MediumSet = CPU.with(Medium::Disk);

/// Far above any call's cost, far below a call that waited on I/O or on the publishing
/// thread: loose on purpose, so that a loaded machine cannot make it flake.
const NEVER_WAITS: Duration = Duration::from_millis(250);

/// Calls `on_put_commit` (two media) `n` times and returns the slowest call.
fn slowest_of(publisher: &Publisher, n: usize) -> Duration {
    (0..n)
        .map(|i| {
            let key = format!("key-{i}");
            let start = Instant::now();
            publisher.on_put_commit("t", key, "", BOTH);
            start.elapsed()
        })
        .max()
        .unwrap()
}

/// Reads until `events` events arrived or nothing came for a second.
fn read_up_to(sub: &mut mooncake_kv_events::watch::Subscriber, events: u64) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut seen = 0;
    while seen < events {
        let Some(batch) = sub.recv(Duration::from_secs(1)).unwrap() else {
            break;
        };
        seen += batch.events.len() as u64;
        batches.push(batch);
    }
    batches
}

#[test]
fn no_subscriber_at_all_costs_the_caller_nothing() {
    let publisher = Publisher::create(&config(&endpoint())).unwrap();
    assert!(slowest_of(&publisher, 50_000) < NEVER_WAITS);
    assert!(publisher.flush(Duration::from_secs(10)));
    let stats = publisher.stats();
    assert_eq!(stats.published_events + stats.dropped_events, 100_000);
}

#[test]
fn a_stalled_subscriber_slows_neither_the_caller_nor_other_subscribers() {
    let (publisher, endpoint) = publish(config(""));
    let context = zmq::Context::new();
    let stalled = context.socket(zmq::SUB).unwrap();
    stalled.set_rcvhwm(10).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled.connect(&endpoint).unwrap();
    let mut reader = subscribe(&endpoint);

    let calls = 200_000; // 6,000+ messages: far more than the stalled peer's buffers hold
    assert!(slowest_of(&publisher, calls) < NEVER_WAITS);
    let published = {
        assert!(publisher.flush(Duration::from_secs(10)));
        publisher.stats().published_events
    };
    let batches = read_up_to(&mut reader, published);
    // The reader reads to the end, and every loss shows in its sequence: the publisher's drops
    // at least. (On a loaded machine its own ZeroMQ buffer may also lose a message, which
    // shows as a further gap; tests/overflow.rs checks the exact account.)
    let last_sequence = publisher.stats().last_sequence;
    assert_eq!(batches.last().map(|b| b.sequence), Some(last_sequence));
    assert!(gaps(&batches) >= publisher.stats().dropped_events);

    // The stalled one held at most its buffers' worth. Once it reads again, the sequence of
    // the next message it gets tells it that it missed some.
    let sequence_of =
        |frames: Vec<Vec<u8>>| u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
    stalled.set_rcvtimeo(1000).unwrap();
    let mut sequences: Vec<u64> = std::iter::from_fn(|| stalled.recv_multipart(0).ok())
        .map(sequence_of)
        .collect();
    publisher.on_put_commit("t", "after-the-stall", "", BOTH);
    assert!(publisher.flush(Duration::from_secs(10)));
    stalled.set_rcvtimeo(10_000).unwrap();
    sequences.push(sequence_of(
        stalled
            .recv_multipart(0)
            .expect("the stalled subscriber reads again"),
    ));
    assert_eq!(sequences.last(), Some(&publisher.stats().last_sequence));
    assert!(
        sequences.len() * 2 < batches.len(),
        "the stalled one held far less"
    );
    assert!(
        sequences.windows(2).any(|w| w[1] > w[0] + 1),
        "the stalled subscriber sees a gap"
    );
}

#[test]
fn a_subscriber_that_reconnects_learns_that_it_missed_messages() {
    let (publisher, endpoint) = publish(config(""));
    let mut first = subscribe(&endpoint);
    publisher.on_put_commit("t", "before", "", CPU);
    read_events(&publisher, &mut first, 1);
    drop(first);
    publisher.on_put_commit("t", "while-away", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)));
    let mut again = subscribe(&endpoint);
    publisher.on_put_commit("t", "after", "", CPU);
    let batches = read_events(&publisher, &mut again, 1);
    assert_eq!(batches[0].continuity, Continuity::First { missed: 2 });
    assert_eq!(
        field(&batches[0].events[0], "object_key"),
        Some(&Value::from("after"))
    );
}

#[test]
fn many_subscribers_see_the_same_stream() {
    let (publisher, endpoint) = publish(config(""));
    let mut subscribers: Vec<_> = (0..8).map(|_| subscribe(&endpoint)).collect();
    for i in 0..500 {
        publisher.on_put_commit("t", format!("k{i}"), "", BOTH);
    }
    assert!(publisher.flush(Duration::from_secs(10)));
    let streams: Vec<Vec<u64>> = subscribers
        .iter_mut()
        .map(|sub| read_up_to(sub, 1000).iter().map(|b| b.sequence).collect())
        .collect();
    assert!(streams.iter().all(|s| s == &streams[0]));
    assert_eq!(streams[0].first(), Some(&1));
    assert_eq!(publisher.stats().published_events, 1000);
}

#[test]
fn binding_one_endpoint_twice_in_one_process_is_refused() {
    let endpoint = format!("tcp://127.0.0.1:{}", {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    });
    let _first = Publisher::create(&config(&endpoint)).unwrap();
    let err = Publisher::create(&config(&endpoint))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&endpoint) && err.contains("in use"), "{err}");
}

#[test]
fn hostile_input_is_forwarded_losslessly_or_counted() {
    let (publisher, mut sub) = connected(config(""));
    let huge = vec![0xffu8; 1 << 20];
    let nul = b"a\0b".to_vec();
    publisher.on_put_commit(&huge, &huge, &huge, CPU); // 1 MiB each, not UTF-8
    publisher.on_put_commit(&nul, &nul, &nul, CPU);
    publisher.on_put_commit("", "k", "", CPU); // empty tenant and group
    publisher.on_put_commit("t", "k", "g", CPU); // the same call twice
    publisher.on_put_commit("t", "k", "g", CPU);
    publisher.on_medium_delta("t", "never-stored", "", BOTH, MediumSet::EMPTY);
    publisher.on_medium_delta("t", "k", "", BOTH, BOTH); // equal sets: nothing
    publisher.on_medium_delta("t", "", "", CPU, MediumSet::EMPTY); // keyless: counted
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "t", u64::MAX, u64::MAX); // skipped: suppressed
    publisher.on_remove_all(&scan, "u", u64::MAX, 0);
    publisher.on_remove_all(&scan, "v", 0, 0);
    let events: Vec<Value> = read_events(&publisher, &mut sub, 8)
        .into_iter()
        .flat_map(|b| b.events)
        .collect();
    let key_of = |e: &Value| field(e, "object_key").cloned();
    assert_eq!(key_of(&events[0]), Some(Value::Binary(huge.clone())));
    assert_eq!(
        field(&events[0], "tenant_id"),
        Some(&Value::Binary(huge.clone()))
    );
    assert_eq!(field(&events[0], "group_id"), Some(&Value::Binary(huge)));
    assert_eq!(key_of(&events[1]), Some(Value::from("a\0b")));
    assert_eq!(
        field(&events[2], "tenant_id"),
        Some(&Value::from("default"))
    );
    assert_eq!(key_of(&events[3]), key_of(&events[4]));
    let removed: Vec<_> = events[5..7]
        .iter()
        .map(|e| field(e, "medium").cloned())
        .collect();
    assert_eq!(
        removed,
        [Some(Value::from("cpu")), Some(Value::from("disk"))]
    );
    assert_eq!(field(&events[7], "tenant_id"), Some(&Value::from("u")));
    let stats = publisher.stats();
    assert_eq!(
        (
            stats.skipped_keyless_events,
            stats.cleared_suppressed,
            stats.dropped_events
        ),
        (1, 2, 0)
    );
}
