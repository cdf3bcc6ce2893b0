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

use super::index::{json_bytes, Index};
use super::watch::{
    CurveClient, Subscriber, SubscriberOptions, WatchError, DEFAULT_MAX_MESSAGE_BYTES,
};
use crate::wire::replay::verb;
use crate::wire::{Checked, Info, Replayed, Request, SnapshotEnd};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::time::{Duration, Instant};

/// The longest [`Follower::poll`] waits on its sockets before looking at its timers.
const TICK: Duration = Duration::from_millis(20);
/// How long one publisher's sockets are read before the others, and the timers, get their
/// turn: half of it for the stream, the rest for the replay socket.
const READ_BUDGET: Duration = Duration::from_millis(20);

/// One publisher to follow: its PUB endpoint, its replay endpoint, and the subscriber's CURVE
/// keys when it speaks CURVE (used on both sockets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The PUB endpoint, e.g. `tcp://master-0:5557`.
    pub endpoint: String,
    /// The replay endpoint, e.g. `tcp://master-0:5558`.
    pub replay_endpoint: String,
    /// The publisher's public key and the subscriber's key pair; `None`: plain.
    pub curve: Option<CurveClient>,
    /// What to subscribe to: the publisher's topic or a prefix of it; empty: everything.
    pub topic: Vec<u8>,
}

impl Source {
    /// A plain source.
    pub fn new(endpoint: impl Into<String>, replay_endpoint: impl Into<String>) -> Source {
        Source {
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
    /// [`SubscriberOptions::max_message_bytes`]).
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

/// What the follower counted, for one publisher or ([`Follower::counters`]) all together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages applied to the index, from the stream or a replay.
    pub messages: u64,
    /// Events applied to the index from those messages (snapshots' events not included).
    pub events: u64,
    /// Stream messages dropped because the index already covered them (sequence at most a
    /// snapshot's `S` or a replay's end): the normal overlap, no loss.
    pub discarded: u64,
    /// Sequence gaps found: a message whose sequence skipped numbers, or `info` saying more
    /// was sent than arrived. Each was then filled by a replay or a snapshot.
    pub gaps: u64,
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
    /// Live messages dropped because [`FollowOptions::max_buffered`] messages or
    /// [`FollowOptions::max_buffered_bytes`] were held already.
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

impl Counters {
    fn add(&mut self, other: &Counters) {
        self.messages += other.messages;
        self.events += other.events;
        self.discarded += other.discarded;
        self.gaps += other.gaps;
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

/// Something that happened to the index of publisher number `source` (its place in the
/// list given to [`Follower::new`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// Which publisher.
    pub source: usize,
    /// What happened.
    pub event: Happened,
}

/// What a [`Notice`] tells. `Display` says it in one line for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happened {
    /// A snapshot became the index.
    Snapshot {
        /// Objects in it.
        objects: usize,
        /// `stored` events it held.
        events: u64,
        /// `S`: the stream is applied from `S + 1` on.
        sequence: u64,
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
    /// on, 0: nothing): a snapshot follows.
    NotHeld {
        /// The first sequence missing.
        from: u64,
        /// The last.
        through: u64,
        /// The oldest sequence the buffer holds, 0 when none.
        oldest: u64,
    },
    /// A replay of `from..=through` stopped short after `reached`: a snapshot follows.
    ReplayShort {
        /// The first sequence asked for.
        from: u64,
        /// The last.
        through: u64,
        /// The last sequence applied.
        reached: u64,
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
    /// The index is in sync again, `took` after the start or the incident.
    InSync {
        /// From the start, or from when the incident was noticed.
        took: Duration,
    },
    /// The connection to the PUB endpoint closed; `info` will say whether the publisher
    /// restarted.
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

impl fmt::Display for Happened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Happened::Snapshot {
                objects,
                sequence,
                took,
                ..
            } => write!(
                f,
                "snapshot: {objects} objects, S={sequence}, {}",
                millis(*took)
            ),
            Happened::Replayed {
                from,
                through,
                took,
            } => write!(
                f,
                "gap {from}..{through} filled by replay, {}",
                millis(*took)
            ),
            Happened::NotHeld {
                from,
                through,
                oldest: 0,
            } => write!(
                f,
                "gap {from}..{through}: the replay buffer holds nothing: snapshot"
            ),
            Happened::NotHeld {
                from,
                through,
                oldest,
            } => write!(
                f,
                "gap {from}..{through}: the replay buffer holds from {oldest} on: snapshot"
            ),
            Happened::ReplayShort {
                from,
                through,
                reached,
            } => write!(
                f,
                "gap {from}..{through}: the replay stopped at {reached}: snapshot"
            ),
            Happened::NewIncarnation { old, new } => {
                write!(f, "new incarnation {new:016x} (was {old:016x}): snapshot")
            }
            Happened::SequenceBack { last, sequence } => write!(
                f,
                "the sequence went back from {last} to {sequence} (a restart): snapshot"
            ),
            Happened::InSync { took } => write!(f, "in sync after {}", millis(*took)),
            Happened::Disconnected => write!(
                f,
                "the connection closed; reconnecting, and asking info whether it restarted"
            ),
            Happened::Malformed(why) => write!(f, "refused a message: {why}"),
            Happened::Skipped(why) => write!(f, "skipped events: {why}"),
            Happened::Failed(why) => write!(f, "{why}; retrying"),
            Happened::Refused(why) => write!(f, "the publisher refused this subscriber: {why}"),
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
    /// The last sequence the index reflects (a snapshot's `S` or the last message applied);
    /// `None` before the first snapshot.
    pub sequence: Option<u64>,
    /// Whether the index is in sync: a snapshot taken, nothing buffered past a gap, no
    /// recovery under way. Messages lost at the end of a burst are only known at the next
    /// quiet check.
    pub in_sync: bool,
    /// When the publisher was last heard from (a message or a reply).
    pub last_heard: Option<Instant>,
    /// The failure of the last request, while requests keep failing.
    pub failing: Option<String>,
}

/// What the follower asked the replay socket and waits for.
enum Ask {
    Info(Purpose),
    Replay {
        from: u64,
        until: u64,
        started: Instant,
    },
    Snapshot {
        staged: Index,
        events: u64,
        started: Instant,
        bad: Option<String>,
    },
}

/// Why `info` was asked.
#[derive(Clone, Copy, Debug)]
enum Purpose {
    /// Messages `from..until` are missing: does the buffer hold them?
    Gap { from: u64, until: u64 },
    /// The stream is quiet: was its end lost, did the publisher restart?
    Quiet,
}

/// One publisher followed.
struct Followed {
    source: Source,
    context: zmq::Context,
    subscriber: Subscriber,
    dealer: zmq::Socket,
    index: Index,
    incarnation: Option<u64>,
    /// The last sequence the index reflects.
    applied: Option<u64>,
    /// The last sequence the SUB socket delivered: it only grows within one life.
    stream_last: Option<u64>,
    /// Stream messages received and not applied yet, by sequence, as they arrived.
    pending: BTreeMap<u64, Checked<zmq::Message>>,
    /// Their payloads' bytes.
    pending_bytes: usize,
    asking: Option<Ask>,
    /// When the last reply frame (or the request) was seen.
    asked_at: Instant,
    snapshot_due: bool,
    /// No request goes out before this (after a failure).
    not_before: Instant,
    /// The start of the gap last counted, so that a retry is not counted again.
    gap_counted: Option<u64>,
    /// The sequence went back and was counted as a new life: the snapshot that follows
    /// does not count it again.
    restart_counted: bool,
    /// When the index stopped being in sync, until it is again.
    incident: Option<Instant>,
    last_stream: Instant,
    last_check: Instant,
    last_heard: Option<Instant>,
    connections_lost: u64,
    failing: Option<String>,
    refused: Option<String>,
    counters: Counters,
}

impl fmt::Debug for Followed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Followed")
            .field("endpoint", &self.source.endpoint)
            .field("applied", &self.applied)
            .field("objects", &self.index.objects())
            .finish_non_exhaustive()
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
    /// Subscribes to every source (ZeroMQ connects in the background: a publisher not up
    /// yet is followed once it is). The first [`Follower::poll`] asks for the snapshots.
    /// The error names the endpoint that cannot be used.
    pub fn new(sources: Vec<Source>, options: FollowOptions) -> Result<Follower, String> {
        let now = Instant::now();
        let mut followed = Vec::with_capacity(sources.len());
        for source in sources {
            let subscriber = Subscriber::open(
                &source.endpoint,
                &SubscriberOptions {
                    rcvhwm: options.rcvhwm,
                    curve: source.curve.clone(),
                    max_message_bytes: options.max_message_bytes,
                    topic: source.topic.clone(),
                },
            )
            .map_err(|e| format!("cannot subscribe to {}: {e}", source.endpoint))?;
            let context = zmq::Context::new();
            let dealer = open_dealer(&context, &source, &options)?;
            followed.push(Followed {
                source,
                context,
                subscriber,
                dealer,
                index: Index::new(),
                incarnation: None,
                applied: None,
                stream_last: None,
                pending: BTreeMap::new(),
                pending_bytes: 0,
                asking: None,
                asked_at: now,
                snapshot_due: true,
                not_before: now,
                gap_counted: None,
                restart_counted: false,
                incident: Some(now),
                last_stream: now,
                last_check: now,
                last_heard: None,
                connections_lost: 0,
                failing: None,
                refused: None,
                counters: Counters::default(),
            });
        }
        Ok(Follower { followed, options })
    }

    /// Reads what arrived, applies it, and sends the requests the state calls for, for up
    /// to `timeout`; returns as soon as something worth a [`Notice`] happened, or when the
    /// time is up. Call it in a loop.
    pub fn poll(&mut self, timeout: Duration) -> Vec<Notice> {
        let deadline = Instant::now() + timeout;
        let mut notices = Vec::new();
        loop {
            for (source, followed) in self.followed.iter_mut().enumerate() {
                let mut notice = |event| notices.push(Notice { source, event });
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
                .flat_map(|f| [f.subscriber.poll_item(), f.dealer.as_poll_item(zmq::POLLIN)])
                .collect();
            // An interrupted wait (a signal) is as good as a wait that ended.
            let _ = zmq::poll(
                &mut items,
                i64::try_from(wait.as_millis()).unwrap_or(20).max(1),
            );
        }
    }

    /// How many publishers are followed.
    pub fn sources(&self) -> usize {
        self.followed.len()
    }

    /// Publisher `source`'s index: what its master holds, as far as the follower knows.
    /// Panics if there is no such source.
    // The name says what it returns; `follower[i]` would not.
    #[allow(clippy::should_implement_trait)]
    pub fn index(&self, source: usize) -> &Index {
        &self.followed[source].index
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

    /// Where publisher `source`'s index stands. Panics if there is no such source.
    pub fn status(&self, source: usize) -> Status {
        let f = &self.followed[source];
        Status {
            endpoint: f.source.endpoint.clone(),
            incarnation: f.incarnation,
            sequence: f.applied,
            in_sync: f.in_sync(),
            last_heard: f.last_heard,
            failing: f.failing.clone(),
        }
    }

    /// Whether every publisher's index is in sync.
    pub fn in_sync(&self) -> bool {
        self.followed.iter().all(Followed::in_sync)
    }

    /// Publisher `source`'s counters. Panics if there is no such source.
    pub fn source_counters(&self, source: usize) -> &Counters {
        &self.followed[source].counters
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

fn open_dealer(
    context: &zmq::Context,
    source: &Source,
    options: &FollowOptions,
) -> Result<zmq::Socket, String> {
    let failed = |e: zmq::Error| format!("cannot connect to {}: {e}", source.replay_endpoint);
    let socket = context.socket(zmq::DEALER).map_err(failed)?;
    socket.set_linger(0).map_err(failed)?;
    socket
        .set_maxmsgsize(i64::try_from(options.max_message_bytes).unwrap_or(i64::MAX))
        .map_err(failed)?;
    if let Some(curve) = &source.curve {
        socket
            .set_curve_serverkey(&curve.server_key.0)
            .map_err(failed)?;
        socket
            .set_curve_publickey(&curve.keys.public.0)
            .map_err(failed)?;
        socket
            .set_curve_secretkey(&curve.keys.secret.0)
            .map_err(failed)?;
    }
    socket.connect(&source.replay_endpoint).map_err(failed)?;
    Ok(socket)
}

impl Followed {
    fn in_sync(&self) -> bool {
        self.applied.is_some()
            && !self.snapshot_due
            && self.pending.is_empty()
            && matches!(self.asking, None | Some(Ask::Info(Purpose::Quiet)))
    }

    /// Reads what the two sockets hold.
    fn read(&mut self, options: &FollowOptions, notice: &mut impl FnMut(Happened)) {
        let start = Instant::now();
        while start.elapsed() < READ_BUDGET / 2 {
            match self.subscriber.recv_checked(Duration::ZERO) {
                Ok(Some((message, _))) => self.on_stream(message, options, notice),
                Ok(None) => break,
                Err(e @ (WatchError::Malformed(_) | WatchError::TooLarge { .. })) => {
                    self.counters.malformed += 1;
                    notice(Happened::Malformed(e.to_string()));
                }
                // A signal interrupted the wait: nothing to say.
                Err(WatchError::Socket(zmq::Error::EINTR)) => break,
                Err(WatchError::Refused(why)) => {
                    if self.refused.as_ref() != Some(&why) {
                        notice(Happened::Refused(why.clone()));
                        self.refused = Some(why);
                    }
                    break;
                }
                Err(e) => {
                    let why = format!("reading {}: {e}", self.source.endpoint);
                    if self.failing.as_ref() != Some(&why) {
                        notice(Happened::Failed(why.clone()));
                        self.failing = Some(why);
                    }
                    break;
                }
            }
        }
        while start.elapsed() < READ_BUDGET {
            match self.dealer.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => self.on_reply(frames, options, notice),
                Err(_) => break,
            }
        }
    }

    /// A message from the stream.
    fn on_stream(
        &mut self,
        message: Checked<zmq::Message>,
        options: &FollowOptions,
        notice: &mut impl FnMut(Happened),
    ) {
        let now = Instant::now();
        self.last_stream = now;
        self.last_heard = Some(now);
        self.refused = None;
        let sequence = message.sequence;
        if let Some(last) = self.stream_last.filter(|last| sequence <= *last) {
            self.counters.incarnations += 1;
            self.restart_counted = true;
            notice(Happened::SequenceBack { last, sequence });
            self.restart(options);
        }
        self.stream_last = Some(sequence);
        // The usual case, in sync: applied as it arrives, never held.
        let next = self.applied.map(|applied| applied.saturating_add(1));
        if self.pending.is_empty() && self.applies_now() && next == Some(sequence) {
            self.apply(&message, notice);
            return;
        }
        if self.pending.len() >= options.max_buffered
            || self.pending_bytes + message.payload_bytes() > options.max_buffered_bytes
        {
            self.counters.overflowed += 1;
            return;
        }
        self.pending_bytes += message.payload_bytes();
        self.pending.insert(sequence, message);
        self.drain(notice);
    }

    /// Whether stream messages that follow the index may be applied: not while a snapshot
    /// is due or under way, which will replace the index.
    fn applies_now(&self) -> bool {
        !self.snapshot_due && !matches!(self.asking, Some(Ask::Snapshot { .. }))
    }

    /// Forgets what is buffered and whatever was asked, and calls for a snapshot.
    fn restart(&mut self, options: &FollowOptions) {
        self.pending.clear();
        self.pending_bytes = 0;
        self.cancel(options);
        self.snapshot_due = true;
        self.not_before = Instant::now();
        self.incident.get_or_insert_with(Instant::now);
    }

    /// Gives up the request under way: the DEALER is replaced, so that no late reply to it
    /// can be taken for the next request's.
    fn cancel(&mut self, options: &FollowOptions) {
        if self.asking.take().is_some() {
            if let Ok(fresh) = open_dealer(&self.context, &self.source, options) {
                self.dealer = fresh;
            }
        }
    }

    /// Applies the buffered messages that follow the index, and drops those it covers.
    /// Nothing while a snapshot is due or under way: it will replace the index.
    fn drain(&mut self, notice: &mut impl FnMut(Happened)) {
        if !self.applies_now() {
            return;
        }
        let Some(mut applied) = self.applied else {
            return;
        };
        while let Some(entry) = self.pending.first_entry() {
            let sequence = *entry.key();
            if sequence > applied.saturating_add(1) {
                break;
            }
            let message = entry.remove();
            self.pending_bytes -= message.payload_bytes();
            if sequence <= applied {
                self.counters.discarded += 1;
            } else {
                self.apply(&message, notice);
                applied = sequence;
            }
        }
    }

    /// Applies one message that follows the index, decoding its events as it goes.
    fn apply(
        &mut self,
        message: &Checked<impl Deref<Target = [u8]>>,
        notice: &mut impl FnMut(Happened),
    ) {
        let (mut skipped, mut first_why) = (0, None);
        for event in message.changes() {
            match self.index.apply_change(&event) {
                Ok(_) => self.counters.events += 1,
                Err(why) => {
                    skipped += 1;
                    first_why.get_or_insert(why);
                }
            }
        }
        if let Some(why) = first_why {
            self.counters.skipped_events += skipped;
            notice(Happened::Skipped(format!(
                "{skipped} of message {}, the first: {why}",
                message.sequence
            )));
        }
        self.counters.messages += 1;
        self.applied = Some(message.sequence);
    }

    /// Sends the request the state calls for, gives up one that timed out, and notices the
    /// index back in sync.
    fn act(&mut self, options: &FollowOptions, notice: &mut impl FnMut(Happened)) {
        let now = Instant::now();
        if self.asking.is_some() && now.duration_since(self.asked_at) >= options.request_timeout {
            let what = self.asking_what();
            self.cancel(options);
            self.fail(
                format!(
                    "{what} to {} got no answer within {} s",
                    self.source.replay_endpoint,
                    options.request_timeout.as_secs_f64()
                ),
                options,
                notice,
            );
        }
        let lost = self.subscriber.connections_lost();
        if lost > self.connections_lost {
            self.connections_lost = lost;
            notice(Happened::Disconnected);
            // Ask info at the next occasion: the publisher may be back as a new life.
            self.last_check = now.checked_sub(options.quiet_check).unwrap_or(now);
            self.last_stream = self.last_check;
        }
        if self.asking.is_some() || now < self.not_before {
            return;
        }
        if self.snapshot_due {
            self.send(
                Request::Snapshot { tenant: None },
                Ask::Snapshot {
                    staged: Index::new(),
                    events: 0,
                    started: now,
                    bad: None,
                },
                options,
                notice,
            );
            return;
        }
        self.drain(notice);
        let Some(applied) = self.applied else { return };
        if let Some(&head) = self.pending.keys().next() {
            // The buffered messages do not follow the index: a gap.
            let from = applied + 1;
            if self.gap_counted != Some(from) {
                self.gap_counted = Some(from);
                self.counters.gaps += 1;
                self.incident.get_or_insert(now);
            }
            let purpose = Purpose::Gap { from, until: head };
            self.send(Request::Info, Ask::Info(purpose), options, notice);
            return;
        }
        if let Some(since) = self.incident.take() {
            let took = now.duration_since(since);
            self.counters.convergences += 1;
            self.counters.last_convergence = Some(took);
            self.counters.longest_convergence = self.counters.longest_convergence.max(took);
            notice(Happened::InSync { took });
        }
        if now.duration_since(self.last_stream.max(self.last_check)) >= options.quiet_check {
            self.last_check = now;
            self.send(Request::Info, Ask::Info(Purpose::Quiet), options, notice);
        }
    }

    fn asking_what(&self) -> &'static str {
        match self.asking {
            Some(Ask::Info(_)) => "info",
            Some(Ask::Replay { .. }) => "a replay",
            Some(Ask::Snapshot { .. }) => "a snapshot",
            None => "a request",
        }
    }

    fn send(
        &mut self,
        request: Request,
        ask: Ask,
        options: &FollowOptions,
        notice: &mut impl FnMut(Happened),
    ) {
        match self.dealer.send_multipart(request.frames(), zmq::DONTWAIT) {
            Ok(()) => {
                self.asking = Some(ask);
                self.asked_at = Instant::now();
            }
            Err(e) => self.fail(
                format!("cannot ask {}: {e}", self.source.replay_endpoint),
                options,
                notice,
            ),
        }
    }

    /// A request failed: counted, noticed unless it is the same failure again, retried
    /// after [`FollowOptions::retry_after`].
    fn fail(&mut self, why: String, options: &FollowOptions, notice: &mut impl FnMut(Happened)) {
        self.counters.failed_requests += 1;
        if self.failing.as_ref() != Some(&why) {
            notice(Happened::Failed(why.clone()));
            self.failing = Some(why);
        }
        self.not_before = Instant::now() + options.retry_after;
    }

    /// A reply from the replay socket.
    fn on_reply(
        &mut self,
        frames: Vec<Vec<u8>>,
        options: &FollowOptions,
        notice: &mut impl FnMut(Happened),
    ) {
        let now = Instant::now();
        self.last_heard = Some(now);
        self.asked_at = now;
        let endpoint = self.source.replay_endpoint.clone();
        let shape = |frames: &[Vec<u8>]| {
            format!(
                "{endpoint} sent a reply of {} frames that is not the protocol's",
                frames.len()
            )
        };
        let rest = match frames.split_first() {
            Some((delimiter, rest)) if delimiter.is_empty() => rest,
            _ => return self.malformed(shape(&frames), notice),
        };
        let Some(ask) = self.asking.take() else {
            return self.malformed(format!("{endpoint} sent a reply nobody asked for"), notice);
        };
        match (ask, rest) {
            (ask, [head, text]) if head.as_slice() == verb::ERROR => {
                let what = match ask {
                    Ask::Info(_) => "info",
                    Ask::Replay { .. } => "a replay",
                    Ask::Snapshot { .. } => "a snapshot",
                };
                if matches!(ask, Ask::Snapshot { .. }) {
                    self.snapshot_due = true;
                }
                self.fail(
                    format!("{what} from {endpoint}: {}", String::from_utf8_lossy(text)),
                    options,
                    notice,
                );
            }
            (Ask::Info(purpose), [head, body]) if head.as_slice() == verb::INFO => {
                match Info::decode(body) {
                    Ok(info) => {
                        self.failing = None;
                        self.on_info(&info, purpose, options, notice);
                    }
                    Err(e) => {
                        self.counters.malformed += 1;
                        self.fail(e, options, notice);
                    }
                }
            }
            (
                Ask::Replay {
                    from,
                    until,
                    started,
                },
                rest,
            ) if Replayed::read(rest).is_some() => {
                self.failing = None;
                match Replayed::read(rest) {
                    Some(Replayed::Message { sequence, payload }) => {
                        self.asking = Some(Ask::Replay {
                            from,
                            until,
                            started,
                        });
                        self.on_replayed(sequence, payload, until, notice);
                    }
                    _ => self.end_replay(from, until, started, notice),
                }
            }
            (
                Ask::Snapshot {
                    mut staged,
                    mut events,
                    started,
                    mut bad,
                },
                [head, payload],
            ) if head.as_slice() == verb::SNAPSHOT => {
                self.failing = None;
                match Checked::new(vec![&[][..], &[0u8; 8][..], payload.as_slice()]) {
                    Ok(page) => {
                        for event in page.changes() {
                            events += 1;
                            if let Err(why) = staged.apply_change(&event) {
                                bad.get_or_insert(format!("a snapshot event: {why}"));
                            }
                        }
                    }
                    Err(e) => {
                        bad.get_or_insert(format!("a snapshot page: {e}"));
                    }
                }
                self.asking = Some(Ask::Snapshot {
                    staged,
                    events,
                    started,
                    bad,
                });
            }
            (
                Ask::Snapshot {
                    staged,
                    events,
                    started,
                    bad,
                },
                [head, body],
            ) if head.as_slice() == verb::SNAPSHOT_END => {
                self.end_snapshot(staged, events, started, bad, body, options, notice);
            }
            (ask, rest) => {
                self.asking = Some(ask);
                self.malformed(shape(rest), notice);
            }
        }
    }

    fn malformed(&mut self, why: String, notice: &mut impl FnMut(Happened)) {
        self.counters.malformed += 1;
        notice(Happened::Malformed(why));
    }

    fn on_info(
        &mut self,
        info: &Info,
        purpose: Purpose,
        options: &FollowOptions,
        notice: &mut impl FnMut(Happened),
    ) {
        if let Some(old) = self.incarnation.filter(|old| *old != info.incarnation) {
            self.counters.incarnations += 1;
            notice(Happened::NewIncarnation {
                old,
                new: info.incarnation,
            });
            self.incarnation = Some(info.incarnation);
            self.restart(options);
            // What the stream delivers from now on is the new life's.
            self.stream_last = None;
            return;
        }
        let Some(applied) = self.applied else { return };
        let (from, until) = match purpose {
            Purpose::Gap { from, until } => (from, until),
            Purpose::Quiet => {
                let seen = self.stream_last.unwrap_or(0).max(applied);
                if info.last_sequence <= seen || !self.pending.is_empty() {
                    return;
                }
                // The end of a burst was lost: no later message would show it.
                let from = applied + 1;
                self.counters.gaps += 1;
                self.gap_counted = Some(from);
                self.incident.get_or_insert_with(Instant::now);
                (from, info.last_sequence + 1)
            }
        };
        if info.oldest_sequence != 0 && info.oldest_sequence <= from {
            self.replay(from, until, options, notice);
        } else {
            notice(Happened::NotHeld {
                from,
                through: until - 1,
                oldest: info.oldest_sequence,
            });
            self.snapshot_due = true;
        }
    }

    fn replay(
        &mut self,
        from: u64,
        until: u64,
        options: &FollowOptions,
        notice: &mut impl FnMut(Happened),
    ) {
        let ask = Ask::Replay {
            from,
            until,
            started: Instant::now(),
        };
        self.send(Request::Replay { from }, ask, options, notice);
    }

    /// One replayed message: applied if it follows the index and is within what was asked.
    fn on_replayed(
        &mut self,
        sequence: &[u8],
        payload: &[u8],
        until: u64,
        notice: &mut impl FnMut(Happened),
    ) {
        let Some(applied) = self.applied else { return };
        let number = u64::from_be_bytes(sequence.try_into().unwrap_or_default());
        if number != applied.saturating_add(1) || number >= until {
            // Already held, beyond the gap (the stream brings it), or after a hole: the
            // end of the replay finds the hole.
            return;
        }
        match Checked::new(vec![&[][..], sequence, payload]) {
            Ok(message) => {
                self.apply(&message, notice);
                self.counters.replayed_messages += 1;
            }
            Err(e) => self.malformed(format!("a replayed message: {e}"), notice),
        }
    }

    fn end_replay(
        &mut self,
        from: u64,
        until: u64,
        started: Instant,
        notice: &mut impl FnMut(Happened),
    ) {
        let reached = self.applied.unwrap_or(0);
        if reached + 1 >= until {
            self.counters.replays += 1;
            notice(Happened::Replayed {
                from,
                through: until - 1,
                took: started.elapsed(),
            });
            self.drain(notice);
        } else {
            notice(Happened::ReplayShort {
                from,
                through: until - 1,
                reached,
            });
            self.snapshot_due = true;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn end_snapshot(
        &mut self,
        staged: Index,
        events: u64,
        started: Instant,
        bad: Option<String>,
        body: &[u8],
        options: &FollowOptions,
        notice: &mut impl FnMut(Happened),
    ) {
        let end = SnapshotEnd::decode(body).and_then(|end| match bad {
            Some(why) => Err(why),
            None if end.tenant.is_some() => Err(format!(
                "a snapshot of tenant {} when every tenant was asked for",
                json_bytes(end.tenant.as_deref().unwrap_or_default())
            )),
            None if end.events != events || end.objects != staged.objects() as u64 => Err(format!(
                "a snapshot announced {} events and {} objects; {events} events and {} \
                     objects arrived",
                end.events,
                end.objects,
                staged.objects()
            )),
            None => Ok(end),
        });
        let end = match end {
            Ok(end) => end,
            Err(why) => {
                self.counters.malformed += 1;
                self.snapshot_due = true;
                self.fail(
                    format!("a snapshot from {}: {why}", self.source.replay_endpoint),
                    options,
                    notice,
                );
                return;
            }
        };
        if let Some(old) = self.incarnation.filter(|old| *old != end.incarnation) {
            if !self.restart_counted {
                self.counters.incarnations += 1;
            }
            notice(Happened::NewIncarnation {
                old,
                new: end.incarnation,
            });
        }
        self.restart_counted = false;
        self.incarnation = Some(end.incarnation);
        self.applied = Some(end.sequence);
        self.index = staged;
        self.snapshot_due = false;
        self.gap_counted = None;
        self.counters.snapshots += 1;
        notice(Happened::Snapshot {
            objects: self.index.objects(),
            events,
            sequence: end.sequence,
            incarnation: end.incarnation,
            took: started.elapsed(),
        });
        self.drain(notice);
        // What the stream delivered first is not S + 1: replay what came between.
        if let Some(&head) = self.pending.keys().next() {
            self.replay(end.sequence + 1, head, options, notice);
        }
    }
}
