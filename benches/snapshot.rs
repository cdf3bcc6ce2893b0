//! What a snapshot costs, measured in one run on loopback TCP:
//! - a snapshot of a master holding 1,000,000 objects (16 shards, 64-byte keys, one medium
//!   each, every tenth on both): seconds, objects/s, bytes sent;
//! - the callers' latency (p50, p99, p99.9 of each call) and the events/s a live subscriber
//!   receives, while snapshots run back to back against while none runs, alternating, so
//!   that the machine's load weighs on both alike.
//!
//! ```sh
//! cargo bench --locked --bench snapshot            # about 60 s
//! cargo bench --locked --bench snapshot -- 200000  # objects in the master
//! ```
//!
//! Two caller threads make `on_medium_delta` calls paced at 50,000 a second in all, under
//! the shard lock of the object they change, as the master does; the snapshot's source takes
//! the same locks to copy each shard. docs/performance.md has the figures.

use kv_events_testing as common;

use common::{raw_subscriber, tcp_endpoint};
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher, Snapshot};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const SHARDS: usize = 16;
const CALLERS: u64 = 2;
const CALLS_PER_SECOND: u64 = 50_000;
const PHASE: Duration = Duration::from_secs(5);

type Shard = Mutex<HashMap<Vec<u8>, MediumSet>>;

struct Master {
    publisher: Publisher,
    shards: Vec<Shard>,
}

fn key(i: u64) -> Vec<u8> {
    format!("{i:0>64}").into_bytes()
}

impl Master {
    fn new(publisher: Publisher, objects: u64) -> Arc<Master> {
        let shards: Vec<Shard> = (0..SHARDS).map(|_| Mutex::default()).collect();
        for i in 0..objects {
            let media = if i % 10 == 0 {
                MediumSet::from([Medium::Cpu, Medium::Disk])
            } else {
                MediumSet::from([Medium::Cpu])
            };
            shards[i as usize % SHARDS]
                .lock()
                .unwrap()
                .insert(key(i), media);
        }
        let master = Arc::new(Master { publisher, shards });
        let source = Arc::clone(&master);
        master
            .publisher
            .set_object_source(move |_: Option<&[u8]>, out: &mut Snapshot| {
                for shard in &source.shards {
                    let copied: Vec<(Vec<u8>, MediumSet)> = shard
                        .lock()
                        .unwrap()
                        .iter()
                        .map(|(k, m)| (k.clone(), *m))
                        .collect();
                    for (key, media) in copied {
                        out.add(b"tenant", &key, b"group", media)
                            .map_err(|e| e.to_string())?;
                    }
                }
                Ok(())
            });
        master
    }

    /// Toggles object `i` between cpu and cpu+disk, under its shard's lock; the call's time.
    fn change(&self, i: u64) -> Duration {
        let key = key(i);
        let mut shard = self.shards[i as usize % SHARDS].lock().unwrap();
        let before = shard.get(&key).copied().unwrap_or(MediumSet::EMPTY);
        let after = if before.contains(Medium::Disk) {
            MediumSet::from([Medium::Cpu])
        } else {
            MediumSet::from([Medium::Cpu, Medium::Disk])
        };
        let started = Instant::now();
        self.publisher
            .on_medium_delta(b"tenant", &key, b"group", before, after);
        let took = started.elapsed();
        shard.insert(key, after);
        took
    }
}

/// One snapshot read whole: (messages, bytes, objects), and how long it took.
fn snapshot(endpoint: &str) -> ((u64, u64, u64), Duration) {
    let socket = zmq::Context::new().socket(zmq::DEALER).unwrap();
    socket.set_rcvtimeo(60_000).unwrap();
    socket.connect(endpoint).unwrap();
    let started = Instant::now();
    socket.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    let (mut messages, mut bytes) = (0, 0);
    loop {
        let frames = socket.recv_multipart(0).expect("the snapshot goes on");
        bytes += frames.iter().map(|f| f.len() as u64).sum::<u64>();
        match &frames[1][..] {
            b"snapshot" => messages += 1,
            b"snapshot-end" => {
                let end = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
                let objects = mooncake_kv_events::wire::field(&end, "objects")
                    .and_then(rmpv::Value::as_u64)
                    .unwrap();
                return ((messages, bytes, objects), started.elapsed());
            }
            other => panic!("{}", String::from_utf8_lossy(other)),
        }
    }
}

struct Phase {
    latencies: Vec<Duration>,
    delivered_per_second: f64,
    snapshots: u64,
}

/// `PHASE` of paced calls, with snapshots back to back when `snapshots` is set.
fn phase(master: &Arc<Master>, subscriber: &zmq::Socket, replay: &str, snapshots: bool) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicU64::new(0));
    let snapshotter = snapshots.then(|| {
        let (stop, taken, replay) = (Arc::clone(&stop), Arc::clone(&taken), replay.to_owned());
        thread::spawn(move || {
            while !stop.load(Relaxed) {
                snapshot(&replay);
                taken.fetch_add(1, Relaxed);
            }
        })
    });
    // Whatever the previous phase left in flight is not this phase's.
    while subscriber.poll(zmq::POLLIN, 200).unwrap() > 0 {
        subscriber.recv_multipart(0).unwrap();
    }
    let started = Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|c| {
            let master = Arc::clone(master);
            thread::spawn(move || {
                let every = Duration::from_secs(1) * CALLERS as u32 / CALLS_PER_SECOND as u32;
                let mut latencies = Vec::new();
                let mut i = c;
                while started.elapsed() < PHASE {
                    latencies.push(master.change(i % 1000));
                    i += CALLERS;
                    let due = every * (latencies.len() as u32);
                    thread::sleep(due.saturating_sub(started.elapsed()));
                }
                latencies
            })
        })
        .collect();
    let mut delivered = 0u64;
    while started.elapsed() < PHASE {
        if subscriber.poll(zmq::POLLIN, 100).unwrap() > 0 {
            let frames = subscriber.recv_multipart(0).unwrap();
            let mut payload = &frames[2][..];
            rmp::decode::read_array_len(&mut payload).unwrap();
            let _: u64 = rmp::decode::read_int(&mut payload).unwrap();
            delivered += u64::from(rmp::decode::read_array_len(&mut payload).unwrap());
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies: Vec<Duration> = callers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    latencies.sort();
    stop.store(true, Relaxed);
    if let Some(s) = snapshotter {
        s.join().unwrap();
    }
    Phase {
        latencies,
        delivered_per_second: delivered as f64 / elapsed,
        snapshots: taken.load(Relaxed),
    }
}

/// CPU seconds the replay socket's thread (`kv-events-replay`) has used: it sends every
/// requester its batches. (A snapshot's own thread exits when it ends, and takes its count
/// with it.)
fn replay_cpu() -> f64 {
    let ticks: u64 = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| {
            let path = task.ok()?.path();
            let comm = std::fs::read_to_string(path.join("comm")).ok()?;
            if !comm.starts_with("kv-events-replay") {
                return None;
            }
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            let after = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = after.split_whitespace().collect();
            Some(fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?)
        })
        .sum();
    ticks as f64 / 100.0
}

fn rss_mb() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / 1e6
}

/// `requesters` DEALERs ask for a snapshot at once and read it whole: the time to the last
/// `snapshot-end`, how many different ends they got (1: one enumeration served them all),
/// the replay thread's CPU seconds and the growth of the process's memory.
fn fleet(replay: &str, requesters: usize) -> (Duration, usize, f64, f64) {
    let (cpu, rss) = (replay_cpu(), rss_mb());
    let started = Instant::now();
    let readers: Vec<_> = (0..requesters)
        .map(|_| {
            let replay = replay.to_owned();
            thread::spawn(move || {
                let socket = zmq::Context::new().socket(zmq::DEALER).unwrap();
                socket.set_rcvtimeo(120_000).unwrap();
                socket.connect(&replay).unwrap();
                socket.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
                loop {
                    let frames = socket.recv_multipart(0).expect("the snapshot goes on");
                    match &frames[1][..] {
                        b"snapshot" => {}
                        b"snapshot-end" => return frames[2].clone(),
                        other => panic!("{}", String::from_utf8_lossy(other)),
                    }
                }
            })
        })
        .collect();
    let mut ends: Vec<Vec<u8>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let took = started.elapsed();
    ends.sort();
    ends.dedup();
    (took, ends.len(), replay_cpu() - cpu, rss_mb() - rss)
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

fn main() {
    let objects: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let (endpoint, replay) = (tcp_endpoint(), tcp_endpoint());
    let publisher = Publisher::create(&Config {
        replay_endpoint: replay.clone(),
        ..common::config(&endpoint)
    })
    .expect("binds");
    let master = Master::new(publisher, objects);

    let ((messages, bytes, held), took) = snapshot(&replay);
    assert_eq!(held, objects);
    println!(
        "snapshot of {objects} objects: {:.2} s, {:.0} objects/s, {messages} messages, \
         {:.1} MB ({:.0} bytes per object)",
        took.as_secs_f64(),
        objects as f64 / took.as_secs_f64(),
        bytes as f64 / 1e6,
        bytes as f64 / objects as f64
    );

    // A fleet asking at once, of a master holding a tenth as many objects.
    let (fleet_endpoint, fleet_replay) = (tcp_endpoint(), tcp_endpoint());
    let fleet_publisher = Publisher::create(&Config {
        replay_endpoint: fleet_replay.clone(),
        ..common::config(&fleet_endpoint)
    })
    .expect("binds");
    let fleet_master = Master::new(fleet_publisher, objects / 10);
    println!(
        "| requesters at once ({} objects) | to the last snapshot-end | enumerations | replay \
         thread CPU-s | RSS growth MB |",
        objects / 10
    );
    println!("|---|---|---|---|---|");
    for requesters in [1, 4, 16, 64] {
        let (took, ends, cpu, rss) = fleet(&fleet_replay, requesters);
        println!(
            "| {requesters} | {:.2} s | {ends} | {cpu:.2} | {rss:.1} |",
            took.as_secs_f64()
        );
    }
    drop(fleet_master);

    let subscriber = raw_subscriber(&endpoint, None);
    thread::sleep(Duration::from_millis(500));
    println!(
        "{CALLERS} callers at {CALLS_PER_SECOND} calls/s in all, {} s per phase:",
        PHASE.as_secs()
    );
    println!("| phase | p50 | p99 | p99.9 | live events/s delivered | snapshots |");
    println!("|---|---|---|---|---|---|");
    let mut p99 = [Vec::new(), Vec::new()];
    let mut rates = [Vec::new(), Vec::new()];
    for round in 0..2 {
        for (i, snapshots) in [false, true].into_iter().enumerate() {
            let p = phase(&master, &subscriber, &replay, snapshots);
            let name = if snapshots {
                "snapshots running"
            } else {
                "no snapshot"
            };
            println!(
                "| {name} (round {}) | {:?} | {:?} | {:?} | {:.0} | {} |",
                round + 1,
                quantile(&p.latencies, 0.5),
                quantile(&p.latencies, 0.99),
                quantile(&p.latencies, 0.999),
                p.delivered_per_second,
                p.snapshots
            );
            p99[i].push(quantile(&p.latencies, 0.99).as_secs_f64());
            rates[i].push(p.delivered_per_second);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "with snapshots / without: p99 {:.2}x, live events/s delivered {:.2}x",
        mean(&p99[1]) / mean(&p99[0]),
        mean(&rates[1]) / mean(&rates[0])
    );
}
