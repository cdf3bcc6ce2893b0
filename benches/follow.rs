//! How fast a reader gets back in sync, measured in one run on loopback TCP:
//! - a `Follower` joins a master holding 500,000 objects while the master changes at
//!   40,000 calls a second: time to in sync, snapshots taken, events applied per second;
//! - the same follower stops reading for 3 s (its socket drops what it cannot hold, and
//!   the replay buffer is too small for the gap), then resumes: time from resuming to in
//!   sync, and whether it needed more than one snapshot;
//! - its index then equals the master's truth.
//!
//! ```sh
//! cargo bench --locked --bench follow             # about 30 s
//! cargo bench --locked --bench follow -- 200000   # objects in the master
//! ```

use kv_events_testing as common;

use common::model::Model;
use mooncake_kv_events::subscriber::{FollowOptions, Follower, Index, Upstream};
use mooncake_kv_events::wire::{decode_message, Checked};
use mooncake_kv_events::{Config, MediumSet, Publisher};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const CALLS_PER_SECOND: u64 = 40_000;
const PAUSE: Duration = Duration::from_secs(3);

/// Polls until the follower is in sync (after at least `at_least` snapshots); the time.
fn in_sync(follower: &mut Follower, at_least: u64) -> Duration {
    let started = Instant::now();
    loop {
        follower.poll(Duration::from_millis(5));
        let counters = follower.counters();
        if follower.in_sync() && counters.snapshots >= at_least {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{counters:?}");
    }
}

/// A snapshot's pages, read raw on a DEALER.
fn raw_snapshot(replay: &str) -> Vec<Vec<u8>> {
    let socket = zmq::Context::new().socket(zmq::DEALER).unwrap();
    socket.set_rcvtimeo(60_000).unwrap();
    socket.connect(replay).unwrap();
    socket.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    let started = Instant::now();
    let mut pages = Vec::new();
    loop {
        let mut frames = socket.recv_multipart(0).expect("the snapshot goes on");
        match &frames[1][..] {
            b"snapshot" => pages.push(frames.pop().unwrap()),
            b"snapshot-end" => break,
            other => panic!("{}", String::from_utf8_lossy(other)),
        }
    }
    println!(
        "a snapshot read raw: {} pages in {:.3} s",
        pages.len(),
        started.elapsed().as_secs_f64()
    );
    pages
}

fn main() {
    let objects: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(500_000);
    let (endpoint, replay) = (common::tcp_endpoint(), common::tcp_endpoint());
    let publisher = Arc::new(
        Publisher::create(&Config {
            replay_endpoint: replay.clone(),
            // A gap of a few seconds at this rate is beyond it: the way back is a snapshot.
            replay_buffer_bytes: 1 << 20,
            ..common::config(&endpoint)
        })
        .expect("binds"),
    );
    let model = Model::new();
    model.serve(&publisher);
    let cpu = MediumSet::from_bits(1);
    for i in 0..objects {
        model.set(&publisher, b"tenant", format!("{i:0>40}").as_bytes(), cpu);
    }
    assert!(publisher.flush(Duration::from_secs(60)));

    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (model, publisher, stop) = (model.clone(), Arc::clone(&publisher), Arc::clone(&stop));
        thread::spawn(move || {
            let started = Instant::now();
            let mut calls = 0u64;
            while !stop.load(Relaxed) {
                let key = format!("{:0>40}", (calls * 7919) % objects);
                model.set(
                    &publisher,
                    b"tenant",
                    key.as_bytes(),
                    MediumSet::from_bits(1 + (calls % 3) as u8),
                );
                calls += 1;
                let due = Duration::from_secs(1) * calls as u32 / CALLS_PER_SECOND as u32;
                thread::sleep(due.saturating_sub(started.elapsed()));
            }
            calls as f64 / started.elapsed().as_secs_f64()
        })
    };

    // What decoding and indexing cost, apart from the sockets: a snapshot read raw, then
    // decoded and applied as the follower does (its four fields, `Change`) and as a reader
    // of every field would (`rmpv`).
    let pages = raw_snapshot(&replay);
    for (name, lean) in [
        ("the follower's (Change)", true),
        ("every field (rmpv)", false),
    ] {
        let started = Instant::now();
        let mut index = Index::new();
        let mut events = 0u64;
        for page in &pages {
            let frames = [&[][..], &[0u8; 8][..], page];
            if lean {
                for event in Checked::new(frames.to_vec()).unwrap().changes() {
                    index.apply_change(&event).unwrap();
                    events += 1;
                }
            } else {
                for event in &decode_message(&frames).unwrap().events {
                    index.apply(event).unwrap();
                    events += 1;
                }
            }
        }
        let took = started.elapsed();
        println!(
            "decode and apply alone, {name}: {events} events in {:.3} s, {:.0} events/s",
            took.as_secs_f64(),
            events as f64 / took.as_secs_f64()
        );
    }

    let options = FollowOptions {
        rcvhwm: 1000,
        ..FollowOptions::default()
    };
    let mut follower = Follower::new(vec![Upstream::new(&endpoint, &replay)], options).unwrap();
    let joined = in_sync(&mut follower, 1);
    let first = follower.counters();
    println!(
        "join: {objects} objects held, the master changing at {CALLS_PER_SECOND} calls/s: in \
         sync after {:.3} s ({:.0} snapshot objects/s applied), {} snapshot(s)",
        joined.as_secs_f64(),
        objects as f64 / joined.as_secs_f64(),
        first.snapshots
    );

    // The reader stops: its socket drops what it cannot hold; the gap outgrows the ring.
    thread::sleep(PAUSE);
    let resumed = Instant::now();
    let back = in_sync(&mut follower, first.snapshots + 1);
    let after = follower.counters();
    println!(
        "resume after {} s away: in sync after {:.3} s, {} snapshot(s) for it, {} live \
         messages overflowed, {} gaps",
        PAUSE.as_secs(),
        back.as_secs_f64(),
        after.snapshots - first.snapshots,
        after.overflowed - first.overflowed,
        after.gaps - first.gaps
    );
    let _ = resumed;
    stop.store(true, Relaxed);
    let rate = churn.join().unwrap();
    assert!(publisher.flush(Duration::from_secs(30)));
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(2) {
        follower.poll(Duration::from_millis(10));
    }
    let equal = *follower.index(0) == model.truth();
    println!(
        "churn {rate:.0} calls/s; the follower's index equals the master's truth: {equal}; \
         {:?}",
        follower.counters()
    );
    assert!(equal);
}
