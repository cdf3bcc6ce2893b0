//! A subscriber that stops reading loses messages alone: past the publisher's send limit for it
//! (`kv_events_send_hwm`) the PUB socket drops what that subscriber has not taken, and it sees
//! a gap when it reads again; the subscribers that keep reading see every message, with no gap.
//!
//! No timing is asserted: the publisher waits for the fast subscribers to have read each round
//! before it makes the next, so a busy machine only makes the test slower.

use kv_events_testing::{config, eventually, gaps, publish, subscribe};
use mooncake_kv_events::subscriber::{Batch, Continuity, Reach, Subscriber};
use mooncake_kv_events::{Config, Medium, MediumSet};
use std::time::Duration;

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
/// Rounds of calls; each ends with a flush, and is at least four messages (64 events each at
/// most).
const ROUNDS: usize = 100;
const CALLS_PER_ROUND: usize = 200;

/// Reads from `subscriber` until the message of `sequence` arrived, into `batches`.
fn read_through(subscriber: &mut Subscriber, sequence: u64, batches: &mut Vec<Batch>) {
    while batches.last().is_none_or(|b| b.sequence < sequence) {
        let batch = subscriber
            .recv(Duration::from_secs(30))
            .expect("a well-formed message")
            .unwrap_or_else(|| panic!("sequence {sequence} never arrived"));
        batches.push(batch);
    }
}

#[test]
fn a_subscriber_that_stops_reading_alone_loses_messages() {
    // A send limit of 100 messages per subscriber, so that the slow one's share fills soon.
    let (publisher, endpoint) = publish(Config {
        send_hwm: 100,
        ..config("")
    });
    let mut fast: Vec<Subscriber> = (0..3).map(|_| subscribe(&endpoint)).collect();
    // The slow one holds at most 10 messages itself, and reads nothing until the end.
    let mut slow = Subscriber::connect(&endpoint, 10).expect("the slow subscriber connects");
    // Setup, as `subscribe` does: the handshake, then a moment for the subscription.
    assert!(eventually(|| matches!(slow.reach(), Ok(Reach::Reached))));
    std::thread::sleep(Duration::from_millis(300));
    let mut seen: Vec<Vec<Batch>> = vec![Vec::new(); fast.len()];
    // The sequence the next message takes: every message so far is numbered below it.
    let mut next = 0;
    for round in 0..ROUNDS {
        for call in 0..CALLS_PER_ROUND {
            publisher.on_put_commit("t", format!("{round}/{call}"), "", CPU);
        }
        assert!(publisher.flush(Duration::from_secs(30)), "flush");
        next = publisher.stats().next_sequence;
        for (subscriber, batches) in fast.iter_mut().zip(&mut seen) {
            read_through(subscriber, next - 1, batches);
        }
    }
    let stats = publisher.stats();
    assert_eq!(stats.dropped_events, 0, "{stats:?}");
    assert!(
        next > 300,
        "{next} messages: too few to fill the slow subscriber's share"
    );
    // The slow subscriber reads what it holds; one more message shows what it lost.
    let mut slow_batches = Vec::new();
    while let Some(batch) = slow.recv(Duration::from_millis(500)).expect("a message") {
        slow_batches.push(batch);
    }
    publisher.on_put_commit("t", "after", "", CPU);
    assert!(publisher.flush(Duration::from_secs(30)), "flush");
    next = publisher.stats().next_sequence;
    read_through(&mut slow, next - 1, &mut slow_batches);
    for (subscriber, batches) in fast.iter_mut().zip(&mut seen) {
        read_through(subscriber, next - 1, batches);
    }

    let events = (ROUNDS * CALLS_PER_ROUND + 1) as u64;
    for batches in &seen {
        assert_eq!(gaps(batches), 0, "a fast subscriber saw a gap");
        let received: usize = batches.iter().map(|b| b.events.len()).sum();
        assert_eq!(received as u64, events);
    }
    // It joined before the first message, and lost messages in the middle.
    assert_eq!(slow_batches[0].sequence, 0);
    let lost: u64 = slow_batches
        .iter()
        .map(|b| match b.continuity {
            Continuity::Gap { missed } => missed,
            _ => 0,
        })
        .sum();
    assert!(lost > 0, "the slow subscriber lost nothing");
    let received: u64 = slow_batches.iter().map(|b| b.events.len() as u64).sum();
    assert!(received < events, "{received} of {events}");
}
