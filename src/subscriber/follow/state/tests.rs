//! The state machine driven step by step, as the sockets would, with the time given.

use super::*;
use crate::wire::replay::{verb, END_OF_REPLAY};
use crate::wire::{Info, SnapshotEnd};
use crate::MediumSet;
use rmpv::Value;
use std::time::Duration;

type State = FollowerState<Vec<u8>>;

const SECOND: Duration = Duration::from_secs(1);
const REPLAY: &str = "tcp://master:5558";
const INCARNATION: u64 = 7;

fn options() -> FollowOptions {
    FollowOptions {
        request_timeout: 5 * SECOND,
        retry_after: SECOND,
        quiet_check: SECOND,
        ..FollowOptions::default()
    }
}

/// A batch storing each key of tenant `t` on disk.
fn batch(keys: &[&str]) -> Vec<u8> {
    let events = keys
        .iter()
        .map(|key| {
            Value::Map(vec![
                (Value::from("event_type"), Value::from("stored")),
                (Value::from("tenant_id"), Value::from("t")),
                (Value::from("object_key"), Value::from(*key)),
                (Value::from("medium"), Value::from("disk")),
            ])
        })
        .collect();
    let body = Value::Array(vec![
        Value::from(1u64),
        Value::Array(events),
        Value::from(0u64),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &body).unwrap();
    out
}

/// Live message `sequence`, storing `key`.
fn message(sequence: u64, key: &str) -> Checked<Vec<u8>> {
    Checked::new(vec![vec![], sequence.to_be_bytes().to_vec(), batch(&[key])]).unwrap()
}

/// A reply as a DEALER reads it: the empty delimiter, then `parts`.
fn reply(parts: &[&[u8]]) -> Vec<Vec<u8>> {
    std::iter::once(Vec::new())
        .chain(parts.iter().map(|p| p.to_vec()))
        .collect()
}

fn info(incarnation: u64, next_sequence: u64, oldest_sequence: u64) -> Vec<Vec<u8>> {
    let info = Info {
        incarnation,
        next_sequence,
        oldest_sequence,
        snapshots: true,
        ..Info::default()
    };
    reply(&[verb::INFO, &info.encode()])
}

fn page(keys: &[&str]) -> Vec<Vec<u8>> {
    reply(&[verb::SNAPSHOT, &batch(keys)])
}

fn snapshot_end(next_sequence: u64, objects: u64, incarnation: u64) -> Vec<Vec<u8>> {
    let end = SnapshotEnd {
        next_sequence,
        objects,
        events: objects,
        incarnation,
        tenant: None,
    };
    reply(&[verb::SNAPSHOT_END, &end.encode()])
}

/// A replayed message in the form without the topic frame.
fn replayed(sequence: u64, key: &str) -> Vec<Vec<u8>> {
    reply(&[&sequence.to_be_bytes(), &batch(&[key])])
}

fn replay_end() -> Vec<Vec<u8>> {
    reply(&[&END_OF_REPLAY, b""])
}

fn sent(actions: &[Action]) -> Vec<&Request> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(request) => Some(request),
            _ => None,
        })
        .collect()
}

fn noticed(actions: &[Action]) -> Vec<&NoticeKind> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Notice(kind) => Some(kind),
            _ => None,
        })
        .collect()
}

fn has(state: &State, key: &str) -> bool {
    state.index.get(b"t", key.as_bytes()) != MediumSet::default()
}

/// A follower that took a snapshot of `keys` ending at `next_sequence` and is in sync.
fn joined(t0: Instant, keys: &[&str], next_sequence: u64) -> State {
    let mut state = State::new(&options(), Some(REPLAY.into()), t0);
    assert_eq!(
        state.tick(t0),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    assert!(state.on_reply(&page(keys), t0).is_empty());
    let end = snapshot_end(next_sequence, keys.len() as u64, INCARNATION);
    state.on_reply(&end, t0);
    assert!(matches!(
        noticed(&state.tick(t0))[..],
        [NoticeKind::InSync { .. }]
    ));
    assert!(state.in_sync());
    state
}

#[test]
fn a_join_holds_the_stream_during_the_snapshot_then_applies_it_from_n() {
    let t0 = Instant::now();
    let mut state = State::new(&options(), Some(REPLAY.into()), t0);
    assert!(!state.in_sync());
    assert_eq!(
        state.tick(t0),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    // The stream while the snapshot is read: 4 is in it, 5 and 6 are not.
    for sequence in [4, 5, 6] {
        assert!(state
            .on_stream(message(sequence, &format!("m{sequence}")), t0)
            .is_empty());
    }
    assert!(!has(&state, "m5"), "nothing is applied before the snapshot");
    state.on_reply(&page(&["a", "m4"]), t0);
    let actions = state.on_reply(&snapshot_end(5, 2, INCARNATION), t0 + SECOND / 10);
    assert!(matches!(
        noticed(&actions)[..],
        [NoticeKind::Snapshot {
            objects: 2,
            next_sequence: 5,
            incarnation: INCARNATION,
            ..
        }]
    ));
    assert!(
        sent(&actions).is_empty(),
        "5 follows the snapshot: nothing to replay"
    );
    assert!(has(&state, "a") && has(&state, "m5") && has(&state, "m6"));
    assert_eq!(state.counters.discarded, 1, "4 was in the snapshot");
    assert!(matches!(
        noticed(&state.tick(t0 + SECOND / 10))[..],
        [NoticeKind::InSync { .. }]
    ));
    // Live: applied as it comes.
    assert!(state.on_stream(message(7, "m7"), t0).is_empty());
    assert!(has(&state, "m7"));
    let status = state.status("tcp://master:5557");
    assert_eq!(status.next_sequence, Some(8));
    assert_eq!(status.incarnation, Some(INCARNATION));
    assert!(status.in_sync);
}

#[test]
fn a_hole_in_what_the_stream_held_during_the_snapshot_is_a_gap() {
    let t0 = Instant::now();
    let mut state = State::new(&options(), Some(REPLAY.into()), t0);
    state.tick(t0);
    // While the snapshot is read the stream brings 5, 6, then 9: 7 and 8 were lost.
    for sequence in [5, 6, 9] {
        state.on_stream(message(sequence, &format!("m{sequence}")), t0);
    }
    state.on_reply(&page(&["a"]), t0);
    let actions = state.on_reply(&snapshot_end(5, 1, INCARNATION), t0);
    assert_eq!(sent(&actions), [&Request::Replay { from: 7 }]);
    assert!(has(&state, "m6") && !has(&state, "m9"));
    assert_eq!(state.counters.gaps, 1, "a loss, counted once");
    assert!(sent(&state.tick(t0)).is_empty(), "the replay is under way");
    assert_eq!(state.counters.gaps, 1);

    // Whereas a stream that starts after N (the messages between were sent before this
    // reader subscribed) lost nothing: replayed, not counted.
    let mut state = State::new(&options(), Some(REPLAY.into()), t0);
    state.tick(t0);
    state.on_stream(message(8, "m8"), t0);
    state.on_reply(&page(&["a"]), t0);
    let actions = state.on_reply(&snapshot_end(5, 1, INCARNATION), t0);
    assert_eq!(sent(&actions), [&Request::Replay { from: 5 }]);
    assert_eq!(state.counters.gaps, 0);
}

#[test]
fn a_gap_the_buffer_holds_is_filled_by_a_replay() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    state.on_stream(message(5, "m5"), t0);
    // 6 and 7 are lost; 8 is held.
    assert!(state.on_stream(message(8, "m8"), t0).is_empty());
    assert!(!state.in_sync() && !has(&state, "m8"));
    assert_eq!(sent(&state.tick(t0)), [&Request::Info]);
    assert_eq!(state.counters.gaps, 1);
    let actions = state.on_reply(&info(INCARNATION, 9, 0), t0);
    assert_eq!(sent(&actions), [&Request::Replay { from: 6 }]);
    // The replay sends all it holds from 6 on, 8 included: the held one is applied once.
    for sequence in [6, 7, 8] {
        assert!(state
            .on_reply(&replayed(sequence, &format!("m{sequence}")), t0)
            .is_empty());
    }
    let actions = state.on_reply(&replay_end(), t0);
    assert!(matches!(
        noticed(&actions)[..],
        [NoticeKind::Replayed {
            from: 6,
            through: 7,
            ..
        }]
    ));
    assert!(has(&state, "m6") && has(&state, "m7") && has(&state, "m8"));
    assert_eq!(state.counters.replayed_messages, 2);
    assert_eq!(state.counters.messages, 4);
    assert!(matches!(
        noticed(&state.tick(t0))[..],
        [NoticeKind::InSync { .. }]
    ));
    assert_eq!(state.status("").next_sequence, Some(9));
}

#[test]
fn a_replay_that_stops_short_or_a_gap_not_held_calls_for_a_snapshot() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    state.on_stream(message(8, "m8"), t0);
    state.tick(t0);
    state.on_reply(&info(INCARNATION, 9, 0), t0);
    // 5 comes back, 6 does not: the publisher dropped it since.
    state.on_reply(&replayed(5, "m5"), t0);
    let actions = state.on_reply(&replay_end(), t0);
    assert_eq!(
        noticed(&actions),
        [&NoticeKind::ReplayShort {
            from: 5,
            through: 7,
            next: 6
        }]
    );
    assert_eq!(
        state.tick(t0),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    state.on_reply(&page(&["a", "b"]), t0);
    state.on_reply(&snapshot_end(8, 2, INCARNATION), t0);
    assert!(has(&state, "b") && has(&state, "m8"));
    assert!(matches!(
        noticed(&state.tick(t0))[..],
        [NoticeKind::InSync { .. }]
    ));
    assert_eq!(state.counters.gaps, 1, "the gap is counted once");
    assert_eq!(state.counters.snapshots, 2);

    // The buffer no longer holds the next gap.
    state.on_stream(message(12, "m12"), t0);
    state.tick(t0);
    let actions = state.on_reply(&info(INCARNATION, 13, 11), t0);
    assert_eq!(
        noticed(&actions),
        [&NoticeKind::NotHeld {
            from: 9,
            through: 11,
            oldest: 11
        }]
    );
    assert_eq!(
        state.tick(t0),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
}

#[test]
fn a_new_incarnation_in_info_before_the_streams_message_0_is_one_new_life() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    // Quiet for a second: info is asked, and tells of a restart that sent nothing yet.
    assert_eq!(sent(&state.tick(t0 + SECOND)), [&Request::Info]);
    let actions = state.on_reply(&info(8, 0, 0), t0 + SECOND);
    assert_eq!(
        noticed(&actions),
        [&NoticeKind::NewIncarnation {
            old: INCARNATION,
            new: 8
        }]
    );
    assert!(!state.in_sync());
    assert_eq!(
        state.tick(t0 + SECOND),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    // The new life's message 0 is no sequence going back: it is held for the snapshot.
    assert!(state.on_stream(message(0, "n0"), t0 + SECOND).is_empty());
    state.on_reply(&snapshot_end(0, 0, 8), t0 + SECOND);
    assert!(has(&state, "n0") && !has(&state, "a"));
    assert_eq!(state.counters.incarnations, 1);
    assert_eq!(state.status("").incarnation, Some(8));
}

#[test]
fn a_new_incarnation_in_info_after_the_streams_message_0_is_found_at_the_next_check() {
    let t0 = Instant::now();
    // Joined a publisher that had sent nothing yet.
    let mut state = joined(t0, &["a"], 0);
    // It restarts before its first message: the new life's 0 follows the index, and nothing
    // in a stream message tells the lives apart.
    assert!(state.on_stream(message(0, "n0"), t0).is_empty());
    assert!(has(&state, "n0"));
    let t1 = t0 + SECOND;
    assert_eq!(sent(&state.tick(t1)), [&Request::Info]);
    let actions = state.on_reply(&info(8, 1, 0), t1);
    assert_eq!(
        noticed(&actions),
        [&NoticeKind::NewIncarnation {
            old: INCARNATION,
            new: 8
        }]
    );
    assert_eq!(
        state.tick(t1),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    state.on_reply(&page(&["n0"]), t1);
    state.on_reply(&snapshot_end(1, 1, 8), t1);
    assert!(has(&state, "n0") && !has(&state, "a"));
    assert_eq!(state.counters.incarnations, 1);
    assert!(matches!(
        noticed(&state.tick(t1))[..],
        [NoticeKind::InSync { .. }]
    ));
}

#[test]
fn the_stream_going_back_before_info_says_so_is_one_new_life_too() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    state.on_stream(message(5, "m5"), t0);
    let actions = state.on_stream(message(0, "n0"), t0);
    assert_eq!(
        noticed(&actions),
        [&NoticeKind::SequenceBack {
            last: 5,
            sequence: 0
        }]
    );
    assert_eq!(
        state.tick(t0),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    state.on_stream(message(1, "n1"), t0);
    let actions = state.on_reply(&snapshot_end(1, 0, 8), t0);
    // The snapshot names the new incarnation; the restart was counted already.
    assert!(noticed(&actions).contains(&&NoticeKind::NewIncarnation {
        old: INCARNATION,
        new: 8
    }));
    assert_eq!(state.counters.incarnations, 1);
    assert!(has(&state, "n1") && !has(&state, "n0") && !has(&state, "m5"));
}

#[test]
fn a_request_under_way_is_given_up_when_the_stream_goes_back() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    state.on_stream(message(7, "m7"), t0);
    assert_eq!(sent(&state.tick(t0)), [&Request::Info]);
    let actions = state.on_stream(message(0, "n0"), t0);
    assert!(actions.contains(&Action::Cancel), "{actions:?}");
}

#[test]
fn the_end_of_a_burst_is_lost_only_when_two_checks_in_a_row_find_the_stream_short() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    state.on_stream(message(5, "m5"), t0);
    state.on_stream(message(6, "m6"), t0);
    // 7 and 8 were sent and lost, or wait in the socket.
    let t1 = t0 + SECOND;
    assert_eq!(sent(&state.tick(t1)), [&Request::Info]);
    let actions = state.on_reply(&info(INCARNATION, 9, 0), t1);
    assert!(actions.is_empty(), "one check ahead is no gap: {actions:?}");
    assert_eq!(state.counters.gaps, 0);
    assert!(state.in_sync());
    let t2 = t1 + SECOND;
    assert_eq!(sent(&state.tick(t2)), [&Request::Info]);
    let actions = state.on_reply(&info(INCARNATION, 9, 0), t2);
    assert_eq!(sent(&actions), [&Request::Replay { from: 7 }]);
    assert_eq!(state.counters.gaps, 1);
    state.on_reply(&replayed(7, "m7"), t2);
    state.on_reply(&replayed(8, "m8"), t2);
    state.on_reply(&replay_end(), t2);
    assert!(has(&state, "m7") && has(&state, "m8"));
}

#[test]
fn a_stall_that_a_check_sees_past_is_no_gap_once_its_messages_arrive() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    state.on_stream(message(5, "m5"), t0);
    let t1 = t0 + SECOND;
    state.tick(t1);
    assert!(state.on_reply(&info(INCARNATION, 8, 0), t1).is_empty());
    // The reader was behind: 6 and 7 arrive after the reply.
    state.on_stream(message(6, "m6"), t1);
    state.on_stream(message(7, "m7"), t1);
    let t2 = t1 + 2 * SECOND;
    assert_eq!(sent(&state.tick(t2)), [&Request::Info]);
    assert!(state.on_reply(&info(INCARNATION, 8, 0), t2).is_empty());
    let t3 = t2 + SECOND;
    assert_eq!(sent(&state.tick(t3)), [&Request::Info]);
    assert!(state.on_reply(&info(INCARNATION, 8, 0), t3).is_empty());
    assert_eq!(state.counters.gaps, 0);
    assert!(state.in_sync());
}

#[test]
fn held_messages_past_max_held_are_dropped_and_the_gap_they_leave_recovered() {
    let t0 = Instant::now();
    let options = FollowOptions {
        max_held: 2,
        ..options()
    };
    let mut state = State::new(&options, Some(REPLAY.into()), t0);
    state.tick(t0);
    for sequence in [5, 6, 7] {
        state.on_stream(message(sequence, "m"), t0);
    }
    assert_eq!(state.counters.overflowed, 1);
    state.on_reply(&snapshot_end(5, 0, INCARNATION), t0);
    assert_eq!(state.status("").next_sequence, Some(7));
    // 7 was dropped: 8 leaves a gap, recovered like any loss.
    state.tick(t0);
    state.on_stream(message(8, "m8"), t0);
    assert_eq!(sent(&state.tick(t0)), [&Request::Info]);
    assert_eq!(
        sent(&state.on_reply(&info(INCARNATION, 9, 0), t0)),
        [&Request::Replay { from: 7 }]
    );
}

#[test]
fn a_request_unanswered_in_time_is_given_up_and_asked_again_later() {
    let t0 = Instant::now();
    let mut state = State::new(&options(), Some(REPLAY.into()), t0);
    state.tick(t0);
    assert!(state.tick(t0 + 4 * SECOND).is_empty());
    let t5 = t0 + 5 * SECOND;
    let actions = state.tick(t5);
    assert_eq!(actions[0], Action::Cancel);
    assert!(matches!(noticed(&actions)[..], [NoticeKind::Failed(_)]));
    assert!(
        sent(&actions).is_empty(),
        "asked again only after retry_after"
    );
    assert_eq!(
        state.tick(t5 + SECOND),
        [Action::Send(Request::Snapshot { tenant: None })]
    );
    assert_eq!(state.counters.failed_requests, 1);
}

#[test]
fn a_reply_nobody_asked_for_is_refused() {
    let t0 = Instant::now();
    let mut state = joined(t0, &["a"], 5);
    let actions = state.on_reply(&replay_end(), t0);
    assert!(matches!(noticed(&actions)[..], [NoticeKind::Malformed(_)]));
    assert_eq!(state.counters.malformed, 1);
    assert!(state.in_sync());
}

#[test]
fn without_a_replay_socket_the_stream_is_applied_from_the_join_and_gaps_are_only_counted() {
    let t0 = Instant::now();
    let mut state = State::new(&options(), None, t0);
    assert!(state.tick(t0 + 10 * SECOND).is_empty(), "nothing to ask");
    assert!(state.on_stream(message(3, "m3"), t0).is_empty());
    assert!(has(&state, "m3"));
    assert_eq!(state.status("").next_sequence, Some(4));
    assert!(!state.in_sync(), "0..3 went by before the join");
    let actions = state.on_stream(message(6, "m6"), t0);
    assert_eq!(
        noticed(&actions),
        [&NoticeKind::Unrecoverable {
            from: 4,
            through: 5
        }]
    );
    assert!(has(&state, "m6"));
    assert_eq!((state.counters.gaps, state.counters.unrecoverable), (1, 1));
    assert!(state
        .disconnected(t0)
        .iter()
        .all(|a| matches!(a, Action::Notice(_))));
    assert!(state.tick(t0 + 20 * SECOND).is_empty());
    // A new life, seen from its first message: complete from there.
    let actions = state.on_stream(message(0, "n0"), t0 + SECOND);
    assert!(matches!(
        noticed(&actions)[..],
        [
            NoticeKind::SequenceBack {
                last: 6,
                sequence: 0
            },
            NoticeKind::InSync { .. }
        ]
    ));
    assert!(has(&state, "n0") && !has(&state, "m6"));
    assert!(state.in_sync());
    assert_eq!(state.counters.incarnations, 1);
}
