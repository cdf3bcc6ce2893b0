//! One publisher followed: its sockets, its index, and the state machine that keeps the index
//! in sync (what to ask the replay socket, what the answers mean).

use super::changes::Changes;
use super::notice::{Counters, Happened, Status};
use super::options::{FollowOptions, Upstream};
use crate::subscriber::index::{json_bytes, Index};
use crate::subscriber::watch::{Subscriber, SubscriberOptions, WatchError};
use crate::wire::replay::verb;
use crate::wire::{Checked, Info, Replayed, Request, SnapshotEnd};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::time::{Duration, Instant};

/// How long one publisher's sockets are read before the others, and the timers, get their
/// turn: half of it for the stream, the rest for the replay socket.
const READ_BUDGET: Duration = Duration::from_millis(20);

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
pub(super) struct Followed {
    upstream: Upstream,
    context: zmq::Context,
    subscriber: Subscriber,
    dealer: zmq::Socket,
    pub(super) index: Index,
    /// What changed in `index` since [`Follower::take_changes`](super::Follower::take_changes),
    /// when tracked.
    pub(super) changes: Option<Changes>,
    /// The messages applied and not taken yet (incarnation, sequence, payload), when
    /// [`FollowOptions::keep_applied`] is on.
    pub(super) applied: Option<Vec<(u64, u64, Vec<u8>)>>,
    incarnation: Option<u64>,
    /// The sequence of the next stream message the index takes: it reflects every one
    /// below. `None` before the first snapshot.
    next: Option<u64>,
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
    /// The `next_sequence` a quiet check found beyond what the stream delivered: the end of
    /// a burst is lost only if the next check finds the stream still short of it.
    promised: Option<u64>,
    /// The sequence went back and was counted as a new life: the snapshot that follows
    /// does not count it again.
    restart_counted: bool,
    /// When the index stopped being in sync, until it is again.
    incident: Option<Instant>,
    last_stream: Instant,
    last_check: Instant,
    pub(super) last_heard: Option<Instant>,
    connections_lost: u64,
    failing: Option<String>,
    refused: Option<String>,
    pub(super) counters: Counters,
}

impl fmt::Debug for Followed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Followed")
            .field("endpoint", &self.upstream.endpoint)
            .field("next", &self.next)
            .field("objects", &self.index.objects())
            .finish_non_exhaustive()
    }
}

impl Followed {
    /// Subscribes to `upstream` and connects its replay socket; the first snapshot is due.
    pub(super) fn open(
        upstream: Upstream,
        options: &FollowOptions,
        now: Instant,
    ) -> Result<Followed, String> {
        let subscriber = Subscriber::open(
            &upstream.endpoint,
            &SubscriberOptions {
                rcvhwm: options.rcvhwm,
                curve: upstream.curve.clone(),
                max_message_bytes: options.max_message_bytes,
                topic: upstream.topic.clone(),
            },
        )
        .map_err(|e| format!("cannot subscribe to {}: {e}", upstream.endpoint))?;
        let context = zmq::Context::new();
        let dealer = open_dealer(&context, &upstream, options)?;
        Ok(Followed {
            upstream,
            context,
            subscriber,
            dealer,
            index: Index::new(),
            changes: options.track_changes.then(Changes::everything),
            applied: options.keep_applied.then(Vec::new),
            incarnation: None,
            next: None,
            stream_last: None,
            pending: BTreeMap::new(),
            pending_bytes: 0,
            asking: None,
            asked_at: now,
            snapshot_due: true,
            not_before: now,
            gap_counted: None,
            promised: None,
            restart_counted: false,
            incident: Some(now),
            last_stream: now,
            last_check: now,
            last_heard: None,
            connections_lost: 0,
            failing: None,
            refused: None,
            counters: Counters::default(),
        })
    }

    /// Where this publisher's index stands.
    pub(super) fn status(&self) -> Status {
        Status {
            endpoint: self.upstream.endpoint.clone(),
            incarnation: self.incarnation,
            next_sequence: self.next,
            in_sync: self.in_sync(),
            last_heard: self.last_heard,
            failing: self.failing.clone(),
        }
    }

    /// What the follower's poll waits on: the stream and the replay socket.
    pub(super) fn poll_items(&self) -> [zmq::PollItem<'_>; 2] {
        [
            self.subscriber.poll_item(),
            self.dealer.as_poll_item(zmq::POLLIN),
        ]
    }
}

fn open_dealer(
    context: &zmq::Context,
    upstream: &Upstream,
    options: &FollowOptions,
) -> Result<zmq::Socket, String> {
    let failed = |e: zmq::Error| format!("cannot connect to {}: {e}", upstream.replay_endpoint);
    let socket = context.socket(zmq::DEALER).map_err(failed)?;
    socket.set_linger(0).map_err(failed)?;
    socket
        .set_maxmsgsize(i64::try_from(options.max_message_bytes).unwrap_or(i64::MAX))
        .map_err(failed)?;
    if let Some(curve) = &upstream.curve {
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
    socket.connect(&upstream.replay_endpoint).map_err(failed)?;
    Ok(socket)
}

impl Followed {
    pub(super) fn in_sync(&self) -> bool {
        self.next.is_some()
            && !self.snapshot_due
            && self.pending.is_empty()
            && matches!(self.asking, None | Some(Ask::Info(Purpose::Quiet)))
    }

    /// Reads what the two sockets hold.
    pub(super) fn read(&mut self, options: &FollowOptions, notice: &mut impl FnMut(Happened)) {
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
                    let why = format!("reading {}: {e}", self.upstream.endpoint);
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
        if self.pending.is_empty() && self.applies_now() && self.next == Some(sequence) {
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
        self.promised = None;
        self.cancel(options);
        self.snapshot_due = true;
        self.not_before = Instant::now();
        self.incident.get_or_insert_with(Instant::now);
    }

    /// Gives up the request under way: the DEALER is replaced, so that no late reply to it
    /// can be taken for the next request's.
    fn cancel(&mut self, options: &FollowOptions) {
        if self.asking.take().is_some() {
            if let Ok(fresh) = open_dealer(&self.context, &self.upstream, options) {
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
        let Some(mut next) = self.next else {
            return;
        };
        while let Some(entry) = self.pending.first_entry() {
            let sequence = *entry.key();
            if sequence > next {
                break;
            }
            let message = entry.remove();
            self.pending_bytes -= message.payload_bytes();
            if sequence < next {
                self.counters.discarded += 1;
            } else {
                self.apply(&message, notice);
                next = sequence.saturating_add(1);
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
            notice(Happened::Skipped(format!(
                "{skipped} of message {}, the first: {why}",
                message.sequence
            )));
        }
        self.counters.messages += 1;
        self.next = Some(message.sequence.saturating_add(1));
        if let Some(applied) = &mut self.applied {
            let incarnation = self.incarnation.unwrap_or_default();
            applied.push((incarnation, message.sequence, message.payload().to_vec()));
        }
    }

    /// Sends the request the state calls for, gives up one that timed out, and notices the
    /// index back in sync.
    pub(super) fn act(&mut self, options: &FollowOptions, notice: &mut impl FnMut(Happened)) {
        let now = Instant::now();
        if self.asking.is_some() && now.duration_since(self.asked_at) >= options.request_timeout {
            let what = self.asking_what();
            self.cancel(options);
            self.fail(
                format!(
                    "{what} to {} got no answer within {} s",
                    self.upstream.replay_endpoint,
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
        let Some(from) = self.next else { return };
        if let Some(&head) = self.pending.keys().next() {
            // The buffered messages do not follow the index: a gap.
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
                format!("cannot ask {}: {e}", self.upstream.replay_endpoint),
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
        let endpoint = self.upstream.replay_endpoint.clone();
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
                        self.fail(e.to_string(), options, notice);
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
        let Some(next) = self.next else { return };
        let (from, until) = match purpose {
            Purpose::Gap { from, until } => (from, until),
            Purpose::Quiet => {
                let seen = self.stream_last.map_or(0, |last| last + 1).max(next);
                let promised = self.promised.take();
                if info.next_sequence <= seen || !self.pending.is_empty() {
                    return;
                }
                // A reply ahead of the stream may be ahead of this reader only: after a
                // stall, the messages still wait in its socket. The end of a burst was lost
                // when the next check finds the stream short of what this one was told.
                if promised.is_none_or(|promised| seen >= promised) {
                    self.promised = Some(info.next_sequence);
                    return;
                }
                // No later message would show the loss.
                self.counters.gaps += 1;
                self.gap_counted = Some(next);
                self.incident.get_or_insert_with(Instant::now);
                (next, info.next_sequence)
            }
        };
        // An empty buffer says its oldest is the next sequence, beyond any gap.
        if info.oldest_sequence <= from {
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
        let Some(next) = self.next else { return };
        let number = u64::from_be_bytes(sequence.try_into().unwrap_or_default());
        if number != next || number >= until {
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
        let next = self.next.unwrap_or(0);
        if next >= until {
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
                next,
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
        let decoded = SnapshotEnd::decode(body).map_err(|e| e.to_string());
        let end = decoded.and_then(|end| match bad {
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
                    format!("a snapshot from {}: {why}", self.upstream.replay_endpoint),
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
        self.next = Some(end.next_sequence);
        self.index = staged;
        if let Some(changes) = &mut self.changes {
            *changes = Changes::everything();
        }
        self.snapshot_due = false;
        self.gap_counted = None;
        self.counters.snapshots += 1;
        notice(Happened::Snapshot {
            objects: self.index.objects(),
            events,
            next_sequence: end.next_sequence,
            incarnation: end.incarnation,
            took: started.elapsed(),
        });
        self.drain(notice);
        // What the stream delivered first is not N: replay what came between.
        if let Some(&head) = self.pending.keys().next() {
            self.replay(end.next_sequence, head, options, notice);
        }
    }
}
