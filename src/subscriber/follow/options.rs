//! What a [`Follower`](super::Follower) follows ([`Upstream`]) and how ([`FollowOptions`]).

use crate::subscriber::watch::{CurveClient, DEFAULT_MAX_MESSAGE_BYTES};
use std::time::Duration;

/// One publisher to follow: its PUB endpoint, its replay endpoint if it has one, and the
/// subscriber's CURVE keys when it speaks CURVE (used on both sockets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// The PUB endpoint, e.g. `tcp://master-0:5557`.
    pub endpoint: String,
    /// The replay endpoint, e.g. `tcp://master-0:5558`. `None` for a publisher without one:
    /// the follower then applies the stream from its first message on, with no snapshot, and
    /// a gap is only counted ([`FollowerCounters::unrecoverable`](super::FollowerCounters::unrecoverable)).
    pub replay_endpoint: Option<String>,
    /// The publisher's public key and the subscriber's key pair; `None`: plain.
    pub curve: Option<CurveClient>,
    /// What to subscribe to: the publisher's topic or a prefix of it; empty: everything.
    pub topic: Vec<u8>,
}

impl Upstream {
    /// A plain upstream with a replay socket.
    pub fn new(endpoint: impl Into<String>, replay_endpoint: impl Into<String>) -> Upstream {
        Upstream {
            replay_endpoint: Some(replay_endpoint.into()),
            ..Upstream::stream_only(endpoint)
        }
    }

    /// A plain upstream without a replay socket: its stream is all there is.
    pub fn stream_only(endpoint: impl Into<String>) -> Upstream {
        Upstream {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            curve: None,
            topic: Vec::new(),
        }
    }
}

/// How the follower reads and when it gives up waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowOptions {
    /// The SUB socket's receive high-water mark, in messages; default 1,000,000. What the
    /// socket drops past it the follower sees as a gap and recovers.
    pub rcvhwm: i32,
    /// The largest message taken, in bytes; default 16 MiB (see
    /// [`SubscriberOptions::max_message_bytes`](crate::subscriber::SubscriberOptions::max_message_bytes)).
    pub max_message_bytes: usize,
    /// How long a request (info, replay, snapshot) may go without a reply frame before it is
    /// given up and retried; default 5 s.
    pub request_timeout: Duration,
    /// How long after a failed request the next one goes out; default 1 s.
    pub retry_after: Duration,
    /// How long the stream may be quiet before `info` is asked for the last sequence sent
    /// and the incarnation; default 1 s.
    pub quiet_check: Duration,
    /// Live messages held while a snapshot or a replay is under way; past it they are
    /// dropped (counted in [`FollowerCounters::overflowed`](super::FollowerCounters::overflowed)) and recovered like any loss. Default
    /// 1,000,000.
    pub max_held: usize,
    /// The most payload bytes those messages may hold together; past it, as past
    /// `max_held`. Default 1 GiB: a million-object burst, held while a snapshot of as
    /// many is read, takes about a quarter of it.
    pub max_held_bytes: usize,
    /// Whether the follower notes which objects each event changes, for
    /// [`Follower::take_changes`](super::Follower::take_changes); default off, since the
    /// note costs a lookup per event.
    pub track_changes: bool,
    /// Whether the follower keeps a copy of each message it applies to an index (from the
    /// stream or a replay, never a snapshot's pages), for
    /// [`Follower::take_applied`](super::Follower::take_applied), and returns from
    /// [`Follower::poll`](super::Follower::poll) as soon as it holds one; default off. For a
    /// reader that passes the master's messages on (the relay) without a second
    /// subscription. What is kept until taken is unbounded: take it after every poll.
    pub keep_applied: bool,
}

impl Default for FollowOptions {
    fn default() -> FollowOptions {
        FollowOptions {
            rcvhwm: 1_000_000,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            request_timeout: Duration::from_secs(5),
            retry_after: Duration::from_secs(1),
            quiet_check: Duration::from_secs(1),
            max_held: 1_000_000,
            max_held_bytes: 1 << 30,
            track_changes: false,
            keep_applied: false,
        }
    }
}
