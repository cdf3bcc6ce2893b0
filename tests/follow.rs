//! The self-healing follower against real publishers: whatever is lost (a late join, a
//! subscriber too slow for the socket, events dropped before encoding, a restart, a move to
//! another master, a stray publisher), its index ends equal to the master's truth.

use kv_events_testing as common;
use kv_events_testing::model;

use common::endpoint;
use model::{config, converge, Model};
use mooncake_kv_events::subscriber::{
    Changes, FollowOptions, Follower, Index, NoticeKind, Upstream,
};
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use std::thread;
use std::time::Duration;

/// Options that retry quickly, for tests.
fn quick() -> FollowOptions {
    FollowOptions {
        request_timeout: Duration::from_secs(2),
        retry_after: Duration::from_millis(200),
        quiet_check: Duration::from_millis(300),
        ..FollowOptions::default()
    }
}

/// A publisher with a replay socket on fresh ipc endpoints, served by `model`.
fn publisher(model: &Model, tune: impl FnOnce(&mut Config)) -> (Publisher, Upstream) {
    let (pub_endpoint, replay_endpoint) = (endpoint(), endpoint());
    let mut config = config(&pub_endpoint, &replay_endpoint);
    tune(&mut config);
    let publisher = Publisher::create(&config).expect("the publisher binds");
    model.serve(&publisher);
    (publisher, Upstream::new(pub_endpoint, replay_endpoint))
}

fn flush(publisher: &Publisher) {
    assert!(publisher.flush(Duration::from_secs(20)), "flush");
}

const WITHIN: Duration = Duration::from_secs(30);

#[test]
fn a_late_join_while_the_master_changes_converges_to_the_truth() {
    let model = Model::new();
    let (publisher, upstream) = publisher(&model, |_| {});
    model.churn(&publisher, 1, 3000, 1000);
    model.remove_all(&publisher, b"tenant-2");
    flush(&publisher);
    let publisher = std::sync::Arc::new(publisher);
    // The master keeps changing while the follower joins and takes its snapshot.
    let churning = {
        let (model, publisher) = (model.clone(), std::sync::Arc::clone(&publisher));
        thread::spawn(move || {
            for round in 0..20 {
                model.churn(&publisher, 100 + round, 100, 1000);
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let mut follower = Follower::new(vec![upstream], quick()).unwrap();
    let mut early = Vec::new();
    while !churning.is_finished() {
        early.extend(follower.poll(Duration::from_millis(5)));
    }
    churning.join().unwrap();
    flush(&publisher);
    let (notices, took) = converge(&mut follower, 0, &model, WITHIN);
    let notices = [early, notices].concat();
    let counters = follower.counters();
    assert!(counters.snapshots >= 1, "{counters:?}");
    assert!(
        notices
            .iter()
            .any(|n| matches!(n.kind, NoticeKind::Snapshot { objects, .. } if objects > 0)),
        "{notices:?}"
    );
    assert_eq!(counters.malformed, 0, "{counters:?}");
    let first = counters.last_convergence.expect("converged once at least");
    eprintln!(
        "late join: {} objects, in sync {first:?} after the start, equal to the truth after \
         {took:?}; {counters:?}",
        model.truth().objects()
    );
}

#[test]
fn a_loss_after_the_socket_is_filled_by_replay() {
    loss_after_the_socket_is_filled_by_replay(true);
}

#[test]
fn a_loss_is_filled_by_replies_without_the_topic_frame_too() {
    loss_after_the_socket_is_filled_by_replay(false);
}

/// A stream with a topic, followed by a subscriber of a prefix of it, loses messages at
/// the socket; replies come in the form `topic_frame` says.
fn loss_after_the_socket_is_filled_by_replay(topic_frame: bool) {
    let model = Model::new();
    let (publisher, mut upstream) = publisher(&model, |c| {
        c.send_hwm = 4;
        c.queue_capacity = 1 << 18;
        c.topic = "kv@pod-1@model-a".into();
        c.replay_topic_frame = topic_frame;
    });
    upstream.topic = b"kv@pod-1".to_vec();
    model.churn(&publisher, 2, 500, 500);
    flush(&publisher);
    let mut follower = Follower::new(
        vec![upstream],
        FollowOptions {
            rcvhwm: 1,
            ..quick()
        },
    )
    .unwrap();
    converge(&mut follower, 0, &model, WITHIN);
    let before = follower.counters();
    // Far more messages than the subscriber's buffers and the send limit hold, while the
    // follower only polls now and then: the socket drops some for it.
    for round in 0..20 {
        model.churn(&publisher, 1000 + round, 2000, 20_000);
        follower.poll(Duration::from_millis(1));
    }
    flush(&publisher);
    let (notices, took) = converge(&mut follower, 0, &model, WITHIN);
    let counters = follower.counters();
    assert!(
        counters.gaps > before.gaps,
        "the socket dropped some: {counters:?}"
    );
    assert!(counters.replays > 0, "{counters:?}");
    assert_eq!(
        counters.snapshots, before.snapshots,
        "the replay buffer held every gap: {notices:?}"
    );
    assert!(
        notices
            .iter()
            .any(|n| n.kind.to_string().contains("filled by replay")),
        "{notices:?}"
    );
    eprintln!("loss at the socket: converged {took:?} after the flush; {counters:?}");
}

#[test]
fn a_loss_before_encoding_is_repaired_by_a_snapshot() {
    let model = Model::new();
    let (publisher, upstream) = publisher(&model, |c| c.queue_capacity = 8);
    let mut follower = Follower::new(vec![upstream], quick()).unwrap();
    converge(&mut follower, 0, &model, WITHIN);
    let before = follower.counters();
    // Calls far faster than the publishing thread drains a queue of 8: events are dropped
    // before they are encoded, and no replay has them.
    model.churn(&publisher, 3, 20_000, 2000);
    flush(&publisher);
    assert!(publisher.stats().dropped_events > 0, "the queue overflowed");
    let (notices, took) = converge(&mut follower, 0, &model, WITHIN);
    let counters = follower.counters();
    assert!(counters.gaps > before.gaps, "{counters:?}");
    assert!(counters.snapshots > before.snapshots, "{notices:?}");
    eprintln!(
        "loss before encoding ({} events dropped): converged {took:?} after the flush; \
         {counters:?}",
        publisher.stats().dropped_events
    );
}

#[test]
fn a_restarted_publisher_is_followed_into_its_new_incarnation() {
    let model = Model::new();
    let (publisher, upstream) = publisher(&model, |_| {});
    model.churn(&publisher, 4, 2000, 500);
    flush(&publisher);
    let mut follower = Follower::new(vec![upstream.clone()], quick()).unwrap();
    converge(&mut follower, 0, &model, WITHIN);
    let old = follower.status(0).incarnation.unwrap();
    // The master restarts its publisher on the same endpoints; its metadata stays. Nothing
    // is published yet: only info can tell the follower.
    drop(publisher);
    model.set(
        &Publisher::create(&Config::default()).unwrap(),
        b"tenant-0",
        b"changed-while-down",
        MediumSet::from([Medium::Disk]),
    );
    let publisher = Publisher::create(&config(
        &upstream.endpoint,
        upstream.replay_endpoint.as_deref().unwrap(),
    ))
    .expect("the publisher binds again");
    model.serve(&publisher);
    let (notices, took) = converge(&mut follower, 0, &model, WITHIN);
    let new = follower.status(0).incarnation.unwrap();
    assert_ne!(old, new);
    assert!(
        notices
            .iter()
            .any(|n| matches!(n.kind, NoticeKind::NewIncarnation { .. })),
        "{notices:?}"
    );
    eprintln!("restart, silent: converged in {took:?}");
    // Now it publishes: the sequences start again from 0 and follow on.
    model.churn(&publisher, 5, 2000, 500);
    flush(&publisher);
    converge(&mut follower, 0, &model, WITHIN);
    let counters = follower.counters();
    assert_eq!(counters.incarnations, 1, "{counters:?}");
    assert_eq!(counters.snapshots, 2, "{counters:?}");
    // And a restart noticed by the sequence going back.
    drop(publisher);
    let publisher = Publisher::create(&config(
        &upstream.endpoint,
        upstream.replay_endpoint.as_deref().unwrap(),
    ))
    .expect("the publisher binds again");
    model.serve(&publisher);
    thread::sleep(Duration::from_millis(300));
    model.churn(&publisher, 6, 500, 500);
    flush(&publisher);
    let (_, took) = converge(&mut follower, 0, &model, WITHIN);
    let counters = follower.counters();
    assert_eq!(counters.incarnations, 2, "{counters:?}");
    eprintln!("restarts: converged in {took:?}; {counters:?}");
}

#[test]
fn a_move_to_another_publisher_converges_on_it() {
    let model = Model::new();
    let (a, source_a) = publisher(&model, |_| {});
    // B's endpoints: nothing is bound there yet.
    let source_b = Upstream::new(endpoint(), endpoint());
    model.churn(&a, 7, 2000, 500);
    flush(&a);
    let mut follower = Follower::new(vec![source_a, source_b.clone()], quick()).unwrap();
    converge(&mut follower, 0, &model, WITHIN);
    assert_eq!(follower.freshest(), Some(0));
    assert!(!follower.status(1).in_sync);
    // The leader changes: A's publisher goes, B's comes up over the same metadata, and the
    // master carries on through B.
    drop(a);
    let b = Publisher::create(&config(
        &source_b.endpoint,
        source_b.replay_endpoint.as_deref().unwrap(),
    ))
    .expect("B binds");
    model.serve(&b);
    model.churn(&b, 8, 2000, 500);
    flush(&b);
    let (notices, took) = converge(&mut follower, 1, &model, WITHIN);
    // A is silent from now on; B is heard.
    let deadline = std::time::Instant::now() + WITHIN;
    while follower.freshest() != Some(1) && std::time::Instant::now() < deadline {
        follower.poll(Duration::from_millis(50));
    }
    assert_eq!(follower.freshest(), Some(1), "{:?}", follower.status(0));
    assert_eq!(*follower.index(1), model.truth());
    assert!(
        notices
            .iter()
            .any(|n| n.upstream == 1 && matches!(n.kind, NoticeKind::Snapshot { .. })),
        "{notices:?}"
    );
    eprintln!(
        "move: B converged {took:?} after its first changes; {:?}",
        follower.counters()
    );
}

#[test]
fn malformed_messages_from_a_stray_publisher_are_counted_and_skipped() {
    let model = Model::new();
    let (publisher, upstream) = publisher(&model, |_| {});
    model.churn(&publisher, 9, 1000, 300);
    flush(&publisher);
    // A stray publisher: a raw PUB whose messages are wrong, and a ROUTER beside it whose
    // replies are mostly wrong.
    let context = zmq::Context::new();
    let stray = context.socket(zmq::PUB).unwrap();
    let stray_endpoint = endpoint();
    stray.bind(&stray_endpoint).unwrap();
    let router = context.socket(zmq::ROUTER).unwrap();
    let router_endpoint = endpoint();
    router.bind(&router_endpoint).unwrap();
    let mut follower = Follower::new(
        vec![upstream, Upstream::new(stray_endpoint, router_endpoint)],
        quick(),
    )
    .unwrap();
    thread::sleep(Duration::from_millis(300));
    // A snapshot gets replies of the wrong shape, then an empty snapshot that the stream
    // applies on from sequence 10; any other
    // request gets an info that is not msgpack.
    let wrong_replies = [
        vec![b"x".to_vec(), b"y".to_vec()],
        vec![vec![], b"what".to_vec(), vec![], vec![]],
        vec![vec![], b"info".to_vec(), b"\x93".to_vec()],
    ];
    let mut end = Vec::new();
    rmpv::encode::write_value(
        &mut end,
        &rmpv::Value::Map(vec![
            ("next_sequence".into(), 10u64.into()),
            ("objects".into(), 0u64.into()),
            ("events".into(), 0u64.into()),
            ("incarnation".into(), 7u64.into()),
            ("tenant".into(), rmpv::Value::Nil),
        ]),
    )
    .unwrap();
    let mut wrong_sent = 0;
    let mut serve = |router: &zmq::Socket| {
        while let Ok(frames) = router.recv_multipart(zmq::DONTWAIT) {
            let peer = frames[0].clone();
            let with_peer = |reply: &Vec<Vec<u8>>| {
                let mut frames = vec![peer.clone()];
                frames.extend(reply.iter().cloned());
                frames
            };
            if frames.get(2).map(Vec::as_slice) == Some(b"snapshot") {
                for reply in &wrong_replies {
                    router.send_multipart(with_peer(reply), 0).unwrap();
                    wrong_sent += 1;
                }
                let reply = vec![vec![], b"snapshot-end".to_vec(), end.clone()];
                router.send_multipart(with_peer(&reply), 0).unwrap();
            } else {
                router
                    .send_multipart(with_peer(&wrong_replies[2]), 0)
                    .unwrap();
                wrong_sent += 1;
            }
        }
    };
    let batch = |events: Vec<rmpv::Value>| {
        let mut out = Vec::new();
        rmpv::encode::write_value(
            &mut out,
            &rmpv::Value::Array(vec![1u64.into(), events.into(), 0u64.into()]),
        )
        .unwrap();
        out
    };
    let unknown = rmpv::Value::Map(vec![("event_type".into(), "evicted".into())]);
    let keyless = rmpv::Value::Map(vec![
        ("event_type".into(), "stored".into()),
        ("tenant_id".into(), "t".into()),
        ("medium".into(), "cpu".into()),
    ]);
    let seq = |n: u64| n.to_be_bytes().to_vec();
    let wrong: Vec<Vec<Vec<u8>>> = vec![
        vec![b"x".to_vec()],
        vec![vec![], seq(1), b"a".to_vec(), b"b".to_vec()],
        vec![vec![b't'; 256], seq(1), batch(vec![keyless.clone()])],
        vec![vec![], vec![1, 2, 3], batch(vec![keyless.clone()])],
        vec![vec![], seq(2), b"{\"not\": \"msgpack\"}".to_vec()],
        vec![vec![], seq(3), vec![0xdd, 0xff, 0xff, 0xff, 0xff]],
    ];
    let mut refused = 0;
    for round in 0..20u64 {
        for message in &wrong {
            stray.send_multipart(message, 0).unwrap();
            refused += 1;
        }
        // Well-formed messages with events no index can take.
        let events = batch(vec![unknown.clone(), keyless.clone()]);
        stray
            .send_multipart([vec![], seq(10 + round), events], 0)
            .unwrap();
        serve(&router);
        follower.poll(Duration::from_millis(50));
    }
    model.churn(&publisher, 10, 1000, 300);
    flush(&publisher);
    let deadline = std::time::Instant::now() + WITHIN;
    while follower.upstream_counters(1).skipped_events < 40 && std::time::Instant::now() < deadline
    {
        serve(&router);
        follower.poll(Duration::from_millis(50));
    }
    converge(&mut follower, 0, &model, WITHIN);
    let stray = follower.upstream_counters(1).clone();
    assert_eq!(stray.skipped_events, 40, "{stray:?}");
    assert!(stray.malformed >= refused + 3, "{stray:?}");
    assert_eq!(stray.snapshots, 1, "{stray:?}");
    assert!(follower.index(1).is_empty());
    let good = follower.upstream_counters(0);
    assert_eq!((good.malformed, good.skipped_events), (0, 0), "{good:?}");
    assert!(wrong_sent > 0);
}

/// `info` requests a follower in sync makes while the stream is idle for 4 s.
fn info_polls_while_idle(heartbeat_ms: u32) -> u64 {
    let model = Model::new();
    let (publisher, upstream) = publisher(&model, |c| c.heartbeat_ms = heartbeat_ms);
    model.churn(&publisher, 3, 100, 100);
    flush(&publisher);
    let options = FollowOptions {
        quiet_check: Duration::from_secs(2),
        ..quick()
    };
    let mut follower = Follower::new(vec![upstream], options).unwrap();
    converge(&mut follower, 0, &model, WITHIN);
    let before = publisher.stats().replay_requests;
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        follower.poll(Duration::from_millis(20));
    }
    assert!(follower.status(0).in_sync);
    assert_eq!(*follower.index(0), model.truth());
    publisher.stats().replay_requests - before
}

#[test]
fn heartbeats_spare_the_follower_its_info_polls() {
    // Without heartbeats a quiet stream is asked about every quiet_check (2 s); with them
    // (every 50 ms) it is never quiet, and a lost tail shows at the next heartbeat instead.
    assert!(info_polls_while_idle(0) >= 1);
    assert_eq!(info_polls_while_idle(50), 0);
}

/// A burst while the follower reads its first snapshot, with a replay ring far too small
/// for it: the live messages are held while the snapshot arrives and applied after it, so
/// one snapshot is enough. Held within `max_held_bytes`: when the burst is larger, the
/// follower drops what it cannot hold, counts it, and takes a second snapshot.
fn burst_during_the_join(
    max_held_bytes: usize,
) -> mooncake_kv_events::subscriber::FollowerCounters {
    let model = Model::new();
    let (publisher, upstream) = publisher(&model, |c| c.replay_buffer_bytes = 64 << 10);
    model.churn(&publisher, 1, 20_000, 20_000);
    flush(&publisher);
    let options = FollowOptions {
        max_held_bytes,
        ..quick()
    };
    let mut follower = Follower::new(vec![upstream], options).unwrap();
    let connected = std::time::Instant::now();
    while publisher.stats().subscribers == 0 {
        assert!(connected.elapsed() < WITHIN, "the follower never connected");
        thread::sleep(Duration::from_millis(5));
    }
    // The subscription travels after the connection.
    thread::sleep(Duration::from_millis(200));
    // The snapshot is asked for; the burst follows while it is on its way.
    follower.poll(Duration::ZERO);
    model.churn(&publisher, 2, 60_000, 20_000);
    flush(&publisher);
    converge(&mut follower, 0, &model, WITHIN);
    follower.counters()
}

#[test]
fn a_burst_during_the_join_is_held_and_one_snapshot_is_enough() {
    let counters = burst_during_the_join(FollowOptions::default().max_held_bytes);
    assert_eq!(counters.snapshots, 1, "{counters:?}");
    assert_eq!(counters.overflowed, 0, "{counters:?}");
    // What came from the snapshot's next sequence on was held, then applied.
    assert!(counters.events > 0, "{counters:?}");
}

#[test]
fn a_burst_beyond_the_held_bytes_is_counted_and_recovered_by_another_snapshot() {
    let counters = burst_during_the_join(32 << 10);
    assert!(counters.overflowed > 0, "{counters:?}");
    assert!(counters.snapshots >= 2, "{counters:?}");
}

/// Brings `copy` to `truth` where `changes` says they may differ, as a reader that keeps
/// its own copy of the index does.
fn bring(copy: &mut Index, truth: &Index, changes: &Changes) {
    for tenant in &changes.cleared {
        copy.replace(Some(tenant), truth.clone());
    }
    for (tenant, keys) in &changes.objects {
        for key in keys {
            let (have, want) = (copy.get(tenant, key), truth.get(tenant, key));
            for medium in have.minus(want).iter() {
                copy.remove(tenant, key, medium);
            }
            for medium in want.minus(have).iter() {
                copy.store(tenant, key, medium);
            }
        }
    }
}

#[test]
fn the_changes_taken_name_every_object_that_moved_and_a_copy_kept_by_them_stays_exact() {
    let model = Model::new();
    let (master, upstream) = publisher(&model, |_| {});
    model.churn(&master, 1, 3000, 1000);
    flush(&master);
    let options = FollowOptions {
        track_changes: true,
        ..quick()
    };
    let mut follower = Follower::new(vec![upstream], options).unwrap();
    converge(&mut follower, 0, &model, WITHIN);
    assert!(follower.take_changes(0).all, "a snapshot made the index");
    let mut copy = follower.index(0).clone();
    for round in 0..5 {
        model.churn(&master, 10 + round, 100, 1000);
        if round == 2 {
            model.remove_all(&master, b"tenant-2");
        }
        flush(&master);
        converge(&mut follower, 0, &model, WITHIN);
        let changes = follower.take_changes(0);
        assert!(!changes.all, "{:?}", follower.counters());
        assert!(changes.objects_len() <= 100, "{}", changes.objects_len());
        assert_eq!(!changes.cleared.is_empty(), round == 2, "{changes:?}");
        assert_ne!(&copy, follower.index(0), "round {round} changed something");
        bring(&mut copy, follower.index(0), &changes);
        assert_eq!(copy, model.truth(), "round {round}");
        assert!(follower.take_changes(0).is_empty());
    }
    // Without tracking, everything may always have changed.
    let (other, upstream) = publisher(&model, |_| {});
    flush(&other);
    let mut untracked = Follower::new(vec![upstream], quick()).unwrap();
    untracked.poll(Duration::from_millis(10));
    assert!(untracked.take_changes(0).all);
}
