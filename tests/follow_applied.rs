//! `FollowOptions::keep_applied` and `Follower::take_applied`: the messages the follower
//! applied, handed out byte for byte, so that a reader that passes them on (the relay)
//! reads the master once. Folding what was handed out, from the index a snapshot gave,
//! gives the follower's own index.

use kv_events_testing as common;
use kv_events_testing::model;

use common::endpoint;
use model::{config, Model};
use mooncake_kv_events::subscriber::{
    AppliedMessage, FollowOptions, Follower, Index, NoticeKind, Upstream,
};
use mooncake_kv_events::wire::Checked;
use mooncake_kv_events::Publisher;
use std::time::{Duration, Instant};

#[test]
fn applied_messages_are_handed_out_in_order_and_fold_into_the_index() {
    let model = Model::new();
    let (pub_endpoint, replay_endpoint) = (endpoint(), endpoint());
    let publisher = Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap();
    model.serve(&publisher);
    let options = FollowOptions {
        keep_applied: true,
        quiet_check: Duration::from_millis(300),
        ..FollowOptions::default()
    };
    let upstream = Upstream::new(pub_endpoint, replay_endpoint);
    let mut follower = Follower::new(vec![upstream], options).unwrap();
    // The first snapshot (empty: nothing was published yet) is the base of the fold.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !follower.status(0).in_sync {
        assert!(Instant::now() < deadline, "never in sync");
        follower.poll(Duration::from_millis(20));
    }
    // The subscription crosses to the PUB socket after the handshake.
    std::thread::sleep(Duration::from_millis(300));
    let mut fold: Index = follower.index(0).clone();
    let mut taken: Vec<AppliedMessage> = follower.take_applied();
    model.churn(&publisher, 7, 3000, 500);
    assert!(publisher.flush(Duration::from_secs(20)));
    let snapshots = follower.counters().snapshots;
    while Instant::now() < deadline {
        follower.poll(Duration::from_millis(20));
        taken.extend(follower.take_applied());
        if follower.status(0).in_sync && *follower.index(0) == model.truth() {
            break;
        }
    }
    assert_eq!(*follower.index(0), model.truth());
    assert_eq!(
        follower.counters().snapshots,
        snapshots,
        "no snapshot replaced the index meanwhile: the fold is comparable"
    );
    assert!(!taken.is_empty());
    let incarnation = follower.status(0).incarnation.unwrap();
    for pair in taken.windows(2) {
        assert_eq!(pair[1].sequence, pair[0].sequence + 1, "in order, no gap");
    }
    for message in &taken {
        assert_eq!((message.upstream, message.incarnation), (0, incarnation));
        let sequence = message.sequence.to_be_bytes();
        let checked = Checked::new(vec![&[][..], &sequence[..], &message.payload[..]])
            .expect("a message of the wire format");
        for change in checked.changes() {
            fold.apply_change(&change)
                .expect("an event the index takes");
        }
    }
    assert_eq!(
        taken.last().unwrap().sequence + 1,
        follower.status(0).next_sequence.unwrap()
    );
    assert_eq!(fold, *follower.index(0));
    assert!(follower.take_applied().is_empty());
}

#[test]
fn nothing_is_kept_unless_asked() {
    let model = Model::new();
    let (pub_endpoint, replay_endpoint) = (endpoint(), endpoint());
    let publisher = Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap();
    model.serve(&publisher);
    let upstream = Upstream::new(pub_endpoint, replay_endpoint);
    let mut follower = Follower::new(vec![upstream], FollowOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut snapshot = false;
    while !snapshot {
        assert!(Instant::now() < deadline, "no snapshot");
        let notices = follower.poll(Duration::from_millis(20));
        snapshot = notices
            .iter()
            .any(|n| matches!(n.kind, NoticeKind::Snapshot { .. }));
    }
    std::thread::sleep(Duration::from_millis(300));
    model.churn(&publisher, 3, 200, 50);
    assert!(publisher.flush(Duration::from_secs(20)));
    while follower.counters().messages == 0 {
        assert!(Instant::now() < deadline, "no message applied");
        follower.poll(Duration::from_millis(20));
    }
    assert!(follower.take_applied().is_empty());
}
