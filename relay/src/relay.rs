//! The relay's decisions: take what the follower applied (the master's messages, read
//! once), and write into the store what the log lacks: the master's own batches while they
//! continue the log, a difference at a real discontinuity; a compacted snapshot now and
//! then; the bucket, when asked for, beside it. Which relay writes (the writer) and when a
//! standby takes over is decided here too. Generic over the master ([`Source`]) and NATS
//! ([`Store`]), so that the tests below drive every decision in memory.

use crate::batch::{self, Context, MAX_PAYLOAD};
use crate::bucket::{self, Bucket};
use crate::counters::RelayCounters;
use crate::diff::{Difference, Events};
use crate::error::StoreError;
use crate::held::Held;
use crate::log::{Entry, Log, Position, Written};
use crate::names::{diff_id, events_id, subject, token};
use crate::source::Source;
use crate::store::{SnapshotMeta, Store};
use mooncake_kv_events::subscriber::{AppliedMessage, Changes, Notice};
use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long one turn writes the master's messages before the follower reads again.
const WRITE_BUDGET: Duration = Duration::from_millis(100);
/// After losing a write to another relay, how long the log must stay still before this one
/// writes again: the other is the writer while it keeps writing.
const TAKEOVER: Duration = Duration::from_secs(3);
/// How often a relay that is not the writer reads what the writer wrote.
const STANDBY_CHECK: Duration = Duration::from_millis(500);
/// How long the relay keeps following the same publisher while it is in sync but silent,
/// before it asks the follower which one is the freshest.
const STICKY: Duration = Duration::from_secs(3);
/// After a NATS failure, how long before the next try.
const RETRY: Duration = Duration::from_secs(1);
/// The most memory applied messages held may take while they cannot be written (NATS down
/// or slow), counted by [`cost`]; past it they are dropped, and the log gets a difference
/// instead.
const MAX_PENDING_BYTES: usize = 128 << 20;
/// What one held message costs beside its payload's bytes: the message itself, its place
/// in the queue, the allocator's header and rounding of the payload's allocation.
const MESSAGE_OVERHEAD: usize = std::mem::size_of::<AppliedMessage>() + 32;

/// The memory a held message takes: its payload's allocation and [`MESSAGE_OVERHEAD`].
fn cost(message: &AppliedMessage) -> usize {
    message.payload.capacity() + MESSAGE_OVERHEAD
}
/// The share of the objects held (log and master together) that changes may name before
/// a difference compares everything: one in 16.
const MAX_NOTED_SHARE: usize = 16;
/// Changes named below this many objects are always kept (a small state).
const MIN_NOTED: usize = 10_000;
/// The fewest log events after which the events rule writes a snapshot (below, the time
/// rule does): a small state is cheaper to read in the log than to snapshot at every turn.
const MIN_SNAPSHOT_EVENTS: u64 = 10_000;
/// The quiet rule: once the master's events stop this long (the end of a burst), a
/// snapshot of what came since the last one, so that a reader that joins then reads
/// (almost) no log after it.
const QUIET: Duration = Duration::from_secs(1);

/// How the relay runs.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// The master's `backend_id`: the subject and the snapshot's name.
    pub(crate) backend: String,
    /// The subjects' prefix (`--subject-prefix`).
    pub(crate) subject_prefix: String,
    /// The time rule: a snapshot at least this often while the log moves.
    pub(crate) snapshot_every: Duration,
    /// Whether the key-value bucket is written.
    pub(crate) bucket: bool,
}

/// Whether this relay writes, or waits for the one that does to fall silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Writes the log, the snapshots and the bucket.
    Writer,
    /// Another relay wrote last, at `since`; checked at `checked`.
    Standby {
        /// When the log last moved under another writer.
        since: Instant,
        /// When this relay last read the log.
        checked: Instant,
    },
}

/// The snapshots: the last one written, and the rule's count.
#[derive(Debug)]
struct Snapshots {
    /// The last written (or loaded at start).
    last: Option<SnapshotMeta>,
    /// Log events written since it.
    events_since: u64,
    /// When the last events were written.
    last_events: Instant,
    /// When the last one was started (or the relay started).
    at: Instant,
    /// One being written: it, the events it covers of `events_since`, when it started.
    writing: Option<(SnapshotMeta, u64, Instant)>,
}

/// A difference being written: to which state of which publisher, on top of which log
/// message, and the changes it was computed from (noted again if it is given up).
#[derive(Debug)]
struct Writing {
    difference: Difference,
    upstream: usize,
    incarnation: u64,
    next: u64,
    base: u64,
    changes: Changes,
}

/// The relay.
pub(crate) struct Relay<S: Source, T: Store> {
    pub(crate) source: S,
    store: T,
    options: Options,
    held: Held,
    /// Per publisher, the objects where the log may differ from its index: a difference
    /// compares those only.
    changes: Vec<Changes>,
    /// Messages applied by the follower and not written yet, in order.
    pending: VecDeque<AppliedMessage>,
    pending_bytes: usize,
    /// Applied messages were dropped: the log can only continue by a difference.
    dropped: bool,
    /// The incarnation and last sequence of an events write whose acknowledgement was lost:
    /// its retry takes the same messages under the same id, so that NATS drops it as a
    /// duplicate when the first one landed (a retry regrouped under another id could land
    /// beside it, around a leader change).
    retry_through: Option<(u64, u64)>,
    /// The master's context, per incarnation, for the events of differences.
    context: Option<(u64, Context)>,
    /// A difference being written, a few messages a turn.
    writing: Option<Writing>,
    /// How long a turn writes before the follower reads again ([`WRITE_BUDGET`]); a turn
    /// that writes writes one message at least.
    budget: Duration,
    pub(crate) log: Log,
    following: Option<usize>,
    pub(crate) role: Role,
    /// The last turn stopped writing with messages left: the next does not wait.
    backlog: bool,
    snapshots: Snapshots,
    bucket: Option<Bucket>,
    /// No store request before this (after a failure).
    not_before: Instant,
    /// Whether this relay wrote the log since it started or last lost a race: a relay
    /// with nothing to write (an idle master) is ready, not yet the writer.
    pub(crate) wrote: bool,
    pub(crate) counters: RelayCounters,
    /// Why writes beside the loop (a snapshot, bucket entries) failed since the last
    /// [`Relay::take_failures`]: each is made again.
    failures: Vec<String>,
}

impl<S: Source, T: Store> std::fmt::Debug for Relay<S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("backend", &self.options.backend)
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl<S: Source, T: Store> Relay<S, T> {
    /// A relay: loads the backend's snapshot, then reads the log written after it, so
    /// that it holds exactly what the log says; with a bucket, marks what the bucket may
    /// lack of it.
    pub(crate) fn start(source: S, mut store: T, options: Options) -> Result<Self, StoreError> {
        let backend = options.backend.clone();
        let subject = subject(&options.subject_prefix, &backend);
        let mut held = Held::new(options.bucket);
        let (last, position, snapshot) = match store.load_snapshot(&token(backend.as_bytes()))? {
            Some((meta, content)) => {
                held.apply(&content.into(), meta.stream_sequence)
                    .map_err(|e| StoreError::Unreadable {
                        what: format!("the snapshot of {backend}: {e}"),
                    })?;
                let position = Position {
                    incarnation: meta.incarnation,
                    next: meta.next_sequence,
                    complete: true,
                };
                (meta.stream_sequence, Some(position), Some(meta))
            }
            None => (0, None, None),
        };
        let bucket = if options.bucket {
            let at = bucket::catch_up(&mut store, &backend, &subject, &mut held, last)?;
            Some(Bucket::new(at))
        } else {
            None
        };
        let mut log = Log::new(subject, last, position);
        log.read(&mut store, &mut held)?;
        if let Some(bucket) = &bucket {
            held.clean_through(bucket.reflected);
        }
        let now = Instant::now();
        Ok(Relay {
            changes: vec![Changes::everything(); source.upstreams()],
            source,
            store,
            options,
            held,
            pending: VecDeque::new(),
            pending_bytes: 0,
            dropped: false,
            retry_through: None,
            context: None,
            writing: None,
            budget: WRITE_BUDGET,
            log,
            following: None,
            role: Role::Writer,
            backlog: false,
            snapshots: Snapshots {
                last: snapshot,
                events_since: 0,
                last_events: now,
                at: now,
                writing: None,
            },
            bucket,
            not_before: now,
            wrote: false,
            counters: RelayCounters::default(),
            failures: Vec::new(),
        })
    }

    /// One turn: reads the master for up to `wait` (not at all when the last turn left
    /// messages to write), then writes what the log lacks. Returns the follower's notices;
    /// `Err` is a store failure, retried a second later.
    pub(crate) fn turn(&mut self, wait: Duration) -> (Vec<Notice>, Result<(), StoreError>) {
        let wait = if self.backlog { Duration::ZERO } else { wait };
        let notices = self.source.poll(wait);
        self.take_applied();
        self.note_changes();
        self.collect();
        if Instant::now() < self.not_before {
            return (notices, Ok(()));
        }
        let outcome = self.stand_by().and_then(|writes| {
            if writes {
                self.write()?;
                self.snapshot_if_due();
                self.flush_bucket();
            }
            Ok(())
        });
        if outcome.is_err() {
            self.backlog = false;
            self.not_before = Instant::now() + RETRY;
            self.counters.nats_failures += 1;
        }
        (notices, outcome)
    }

    /// Takes what the follower applied; past [`MAX_PENDING_BYTES`] held, drops it all.
    fn take_applied(&mut self) {
        for message in self.source.take_applied() {
            self.pending_bytes += cost(&message);
            self.pending.push_back(message);
        }
        if self.pending_bytes > MAX_PENDING_BYTES {
            self.pending.clear();
            self.pending_bytes = 0;
            self.dropped = true;
            self.counters.dropped += 1;
        }
    }

    fn pop_pending(&mut self) -> Option<AppliedMessage> {
        let message = self.pending.pop_front()?;
        self.pending_bytes -= cost(&message);
        Some(message)
    }

    /// Drops the held messages the log holds already (by whoever wrote it); with none left,
    /// gives the queue's memory back.
    fn prune_pending(&mut self) {
        if let Some(p) = self.log.position.filter(|p| p.complete) {
            while self
                .pending
                .front()
                .is_some_and(|m| m.incarnation == p.incarnation && m.sequence < p.next)
            {
                self.pop_pending();
            }
        }
        if self.pending.is_empty() && self.pending.capacity() > 1024 {
            self.pending = VecDeque::new();
        }
    }

    /// Puts messages taken back at the head of the pending ones, in their order.
    fn put_back(&mut self, taken: Vec<AppliedMessage>) {
        for m in taken.into_iter().rev() {
            self.pending_bytes += cost(&m);
            self.pending.push_front(m);
        }
    }

    /// Adds what the follower changed in each publisher's index to what may differ from the
    /// log. Past [`MAX_NOTED_SHARE`] of the objects both hold (and [`MIN_NOTED`]), the
    /// difference compares everything: the noted keys are copies of the indexes' keys, and
    /// comparing everything costs a pass over both, paid at a difference only.
    fn note_changes(&mut self) {
        for (i, changes) in self.changes.iter_mut().enumerate() {
            changes.merge(self.source.take_changes(i));
            let walk = self.held.index().objects() + self.source.index(i).objects();
            if changes.objects_len() > (walk / MAX_NOTED_SHARE).max(MIN_NOTED) {
                *changes = Changes::everything();
            }
        }
    }

    /// The log was read (another writer wrote it): it may differ from any index anywhere.
    fn forget_changes(&mut self) {
        self.changes.fill(Changes::everything());
    }

    /// Collects what the snapshot and the bucket writes beside the loop came to.
    fn collect(&mut self) {
        if let Some(outcome) = self.store.snapshot_done() {
            if let Some((meta, events, started)) = self.snapshots.writing.take() {
                match outcome {
                    Ok(written) => {
                        self.counters.snapshot_bytes = written.bytes;
                        self.counters.snapshot_events = written.events;
                        self.snapshots.last = Some(meta);
                        self.snapshots.events_since =
                            self.snapshots.events_since.saturating_sub(events);
                        self.counters.snapshots += 1;
                        self.counters.snapshot_ms = started.elapsed().as_millis() as u64;
                    }
                    Err(why) => {
                        self.counters.snapshot_failures += 1;
                        self.failures
                            .push(format!("a snapshot failed ({why}); written again"));
                    }
                }
            }
        }
        self.held.settle();
        if let Some(bucket) = &mut self.bucket {
            if let Some(why) = bucket.collect(&mut self.store, &mut self.held) {
                self.failures
                    .push(format!("bucket entries failed ({why}); written again"));
            }
        }
    }

    /// Why writes beside the loop failed since the last call.
    pub(crate) fn take_failures(&mut self) -> Vec<String> {
        std::mem::take(&mut self.failures)
    }

    /// As a standby, follows what the writer writes; returns whether this relay writes now.
    fn stand_by(&mut self) -> Result<bool, StoreError> {
        let Role::Standby { since, checked } = self.role else {
            return Ok(true);
        };
        let now = Instant::now();
        if now - checked < STANDBY_CHECK {
            return Ok(false);
        }
        let mut since = since;
        // What the writer wrote need not be held: a standby holds only what the log may
        // still lack, and gives the memory back.
        self.prune_pending();
        if self.store.last_on(&self.log.subject)? != self.log.last {
            self.log.read(&mut self.store, &mut self.held)?;
            self.forget_changes();
            if let Some(bucket) = &mut self.bucket {
                // What the writer noted as in the bucket need not be written by this one.
                let reflected = bucket::reflected(&mut self.store, &self.options.backend)?;
                bucket.reflected = reflected.stream_sequence;
                self.held.clean_through(reflected.stream_sequence);
            }
            self.prune_pending();
            since = now;
        }
        if now - since >= TAKEOVER {
            self.role = Role::Writer;
            self.counters.takeovers += 1;
            return Ok(true);
        }
        self.role = Role::Standby {
            since,
            checked: now,
        };
        Ok(false)
    }

    /// The publisher to write from: the one followed so far while it is in sync and heard
    /// from lately, else the follower's freshest.
    fn upstream(&mut self) -> Option<usize> {
        let fresh = |i: usize| {
            let status = self.source.status(i);
            status.in_sync && status.last_heard.is_some_and(|t| t.elapsed() < STICKY)
        };
        if let Some(i) = self.following.filter(|&i| fresh(i)) {
            return Some(i);
        }
        self.following = self.source.freshest().or(self.following);
        self.following.filter(|&i| self.source.status(i).in_sync)
    }

    /// Writes what the log lacks of the followed publisher's state: its messages while they
    /// continue the log, else (a real discontinuity) the difference.
    fn write(&mut self) -> Result<(), StoreError> {
        self.backlog = false;
        let upstream = self.upstream();
        let status = upstream.map(|i| self.source.status(i));
        let (Some(i), Some(incarnation), Some(next)) = (
            upstream,
            status.as_ref().and_then(|s| s.incarnation),
            status.as_ref().and_then(|s| s.next_sequence),
        ) else {
            self.give_up_difference();
            return Ok(());
        };
        let started = Instant::now();
        if let Some(w) = &self.writing {
            if w.upstream != i || w.incarnation != incarnation {
                self.give_up_difference();
            } else {
                return self.go_on_writing(started);
            }
        }
        // The log moves towards publisher `i`'s index, and away from the others'.
        for (j, changes) in self.changes.iter_mut().enumerate() {
            if j != i {
                *changes = Changes::everything();
            }
        }
        let mut forwarded = false;
        while let Some(p) = self.log.position.filter(|p| p.complete && !self.dropped) {
            // What the log holds already, and what another publisher applied, is not
            // written.
            while self.pending.front().is_some_and(|m| {
                m.upstream != i || (m.incarnation == p.incarnation && m.sequence < p.next)
            }) {
                self.pop_pending();
            }
            match self.pending.front() {
                Some(m) if m.incarnation == p.incarnation && m.sequence == p.next => {
                    if forwarded && started.elapsed() >= self.budget {
                        self.backlog = true;
                        return Ok(());
                    }
                    if !self.forward(i, p)? {
                        return Ok(());
                    }
                    forwarded = true;
                }
                // The log is the index (or ahead of it: another writer's follower is).
                None if p.incarnation == incarnation && p.next >= next => {
                    if p.next == next {
                        self.changes[i] = Changes::default();
                    }
                    return Ok(());
                }
                _ => break,
            }
        }
        if !self.held.settle() {
            // A snapshot shares the fold: the difference waits for it rather than compare
            // a copy of the whole fold.
            return Ok(());
        }
        self.start_difference(i, incarnation, next);
        self.go_on_writing(started)
    }

    /// Writes the messages at the head of the pending ones that continue the log at `p`,
    /// as many as fit one log message, verbatim; `false` when the log was read instead.
    fn forward(&mut self, i: usize, p: Position) -> Result<bool, StoreError> {
        let mut payload = Vec::new();
        let mut taken = Vec::new();
        let mut expected = p.next;
        while let Some(m) = self.pending.front() {
            let continues =
                m.upstream == i && m.incarnation == p.incarnation && m.sequence == expected;
            let past_retry = self.retry_through.is_some_and(|(incarnation, last)| {
                incarnation == p.incarnation && m.sequence > last
            });
            if !continues
                || past_retry
                || (!payload.is_empty() && payload.len() + m.payload.len() > MAX_PAYLOAD)
            {
                break;
            }
            let Some(m) = self.pop_pending() else { break };
            payload.extend_from_slice(&m.payload);
            expected += 1;
            taken.push(m);
        }
        let (Some(first), Some(last)) = (taken.first(), taken.last()) else {
            return Ok(true);
        };
        if payload.len() > MAX_PAYLOAD {
            // One master message larger than a log message may be: the log continues by a
            // difference.
            self.dropped = true;
            return Ok(true);
        }
        if self
            .context
            .as_ref()
            .is_none_or(|(inc, _)| *inc != p.incarnation)
        {
            if let Some(context) = taken.iter().find_map(|m| Context::of(&m.payload)) {
                self.context = Some((p.incarnation, context));
            }
        }
        let (first, last) = (first.sequence, last.sequence);
        let timestamp_ms = batch::timestamp(&taken[taken.len() - 1].payload);
        let entry = Entry {
            id: events_id(&self.options.backend, p.incarnation, first, last),
            position: Position {
                incarnation: p.incarnation,
                next: last + 1,
                complete: true,
            },
            kind: "events",
            part: None,
            payload,
        };
        // The master's batches, which the follower took: they are batches.
        let appended = self
            .log
            .append(&mut self.store, &mut self.held, entry, |held, p, at| {
                held.apply(p, at).unwrap_or_default()
            });
        self.retry_through = match &appended {
            Err(StoreError::Failed { .. }) => Some((p.incarnation, last)),
            _ => None,
        };
        match appended {
            Ok(Written::Yes(events)) => {
                self.wrote = true;
                let lag = timestamp_ms.map_or(0, |t| now_ms().saturating_sub(t));
                self.counters.written(events, taken.len() as u64, lag);
                if events > 0 {
                    self.snapshots.events_since += events;
                    self.snapshots.last_events = Instant::now();
                }
                Ok(true)
            }
            Ok(Written::ReadInstead(raced)) => {
                // What the log read holds is dropped at the next write; the rest is kept.
                self.put_back(taken);
                self.lost(raced);
                Ok(false)
            }
            Err(e) => {
                self.put_back(taken);
                Err(e)
            }
        }
    }

    /// Starts the difference between what the log holds and publisher `i`'s state before
    /// `next` ([`Events::between`]), in messages of at most [`MAX_PAYLOAD`] bytes of
    /// batches. Only with the truth at hand: publisher `i` in sync. The messages held are
    /// in that state, and those applied from now on continue it.
    fn start_difference(&mut self, i: usize, incarnation: u64, next: u64) {
        let context = match &self.context {
            Some((inc, context)) if *inc == incarnation => context.clone(),
            _ => Context::default(),
        };
        let restarted = self
            .log
            .position
            .is_some_and(|p| p.incarnation != incarnation);
        let changes = std::mem::take(&mut self.changes[i]);
        let events = Events::between(self.held.index(), self.source.index(i), &changes, restarted);
        let backend = self.options.backend.clone();
        let difference = Difference::new(events, context, backend, now_ms(), MAX_PAYLOAD);
        self.writing = Some(Writing {
            difference,
            upstream: i,
            incarnation,
            next,
            base: self.log.last,
            changes,
        });
        self.pending.clear();
        self.pending_bytes = 0;
        self.dropped = false;
    }

    /// Writes the next messages of the difference being written, for up to the turn's
    /// budget since `started`; each is applied to the fold from the events it
    /// carries, not decoded back. A failure or a race gives the difference up.
    fn go_on_writing(&mut self, started: Instant) -> Result<(), StoreError> {
        let Some(w) = &mut self.writing else {
            return Ok(());
        };
        let (log, store, held) = (&mut self.log, &mut self.store, &mut self.held);
        let outcome = loop {
            let Some(message) = w.difference.next_message() else {
                break Ok(None);
            };
            let entry = Entry {
                id: diff_id(
                    &self.options.backend,
                    w.incarnation,
                    w.next,
                    w.base,
                    message.part,
                ),
                position: Position {
                    incarnation: w.incarnation,
                    next: w.next,
                    complete: message.part + 1 == message.parts,
                },
                kind: "diff",
                part: Some((message.part + 1, message.parts)),
                payload: message.payload,
            };
            let events = &message.events;
            match log.append(store, held, entry, |held, _, at| {
                held.apply_events(events, at)
            }) {
                Ok(Written::Yes(n)) => {
                    self.snapshots.events_since += n;
                    self.snapshots.last_events = Instant::now();
                }
                Ok(Written::ReadInstead(raced)) => break Ok(Some(raced)),
                Err(e) => break Err(e),
            }
            if w.difference.done() || started.elapsed() >= self.budget {
                break Ok(None);
            }
        };
        match outcome {
            Ok(None) if w.difference.done() => {
                self.wrote = true;
                self.counters.diffs += 1;
                self.counters.diff_events += w.difference.events();
                self.writing = None;
                Ok(())
            }
            Ok(None) => {
                self.backlog = true;
                Ok(())
            }
            Ok(Some(raced)) => {
                self.give_up_difference();
                self.lost(raced);
                Ok(())
            }
            Err(e) => {
                self.give_up_difference();
                Err(e)
            }
        }
    }

    /// Gives up the difference being written, if any (its publisher is out of sync, another
    /// wrote the log, NATS failed): the log stays incomplete, and the objects it was
    /// computed from are compared again by the next.
    fn give_up_difference(&mut self) {
        if let Some(w) = self.writing.take() {
            self.changes[w.upstream].merge(w.changes);
        }
    }

    /// Another relay wrote the log meanwhile (or this one had, before a lost acknowledgement):
    /// it was read; with another writer, this relay stands by.
    fn lost(&mut self, raced: bool) {
        self.forget_changes();
        if raced {
            self.wrote = false;
            let now = Instant::now();
            self.role = Role::Standby {
                since: now,
                checked: now,
            };
            self.counters.races_lost += 1;
        }
    }

    /// Starts a snapshot of what the log holds when the rule says so: at least as many log
    /// events since the last as objects held (and [`MIN_SNAPSHOT_EVENTS`]); or events since
    /// it and none for [`QUIET`]; or [`Options::snapshot_every`] since it while the log
    /// moved. Only where the log is complete and does not lag what the follower applied,
    /// one at a time.
    fn snapshot_if_due(&mut self) {
        if self.snapshots.writing.is_some() || self.store.snapshot_busy() {
            return;
        }
        // Not while the log lags what the follower applied: messages taken while a
        // snapshot is written wait for it, and the snapshot's chunks compete with the
        // appends that would catch up.
        if self.backlog || self.dropped || !self.pending.is_empty() {
            return;
        }
        let Some(p) = self.log.position.filter(|p| p.complete) else {
            return;
        };
        if self
            .snapshots
            .last
            .is_some_and(|s| s.stream_sequence == self.log.last)
        {
            return;
        }
        let objects = self.held.index().objects() as u64;
        let events = self.snapshots.events_since;
        let by_events = events >= objects.max(MIN_SNAPSHOT_EVENTS);
        let by_quiet = events > 0 && self.snapshots.last_events.elapsed() >= QUIET;
        let by_time = self.snapshots.at.elapsed() >= self.options.snapshot_every;
        if !by_events && !by_quiet && !by_time {
            return;
        }
        let Some(index) = self.held.share() else {
            return;
        };
        let meta = SnapshotMeta {
            stream_sequence: self.log.last,
            incarnation: p.incarnation,
            next_sequence: p.next,
        };
        self.counters.snapshot_objects = objects;
        let content = batch::Snapshot {
            index,
            backend: self.options.backend.clone(),
            timestamp_ms: now_ms(),
        };
        let name = token(self.options.backend.as_bytes());
        self.store.start_snapshot(&name, meta, content);
        self.snapshots.writing = Some((meta, events, Instant::now()));
        self.snapshots.at = Instant::now();
    }

    /// Starts the next bucket writes, if there is a bucket; none while log messages wait
    /// for a snapshot (the bucket would be noted as reflecting what the fold lacks).
    fn flush_bucket(&mut self) {
        if self.held.deferring() {
            return;
        }
        if let Some(bucket) = &mut self.bucket {
            bucket.flush(
                &mut self.store,
                &self.options.backend,
                &mut self.held,
                self.log.last,
                self.log.position,
            );
        }
    }

    /// Whether the log (and the bucket, for its writer) hold the followed publisher's state
    /// as of the last message it applied.
    pub(crate) fn up_to_date(&self) -> bool {
        let Some(i) = self.following else {
            return false;
        };
        let status = self.source.status(i);
        let bucket_done = self.role != Role::Writer
            || self.bucket.as_ref().is_none_or(|b| {
                self.held.dirty_len() == 0 && !self.held.deferring() && !b.busy(&self.store)
            });
        status.in_sync
            && bucket_done
            && self.pending.is_empty()
            && status.incarnation.is_some()
            && self.log.position
                == Some(Position {
                    incarnation: status.incarnation.unwrap_or_default(),
                    next: status.next_sequence.unwrap_or_default(),
                    complete: true,
                })
    }

    /// How far behind the master the log is, in milliseconds: 0 when it is up to date;
    /// else how long ago the master sent the oldest message not written yet (or, with none
    /// held, the lag of the last write).
    pub(crate) fn lag_ms(&self) -> u64 {
        if self.up_to_date() {
            return 0;
        }
        self.pending
            .front()
            .and_then(|m| batch::timestamp(&m.payload))
            .map_or(self.counters.lag_ms, |t| now_ms().saturating_sub(t))
    }

    /// Whether the relay waits before asking NATS again, after a failure.
    pub(crate) fn backing_off(&self) -> bool {
        Instant::now() < self.not_before
    }

    /// Whether a snapshot is being written.
    pub(crate) fn snapshot_writing(&self) -> bool {
        self.snapshots.writing.is_some()
    }

    /// Bucket entries still to write (dirty), or `None` without a bucket.
    pub(crate) fn bucket_pending(&self) -> Option<usize> {
        self.bucket.as_ref().map(|_| self.held.dirty_len())
    }

    /// Bucket entries written, or `None` without a bucket.
    pub(crate) fn bucket_written(&self) -> Option<u64> {
        self.bucket.as_ref().map(|b| b.written)
    }

    /// The publisher followed, if any.
    pub(crate) fn following(&self) -> Option<usize> {
        self.following
    }

    /// Master messages applied and not written yet.
    pub(crate) fn pending_messages(&self) -> usize {
        self.pending.len()
    }

    /// The objects the log holds.
    pub(crate) fn objects(&self) -> usize {
        self.held.index().objects()
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
