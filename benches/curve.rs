//! What CURVE costs: the delivered events/s and the CPU-seconds per million events of one
//! publisher and one subscriber on loopback TCP, plain and with CURVE (encrypted, an
//! allow-list of one key), measured in one run, alternating, so that the machine's load
//! weighs on both alike.
//!
//!     cargo bench --locked --bench curve            # about 30 s
//!     cargo bench --locked --bench curve -- 500000  # events per round (default 3,000,000)
//!
//! One producer thread calls `on_put_commit` as fast as the stream delivers: it backs off
//! while more than 16,384 events are sent but not yet received (256 full messages, well
//! under the PUB socket's high-water mark of 1000), so nothing is dropped, neither by the
//! queue nor by ZeroMQ, and every event is delivered; the subscriber counts events from
//! each message's array header. CPU is the whole
//! process's (`/proc/self/stat`): the producer, the publishing thread, both sides' libzmq
//! I/O threads (where CURVE encrypts and decrypts) and the subscriber. The producers do no
//! cryptography either way. docs/performance.md has the figures.

// The tests' helpers (key files, raw subscribers), shared rather than copied.
use kv_events_testing as common;

use common::{curve_config, curve_keys, raw_subscriber, tcp_endpoint, TempDir};
use mooncake_kv_events::keys::KeyPair;
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Events the producer lets be sent but not yet received.
const IN_FLIGHT: u64 = 16_384;

/// User plus system CPU time of this process so far.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // Linux reports in USER_HZ, 100 on every architecture it runs on.
    Duration::from_millis(ticks * 10)
}

/// Events in one message, from its payload's array header: `[ts, [events...], dp_rank]`.
fn events_in(payload: &[u8]) -> u64 {
    let mut cursor = payload;
    rmp::decode::read_array_len(&mut cursor).expect("an array");
    let _: u64 = rmp::decode::read_int(&mut cursor).expect("a timestamp");
    u64::from(rmp::decode::read_array_len(&mut cursor).expect("the events"))
}

struct Round {
    events_per_second: f64,
    cpu_seconds_per_million: f64,
}

/// One round of `events` events on a publisher from `config`, read by a subscriber that is
/// a CURVE client of (server, own key pair) when `curve` is given.
fn round(config: &Config, curve: Option<(&KeyPair, &KeyPair)>, events: u64) -> Round {
    let publisher = Publisher::create(config).expect("the publisher binds");
    let subscriber = raw_subscriber(&config.bind_endpoint, curve.map(|(s, c)| (&s.public, c)));
    // ZeroMQ's slow joiner: setup, not a measurement.
    std::thread::sleep(Duration::from_millis(500));
    let received = Arc::new(AtomicU64::new(0));
    let (cpu_before, started) = (cpu_time(), Instant::now());
    let counted = Arc::clone(&received);
    let reader = std::thread::spawn(move || {
        let mut seen = 0;
        while seen < events {
            assert!(
                subscriber.poll(zmq::POLLIN, 10_000).unwrap() > 0,
                "only {seen} of {events} events arrived"
            );
            let frames = subscriber.recv_multipart(0).unwrap();
            seen += events_in(&frames[2]);
            counted.store(seen, Relaxed);
        }
        Instant::now()
    });
    for i in 0..events {
        if i % 1024 == 0 {
            while i - received.load(Relaxed) > IN_FLIGHT {
                std::thread::yield_now();
            }
        }
        publisher.on_put_commit(
            "tenant",
            i.to_le_bytes(),
            "",
            MediumSet::from([Medium::Cpu]),
        );
    }
    let finished = reader.join().expect("the reader");
    let (wall, cpu) = (finished - started, cpu_time() - cpu_before);
    assert_eq!(publisher.stats().dropped_events, 0);
    Round {
        events_per_second: events as f64 / wall.as_secs_f64(),
        cpu_seconds_per_million: cpu.as_secs_f64() / (events as f64 / 1e6),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let events: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(3_000_000);
    let dir = TempDir::new("bench-curve");
    let (server, client) = curve_keys(&dir.0, "bench");
    let uptime = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", uptime.trim());
    let mut results: Vec<(&str, Vec<Round>)> = vec![("plain", Vec::new()), ("CURVE", Vec::new())];
    for _ in 0..3 {
        for (mode, rounds) in &mut results {
            let endpoint = tcp_endpoint();
            let config = if *mode == "plain" {
                common::config(&endpoint)
            } else {
                curve_config(&endpoint, &dir.0)
            };
            let curve = (*mode == "CURVE").then_some((&server, &client));
            let r = round(&config, curve, events);
            println!(
                "{mode:>6}: {:>9.0} events/s delivered, {:.3} CPU-s per million events",
                r.events_per_second, r.cpu_seconds_per_million
            );
            rounds.push(r);
        }
    }
    println!("medians of 3 rounds of {events} events each:");
    for (mode, rounds) in &results {
        println!(
            "{mode:>6}: {:>9.0} events/s delivered, {:.3} CPU-s per million events",
            median(rounds.iter().map(|r| r.events_per_second).collect()),
            median(rounds.iter().map(|r| r.cpu_seconds_per_million).collect())
        );
    }
    let uptime = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at end: {}", uptime.trim());
}
