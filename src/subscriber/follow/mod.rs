//! A subscriber that heals itself: [`Follower`] keeps an [`Index`] of what each publisher it
//! follows announces, and brings it back in line whenever the stream alone cannot.
//!
//! For each publisher (a PUB endpoint and its replay endpoint, the master's
//! `kv_events_bind_endpoint` and `kv_events_replay_endpoint`) the follower subscribes first,
//! then asks the replay socket for a snapshot, and holds the live messages meanwhile. The
//! snapshot ends with `N`, the sequence the publisher would assign next when it began: the
//! follower takes the snapshot as its index, drops the held messages below `N`, applies
//! the others in order, and replays from `N` if the first of them is not `N`.
//! Afterwards:
//!
//! - a sequence gap is filled by a replay when the publisher's replay buffer still holds it
//!   (`info`'s `oldest_sequence` says so), and by a snapshot when it does not, or when the
//!   replay came back short;
//! - a new incarnation (from `info`) or a sequence that goes back (a restart) is answered by
//!   a snapshot;
//! - when the stream has been quiet for [`FollowOptions::quiet_check`], `info` is asked for
//!   the next sequence and the incarnation, so that a loss at the end of a burst, or a
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
//! A publisher without a replay socket ([`Upstream::stream_only`]) is followed from the first
//! message received: no snapshot, and a gap is only counted
//! ([`FollowerCounters::unrecoverable`]).
//!
//! The follower runs on the caller's thread: [`Follower::poll`] does the work and returns
//! what happened as [`Notice`]s. Each publisher is a state machine without sockets
//! (`state/`: what arrives and the time passing in, requests and notices out) driven by its
//! links (`links.rs`: the SUB and DEALER sockets).

mod changes;
mod links;
mod notice;
mod options;
mod state;

use super::index::Index;
pub use changes::{Changes, Keys};
pub use links::FollowError;
use links::Followed;
pub use notice::{AppliedMessage, FollowerCounters, Notice, NoticeKind, Status};
pub use options::{FollowOptions, Upstream};
use std::time::{Duration, Instant};

/// The longest [`Follower::poll`] waits on its sockets before looking at its timers.
const TICK: Duration = Duration::from_millis(20);
/// Follows one or several publishers and keeps each one's [`Index`] in sync; see the
/// module's documentation.
///
/// ```no_run
/// use mooncake_kv_events::subscriber::{FollowOptions, Follower, Upstream};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), mooncake_kv_events::subscriber::FollowError> {
/// let upstreams = vec![
///     Upstream::new("tcp://master-0:5557", "tcp://master-0:5558"),
///     // A publisher without a replay socket: its stream alone.
///     Upstream::stream_only("tcp://master-1:5557"),
/// ];
/// let mut follower = Follower::new(upstreams, FollowOptions::default())?;
/// loop {
///     for notice in follower.poll(Duration::from_millis(100)) {
///         eprintln!("publisher {}: {}", notice.upstream, notice.kind);
///     }
///     if let Some(leader) = follower.freshest() {
///         let media = follower.index(leader).get(b"tenant-a", b"prefix/0001");
///         let next = follower.status(leader).next_sequence;
///         println!("{media:?} as of sequence {next:?}");
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Follower {
    followed: Vec<Followed>,
    options: FollowOptions,
}

impl Follower {
    /// Subscribes to every upstream (ZeroMQ connects in the background: a publisher not up
    /// yet is followed once it is). The first [`Follower::poll`] asks for the snapshots.
    /// The error names the endpoint that cannot be used.
    pub fn new(upstreams: Vec<Upstream>, options: FollowOptions) -> Result<Follower, FollowError> {
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
                let mut notice = |kind| notices.push(Notice { upstream, kind });
                followed.step(&self.options, &mut notice);
            }
            let now = Instant::now();
            let applied = self
                .followed
                .iter()
                .any(|f| f.state.applied.as_ref().is_some_and(|a| !a.is_empty()));
            if !notices.is_empty() || applied || now >= deadline {
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
        &self.followed[upstream].state.index
    }

    /// Which objects of publisher `upstream`'s index may have changed since the last call
    /// for it (since the follower started, at the first), and forgets them: a reader that
    /// keeps its own copy compares only those. Everything, always, unless
    /// [`FollowOptions::track_changes`] is on. Panics if there is no such upstream.
    pub fn take_changes(&mut self, upstream: usize) -> Changes {
        match &mut self.followed[upstream].state.changes {
            Some(changes) => std::mem::take(changes),
            None => Changes::everything(),
        }
    }

    /// The messages applied since the last call, every publisher's, each publisher's in the
    /// order they were applied; always empty unless [`FollowOptions::keep_applied`] is on.
    /// Publisher `i`'s index is the fold of what was taken of it so far, unless a snapshot
    /// replaced it or its incarnation changed (see [`AppliedMessage`]).
    pub fn take_applied(&mut self) -> Vec<AppliedMessage> {
        let mut out = Vec::new();
        for (upstream, followed) in self.followed.iter_mut().enumerate() {
            let Some(applied) = &mut followed.state.applied else {
                continue;
            };
            out.extend(
                applied
                    .drain(..)
                    .map(|(incarnation, sequence, payload)| AppliedMessage {
                        upstream,
                        incarnation,
                        sequence,
                        payload,
                    }),
            );
        }
        out
    }

    /// Every publisher's index merged: an object is readable on the media any of them
    /// says.
    pub fn union(&self) -> Index {
        let mut union = Index::new();
        for followed in &self.followed {
            union.merge(&followed.state.index);
        }
        union
    }

    /// The publisher in sync that was heard from last: in an HA deployment, the leader.
    pub fn freshest(&self) -> Option<usize> {
        (0..self.followed.len())
            .filter(|&i| self.followed[i].state.in_sync())
            .max_by_key(|&i| self.followed[i].state.last_heard)
    }

    /// Where publisher `upstream`'s index stands. Panics if there is no such upstream.
    pub fn status(&self, upstream: usize) -> Status {
        let followed = &self.followed[upstream];
        followed.state.status(&followed.upstream.endpoint)
    }

    /// Whether every publisher's index is in sync.
    pub fn in_sync(&self) -> bool {
        self.followed.iter().all(|f| f.state.in_sync())
    }

    /// Publisher `upstream`'s counters. Panics if there is no such upstream.
    pub fn upstream_counters(&self, upstream: usize) -> &FollowerCounters {
        &self.followed[upstream].state.counters
    }

    /// The counters of every publisher added up; `last_convergence` is the longest of the
    /// publishers' last ones.
    pub fn counters(&self) -> FollowerCounters {
        let mut sum = FollowerCounters::default();
        for followed in &self.followed {
            sum.add(&followed.state.counters);
        }
        sum
    }
}
