//! The publishing thread: takes records off the queue in order, batches and encodes their
//! events, and sends each batch as one three-frame message on the PUB socket (topic,
//! sequence, payload). A call whose tenant, key or group is not UTF-8 gets a message of its
//! own. After `kv_events_heartbeat_ms` without a message it sends one with no event.
//!
//! The socket is an XPUB so that the thread sees what peers subscribe to: the stream has one
//! topic, and a subscription to anything but a prefix of it could never match (libzmq keeps
//! it for as long as the peer stays). Such a subscription is counted; a peer that keeps
//! sending them is cut off ([`Refusals`]).

use super::record::Record;
use super::scan::ScanLog;
use super::shared::Shared;
use crate::error::CreateError;
use crate::event::Event;
use crate::logging::{log, Level, RateLimited};
use crate::recovery::replay::Ring;
use crate::stats::Counters;
use crate::threads;
use crate::transport::connections::Listeners;
use crate::wire::encode::{needs_own_message, Encoder, MAX_BATCH_EVENTS};
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long the thread naps between looks at the queue while calls keep coming: the longest
/// a lone call's events wait, and producers never pay a system call to wake it.
const NAP: Duration = Duration::from_micros(200);

/// After this long without a call the thread sleeps until the next call wakes it.
const IDLE_AFTER: Duration = Duration::from_millis(20);

/// How long an idle thread sleeps between checks that do not rely on being woken.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// How long shutdown may spend sending what is queued and letting the socket deliver it.
pub(crate) const SHUTDOWN_LINGER: Duration = Duration::from_secs(1);

/// Subscriptions that can never match one peer may send within [`REFUSALS_WINDOW`] before it
/// is cut off: a client that guessed the topic wrong once keeps its connection (and reads
/// nothing); one that floods them goes.
const REFUSALS_ALLOWED: u32 = 8;
const REFUSALS_WINDOW: Duration = Duration::from_secs(10);

/// The publishing thread's state; it owns the socket and the encoder.
pub(crate) struct Worker {
    shared: Arc<Shared>,
    socket: zmq::Socket,
    endpoint: String,
    encoder: Encoder,
    scans: ScanLog,
    batch: Vec<Record>,
    batch_events: usize,
    /// The transport sequence the next message takes; every number below it was taken, by a
    /// message, sent or not, or by a dropped event. The first message is 0, as vLLM numbers.
    next_sequence: u64,
    /// `dropped_events` when numbers were last taken for drops: the growth since is the
    /// next gap.
    dropped_seen: u64,
    payload: Vec<u8>,
    send_failures: RateLimited,
    /// To cut a peer off by the descriptor its subscription came from.
    listeners: Arc<Listeners>,
    refused_subscriptions: RateLimited,
    refusals: Refusals,
    /// The first frame of every message.
    topic: Vec<u8>,
    heartbeat: Option<Duration>,
    /// When the last message went out (or the thread started).
    last_message: Instant,
    /// What was sent, for the replay socket, when there is one.
    ring: Option<Arc<Ring>>,
}

/// What the publishing thread needs besides the state it shares with the callers.
pub(crate) struct Outlet {
    pub(crate) socket: zmq::Socket,
    pub(crate) endpoint: String,
    pub(crate) listeners: Arc<Listeners>,
    pub(crate) ring: Option<Arc<Ring>>,
    pub(crate) topic: Vec<u8>,
    /// `kv_events_heartbeat_ms`, when on.
    pub(crate) heartbeat: Option<Duration>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("next_sequence", &self.next_sequence)
            .finish_non_exhaustive()
    }
}

impl Worker {
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        outlet: Outlet,
        encoder: Encoder,
    ) -> Result<JoinHandle<()>, CreateError> {
        let worker = Worker {
            shared,
            socket: outlet.socket,
            endpoint: outlet.endpoint,
            listeners: outlet.listeners,
            ring: outlet.ring,
            refused_subscriptions: RateLimited::new(Duration::from_secs(10)),
            refusals: Refusals::default(),
            topic: outlet.topic,
            heartbeat: outlet.heartbeat,
            last_message: Instant::now(),
            encoder,
            scans: ScanLog::default(),
            batch: Vec::with_capacity(MAX_BATCH_EVENTS),
            batch_events: 0,
            next_sequence: 0,
            dropped_seen: 0,
            payload: Vec::with_capacity(64 * 1024),
            send_failures: RateLimited::new(Duration::from_secs(10)),
        };
        threads::spawn("kv-events-pub", move || worker.run())
    }

    fn run(mut self) {
        let mut last_call = Instant::now();
        loop {
            // Read before draining: whatever was queued before shutdown began is then sent.
            let closing = self.shared.is_closing();
            self.take_subscriptions();
            let (taken, _) = self.drain(None);
            if closing {
                break;
            }
            let now = Instant::now();
            if taken > 0 {
                last_call = now;
            }
            if now.duration_since(last_call) < IDLE_AFTER {
                self.shared.queue.nap(NAP);
            } else {
                self.shared.queue.sleep(self.heartbeat_due().min(IDLE_WAIT));
            }
            if self.heartbeat_due().is_zero() {
                self.send_heartbeat();
            }
        }
        let deadline = Instant::now() + SHUTDOWN_LINGER;
        let (_, dropped) = self.drain(Some(deadline));
        if dropped > 0 {
            log(
                Level::Warn,
                &format!("shutdown: {dropped} queued events could not be sent within the linger and were dropped"),
            );
        }
        let counters = &self.shared.counters;
        log(
            Level::Info,
            &format!(
                "kv events publisher stopped: {} events in {} batches, {} dropped, next sequence {}",
                counters.published_events.load(Relaxed),
                counters.published_batches.load(Relaxed),
                counters.dropped_events.load(Relaxed),
                self.next_sequence
            ),
        );
        let linger = deadline.saturating_duration_since(Instant::now());
        let _ = self.socket.set_linger(linger.as_millis() as i32);
        // Dropping the socket and with it the last handle on its context waits, at most the
        // linger, for ZeroMQ to hand queued messages to subscribers. With CURVE or an
        // allow-list, the last handle is the thread kv-events-zap's, which shutdown joins
        // next: the wait happens there, within the same bound.
        drop(self.socket);
        // ZeroMQ leaves the file of an ipc endpoint behind; it is ours, as binding replaced
        // whatever was there.
        if let Some(path) = self.endpoint.strip_prefix("ipc://") {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Reads what peers sent: subscriptions to a prefix of the topic (the empty one
    /// included) and their cancellations are libzmq's business; anything else is refused
    /// and counted, and a peer that keeps sending them is cut off.
    fn take_subscriptions(&mut self) {
        let mut message = zmq::Message::new();
        while self.socket.recv(&mut message, zmq::DONTWAIT).is_ok() {
            if let [0 | 1, prefix @ ..] = &message[..] {
                if self.topic.starts_with(prefix) {
                    continue;
                }
            }
            Counters::add(&self.shared.counters.peers.subscriptions_refused, 1);
            let fd = message.gets("__fd").and_then(|fd| fd.parse().ok());
            let flood = fd.is_some_and(|fd| self.refusals.one_more(fd, Instant::now()));
            let cut = flood && fd.is_some_and(|fd| self.listeners.cut(fd));
            let size = message.len();
            let topic = String::from_utf8_lossy(&self.topic).into_owned();
            self.refused_subscriptions.log(Level::Warn, || {
                format!(
                    "refused a subscription of {size} bytes: it is no prefix of the stream's \
                     topic {topic:?}, so it can match nothing{}",
                    if cut {
                        "; its peer kept sending such and was disconnected"
                    } else {
                        ""
                    }
                )
            });
        }
    }

    /// How long until a heartbeat is due: `Duration::MAX` when heartbeats are off, zero
    /// when one is due now.
    fn heartbeat_due(&self) -> Duration {
        self.heartbeat.map_or(Duration::MAX, |every| {
            every.saturating_sub(self.last_message.elapsed())
        })
    }

    /// Sends a message with the next sequence and no event, so that a subscriber that lost
    /// the last messages before a silence sees the gap.
    fn send_heartbeat(&mut self) {
        self.number_drops();
        self.encoder
            .encode_batch(now_ms(), 0, std::iter::empty(), &mut self.payload);
        if self.send_payload().is_ok() {
            Counters::add(&self.shared.counters.heartbeats, 1);
        }
    }

    /// Sends `payload` as the next message, `[topic, sequence, payload]`, for the replay
    /// socket too, counting a failure.
    fn send_payload(&mut self) -> zmq::Result<()> {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.shared
            .counters
            .next_sequence
            .store(self.next_sequence, Relaxed);
        self.last_message = Instant::now();
        let sent = self
            .socket
            .send(&self.topic[..], zmq::SNDMORE)
            .and_then(|()| self.socket.send(&sequence.to_be_bytes()[..], zmq::SNDMORE))
            .and_then(|()| self.socket.send(&self.payload[..], 0));
        if let Some(ring) = &self.ring {
            ring.sent(sequence, sent.is_ok().then_some(&self.payload[..]));
        }
        if let Err(e) = sent {
            Counters::add(&self.shared.counters.send_failures, 1);
            self.send_failures.log(Level::Warn, || {
                format!("sending message {sequence} failed: {e}; its events are lost")
            });
        }
        sent
    }

    /// Takes every queued record and sends what they hold; past `deadline`, records are
    /// counted as dropped instead. Returns how many records it took and how many events it
    /// dropped.
    fn drain(&mut self, deadline: Option<Instant>) -> (usize, usize) {
        let (mut taken, mut dropped) = (0, 0);
        loop {
            if self.batch_events == 0 {
                self.number_drops();
            }
            let Some(record) = self.shared.queue.pop() else {
                break;
            };
            taken += 1;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                dropped += record.event_count();
                record.recycle(&self.shared.strings);
                continue;
            }
            self.accept(record);
        }
        self.send_batch();
        if dropped > 0 {
            Counters::add(&self.shared.counters.dropped_events, dropped);
        }
        (taken, dropped)
    }

    fn accept(&mut self, record: Record) {
        self.scans.advance();
        // A record's events share its tenant, key and group: the first one tells.
        let not_utf8 = events_of(&record)
            .next()
            .is_some_and(|event| needs_own_message(&event));
        if not_utf8 && self.encoder.skips_non_utf8() {
            // Dropped before it takes a sequence number: no reader sees a gap for it.
            Counters::add(
                &self.shared.counters.skipped_non_utf8_events,
                record.event_count(),
            );
            record.recycle(&self.shared.strings);
            return;
        }
        match record {
            Record::Object(ref object) => {
                if object.adds_medium() {
                    self.scans.medium_added(object.tenant());
                }
                self.add_to_batch(record, not_utf8);
            }
            Record::Cleared(ref cleared) => {
                if self.scans.may_clear(cleared.scan, &cleared.tenant) {
                    self.add_to_batch(record, not_utf8);
                } else {
                    Counters::add(&self.shared.counters.cleared_suppressed, 1);
                }
            }
            Record::ScanBegin(scan) => self.scans.begin(scan),
            Record::Flush(done) => {
                self.send_batch();
                let _ = done.send(());
            }
        }
    }

    /// Keeps a call's events in one batch: a record that does not fit starts the next one.
    /// A record whose strings are not all UTF-8 (`alone`) goes in a batch of its own: the
    /// batch before it is sent first, and it is sent at once.
    fn add_to_batch(&mut self, record: Record, alone: bool) {
        let events = record.event_count();
        if alone || self.batch_events + events > MAX_BATCH_EVENTS {
            self.send_batch();
        }
        self.batch_events += events;
        self.batch.push(record);
        if alone {
            self.send_batch();
        }
    }

    /// Takes a sequence number for each event dropped since the last look, between
    /// batches: a full queue drops its oldest records, which are newer than every record
    /// this thread took and older than every one it will take, so their gap goes here, in
    /// their place in the stream. A subscriber that asks `info` sees it even when no message
    /// follows, and a snapshot's sequence taken now covers only events that are behind it.
    fn number_drops(&mut self) {
        let dropped = self.shared.counters.dropped_events.load(Acquire);
        if dropped == self.dropped_seen {
            return;
        }
        self.next_sequence += dropped - self.dropped_seen;
        self.dropped_seen = dropped;
        self.shared
            .counters
            .next_sequence
            .store(self.next_sequence, Relaxed);
        if let Some(ring) = &self.ring {
            ring.taken(self.next_sequence);
        }
    }

    fn send_batch(&mut self) {
        if self.batch_events == 0 {
            return;
        }
        self.encoder.encode_batch(
            now_ms(),
            self.batch_events,
            self.batch.iter().flat_map(events_of),
            &mut self.payload,
        );
        if self.send_payload().is_ok() {
            let counters = &self.shared.counters;
            Counters::add(&counters.published_batches, 1);
            Counters::add(&counters.published_events, self.batch_events);
        }
        for record in self.batch.drain(..) {
            record.recycle(&self.shared.strings);
        }
        self.batch_events = 0;
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Refused subscriptions per peer (by descriptor) within [`REFUSALS_WINDOW`].
#[derive(Debug, Default)]
struct Refusals(HashMap<RawFd, (u32, Instant)>);

impl Refusals {
    /// Counts one more from the peer on `fd`; true when it went past [`REFUSALS_ALLOWED`]
    /// (then it is forgotten, as it is about to be cut off).
    fn one_more(&mut self, fd: RawFd, now: Instant) -> bool {
        // A descriptor number outlives its connection here; an old count lapses instead.
        self.0
            .retain(|_, (_, since)| now.duration_since(*since) < REFUSALS_WINDOW);
        let (count, _) = self.0.entry(fd).or_insert((0, now));
        *count += 1;
        if *count <= REFUSALS_ALLOWED {
            return false;
        }
        self.0.remove(&fd);
        true
    }
}

fn events_of(record: &Record) -> impl Iterator<Item = Event<'_>> {
    let (object, cleared) = match record {
        Record::Object(o) => (Some(o), None),
        Record::Cleared(c) => (None, Some(c.event())),
        Record::ScanBegin(_) | Record::Flush(_) => (None, None),
    };
    object.into_iter().flat_map(|o| o.events()).chain(cleared)
}
