//! The replay socket: a ROUTER beside the PUB socket, under the same access rules, through
//! which a subscriber learns where the stream stands and gets back what it missed.
//!
//! The protocol (requests, replies, the maps) is [`crate::wire::replay`]'s. One snapshot of a
//! scope at a time, shared by whoever asks for it while it is taken; a request for another
//! scope meanwhile is answered "busy". A request that is not the protocol's is counted in
//! `bad_requests`.
//!
//! The thread `kv-events-replay` owns the socket; the publishing thread only appends what it
//! sent to the [`Ring`], and a snapshot's thread hands over its messages. A replay is sent a
//! slice at a time, so one large replay neither stalls another nor takes the libzmq I/O thread
//! from the live stream for long. Payloads are lent to libzmq, never copied, within a window
//! per requester and a total ([`window`]); a requester whose window stays full, or whose queue
//! stays full, longer than [`STALLED_FOR`] is abandoned.

use super::fanout::{Fanout, Turn, RETAIN};
use super::requester::{self, Reply, Requester, STALLED_FOR};
use super::snapshot::{self, ObjectSource};
use crate::config::Config;
use crate::error::CreateError;
use crate::logging::{log, Level};
use crate::stats::PeerCounters;
use crate::threads;
use crate::transport::connections::Listeners;
use crate::wire::replay::{verb, ReplyForm};
use crate::wire::{Info, Request};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Replays sent at once; a request beyond them is answered "busy".
const MAX_REPLAYS: usize = 8;
/// Messages one replay sends before the others get their turn.
const SLICE: usize = 64;
/// Messages the socket holds for one requester that has not read them.
const SEND_HWM: i32 = 1000;
/// How long the thread waits for a request when no replay is under way.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// A message as sent: its sequence and its payload.
type Sent = (u64, Arc<[u8]>);

/// The messages sent recently, newest last, at most `capacity` bytes of payload.
#[derive(Debug)]
pub(crate) struct Ring {
    capacity: u64,
    /// The messages, and their payloads' bytes.
    held: Mutex<(VecDeque<Sent>, u64)>,
    /// The sequence the next message takes: every number below it was taken, by a message,
    /// delivered or not, or by dropped events.
    next_sequence: AtomicU64,
    counters: Arc<PeerCounters>,
}

impl Ring {
    pub(crate) fn new(capacity: u64, counters: Arc<PeerCounters>) -> Ring {
        Ring {
            capacity,
            held: Mutex::new((VecDeque::new(), 0)),
            next_sequence: AtomicU64::new(0),
            counters,
        }
    }

    /// The publishing thread took the numbers below `next` for events it dropped.
    pub(crate) fn taken(&self, next: u64) {
        self.next_sequence.store(next, Relaxed);
        self.note_oldest(&self.held.lock().unwrap_or_else(PoisonError::into_inner).0);
    }

    /// The sequence the next message takes: everything numbered below it happened before
    /// now.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence.load(Relaxed)
    }

    /// The publishing thread sent message `sequence`; `payload` when the socket took it.
    pub(crate) fn sent(&self, sequence: u64, payload: Option<&[u8]>) {
        self.next_sequence.store(sequence + 1, Relaxed);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(payload) = payload.filter(|p| p.len() as u64 <= self.capacity) else {
            // Nothing kept: an empty buffer's oldest moves on with the next sequence.
            self.note_oldest(&held.0);
            return;
        };
        let (messages, bytes) = &mut *held;
        messages.push_back((sequence, Arc::from(payload)));
        *bytes += payload.len() as u64;
        while *bytes > self.capacity {
            let Some((_, gone)) = messages.pop_front() else {
                break;
            };
            *bytes -= gone.len() as u64;
        }
        self.counters.replay_buffer_bytes.store(*bytes, Relaxed);
        self.note_oldest(messages);
    }

    /// Publishes the oldest sequence a replay can send in the stats: the first held, or the
    /// next one when none is held.
    fn note_oldest(&self, messages: &VecDeque<Sent>) {
        let oldest = messages.front().map_or(self.next_sequence(), |(s, _)| *s);
        self.counters.replay_oldest_sequence.store(oldest, Relaxed);
    }

    /// Up to `max` held messages with sequences from `from` up to, not including, `until`.
    fn slice(&self, from: u64, until: u64, max: usize) -> Vec<Sent> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let messages = &held.0;
        let start = messages.partition_point(|(s, _)| *s < from);
        messages
            .range(start..)
            .take_while(|(s, _)| *s < until)
            .take(max)
            .cloned()
            .collect()
    }

    /// The oldest sequence a replay can send: the first held, or the next one when none is.
    fn oldest(&self) -> u64 {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.0.front().map_or(self.next_sequence(), |(s, _)| *s)
    }
}

/// What `info` says besides the ring's state, and the form of replayed messages.
#[derive(Clone, Debug)]
struct Identity {
    incarnation: u64,
    backend_id: String,
    dp_rank: u32,
    form: ReplyForm,
}

/// Where snapshots come from: the master's object source, once registered, and what a
/// snapshot needs besides.
struct Snapshots {
    source: Arc<SourceSlot>,
    context: snapshot::Context,
    /// Requesters one snapshot serves at once (`kv_events_snapshot_max_requesters`).
    max_requesters: usize,
}

/// The object source the master registered, if any.
pub(crate) type SourceSlot = RwLock<Option<Arc<dyn ObjectSource>>>;

/// One replay under way.
#[derive(Debug)]
struct Replay {
    requester: Requester,
    next: u64,
    /// The next sequence when the request came: a replay ends before it.
    until: u64,
}

/// The running thread `kv-events-replay`; dropping it stops and joins the thread.
#[derive(Debug)]
pub(crate) struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
}

impl Server {
    /// Starts serving requests on `socket`, bound already, for a publisher of `config` in
    /// its life `incarnation`; returns the server and the ring the publishing thread fills.
    /// Snapshots get their objects from `source` and let the `live_backlog` (the calls
    /// waiting in the publisher's queue) go first.
    pub(crate) fn start(
        socket: zmq::Socket,
        config: &Config,
        incarnation: u64,
        source: Arc<SourceSlot>,
        live_backlog: Arc<dyn Fn() -> usize + Send + Sync>,
        peers: Arc<PeerCounters>,
        listeners: Arc<Listeners>,
    ) -> Result<(Server, Arc<Ring>), CreateError> {
        let ring = Arc::new(Ring::new(config.replay_buffer_bytes, peers));
        let identity = Identity {
            incarnation,
            backend_id: config.backend_id.clone(),
            dp_rank: config.dp_rank,
            form: if config.replay_topic_frame {
                ReplyForm::TopicFrame(config.topic.as_bytes().to_vec())
            } else {
                ReplyForm::Plain
            },
        };
        let taken = Arc::clone(&ring);
        let snapshots = Snapshots {
            max_requesters: config.snapshot_max_requesters as usize,
            source,
            context: snapshot::Context {
                config: Arc::new(config.clone()),
                incarnation,
                next_sequence: Arc::new(move || taken.next_sequence()),
                live_backlog,
            },
        };
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Serving {
            socket,
            counters: Arc::clone(&ring.counters),
            ring: Arc::clone(&ring),
            identity,
            replays: Vec::new(),
            snapshots,
            snapshot: None,
            listeners,
            finishing: Vec::new(),
            stop: Arc::clone(&stop),
        };
        let thread = threads::spawn("kv-events-replay", move || serving.run())?;
        let server = Server {
            stop,
            thread: Some(thread),
            endpoint: config.replay_endpoint.clone(),
        };
        Ok((server, ring))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // ZeroMQ leaves the file of an ipc endpoint behind; it is ours, as binding replaced
        // whatever was there.
        if let Some(path) = self.endpoint.strip_prefix("ipc://") {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Sets up a replay socket, not yet bound: a requester that stops reading makes sends fail
/// at once rather than vanish, so its replay can be given up.
pub(crate) fn prepare(socket: &zmq::Socket) -> Result<(), zmq::Error> {
    socket.set_router_mandatory(true)?;
    socket.set_sndhwm(SEND_HWM)?;
    socket.set_linger(0)
}

struct Serving {
    socket: zmq::Socket,
    ring: Arc<Ring>,
    counters: Arc<PeerCounters>,
    identity: Identity,
    replays: Vec<Replay>,
    snapshots: Snapshots,
    snapshot: Option<Fanout>,
    /// The listeners' connections, to cut off a requester given up.
    listeners: Arc<Listeners>,
    /// Threads of snapshots that ended or were given up, joined once they return.
    finishing: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Serving {
    fn run(mut self) {
        while !self.stop.load(Relaxed) {
            let wait = if self.replays.is_empty() && self.snapshot.is_none() {
                IDLE_POLL
            } else {
                Duration::from_millis(1)
            };
            let mut items = [self.socket.as_poll_item(zmq::POLLIN)];
            if zmq::poll(&mut items, wait.as_millis() as i64).is_ok() && items[0].is_readable() {
                while let Ok((frames, fd)) = requester::recv_request(&self.socket) {
                    self.answer(frames, fd);
                }
            }
            self.advance();
            self.advance_snapshot();
            self.finishing.retain(|t| !t.is_finished());
        }
        // A snapshot's source sees it abandoned at its next object, and returns.
        if let Some(fanout) = self.snapshot.take() {
            self.finishing.push(fanout.into_thread());
        }
        for thread in self.finishing.drain(..) {
            let _ = thread.join();
        }
    }

    fn answer(&mut self, mut frames: Vec<Vec<u8>>, fd: Option<RawFd>) {
        if frames.is_empty() {
            return;
        }
        let peer = frames.remove(0);
        match Request::parse(&frames) {
            Ok(Request::Replay { from }) => {
                self.counters.replay_requests.fetch_add(1, Relaxed);
                if self.replays.len() >= MAX_REPLAYS {
                    self.reply(
                        &peer,
                        verb::ERROR,
                        b"busy: too many replays under way, ask again",
                    );
                    return;
                }
                self.replays.push(Replay {
                    requester: Requester::new(peer, fd),
                    next: from,
                    until: self.ring.next_sequence(),
                });
            }
            Ok(Request::Info) => {
                self.counters.replay_requests.fetch_add(1, Relaxed);
                self.reply(&peer, verb::INFO, &self.info().encode());
            }
            Ok(Request::Snapshot { tenant }) => {
                self.counters.replay_requests.fetch_add(1, Relaxed);
                self.start_snapshot(Requester::new(peer, fd), tenant);
            }
            Err(why) => {
                self.counters.bad_requests.fetch_add(1, Relaxed);
                self.reply(&peer, verb::ERROR, why.to_string().as_bytes());
            }
        }
    }

    /// Sends a one-message reply; a requester that cannot take it loses it.
    fn reply(&self, peer: &[u8], verb: &[u8], body: &[u8]) {
        let _ = self
            .socket
            .send_multipart([peer, b"", verb, body], zmq::DONTWAIT);
    }

    fn info(&self) -> Info {
        let id = &self.identity;
        let peers = &self.counters;
        Info {
            incarnation: id.incarnation,
            backend_id: id.backend_id.clone(),
            dp_rank: u64::from(id.dp_rank),
            next_sequence: self.ring.next_sequence(),
            oldest_sequence: self.ring.oldest(),
            snapshots: self.source().is_some(),
            subscribers: peers.subscribers.load(Relaxed),
            subscriber_connects: peers.subscriber_connects.load(Relaxed),
            subscriber_disconnects: peers.subscriber_disconnects.load(Relaxed),
        }
    }

    fn source(&self) -> Option<Arc<dyn ObjectSource>> {
        let slot = self.snapshots.source.read();
        slot.unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// A snapshot request: it joins the snapshot of its scope under way, or starts one; a
    /// request of another scope, or one past the bound of requesters, is told "busy".
    fn start_snapshot(&mut self, requester: Requester, scope: Option<Vec<u8>>) {
        if let Some(fanout) = &mut self.snapshot {
            let busy: &[u8] = if fanout.scope() != scope.as_deref() {
                b"busy: a snapshot of another scope is under way, ask again when it ends"
            } else if fanout.requesters() >= self.snapshots.max_requesters {
                b"busy: the snapshot under way has as many requesters as it takes, ask again"
            } else {
                return fanout.join(requester);
            };
            return self.reply(&requester.peer, verb::ERROR, busy);
        }
        self.snapshot_for(vec![requester], scope);
    }

    /// Starts a snapshot of `scope` for `requesters`.
    fn snapshot_for(&mut self, requesters: Vec<Requester>, scope: Option<Vec<u8>>) {
        let Some(source) = self.source() else {
            let none = b"snapshots are not available: the master registered no object source";
            for requester in &requesters {
                self.reply(&requester.peer, verb::ERROR, none);
            }
            return;
        };
        match snapshot::start(source, scope.clone(), &self.snapshots.context) {
            Ok((pieces, thread)) => {
                self.snapshot = Some(Fanout::new(scope, pieces, thread, requesters, RETAIN));
            }
            Err(e) => {
                let why = e.to_string();
                for requester in &requesters {
                    self.reply(&requester.peer, verb::ERROR, why.as_bytes());
                }
            }
        }
    }

    /// Sends what the snapshot under way has ready; once it is over, starts the next one for
    /// the requests that came too late to join it.
    fn advance_snapshot(&mut self) {
        let Some(fanout) = self.snapshot.take() else {
            return;
        };
        match fanout.turn(&mut self.socket, &self.counters, &self.listeners) {
            Turn::Ongoing(fanout) => self.snapshot = Some(fanout),
            Turn::Over(thread, scope, waiting) => {
                // Dropping the receiver told the source, at its next object, to stop.
                self.finishing.push(thread);
                if !waiting.is_empty() {
                    self.snapshot_for(waiting, scope);
                }
            }
        }
    }

    /// Sends the next slice of every replay under way; ends the finished and the abandoned.
    fn advance(&mut self) {
        let mut i = 0;
        while i < self.replays.len() {
            if self.advance_one(i) {
                i += 1;
            } else {
                self.replays.swap_remove(i);
            }
        }
    }

    /// False once replay `i` is over.
    fn advance_one(&mut self, i: usize) -> bool {
        let replay = &mut self.replays[i];
        let (socket, counters) = (&mut self.socket, &self.counters);
        let slice = self.ring.slice(replay.next, replay.until, SLICE);
        if slice.is_empty() {
            let end: Arc<[u8]> = Arc::from(&[][..]);
            let head = self.identity.form.end_head();
            return match replay.requester.send(socket, counters, head, &end, true) {
                Reply::Yes | Reply::Gone => false,
                Reply::Wait => true,
                Reply::Behind => !stalled(replay, counters, &self.listeners),
            };
        }
        for (sequence, payload) in slice {
            let sequence_frame = sequence.to_be_bytes();
            let head = self.identity.form.head(&sequence_frame);
            match replay
                .requester
                .send(socket, counters, &head, &payload, true)
            {
                Reply::Yes => {
                    replay.next = sequence + 1;
                    counters.replayed_messages.fetch_add(1, Relaxed);
                }
                Reply::Wait => return true,
                Reply::Behind => return !stalled(replay, counters, &self.listeners),
                // The requester is gone (EHOSTUNREACH): nobody to finish for.
                Reply::Gone => return false,
            }
        }
        true
    }
}

/// Whether a replay whose requester is not taking what it is sent has been so for
/// [`STALLED_FOR`]: then it is given up, and the requester's connection cut.
fn stalled(replay: &mut Replay, counters: &PeerCounters, listeners: &Listeners) -> bool {
    if !replay.requester.stalled(listeners) {
        return false;
    }
    counters.replays_abandoned.fetch_add(1, Relaxed);
    log(
        Level::Warn,
        &format!(
            "gave up a replay at sequence {}: the requester read nothing for {} s",
            replay.next,
            STALLED_FOR.as_secs()
        ),
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_within_its_bytes() {
        let ring = Ring::new(10, Arc::default());
        // Empty, a replay could start at the next message: 0.
        assert_eq!((ring.next_sequence(), ring.oldest()), (0, 0));
        for sequence in 0..5 {
            ring.sent(sequence, Some(&[sequence as u8; 3]));
        }
        // 3 messages of 3 bytes fit in 10.
        let held: Vec<u64> = ring.slice(0, u64::MAX, 100).iter().map(|m| m.0).collect();
        assert_eq!(held, [2, 3, 4]);
        assert_eq!(ring.oldest(), 2);
        assert_eq!(ring.counters.replay_oldest_sequence.load(Relaxed), 2);
        assert_eq!(ring.counters.replay_buffer_bytes.load(Relaxed), 9);
        // A failed send takes its number but leaves nothing to replay.
        ring.sent(5, None);
        assert_eq!(ring.next_sequence(), 6);
        let from_3: Vec<u64> = ring.slice(3, 6, 1).iter().map(|m| m.0).collect();
        assert_eq!(from_3, [3]);
        let before_4: Vec<u64> = ring.slice(0, 4, 100).iter().map(|m| m.0).collect();
        assert_eq!(before_4, [2, 3]);
        // A payload larger than the whole buffer is not kept.
        ring.sent(6, Some(&[0; 11]));
        assert_eq!(ring.oldest(), 2);
        // A buffer that keeps nothing says its oldest is the next sequence.
        let none = Ring::new(0, Arc::default());
        none.sent(0, Some(&[1]));
        assert_eq!(none.counters.replay_oldest_sequence.load(Relaxed), 1);
        // Two dropped events take 7 and 8.
        ring.taken(9);
        assert_eq!((ring.next_sequence(), ring.oldest()), (9, 2));
    }
}
