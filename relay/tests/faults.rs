//! `kv-events-relay` against a real `nats-server -js` and the real `kv-events demo`
//! publisher, through the faults of issue 33: the master restarted on the same endpoints, the
//! relay killed mid-stream and started again, nats-server restarted, two relays at once; and
//! a cluster of three NATS nodes that loses the one the relay is connected to; NATS killed
//! (SIGKILL) and restarted on its store; a writer stopped (SIGSTOP) for 20 s; a master
//! replaced on other endpoints (listed as a candidate, or given to a relay started again). Each
//! time the bucket and the stream's events folded from the first message equal the demo's
//! `--dump-index` truth, and no master message, message id or write on top of a stale log
//! is in the stream twice. Each test has its own server, ports and files.

mod common;

use common::{assert_exact, assert_exact_at, said, truth, Cluster, Master, Nats, TempDir};
use std::time::Duration;

#[test]
fn a_master_restarted_on_the_same_endpoints_is_a_difference_not_a_reset() {
    let dir = TempDir::new("relay-restart-master");
    let nats = Nats::start(&dir.0);
    let master = Master::new();
    let log = dir.path("relay.log");
    let relay = master.relay(&nats, &log);

    // Enough objects that the restart's difference reaches the bucket in several chunks of
    // 4,096 entries, over several turns.
    let first = dir.path("first.json");
    assert_eq!(
        master
            .demo(30_000, 30_000, 2.0, &first)
            .0
            .wait()
            .unwrap()
            .code(),
        Some(0)
    );
    assert_exact(&nats, &truth(&first), &[&log]);

    // Another life of the master: a new incarnation, other objects.
    let second = dir.path("second.json");
    assert_eq!(
        master
            .demo(1500, 4000, 3.0, &second)
            .0
            .wait()
            .unwrap()
            .code(),
        Some(0)
    );
    assert_exact(&nats, &truth(&second), &[&log]);
    // SIGTERM stops it; whether the master that went away counts as followed is the
    // follower's to say, so either status.
    assert!(matches!(relay.terminate(), Some(0 | 1)));
    assert!(common::said(&log).contains("diffs after resyncs"));
}

#[test]
fn a_relay_killed_mid_stream_and_a_nats_restart_lose_and_repeat_nothing() {
    let dir = TempDir::new("relay-kill");
    let mut nats = Nats::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(6000, 1500, 4.0, &expected);
    let log = dir.path("relay.log");
    let relay = master.relay(&nats, &log);
    std::thread::sleep(Duration::from_millis(2500));
    relay.kill();
    std::thread::sleep(Duration::from_millis(500));
    let again = dir.path("again.log");
    let relay = master.relay(&nats, &again);
    std::thread::sleep(Duration::from_millis(1500));
    nats.restart(Duration::from_millis(500));
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    assert_exact(&nats, &truth(&expected), &[&log, &again]);
    drop(relay);
}

#[test]
fn two_relays_at_once_write_one_log() {
    let dir = TempDir::new("relay-two");
    let nats = Nats::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(5000, 2000, 3.0, &expected);
    let (one, two) = (dir.path("one.log"), dir.path("two.log"));
    let first = master.relay(&nats, &one);
    let second = master.relay(&nats, &two);
    // The writer dies mid-stream: the other takes over.
    std::thread::sleep(Duration::from_millis(2000));
    first.kill();
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    assert_exact(&nats, &truth(&expected), &[&one, &two]);
    drop(second);
}

#[test]
fn on_a_cluster_of_three_the_loss_of_the_relays_node_loses_nothing() {
    let dir = TempDir::new("relay-cluster");
    let mut cluster = Cluster::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(8000, 2000, 4.0, &expected);
    let log = dir.path("relay.log");
    let relay = master.relay_at(&cluster.url(0), &log, &["--replicas", "3"]);
    std::thread::sleep(Duration::from_millis(3000));
    // The relay's node goes: its client moves to another, the stream and the snapshots have
    // their replicas there.
    cluster.kill(0);
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    assert_exact_at(&cluster.url(2), &truth(&expected), &[&log]);
    drop(relay);
}

#[test]
fn nats_killed_and_restarted_on_its_store_is_no_race_for_a_lone_relay() {
    let dir = TempDir::new("relay-nats-kill");
    let mut nats = Nats::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(6000, 2000, 4.0, &expected);
    let log = dir.path("relay.log");
    let relay = master.relay(&nats, &log);
    std::thread::sleep(Duration::from_millis(2000));
    nats.crash_restart(Duration::from_millis(500));
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    assert_exact(&nats, &truth(&expected), &[&log]);
    // Whatever acknowledgement the crash lost, the relay took no write for another's.
    let text = said(&log);
    let last = text
        .lines()
        .rev()
        .find(|l| l.contains("races lost"))
        .unwrap_or("");
    assert!(last.contains("races lost 0, takeovers 0"), "{text}");
    drop(relay);
}

#[test]
fn a_writer_stopped_20_s_is_taken_over_and_stands_by_when_it_wakes() {
    let dir = TempDir::new("relay-sigstop");
    let nats = Nats::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(12_000, 1000, 2.0, &expected);
    let (one, two) = (dir.path("one.log"), dir.path("two.log"));
    // With the bucket: the entries the stopped writer had in flight must not land on top
    // of the new writer's when it wakes.
    let first = master.relay(&nats, &one);
    std::thread::sleep(Duration::from_millis(1500));
    let second = master.relay(&nats, &two);
    std::thread::sleep(Duration::from_millis(1500));
    first.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(20));
    first.signal(libc::SIGCONT);
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    assert_exact(&nats, &truth(&expected), &[&one, &two]);
    assert!(said(&two).contains("takeovers 1"), "{}", said(&two));
    drop((first, second));
}

#[test]
fn a_master_replaced_on_other_endpoints_is_a_difference() {
    let dir = TempDir::new("relay-replaced");
    let nats = Nats::start(&dir.0);
    let (first, second, third) = (Master::new(), Master::new(), Master::new());
    // An HA deployment lists its candidate masters: the relay follows whichever serves.
    let log = dir.path("relay.log");
    let relay = first.relay_with(
        &nats,
        &log,
        &[
            "--bucket",
            "kv-events",
            "--replay-endpoint",
            &second.replay,
            &second.endpoint,
        ],
    );
    let run = |master: &Master, objects, name: &str| {
        let path = dir.path(name);
        let code = master
            .demo(objects, 4000, 2.0, &path)
            .0
            .wait()
            .unwrap()
            .code();
        assert_eq!(code, Some(0));
        truth(&path)
    };
    let one = run(&first, 3000, "first.json");
    assert_exact(&nats, &one, &[&log]);
    let two = run(&second, 1500, "second.json");
    assert_exact(&nats, &two, &[&log]);
    // A master on endpoints the relay was not given: the operator starts the relay again
    // with them; it writes the difference from the log's state to the new master's.
    assert!(matches!(relay.terminate(), Some(0 | 1)));
    let again = dir.path("again.log");
    let relay = third.relay(&nats, &again);
    let three = run(&third, 2000, "third.json");
    assert_exact(&nats, &three, &[&log, &again]);
    assert!(
        said(&again).contains("diffs after resyncs 1"),
        "{}",
        said(&again)
    );
    drop(relay);
}
