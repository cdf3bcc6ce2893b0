//! A subscriber that heals itself: [`Follower`] keeps an [`Index`] of what each publisher it
//! follows announces, and brings it back in line whenever the stream alone cannot.
//!
//! For each publisher (a PUB endpoint and its replay endpoint, the master's
//! `kv_events_bind_endpoint` and `kv_events_replay_endpoint`) the follower subscribes first,
//! then asks the replay socket for a snapshot, and buffers the live messages meanwhile. The
//! snapshot ends with `S`, the last sequence the publisher had assigned when it began: the
//! follower takes the snapshot as its index, drops the buffered messages up to `S`, applies
//! the others in order, and replays from `S + 1` if the first of them is not `S + 1`.
//! Afterwards:
//!
//! - a sequence gap is filled by a replay when the publisher's replay buffer still holds it
//!   (`info`'s `oldest_sequence` says so), and by a snapshot when it does not, or when the
//!   replay came back short;
//! - a new incarnation (from `info`) or a sequence that goes back (a restart) is answered by
//!   a snapshot;
//! - when the stream has been quiet for [`FollowOptions::quiet_check`], `info` is asked for
//!   the last sequence sent and the incarnation, so that a loss at the end of a burst, or a
//!   publisher that restarted and sent nothing yet, is found too;
//! - a malformed message, a reply of the wrong shape or a publisher that speaks something else
//!   is counted and skipped, never a panic; a request that fails is retried after
//!   [`FollowOptions::retry_after`].
//!
//! The follower keeps **one index per publisher**: each is what that publisher's master
//! holds, as far as its stream and replay socket told. In an HA deployment, give it every
//! candidate master: [`Follower::freshest`] names the publisher in sync that was heard from
//! last (the leader, when the others are gone or silent), and [`Follower::index`] is its view.
//! [`Follower::union`] merges every view, for deployments where each publisher owns a part
//! of the objects; after a failover it would still hold what the old leader last said.
//!
//! The follower runs on the caller's thread: [`Follower::poll`] does the work and returns
//! what happened as [`Notice`]s.

mod followed;
mod notice;

use super::index::Index;
use super::watch::{CurveClient, DEFAULT_MAX_MESSAGE_BYTES};
use followed::Followed;
pub use notice::{Counters, Happened, Notice, Status};
use std::time::{Duration, Instant};

/// The longest [`Follower::poll`] waits on its sockets before looking at its timers.
const TICK: Duration = Duration::from_millis(20);
/// One publisher to follow: its PUB endpoint, its replay endpoint, and the subscriber's CURVE
/// keys when it speaks CURVE (used on both sockets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// The PUB endpoint, e.g. `tcp://master-0:5557`.
    pub endpoint: String,
    /// The replay endpoint, e.g. `tcp://master-0:5558`.
    pub replay_endpoint: String,
    /// The publisher's public key and the subscriber's key pair; `None`: plain.
    pub curve: Option<CurveClient>,
    /// What to subscribe to: the publisher's topic or a prefix of it; empty: everything.
    pub topic: Vec<u8>,
}

impl Upstream {
    /// A plain upstream.
    pub fn new(endpoint: impl Into<String>, replay_endpoint: impl Into<String>) -> Upstream {
        Upstream {
            endpoint: endpoint.into(),
            replay_endpoint: replay_endpoint.into(),
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
    /// [`SubscriberOptions::max_message_bytes`](super::SubscriberOptions::max_message_bytes)).
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
    /// dropped (counted in [`Counters::overflowed`]) and recovered like any loss. Default
    /// 1,000,000.
    pub max_buffered: usize,
    /// The most payload bytes those messages may hold together; past it, as past
    /// `max_buffered`. Default 1 GiB: a million-object burst, held while a snapshot of as
    /// many is read, takes about a quarter of it.
    pub max_buffered_bytes: usize,
}

impl Default for FollowOptions {
    fn default() -> FollowOptions {
        FollowOptions {
            rcvhwm: 1_000_000,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            request_timeout: Duration::from_secs(5),
            retry_after: Duration::from_secs(1),
            quiet_check: Duration::from_secs(1),
            max_buffered: 1_000_000,
            max_buffered_bytes: 1 << 30,
        }
    }
}

/// Follows one or several publishers and keeps each one's [`Index`] in sync; see the
/// module's documentation.
#[derive(Debug)]
pub struct Follower {
    followed: Vec<Followed>,
    options: FollowOptions,
}

impl Follower {
    /// Subscribes to every upstream (ZeroMQ connects in the background: a publisher not up
    /// yet is followed once it is). The first [`Follower::poll`] asks for the snapshots.
    /// The error names the endpoint that cannot be used.
    pub fn new(upstreams: Vec<Upstream>, options: FollowOptions) -> Result<Follower, String> {
        let now = Instant::now();
        let followed = upstreams
            .into_iter()
            .map(|upstream| Followed::open(upstream, &options, now))
            .collect::<Result<_, _>>()?;
        Ok(Follower { followed, options })
    }

    /// Reads what arrived, applies it, and sends the requests the state calls for, for up
    /// to `timeout`; returns as soon as something worth a [`Notice`] happened, or when the
    /// time is up. Call it in a loop.
    pub fn poll(&mut self, timeout: Duration) -> Vec<Notice> {
        let deadline = Instant::now() + timeout;
        let mut notices = Vec::new();
        loop {
            for (upstream, followed) in self.followed.iter_mut().enumerate() {
                let mut notice = |event| notices.push(Notice { upstream, event });
                followed.read(&self.options, &mut notice);
                followed.act(&self.options, &mut notice);
            }
            let now = Instant::now();
            if !notices.is_empty() || now >= deadline {
                return notices;
            }
            let wait = (deadline - now).min(TICK);
            let mut items: Vec<zmq::PollItem<'_>> = self
                .followed
                .iter()
                .flat_map(Followed::poll_items)
                .collect();
            // An interrupted wait (a signal) is as good as a wait that ended.
            let _ = zmq::poll(
                &mut items,
                i64::try_from(wait.as_millis()).unwrap_or(20).max(1),
            );
        }
    }

    /// How many publishers are followed.
    pub fn upstreams(&self) -> usize {
        self.followed.len()
    }

    /// Publisher `upstream`'s index: what its master holds, as far as the follower knows.
    /// Panics if there is no such upstream.
    // The name says what it returns; `follower[i]` would not.
    #[allow(clippy::should_implement_trait)]
    pub fn index(&self, upstream: usize) -> &Index {
        &self.followed[upstream].index
    }

    /// Every publisher's index merged: an object is readable on the media any of them
    /// says.
    pub fn union(&self) -> Index {
        let mut union = Index::new();
        for followed in &self.followed {
            union.merge(&followed.index);
        }
        union
    }

    /// The publisher in sync that was heard from last: in an HA deployment, the leader.
    pub fn freshest(&self) -> Option<usize> {
        (0..self.followed.len())
            .filter(|&i| self.followed[i].in_sync())
            .max_by_key(|&i| self.followed[i].last_heard)
    }

    /// Where publisher `upstream`'s index stands. Panics if there is no such upstream.
    pub fn status(&self, upstream: usize) -> Status {
        self.followed[upstream].status()
    }

    /// Whether every publisher's index is in sync.
    pub fn in_sync(&self) -> bool {
        self.followed.iter().all(Followed::in_sync)
    }

    /// Publisher `upstream`'s counters. Panics if there is no such upstream.
    pub fn upstream_counters(&self, upstream: usize) -> &Counters {
        &self.followed[upstream].counters
    }

    /// The counters of every publisher added up; `last_convergence` is the longest of the
    /// publishers' last ones.
    pub fn counters(&self) -> Counters {
        let mut sum = Counters::default();
        for followed in &self.followed {
            sum.add(&followed.counters);
        }
        sum
    }
}
