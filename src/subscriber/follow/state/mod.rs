//! One publisher followed, without its sockets: its index and the state machine that keeps
//! the index in sync. It takes what the sockets bring (a stream message, a reply of the replay
//! socket, the stream's connection lost) and the time passing (`tick`), each with the current
//! instant, and answers with [`Action`]s: a request to send, a request to give up, a notice.
//! It reads no clock and owns no socket, so that each step can be driven by hand (`tests.rs`
//! does, case by case); the links (`links.rs`) drive it with real sockets. Here: the stream
//! and the timers; in `replies.rs`: what the replay socket's answers mean.
//!
//! Its phases, for a publisher with a replay socket: joining (the first snapshot due or under
//! way, live messages held), live (messages applied as they come; a quiet check may be under
//! way), recovering (a gap or a new life found: `info`, then a replay or a snapshot, live
//! messages held meanwhile). Without a replay socket it is live from its first message on, and
//! a gap can only be counted.

mod replies;

use super::changes::Changes;
use super::notice::{FollowerCounters, NoticeKind, Status};
use super::options::FollowOptions;
use crate::subscriber::index::Index;
use crate::wire::{Checked, Request};
use std::collections::BTreeMap;
use std::mem;
use std::ops::Deref;
use std::time::Instant;

/// What the state asks of its links, in order.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Send this request on the replay socket; if it cannot go, say so with
    /// [`FollowerState::send_failed`].
    Send(Request),
    /// Replace the replay socket: the request under way was given up, and a late reply to it
    /// must not be taken for the next one's.
    Cancel,
    /// Tell the caller.
    Notice(NoticeKind),
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

impl Ask {
    fn what(&self) -> &'static str {
        match self {
            Ask::Info(_) => "info",
            Ask::Replay { .. } => "a replay",
            Ask::Snapshot { .. } => "a snapshot",
        }
    }
}

/// Why `info` was asked.
#[derive(Clone, Copy, Debug)]
enum Purpose {
    /// Messages `from..until` are missing: does the buffer hold them?
    Gap { from: u64, until: u64 },
    /// The stream is quiet: was its end lost, did the publisher restart?
    Quiet,
}

/// One publisher's index and where its recovery stands; `M` holds a live message's bytes
/// while it is held (libzmq's buffer in the follower, a `Vec` in tests).
pub(super) struct FollowerState<M> {
    options: FollowOptions,
    /// The replay endpoint, for what notices say; `None`: the publisher has none, and the
    /// stream is all there is.
    replay_endpoint: Option<String>,
    pub(super) index: Index,
    /// What changed in `index` since [`Follower::take_changes`](super::Follower::take_changes),
    /// when tracked.
    pub(super) changes: Option<Changes>,
    /// The messages applied and not taken yet (incarnation, sequence, payload), when
    /// [`FollowOptions::keep_applied`] is on.
    pub(super) applied: Option<Vec<(u64, u64, Vec<u8>)>>,
    incarnation: Option<u64>,
    /// The sequence of the next stream message the index takes: it reflects every one
    /// below. `None` before the first snapshot (the first message, without a replay socket).
    next_sequence: Option<u64>,
    /// The last sequence the stream delivered: it only grows within one life.
    stream_last: Option<u64>,
    /// Live messages received and not applied yet, by sequence.
    held: BTreeMap<u64, Checked<M>>,
    /// Their payloads' bytes.
    held_bytes: usize,
    asking: Option<Ask>,
    /// When the last reply frame (or the request) was seen.
    asked_at: Instant,
    snapshot_due: bool,
    /// No request goes out before this (after a failure).
    not_before: Instant,
    /// The start of the gap last counted, so that a retry is not counted again.
    gap_counted: Option<u64>,
    /// The `next_sequence` a quiet check found beyond what the stream delivered: the end of
    /// a burst is lost only if the next check finds the stream still short of it.
    promised: Option<u64>,
    /// The sequence went back and was counted as a new life: the snapshot that follows
    /// does not count it again.
    restart_counted: bool,
    /// Without a replay socket: the index holds every message of this life (the first one
    /// taken was 0, and none was missed since).
    complete: bool,
    /// When the index stopped being in sync, until it is again.
    incident: Option<Instant>,
    last_stream: Instant,
    last_check: Instant,
    pub(super) last_heard: Option<Instant>,
    failing: Option<String>,
    refused: Option<String>,
    pub(super) counters: FollowerCounters,
    out: Vec<Action>,
}

impl<M: Deref<Target = [u8]>> FollowerState<M> {
    /// A publisher followed from `now`; with a replay socket, the first snapshot is due.
    pub(super) fn new(
        options: &FollowOptions,
        replay_endpoint: Option<String>,
        now: Instant,
    ) -> FollowerState<M> {
        FollowerState {
            options: options.clone(),
            snapshot_due: replay_endpoint.is_some(),
            replay_endpoint,
            index: Index::new(),
            changes: options.track_changes.then(Changes::everything),
            applied: options.keep_applied.then(Vec::new),
            incarnation: None,
            next_sequence: None,
            stream_last: None,
            held: BTreeMap::new(),
            held_bytes: 0,
            asking: None,
            asked_at: now,
            not_before: now,
            gap_counted: None,
            promised: None,
            restart_counted: false,
            complete: false,
            incident: Some(now),
            last_stream: now,
            last_check: now,
            last_heard: None,
            failing: None,
            refused: None,
            counters: FollowerCounters::default(),
            out: Vec::new(),
        }
    }

    /// Where this publisher's index stands; `endpoint` is its PUB endpoint.
    pub(super) fn status(&self, endpoint: &str) -> Status {
        Status {
            endpoint: endpoint.to_owned(),
            incarnation: self.incarnation,
            next_sequence: self.next_sequence,
            in_sync: self.in_sync(),
            last_heard: self.last_heard,
            failing: self.failing.clone(),
        }
    }

    /// Whether the index is what the publisher holds, as far as anything tells: with a replay
    /// socket, a snapshot taken and no recovery under way (a quiet check may be); without,
    /// every message of the publisher's life applied.
    pub(super) fn in_sync(&self) -> bool {
        if self.replay_endpoint.is_none() {
            return self.next_sequence.is_some() && self.complete;
        }
        self.next_sequence.is_some()
            && !self.snapshot_due
            && self.held.is_empty()
            && matches!(self.asking, None | Some(Ask::Info(Purpose::Quiet)))
    }

    fn notice(&mut self, kind: NoticeKind) {
        self.out.push(Action::Notice(kind));
    }

    fn actions(&mut self) -> Vec<Action> {
        mem::take(&mut self.out)
    }

    /// A stream message that does not pass the wire format's checks.
    pub(super) fn malformed(&mut self, why: String) -> Vec<Action> {
        self.counters.malformed += 1;
        self.notice(NoticeKind::Malformed(why));
        self.actions()
    }

    /// The publisher refused this subscriber's handshake; said once until a message arrives.
    pub(super) fn refused(&mut self, why: String) -> Vec<Action> {
        if self.refused.as_ref() != Some(&why) {
            self.notice(NoticeKind::Refused(why.clone()));
            self.refused = Some(why);
        }
        self.actions()
    }

    /// Reading the stream failed; said once while it keeps failing the same way.
    pub(super) fn read_failed(&mut self, why: String) -> Vec<Action> {
        if self.failing.as_ref() != Some(&why) {
            self.notice(NoticeKind::Failed(why.clone()));
            self.failing = Some(why);
        }
        self.actions()
    }

    /// The stream's connection closed: `info` is asked at the next tick, since the publisher
    /// may come back as a new life.
    pub(super) fn disconnected(&mut self, now: Instant) -> Vec<Action> {
        self.notice(NoticeKind::Disconnected);
        self.last_check = now.checked_sub(self.options.quiet_check).unwrap_or(now);
        self.last_stream = self.last_check;
        self.actions()
    }

    /// A message from the stream.
    pub(super) fn on_stream(&mut self, message: Checked<M>, now: Instant) -> Vec<Action> {
        self.last_stream = now;
        self.last_heard = Some(now);
        self.refused = None;
        let sequence = message.sequence;
        if let Some(last) = self.stream_last.filter(|last| sequence <= *last) {
            self.counters.incarnations += 1;
            self.notice(NoticeKind::SequenceBack { last, sequence });
            if self.replay_endpoint.is_some() {
                self.restart_counted = true;
                self.restart(now);
            } else {
                // Nothing tells what the new life holds but its stream, from here on.
                self.replace_index(Index::new());
                self.next_sequence = None;
                self.incident.get_or_insert(now);
            }
        }
        self.stream_last = Some(sequence);
        if self.replay_endpoint.is_none() {
            self.take_stream_only(&message, now);
            return self.actions();
        }
        // The usual case, in sync: applied as it arrives, never held.
        if self.held.is_empty() && self.applies_now() && self.next_sequence == Some(sequence) {
            self.apply(&message);
            return self.actions();
        }
        if self.held.len() >= self.options.max_held
            || self.held_bytes + message.payload_bytes() > self.options.max_held_bytes
        {
            self.counters.overflowed += 1;
            return self.actions();
        }
        self.held_bytes += message.payload_bytes();
        self.held.insert(sequence, message);
        self.drain();
        self.actions()
    }

    /// A live message when the stream is all there is: applied, whatever it follows.
    fn take_stream_only(&mut self, message: &Checked<M>, now: Instant) {
        let sequence = message.sequence;
        match self.next_sequence {
            None => {
                // A life's first message is 0: joined there, nothing came before.
                self.complete = sequence == 0;
                if self.complete {
                    self.converged(now);
                }
            }
            Some(next) if sequence > next => {
                self.counters.gaps += 1;
                self.counters.unrecoverable += 1;
                self.complete = false;
                self.notice(NoticeKind::Unrecoverable {
                    from: next,
                    through: sequence - 1,
                });
            }
            Some(_) => {}
        }
        self.apply(message);
    }

    /// Whether stream messages that follow the index may be applied: not while a snapshot
    /// is due or under way, which will replace the index.
    fn applies_now(&self) -> bool {
        !self.snapshot_due && !matches!(self.asking, Some(Ask::Snapshot { .. }))
    }

    /// Forgets what is held and whatever was asked, and calls for a snapshot.
    fn restart(&mut self, now: Instant) {
        self.held.clear();
        self.held_bytes = 0;
        self.promised = None;
        self.cancel();
        self.snapshot_due = true;
        self.not_before = now;
        self.incident.get_or_insert(now);
    }

    /// Gives up the request under way.
    fn cancel(&mut self) {
        if self.asking.take().is_some() {
            self.out.push(Action::Cancel);
        }
    }

    fn replace_index(&mut self, index: Index) {
        self.index = index;
        if let Some(changes) = &mut self.changes {
            *changes = Changes::everything();
        }
    }

    /// Applies the held messages that follow the index, and drops those it covers.
    /// Nothing while a snapshot is due or under way: it will replace the index.
    fn drain(&mut self) {
        if !self.applies_now() {
            return;
        }
        let Some(mut next) = self.next_sequence else {
            return;
        };
        while let Some(entry) = self.held.first_entry() {
            let sequence = *entry.key();
            if sequence > next {
                break;
            }
            let message = entry.remove();
            self.held_bytes -= message.payload_bytes();
            if sequence < next {
                self.counters.discarded += 1;
            } else {
                self.apply(&message);
                next = sequence.saturating_add(1);
            }
        }
    }

    /// Applies one message that follows the index, decoding its events as it goes.
    fn apply(&mut self, message: &Checked<impl Deref<Target = [u8]>>) {
        let (mut skipped, mut first_why) = (0, None);
        for event in message.changes() {
            match self.index.apply_change(&event) {
                Ok(applied) => {
                    self.counters.events += 1;
                    if let Some(changes) = &mut self.changes {
                        changes.note(&event, applied);
                    }
                }
                Err(why) => {
                    skipped += 1;
                    first_why.get_or_insert(why);
                }
            }
        }
        if let Some(why) = first_why {
            self.counters.skipped_events += skipped;
            self.notice(NoticeKind::Skipped(format!(
                "{skipped} of message {}, the first: {why}",
                message.sequence
            )));
        }
        self.counters.messages += 1;
        self.next_sequence = Some(message.sequence.saturating_add(1));
        if let Some(applied) = &mut self.applied {
            let incarnation = self.incarnation.unwrap_or_default();
            applied.push((incarnation, message.sequence, message.payload().to_vec()));
        }
    }

    /// Lets time pass: gives up a request that timed out, sends the one the state calls for,
    /// and notices the index back in sync.
    pub(super) fn tick(&mut self, now: Instant) -> Vec<Action> {
        let Some(endpoint) = self.replay_endpoint.clone() else {
            return self.actions();
        };
        if let Some(ask) = &self.asking {
            if now.duration_since(self.asked_at) >= self.options.request_timeout {
                let what = ask.what();
                self.cancel();
                let timeout = self.options.request_timeout.as_secs_f64();
                self.fail(
                    format!("{what} to {endpoint} got no answer within {timeout} s"),
                    now,
                );
            }
        }
        if self.asking.is_some() || now < self.not_before {
            return self.actions();
        }
        if self.snapshot_due {
            let snapshot = Ask::Snapshot {
                staged: Index::new(),
                events: 0,
                started: now,
                bad: None,
            };
            self.send(Request::Snapshot { tenant: None }, snapshot, now);
            return self.actions();
        }
        self.drain();
        let Some(from) = self.next_sequence else {
            return self.actions();
        };
        if let Some(&head) = self.held.keys().next() {
            // The held messages do not follow the index: a gap.
            if self.gap_counted != Some(from) {
                self.gap_counted = Some(from);
                self.counters.gaps += 1;
                self.incident.get_or_insert(now);
            }
            let purpose = Purpose::Gap { from, until: head };
            self.send(Request::Info, Ask::Info(purpose), now);
            return self.actions();
        }
        self.converged(now);
        if now.duration_since(self.last_stream.max(self.last_check)) >= self.options.quiet_check {
            self.last_check = now;
            self.send(Request::Info, Ask::Info(Purpose::Quiet), now);
        }
        self.actions()
    }

    /// The index is in sync: the incident under way, if any, is over.
    fn converged(&mut self, now: Instant) {
        if let Some(since) = self.incident.take() {
            let took = now.duration_since(since);
            self.counters.convergences += 1;
            self.counters.last_convergence = Some(took);
            self.counters.longest_convergence = self.counters.longest_convergence.max(took);
            self.notice(NoticeKind::InSync { took });
        }
    }

    fn send(&mut self, request: Request, ask: Ask, now: Instant) {
        self.asking = Some(ask);
        self.asked_at = now;
        self.out.push(Action::Send(request));
    }

    /// The request just sent could not go.
    pub(super) fn send_failed(&mut self, why: String, now: Instant) -> Vec<Action> {
        // A snapshot stays due until one ends.
        self.asking = None;
        self.fail(why, now);
        self.actions()
    }

    /// A request failed: counted, noticed unless it is the same failure again, retried
    /// after [`FollowOptions::retry_after`].
    fn fail(&mut self, why: String, now: Instant) {
        self.counters.failed_requests += 1;
        if self.failing.as_ref() != Some(&why) {
            self.notice(NoticeKind::Failed(why.clone()));
            self.failing = Some(why);
        }
        self.not_before = now + self.options.retry_after;
    }
}

#[cfg(test)]
mod tests;
