//! `kv-events-relay` on a cluster of three `nats-server -js` (loopback routes, a store each),
//! the stream, the snapshots and the bucket at three replicas, through the faults of a
//! cluster: the stream's leader killed (SIGKILL) and started again on its store, the
//! stream's leader hung (SIGSTOP) for 20 s, and the whole cluster down and up again on its
//! stores, each mid-workload of the real `kv-events demo`. Through the leader's loss and hang,
//! `examples/relay/reader.py` on another node follows the log and ends with the truth; each
//! time a reader that joins after (the stream folded from its first message, the snapshot and the log after it, the
//! bucket) holds the demo's `--dump-index` truth, and no master message or message id is
//! in the stream twice.

mod common;

use common::{assert_exact_at, truth, Cluster, Master, Reader, TempDir};
use std::path::Path;
use std::time::Duration;

/// The stream of the log, as the relay names it by default.
const STREAM: &str = "KV_EVENTS";

/// A relay of `master` into node 0 of `cluster`, everything at three replicas, with the
/// bucket.
fn relay(master: &Master, cluster: &Cluster, log: &Path) -> common::Process {
    master.relay_at(
        &cluster.url(0),
        log,
        &["--replicas", "3", "--bucket", "kv-events"],
    )
}

/// The demo (`rate` calls/s, `linger` s, its truth in `name`'s folder) relayed into a
/// fresh cluster, `fault` done to it 2.5 s in (given the cluster and the stream's leader)
/// while a reader on node `reader_on(leader)` follows the log; then the stream, snapshot,
/// bucket and that reader must all be the demo's truth.
fn through(
    name: &str,
    rate: u32,
    linger: f64,
    reader_on: fn(usize) -> usize,
    fault: impl FnOnce(&mut Cluster, usize),
) {
    let dir = TempDir::new(name);
    let mut cluster = Cluster::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(10_000, rate, linger, &expected);
    let log = dir.path("relay.log");
    let relay = relay(&master, &cluster, &log);
    let leader = cluster.leader(STREAM, 1);
    let node = reader_on(leader);
    let reader = Reader::start(&cluster.url(node), dir.path("reader.jsonl"));
    std::thread::sleep(Duration::from_millis(2500));
    fault(&mut cluster, leader);
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    let expected = truth(&expected);
    assert_exact_at(&cluster.url(node), &expected, &[&log]);
    let (held, said) = reader.stop_saying();
    assert!(
        held == expected,
        "the reader that followed through the fault is not the truth: {} objects it lacks, {} \
         it should not hold; it said:\n{said}",
        expected.difference(&held).count(),
        held.difference(&expected).count(),
    );
    drop(relay);
}

/// Another node than the leader's.
fn next(leader: usize) -> usize {
    (leader + 1) % 3
}

#[test]
fn the_streams_leader_killed_and_started_again_loses_nothing() {
    through(
        "relay-cluster-leader",
        2000,
        4.0,
        next,
        |cluster, leader| {
            cluster.kill(leader);
            std::thread::sleep(Duration::from_millis(2000));
            cluster.up(leader);
        },
    );
}

#[test]
fn the_streams_leader_hung_20_s_loses_nothing() {
    through("relay-cluster-hang", 1000, 2.0, next, |cluster, leader| {
        cluster.signal(leader, libc::SIGSTOP);
        std::thread::sleep(Duration::from_secs(20));
        cluster.signal(leader, libc::SIGCONT);
    });
}

#[test]
fn the_whole_cluster_down_and_up_on_its_stores_loses_nothing() {
    // The reader on node 1 goes down with the rest and reconnects, as nats-py does.
    through(
        "relay-cluster-restart",
        1500,
        4.0,
        |_| 1,
        |cluster, _| {
            for node in 0..3 {
                cluster.kill(node);
            }
            std::thread::sleep(Duration::from_millis(1000));
            for node in 0..3 {
                cluster.up(node);
            }
        },
    );
}
