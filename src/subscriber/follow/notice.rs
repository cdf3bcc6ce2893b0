//! What the follower tells its caller: [`Notice`]s of what [`NoticeKind`], [`FollowerCounters`] and
//! each publisher's [`Status`].

use std::fmt;
use std::time::{Duration, Instant};

/// What the follower counted, for one publisher or ([`Follower::counters`](super::Follower::counters)) all together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FollowerCounters {
    /// Messages applied to the index, from the stream or a replay.
    pub messages: u64,
    /// Events applied to the index from those messages (snapshots' events not included).
    pub events: u64,
    /// Stream messages dropped because the index already covered them (sequence at most a
    /// snapshot's `S` or a replay's end): the normal overlap, no loss.
    pub discarded: u64,
    /// Sequence gaps found: a message whose sequence skipped numbers, or `info` saying more
    /// was sent than arrived. Each was then filled by a replay or a snapshot, unless the
    /// publisher has no replay socket (`unrecoverable`).
    pub gaps: u64,
    /// Gaps that nothing could fill: the publisher has no replay socket
    /// ([`Upstream::replay_endpoint`](super::Upstream::replay_endpoint) `None`). The index
    /// misses what they carried.
    pub unrecoverable: u64,
    /// Replays that filled what they were asked for.
    pub replays: u64,
    /// Messages those replays brought back.
    pub replayed_messages: u64,
    /// Snapshots taken as the index (the first one included).
    pub snapshots: u64,
    /// New lives of a publisher seen: a new incarnation in `info` or a snapshot, or the
    /// sequence going back. Each is followed by a snapshot.
    pub incarnations: u64,
    /// Messages and replies refused: not three frames, not the wire format, over the size
    /// bound, a reply that is not the replay socket's protocol, a snapshot whose end does
    /// not match what arrived. Skipped; what they carried is recovered like a loss.
    pub malformed: u64,
    /// Events in a well-formed message that the index cannot take (an unknown type, no key
    /// or no medium): skipped, the rest of the message applied.
    pub skipped_events: u64,
    /// Requests to the replay socket that failed: no answer in time, an error reply
    /// (`busy`, snapshots not available), an unusable reply. Each is retried.
    pub failed_requests: u64,
    /// Live messages dropped because [`FollowOptions::max_held`](super::FollowOptions::max_held)
    /// messages or [`FollowOptions::max_held_bytes`](super::FollowOptions::max_held_bytes) were
    /// held already.
    pub overflowed: u64,
    /// Times the index came back in sync: after the start, and after each incident (a
    /// gap, a new incarnation, a restart).
    pub convergences: u64,
    /// How long the last of those took, from the start or from when the incident was
    /// noticed to being in sync.
    pub last_convergence: Option<Duration>,
    /// The longest of them.
    pub longest_convergence: Duration,
}

impl FollowerCounters {
    pub(super) fn add(&mut self, other: &FollowerCounters) {
        self.messages += other.messages;
        self.events += other.events;
        self.discarded += other.discarded;
        self.gaps += other.gaps;
        self.unrecoverable += other.unrecoverable;
        self.replays += other.replays;
        self.replayed_messages += other.replayed_messages;
        self.snapshots += other.snapshots;
        self.incarnations += other.incarnations;
        self.malformed += other.malformed;
        self.skipped_events += other.skipped_events;
        self.failed_requests += other.failed_requests;
        self.overflowed += other.overflowed;
        self.convergences += other.convergences;
        self.last_convergence = match (self.last_convergence, other.last_convergence) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.longest_convergence = self.longest_convergence.max(other.longest_convergence);
    }
}

/// A message the follower applied to publisher `upstream`'s index, as it arrived: kept when
/// [`FollowOptions::keep_applied`](super::FollowOptions::keep_applied) is on, handed out by
/// [`Follower::take_applied`](super::Follower::take_applied) in the order it was applied.
/// A publisher's messages follow each other (`sequence` + 1) while its index is not
/// replaced by a snapshot and its incarnation stays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedMessage {
    /// Which publisher (its place in the list given to [`Follower::new`](super::Follower::new)).
    pub upstream: usize,
    /// The publisher's incarnation when the message was applied.
    pub incarnation: u64,
    /// Its transport sequence.
    pub sequence: u64,
    /// Its payload, `[timestamp_ms, [event, ...], dp_rank]`, byte for byte as received.
    pub payload: Vec<u8>,
}

/// Something that happened to the index of publisher number `upstream` (its place in the
/// list given to [`Follower::new`](super::Follower::new)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// Which publisher.
    pub upstream: usize,
    /// What happened.
    pub kind: NoticeKind,
}

/// What a [`Notice`] tells. `Display` says it in one line for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// A snapshot became the index.
    Snapshot {
        /// Objects in it.
        objects: usize,
        /// `stored` events it held.
        events: u64,
        /// `N`: the stream is applied from sequence `N` on.
        next_sequence: u64,
        /// The publisher's incarnation.
        incarnation: u64,
        /// From the request to the end of the snapshot.
        took: Duration,
    },
    /// The gap `from..=through` was filled by a replay.
    Replayed {
        /// The first sequence missing.
        from: u64,
        /// The last.
        through: u64,
        /// How long the replay took.
        took: Duration,
    },
    /// The replay buffer no longer holds the gap `from..=through` (it holds from `oldest`
    /// on): a snapshot follows.
    NotHeld {
        /// The first sequence missing.
        from: u64,
        /// The last.
        through: u64,
        /// The oldest sequence the buffer holds; the publisher's next one when it holds
        /// none.
        oldest: u64,
    },
    /// A replay of `from..=through` stopped short before `next`: a snapshot follows.
    ReplayShort {
        /// The first sequence asked for.
        from: u64,
        /// The last.
        through: u64,
        /// The sequence the index needed next.
        next: u64,
    },
    /// The publisher has a new incarnation (restart, another master): a snapshot follows.
    NewIncarnation {
        /// The one the index was built from.
        old: u64,
        /// The new one.
        new: u64,
    },
    /// The stream's sequence went back from `last` to `sequence`: the publisher restarted;
    /// a snapshot follows.
    SequenceBack {
        /// The last sequence seen before.
        last: u64,
        /// The one that came.
        sequence: u64,
    },
    /// Sequences `from..=through` never arrived and the publisher has no replay socket to
    /// ask: the index misses what they carried, and is not in sync from now on.
    Unrecoverable {
        /// The first sequence missing.
        from: u64,
        /// The last.
        through: u64,
    },
    /// The index is in sync again, `took` after the start or the incident.
    InSync {
        /// From the start, or from when the incident was noticed.
        took: Duration,
    },
    /// The connection to the PUB endpoint closed; ZeroMQ reconnects. With a replay socket,
    /// `info` is asked at once whether the publisher restarted.
    Disconnected,
    /// A message or reply was refused and skipped.
    Malformed(String),
    /// Events of a message were skipped.
    Skipped(String),
    /// A request failed; it is retried. Repeats of the same failure are not noticed again.
    Failed(String),
    /// The publisher refused this subscriber's handshake.
    Refused(String),
}

fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

impl fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoticeKind::Snapshot {
                objects,
                next_sequence,
                took,
                ..
            } => write!(
                f,
                "snapshot: {objects} objects, next sequence {next_sequence}, {}",
                millis(*took)
            ),
            NoticeKind::Replayed {
                from,
                through,
                took,
            } => write!(
                f,
                "gap {from}..{through} filled by replay, {}",
                millis(*took)
            ),
            NoticeKind::NotHeld {
                from,
                through,
                oldest: 0,
            } => write!(
                f,
                "gap {from}..{through}: the replay buffer holds nothing: snapshot"
            ),
            NoticeKind::NotHeld {
                from,
                through,
                oldest,
            } => write!(
                f,
                "gap {from}..{through}: the replay buffer holds from {oldest} on: snapshot"
            ),
            NoticeKind::ReplayShort {
                from,
                through,
                next,
            } => write!(
                f,
                "gap {from}..{through}: the replay stopped before {next}: snapshot"
            ),
            NoticeKind::NewIncarnation { old, new } => {
                write!(f, "new incarnation {new:016x} (was {old:016x}): snapshot")
            }
            NoticeKind::SequenceBack { last, sequence } => write!(
                f,
                "the sequence went back from {last} to {sequence} (a restart): snapshot"
            ),
            NoticeKind::Unrecoverable { from, through } => write!(
                f,
                "gap {from}..{through}: no replay endpoint to fill it; the index misses it"
            ),
            NoticeKind::InSync { took } => write!(f, "in sync after {}", millis(*took)),
            NoticeKind::Disconnected => write!(f, "the connection closed; reconnecting"),
            NoticeKind::Malformed(why) => write!(f, "refused a message: {why}"),
            NoticeKind::Skipped(why) => write!(f, "skipped events: {why}"),
            NoticeKind::Failed(why) => write!(f, "{why}; retrying"),
            NoticeKind::Refused(why) => write!(f, "the publisher refused this subscriber: {why}"),
        }
    }
}

/// Where one publisher's index stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The PUB endpoint.
    pub endpoint: String,
    /// The incarnation the index was built from; `None` before the first snapshot.
    pub incarnation: Option<u64>,
    /// The sequence of the next stream message the index takes (a snapshot's
    /// `next_sequence`, or one past the last message applied); `None` before the first
    /// snapshot.
    pub next_sequence: Option<u64>,
    /// Whether the index is in sync: a snapshot taken, nothing held past a gap, no
    /// recovery under way. Messages lost at the end of a burst are only known at the next
    /// quiet check. Without a replay socket: every message of the publisher's life applied
    /// (the first one taken was 0, none missing since).
    pub in_sync: bool,
    /// When the publisher was last heard from (a message or a reply).
    pub last_heard: Option<Instant>,
    /// The failure of the last request, while requests keep failing.
    pub failing: Option<String>,
}
