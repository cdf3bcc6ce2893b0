//! Process-wide resources under floods, shutdown and failed creation: memory, threads and open
//! files. These tests measure the whole process, so they live in their own test binary and
//! take turns.

use kv_events_testing as common;

use common::{config, publish};
use mooncake_kv_events::subscriber::Subscriber;
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BOTH: MediumSet = MediumSet::EMPTY.with(Medium::Cpu).with(Medium::Disk);

/// Held by each test: the others would disturb what it measures.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Threads of publishers and ZeroMQ contexts (the test harness starts threads of its own).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.unwrap().path().join("comm")).ok())
        .filter(|name| name.starts_with("kv-events") || name.starts_with("ZMQbg"))
        .count()
}

/// `threads()` once it equals `expected`, or after 5 s: `pthread_join` returns before the
/// kernel takes a joined thread out of /proc, so a count right after a join may be one high.
fn threads_settled_to(expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = threads();
        if n == expected || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `threads()` once two reads 20 ms apart agree: threads joined just before have left.
fn threads_steady() -> usize {
    let mut last = threads();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let n = threads();
        if n == last {
            return n;
        }
        last = n;
    }
}

fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_flood_keeps_memory_bounded_by_the_capacity() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // What the process may hold is the queue, the messages the PUB socket keeps for the
    // subscriber (send_hwm) and those the SUB socket has received (its rcvhwm): 200 messages
    // of at most 64 events here, a few MB. What does not fit is dropped at the sockets (and
    // seen as gaps). With the default send_hwm of 10,000 messages the bound would be hundreds
    // of MB, reached or not depending on how fast this thread drains the subscriber, which
    // the producers' flood on a loaded machine decides.
    let (publisher, endpoint) = publish(Config {
        queue_capacity: 64,
        send_hwm: 100,
        ..config("")
    });
    let mut sub = Subscriber::connect(&endpoint, 100).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(3);
    let rss_before = rss_bytes();
    let mut max_depth = 0;
    std::thread::scope(|s| {
        for thread in 0..4 {
            let publisher = &publisher;
            s.spawn(move || {
                let mut call = 0u64;
                while Instant::now() < deadline {
                    publisher.on_put_commit("t", format!("{thread}/{call}"), "", BOTH);
                    call += 1;
                }
            });
        }
        while Instant::now() < deadline {
            max_depth = max_depth.max(publisher.stats().queue_depth);
            // Keep the subscriber's own buffer from growing without bound in this process.
            while sub.recv(Duration::ZERO).unwrap().is_some() {}
        }
    });
    assert!(max_depth <= 64, "queue depth {max_depth}");
    let growth = rss_bytes().saturating_sub(rss_before);
    assert!(
        growth < 64 << 20,
        "RSS grew by {growth} bytes during the flood"
    );
    assert!(publisher.stats().dropped_events > 0);
}

#[test]
fn shutdown_under_flood_and_stall_returns_within_its_linger_and_accounts_for_everything() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let threads_before = threads_steady();
    let (publisher, endpoint) = publish(Config {
        queue_capacity: 1024,
        ..config("")
    });
    let context = zmq::Context::new();
    let stalled = context.socket(zmq::SUB).unwrap();
    stalled.set_rcvhwm(1).unwrap();
    stalled.set_subscribe(b"").unwrap();
    stalled.connect(&endpoint).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        threads() > threads_before,
        "the publisher and ZeroMQ run threads"
    );

    let offered = std::sync::atomic::AtomicU64::new(0);
    let elapsed = std::thread::scope(|s| {
        for thread in 0..4 {
            let (publisher, offered) = (&publisher, &offered);
            s.spawn(move || {
                for call in 0..50_000 {
                    publisher.on_put_commit("t", format!("{thread}/{call}"), "", BOTH);
                    offered.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        publisher.shutdown(); // the producers are still calling
        start.elapsed()
    });
    assert!(
        elapsed < Duration::from_secs(5),
        "shutdown took {elapsed:?}"
    );
    let stats = publisher.stats();
    let offered = offered.into_inner();
    assert_eq!(stats.published_events + stats.dropped_events, offered);
    assert_eq!(stats.queue_depth, 0);
    drop(publisher);
    drop(stalled);
    drop(context);
    assert_eq!(
        threads_settled_to(threads_before),
        threads_before,
        "no thread is left behind"
    );
}

#[test]
fn failed_creation_leaks_neither_threads_nor_files() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = format!("tcp://127.0.0.1:{}", taken.local_addr().unwrap().port());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bad = [
        "tcp://nonsense",
        "ipc:///no/such/dir/kv.sock",
        busy.as_str(),
    ];
    // The first failures may open what the resolver keeps open for the process.
    for endpoint in bad {
        assert!(Publisher::create(&config(endpoint)).is_err());
    }
    let (threads_before, files_before) = (threads_steady(), open_files());
    for i in 0..1000 {
        assert!(Publisher::create(&config(bad[i % bad.len()])).is_err());
    }
    assert_eq!(threads_settled_to(threads_before), threads_before);
    assert_eq!(open_files(), files_before);
}

#[test]
fn replays_that_nobody_reads_hold_a_bounded_share_and_give_it_back() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A full 32 MiB ring of messages of 64 events (long keys: about 24 KB each), then eight
    // requesters that ask for all of it and never read. Copied replies would put up to 1,000
    // messages per requester in the sockets' queues, 24 MB each; lent ones hold at most the
    // replies' total (16 MiB) beyond the ring, and nothing once the requesters are given up.
    let replay_endpoint = common::tcp_endpoint();
    let (publisher, _endpoint) = publish(Config {
        replay_endpoint: replay_endpoint.clone(),
        replay_buffer_bytes: 32 << 20,
        ..config("")
    });
    let padding = "k".repeat(200);
    let mut call = 0u64;
    while publisher.stats().replay_buffer_bytes < 31 << 20 {
        for _ in 0..1024 {
            publisher.on_put_commit("t", format!("{padding}/{call}"), "", BOTH);
            call += 1;
        }
        publisher.flush(Duration::from_secs(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let rss_before = rss_bytes();
    let context = zmq::Context::new();
    let requesters: Vec<zmq::Socket> = (0..8)
        .map(|_| {
            let dealer = context.socket(zmq::DEALER).unwrap();
            dealer.set_rcvhwm(1).unwrap();
            dealer.set_rcvbuf(4096).unwrap();
            dealer.set_linger(0).unwrap();
            dealer.connect(&replay_endpoint).unwrap();
            dealer
                .send_multipart([&b""[..], &1u64.to_be_bytes()], 0)
                .unwrap();
            dealer
        })
        .collect();
    // While the replays stall, and until they are given up (5 s without progress).
    let mut most_in_flight = 0;
    let mut most_growth = 0;
    let given_up = common::eventually(|| {
        let stats = publisher.stats();
        most_in_flight = most_in_flight.max(stats.replay_bytes_in_flight);
        most_growth = most_growth.max(rss_bytes().saturating_sub(rss_before));
        stats.replays_abandoned == 8
    });
    assert!(given_up, "{:?}", publisher.stats());
    assert!(most_in_flight > 0, "the replays sent nothing");
    assert!(
        most_in_flight <= (16 << 20) + (64 << 10),
        "replies held {most_in_flight} bytes"
    );
    assert!(
        most_growth < 40 << 20,
        "RSS grew by {most_growth} bytes with eight stalled replays"
    );
    // Given up, their connections are cut: libzmq lets go of every reply it held for them.
    assert!(common::eventually(|| publisher
        .stats()
        .replay_bytes_in_flight
        == 0));
    drop(requesters);
}
