//! Faults around the publisher: absent, stalled, reconnecting and many subscribers, floods,
//! shutdown under load, failed creation and hostile input. The master must never wait and
//! every loss must be counted or visible as a gap.

use kv_events_testing as common;

use common::{config, connected, endpoint, gaps, publish, read_events, subscribe};
use mooncake_kv_events::subscriber::{Batch, Continuity};
use mooncake_kv_events::wire::field;
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
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

/// Reads until the message of sequence `last` arrived; panics if the stream stops first.
fn read_through(sub: &mut mooncake_kv_events::subscriber::Subscriber, last: u64) -> Vec<Batch> {
    let mut batches: Vec<Batch> = Vec::new();
    while batches.last().is_none_or(|b| b.sequence < last) {
        let batch = sub.recv(Duration::from_secs(10)).unwrap();
        let seen = batches.last().map_or(0, |b| b.sequence);
        batches.push(batch.unwrap_or_else(|| panic!("the stream stopped at {seen} of {last}")));
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
    // Room for every call: the messages then far outnumber what the stalled peer's buffers
    // hold however little CPU the publishing thread gets (tests/overflow.rs covers drops).
    let calls = 200_000; // 6,250 messages
    let (publisher, endpoint) = publish(Config {
        queue_capacity: 1 << 18,
        // A send limit far below the messages sent, so that the stalled peer overflows it.
        send_hwm: 1000,
        ..config("")
    });
    let context = zmq::Context::new();
    let stalled = context.socket(zmq::SUB).unwrap();
    stalled.set_rcvhwm(10).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled.connect(&endpoint).unwrap();
    let mut reader = subscribe(&endpoint);

    assert!(slowest_of(&publisher, calls) < NEVER_WAITS);
    assert!(publisher.flush(Duration::from_secs(10)));
    let stats = publisher.stats();
    assert_eq!(stats.published_events, 2 * calls as u64, "{stats:?}");
    // The reader reads to the end. Its own ZeroMQ buffer may lose a message on a loaded
    // machine; that shows as a gap, never as a silent loss.
    let batches = read_through(&mut reader, stats.next_sequence - 1);
    let received: u64 = batches.iter().map(|b| b.events.len() as u64).sum();
    assert_eq!(gaps(&batches) + received, 2 * calls as u64);

    // The stalled one held at most its buffers' worth. Once it reads again, the sequence of
    // the next message it gets tells it that it missed some. A probe published after its
    // buffers are read marks the end; one that found them still full is lost, so try again.
    let sequence_of =
        |frames: Vec<Vec<u8>>| u64::from_be_bytes(frames[1].as_slice().try_into().unwrap());
    let mut sequences = Vec::new();
    for _ in 0..5 {
        stalled.set_rcvtimeo(1000).unwrap();
        sequences.extend(std::iter::from_fn(|| stalled.recv_multipart(0).ok()).map(sequence_of));
        publisher.on_put_commit("t", "after-the-stall", "", BOTH);
        assert!(publisher.flush(Duration::from_secs(10)));
        let probe = publisher.stats().next_sequence - 1;
        stalled.set_rcvtimeo(10_000).unwrap();
        while let Ok(frames) = stalled.recv_multipart(0) {
            sequences.push(sequence_of(frames));
            if sequences.last() >= Some(&probe) {
                break;
            }
        }
        if sequences.last() == Some(&probe) {
            break;
        }
    }
    assert_eq!(
        sequences.last(),
        Some(&(publisher.stats().next_sequence - 1)),
        "the stalled subscriber reads again"
    );
    assert!(
        sequences.len() * 2 < batches.len(),
        "the stalled one held far less: {} against {}",
        sequences.len(),
        batches.len()
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
    // "before" was 0 and "while-away" 1: "after", 2, has two before it.
    assert_eq!(batches[0].sequence, 2);
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
        .map(|sub| {
            let batches = read_through(sub, publisher.stats().next_sequence - 1);
            batches.iter().map(|b| b.sequence).collect()
        })
        .collect();
    assert!(streams.iter().all(|s| s == &streams[0]));
    assert_eq!(streams[0].first(), Some(&0));
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
    // Strings that are not UTF-8 forwarded byte for byte, as `bin`.
    let (publisher, mut sub) = connected(Config {
        non_utf8: "bin".into(),
        ..config("")
    });
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
