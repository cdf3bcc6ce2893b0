//! The relay's loop: follow the master with the library's [`Follower`] (the truth), read its
//! messages a second time for the log ([`Raw`]), and write into NATS what the log lacks:
//! the master's own messages while they follow each other, a difference otherwise.

use crate::batch::{self, MAX_EVENTS};
use crate::bucket;
use crate::counters::Counters;
use crate::held::Held;
use crate::log::{Appended, Entry, Log, Position};
use crate::names::{diff_id, events_id, subject};
use crate::nats::Nats;
use crate::raw::{Raw, Run};
use mooncake_kv_events::subscriber::{Changes, Follower, Notice};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the master's messages the follower applied may be missing from the relay's own
/// socket (the two sockets read the same stream at their own pace) before the relay stops
/// waiting for them and writes a difference.
const GRACE: Duration = Duration::from_millis(500);
/// Master messages the log may be behind the follower (about 130,000 events at 64 a message)
/// before the relay writes a difference instead of them: a master sending faster than NATS
/// takes its messages one by one would leave the log ever further behind, while the
/// difference holds at most an event per object and medium that changed.
const MAX_BEHIND: u64 = 2048;
/// How long one turn writes the master's messages before the follower reads again: a
/// follower kept waiting falls behind the master with the log, and the log could never
/// be far enough behind the follower for a difference to catch it up.
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

/// Whether this relay writes, or waits for the one that does to fall silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Writes the log and the bucket.
    Writer,
    /// Another relay wrote last, at `since`; checked at `checked`.
    Standby {
        /// When the log last moved under another writer.
        since: Instant,
        /// When this relay last read the log.
        checked: Instant,
    },
}

/// The relay: the follower, the raw streams, NATS, and what the log holds.
pub(crate) struct Relay {
    pub(crate) follower: Follower,
    raws: Vec<Raw>,
    nats: Nats,
    pub(crate) backend: String,
    held: Held,
    /// Per publisher, the objects where the log may differ from its index: a difference
    /// compares those only.
    changes: Vec<Changes>,
    pub(crate) log: Log,
    following: Option<usize>,
    pub(crate) role: Role,
    behind_since: Option<Instant>,
    /// No NATS request before this (after a failure).
    not_before: Instant,
    pub(crate) counters: Counters,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("backend", &self.backend)
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

impl Relay {
    /// A relay for `backend`: loads the bucket, then reads the log written since the bucket
    /// was last brought up to date, so that it holds exactly what the log says.
    pub(crate) fn start(
        follower: Follower,
        raws: Vec<Raw>,
        nats: Nats,
        backend: String,
    ) -> Result<Relay, String> {
        let mut held = Held::default();
        let reflected = bucket::load(&nats, &backend, &mut held)?;
        let mut log = Log::new(
            subject(&backend),
            reflected.stream_sequence,
            reflected.position(),
        );
        log.read(&nats, &mut held)?;
        Ok(Relay {
            changes: vec![Changes::everything(); follower.upstreams()],
            follower,
            raws,
            nats,
            backend,
            held,
            log,
            following: None,
            role: Role::Writer,
            behind_since: None,
            not_before: Instant::now(),
            counters: Counters::default(),
        })
    }

    /// One turn: reads the master for up to `wait`, then writes what the log lacks.
    /// Returns the follower's notices; `Err` is a NATS failure, retried at the next turn.
    pub(crate) fn turn(&mut self, wait: Duration) -> (Vec<Notice>, Result<(), String>) {
        let notices = self.follower.poll(wait);
        self.note_changes();
        for raw in &mut self.raws {
            raw.drain();
        }
        if Instant::now() < self.not_before {
            return (notices, Ok(()));
        }
        let outcome = self.stand_by().and_then(|writes| {
            if writes {
                self.write()?;
                self.flush()?;
            }
            Ok(())
        });
        if outcome.is_err() {
            self.not_before = Instant::now() + RETRY;
            self.counters.nats_failures += 1;
        }
        (notices, outcome)
    }

    /// Adds what the follower changed in each publisher's index to what may differ from the
    /// log. Past as many objects as both hold, comparing everything costs less.
    fn note_changes(&mut self) {
        for (i, changes) in self.changes.iter_mut().enumerate() {
            changes.merge(self.follower.take_changes(i));
            let walk = self.held.index().objects() + self.follower.index(i).objects();
            if changes.objects_len() > walk {
                *changes = Changes::everything();
            }
        }
    }

    /// The log was read (another writer wrote it): it may differ from any index anywhere.
    fn forget_changes(&mut self) {
        self.changes.fill(Changes::everything());
    }

    /// As a standby, follows what the writer writes; returns whether this relay writes now.
    fn stand_by(&mut self) -> Result<bool, String> {
        let Role::Standby { since, checked } = self.role else {
            return Ok(true);
        };
        let now = Instant::now();
        if now - checked < STANDBY_CHECK {
            return Ok(false);
        }
        let mut since = since;
        if self.nats.last_on(&self.log.subject)? != self.log.last {
            self.log.read(&self.nats, &mut self.held)?;
            self.forget_changes();
            // What the writer noted as in the bucket need not be written by this one.
            let reflected = bucket::reflected(&self.nats, &self.backend)?;
            self.held.clean_through(reflected.stream_sequence);
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
            let status = self.follower.status(i);
            status.in_sync && status.last_heard.is_some_and(|t| t.elapsed() < STICKY)
        };
        if let Some(i) = self.following.filter(|&i| fresh(i)) {
            return Some(i);
        }
        self.following = self.follower.freshest().or(self.following);
        self.following.filter(|&i| self.follower.status(i).in_sync)
    }

    /// Writes what the log lacks of the followed publisher's state.
    fn write(&mut self) -> Result<(), String> {
        let Some(i) = self.upstream() else {
            return Ok(());
        };
        let status = self.follower.status(i);
        let (Some(incarnation), Some(sequence)) = (status.incarnation, status.sequence) else {
            return Ok(());
        };
        // The log moves towards publisher `i`'s index, and away from the others'.
        for (j, changes) in self.changes.iter_mut().enumerate() {
            if j != i {
                *changes = Changes::everything();
            }
        }
        match self.log.position {
            Some(p) if p.complete && p.incarnation == incarnation => {
                self.raws[i].drop_through(p.sequence);
                if p.sequence >= sequence {
                    self.behind_since = None;
                    return Ok(());
                }
                self.forward(i, incarnation, p.sequence + 1, sequence)
            }
            _ => self.difference(i, incarnation, sequence),
        }
    }

    /// Writes the master's messages `from..=through` as they came, as long as the relay's
    /// own socket has them in order, for up to [`WRITE_BUDGET`]; a difference when it has
    /// not had them for [`GRACE`], or when they are more than [`MAX_BEHIND`].
    fn forward(
        &mut self,
        i: usize,
        incarnation: u64,
        from: u64,
        through: u64,
    ) -> Result<(), String> {
        if through - from >= MAX_BEHIND {
            self.behind_since = None;
            return self.difference(i, incarnation, through);
        }
        let mut from = from;
        let started = Instant::now();
        while from <= through && started.elapsed() < WRITE_BUDGET {
            let Some(run) = self.raws[i].take(from, through, MAX_EVENTS) else {
                let since = *self.behind_since.get_or_insert_with(Instant::now);
                if since.elapsed() < GRACE {
                    return Ok(());
                }
                self.behind_since = None;
                return self.difference(i, incarnation, through);
            };
            self.behind_since = None;
            let next = run.last + 1;
            if !self.append_run(i, incarnation, run)? {
                return Ok(());
            }
            from = next;
        }
        Ok(())
    }

    /// Appends one run of the master's messages; `false` when the log was read instead.
    fn append_run(&mut self, i: usize, incarnation: u64, run: Run) -> Result<bool, String> {
        let entry = Entry {
            id: events_id(&self.backend, incarnation, run.first, run.last),
            position: Position {
                incarnation,
                sequence: run.last,
                complete: true,
            },
            kind: "events",
            part: None,
            timestamp_ms: run.timestamp_ms,
            dp_rank: run.dp_rank,
            events: run.events.clone(),
        };
        let (events, timestamp_ms) = (entry.events.len() as u64, run.timestamp_ms);
        match self.log.append(&self.nats, &mut self.held, entry) {
            Ok(Appended::Written) => {
                self.counters
                    .written(events, now_ms().saturating_sub(timestamp_ms));
                Ok(true)
            }
            Ok(Appended::ReadInstead(raced)) => {
                self.lost(raced);
                Ok(false)
            }
            Err(why) => {
                self.raws[i].put_back(run);
                Err(why)
            }
        }
    }

    /// Writes the difference between what the log holds and publisher `i`'s state at
    /// `sequence`, in parts of at most [`MAX_EVENTS`] events (one empty part when there is
    /// none: the log still notes the new position).
    fn difference(&mut self, i: usize, incarnation: u64, sequence: u64) -> Result<(), String> {
        let truth = self.follower.index(i);
        let events = batch::difference(
            self.held.index(),
            truth,
            &self.changes[i],
            &self.backend,
            now_ms(),
        );
        let total = events.len() as u64;
        let base = self.log.last;
        // Moved into the parts, not copied: a difference can hold millions of events.
        let mut events = events.into_iter().peekable();
        let mut parts: Vec<Vec<rmpv::Value>> = Vec::new();
        while events.peek().is_some() {
            parts.push(events.by_ref().take(MAX_EVENTS).collect());
        }
        if parts.is_empty() {
            parts.push(Vec::new());
        }
        let count = parts.len();
        for (k, events) in parts.into_iter().enumerate() {
            let entry = Entry {
                id: diff_id(&self.backend, incarnation, sequence, base, k),
                position: Position {
                    incarnation,
                    sequence,
                    complete: k + 1 == count,
                },
                kind: "diff",
                part: Some((k + 1, count)),
                timestamp_ms: now_ms(),
                dp_rank: 0,
                events,
            };
            if let Appended::ReadInstead(raced) =
                self.log.append(&self.nats, &mut self.held, entry)?
            {
                self.lost(raced);
                return Ok(());
            }
        }
        self.changes[i] = Changes::default();
        self.counters.diffs += 1;
        self.counters.diff_events += total;
        self.raws[i].drop_through(sequence);
        Ok(())
    }

    /// Another relay wrote the log meanwhile (or this one had, before a lost acknowledgement):
    /// it is read; with another writer, this relay stands by.
    fn lost(&mut self, raced: bool) {
        self.forget_changes();
        if raced {
            let now = Instant::now();
            self.role = Role::Standby {
                since: now,
                checked: now,
            };
            self.counters.races_lost += 1;
        }
    }

    /// Brings the bucket up to what the log holds.
    fn flush(&mut self) -> Result<(), String> {
        if self.held.dirty_len() == 0 {
            return Ok(());
        }
        let written = bucket::flush(
            &self.nats,
            &self.backend,
            &mut self.held,
            self.log.last,
            self.log.position,
        )?;
        self.counters.entries += written as u64;
        Ok(())
    }

    /// Whether the log and the bucket hold the followed publisher's state as of the last
    /// message it applied.
    pub(crate) fn up_to_date(&self) -> bool {
        let Some(i) = self.following else {
            return false;
        };
        let status = self.follower.status(i);
        let bucket_done = self.role != Role::Writer || self.held.dirty_len() == 0;
        status.in_sync
            && bucket_done
            && self.log.position
                == Some(Position {
                    incarnation: status.incarnation.unwrap_or_default(),
                    sequence: status.sequence.unwrap_or_default(),
                    complete: true,
                })
    }

    /// Bucket entries still to write.
    pub(crate) fn pending(&self) -> usize {
        self.held.dirty_len()
    }

    /// The publisher followed, if any.
    pub(crate) fn following(&self) -> Option<usize> {
        self.following
    }

    /// Master messages held for the log, all publishers together.
    pub(crate) fn held_messages(&self) -> usize {
        self.raws.iter().map(Raw::len).sum()
    }
}
