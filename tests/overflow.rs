//! Many producer threads flooding a small queue: every loss is counted and visible as a gap.

use kv_events_testing as common;

use common::{config, connected, gaps};
use mooncake_kv_events::subscriber::Batch;
use mooncake_kv_events::wire::field;
use mooncake_kv_events::{Config, Medium, MediumSet, Stats};
use rmpv::Value;
use std::collections::HashMap;
use std::time::Duration;

const THREADS: u64 = 8;
const CALLS_PER_THREAD: u64 = 20_000;

/// Eight threads flood a queue of 16, then one `end` call follows; returns the stats and
/// every batch the subscriber received, read while the flood ran.
fn flood() -> (Stats, Vec<Batch>) {
    let (publisher, mut sub) = connected(Config {
        queue_capacity: 16,
        ..config("")
    });
    let both = MediumSet::from([Medium::Cpu, Medium::Disk]);
    let is_end = |e: &Value| field(e, "object_key") == Some(&Value::from("end"));
    let batches = std::thread::scope(|s| {
        // Read while the flood runs, so that the subscriber's own buffer never overflows.
        let reader = s.spawn(move || {
            let mut batches = Vec::new();
            loop {
                let batch = sub
                    .recv(Duration::from_secs(30))
                    .unwrap()
                    .expect("every batch arrives");
                let done = batch.events.iter().any(is_end);
                batches.push(batch);
                if done {
                    break batches;
                }
            }
        });
        std::thread::scope(|p| {
            for thread in 0..THREADS {
                let publisher = &publisher;
                p.spawn(move || {
                    for call in 0..CALLS_PER_THREAD {
                        publisher.on_put_commit("t", key(thread, call), "", both);
                    }
                });
            }
        });
        // Drops after the last message show as the gap before the next one: send one more,
        // into an emptied queue, so that it pushes nothing out itself.
        assert!(publisher.flush(Duration::from_secs(30)));
        publisher.on_put_commit("t", "end", "", MediumSet::from([Medium::Cpu]));
        assert!(publisher.flush(Duration::from_secs(30)));
        reader.join().unwrap()
    });
    (publisher.stats(), batches)
}

/// Odd threads' keys are too long for a queue slot: their strings take the string pool's
/// blocks (4 for a queue of 16), or the heap once those are all queued, and blocks come back
/// whether a call is sent or pushed out.
fn key(thread: u64, call: u64) -> String {
    let padding = if thread % 2 == 1 { PADDING } else { "" };
    format!("{thread}/{call}/{padding}")
}

const PADDING: &str = "a-key-of-a-vllm-connector-s-length:meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@0123456789abcdef";

fn received(batches: &[Batch]) -> u64 {
    batches.iter().map(|b| b.events.len() as u64).sum()
}

#[test]
fn gaps_seen_by_the_subscriber_sum_to_the_dropped_events() {
    // The publisher's drops are the subject. ZeroMQ's own, when the PUB's send buffer for
    // this subscriber fills because a loaded machine starved an I/O thread, are not: they show
    // as fewer events received than published, and the flood is then run again.
    let mut attempts = 0;
    let (stats, batches) = loop {
        attempts += 1;
        let (stats, batches) = flood();
        if received(&batches) == stats.published_events || attempts == 3 {
            break (stats, batches);
        }
    };
    assert!(
        stats.dropped_events > 0,
        "a queue of 16 must overflow under this flood"
    );
    let offered = THREADS * CALLS_PER_THREAD * 2 + 1;
    assert_eq!(stats.published_events + stats.dropped_events, offered);
    assert_eq!(
        gaps(&batches),
        stats.dropped_events,
        "gaps are exactly the dropped events"
    );
    assert_eq!(received(&batches), stats.published_events);
    let events: Vec<Value> = batches.into_iter().flat_map(|b| b.events).collect();

    let mut last_call: HashMap<u64, i64> = HashMap::new();
    let mut previous_id = 0;
    let mut pending: Option<String> = None; // the key whose disk event must come next
    for event in &events {
        let id = field(event, "event_id").and_then(Value::as_u64).unwrap();
        assert!(id > previous_id, "event ids increase");
        previous_id = id;
        let key = field(event, "object_key")
            .and_then(Value::as_str)
            .unwrap()
            .to_owned();
        let medium = field(event, "medium").and_then(Value::as_str).unwrap();
        if let Some(first) = pending.take() {
            assert_eq!(
                (first.as_str(), medium),
                (key.as_str(), "disk"),
                "a call's events stay together"
            );
            continue;
        }
        if key == "end" {
            continue;
        }
        assert_eq!(medium, "cpu");
        pending = Some(key.clone());
        let mut parts = key.splitn(3, '/');
        let (thread, call, padding) = (parts.next(), parts.next(), parts.next());
        let (thread, call): (u64, i64) = (
            thread.unwrap().parse().unwrap(),
            call.unwrap().parse().unwrap(),
        );
        let expected = if thread % 2 == 1 { PADDING } else { "" };
        assert_eq!(padding, Some(expected), "the key arrives whole: {key}");
        let last = last_call.entry(thread).or_insert(-1);
        assert!(call > *last, "thread {thread}'s calls keep their order");
        *last = call;
    }
    assert_eq!(events.len() as u64, previous_id, "event ids have no gaps");
}
