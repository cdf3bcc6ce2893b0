//! A publisher and a subscriber on a private ipc endpoint, for tests that read the real stream.
#![allow(dead_code)] // each test binary uses part of this

use mooncake_kv_events::watch::{Batch, Continuity, Subscriber};
use mooncake_kv_events::{Config, Publisher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A ZeroMQ endpoint no other test uses.
pub fn endpoint() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ipc:///tmp/kv-events-test-{}-{n}.sock", std::process::id())
}

pub fn config(endpoint: &str) -> Config {
    Config {
        enable_kv_events: true,
        bind_endpoint: endpoint.to_owned(),
        backend_id: "store-a".into(),
        ..Config::default()
    }
}

/// A publisher created from `config`, its endpoint replaced by a fresh one, and that endpoint.
pub fn publish(mut config: Config) -> (Publisher, String) {
    config.bind_endpoint = endpoint();
    let publisher = Publisher::create(&config).expect("the publisher binds");
    (publisher, config.bind_endpoint)
}

/// A subscriber that has joined the publisher on `endpoint`, so the next message reaches it.
pub fn subscribe(endpoint: &str) -> Subscriber {
    let subscriber = Subscriber::connect(endpoint, 1_000_000).expect("the subscriber connects");
    // ZeroMQ's slow joiner: a subscription takes a moment to reach the PUB socket. This is
    // setup, not an assertion; messages sent before it would be missed and the test fail.
    std::thread::sleep(Duration::from_millis(300));
    subscriber
}

/// A publisher from `config` on a fresh endpoint, and a subscriber that has joined it.
pub fn connected(config: Config) -> (Publisher, Subscriber) {
    let (publisher, endpoint) = publish(config);
    (publisher, subscribe(&endpoint))
}

/// The sum of the sequence gaps in `batches`, counting numbers missed before the first.
pub fn gaps(batches: &[Batch]) -> u64 {
    batches
        .iter()
        .map(|b| match b.continuity {
            Continuity::First { missed } | Continuity::Gap { missed } => missed,
            Continuity::Next => 0,
            Continuity::Restart => panic!("the sequence went back at {}", b.sequence),
        })
        .sum()
}

/// Flushes the publisher, then reads until `events` events arrived.
pub fn read_events(
    publisher: &Publisher,
    subscriber: &mut Subscriber,
    events: usize,
) -> Vec<Batch> {
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    let mut batches = Vec::new();
    let mut seen = 0;
    while seen < events {
        let batch = subscriber
            .recv(Duration::from_secs(10))
            .expect("a well-formed message")
            .unwrap_or_else(|| panic!("only {seen} of {events} events arrived"));
        seen += batch.events.len();
        batches.push(batch);
    }
    assert_eq!(seen, events, "more events than expected");
    batches
}

/// Asserts that nothing more arrives within a short while.
pub fn assert_silent(subscriber: &mut Subscriber) {
    let extra = subscriber
        .recv(Duration::from_millis(200))
        .expect("a well-formed message");
    assert!(extra.is_none(), "unexpected message: {extra:?}");
}
