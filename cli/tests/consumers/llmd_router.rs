//! llm-d's router reading a Mooncake master's stream: its ZMQ subscriber's receive, replay
//! and hand-on logic, transcribed from
//! <https://github.com/llm-d/llm-d-router> at commit
//! `ebab687927f5331c1b39defcb579a07951bce56c` (main, 2026-08-21), file
//! `pkg/kvevents/zmq_subscriber.go` (last changed there by PR #2410, "Bound and resume KV-event
//! replay", commit `dd65342ee538ab76d4b9f7e1efb5d8e95385d06e`), run against the real
//! `kv-events demo`.
//!
//! What the Go code does, and so what this file does:
//!
//! - `Start` runs `runSubscriber` until the context ends, 5 s (`retryInterval`) between runs.
//! - `runSubscriber` dials the PUB socket with a fresh SUB socket (go-zeromq's `Dial`: the
//!   handshake done before it returns), subscribes to the topic filter (`kv@` by default) and,
//!   when the pod has a replay endpoint and nothing was handed on yet (`!hasLastSeq`), asks a
//!   replay from sequence 0 at once. Then, for each message: a sequence below the last live
//!   one is a publisher restart (the source is reset, the replay state cleared, a replay from
//!   0 asked; a restarted publisher first seen above the last live sequence is taken for a
//!   gap instead); the last live sequence again is skipped; one at or below the last handed on is
//!   skipped; one beyond the next is a gap (a replay from the next, or the message dropped
//!   while the cooldown lasts); the first message of a subscriber that has handed nothing on
//!   and whose sequence is above 0 is a mid-stream join (a replay from 0); a message is
//!   handed on only when it is exactly the next one (or, with nothing handed on yet, when it
//!   is sequence 0).
//! - `requestReplay` asks `["", start]` on a fresh DEALER per attempt and hands on every
//!   replayed message, which must come in order from exactly `start`: any other sequence
//!   ("incomplete replay: expected sequence 0, got 1"), a malformed frame, an empty reply to
//!   a request above 0, a dial or send failure, 3 attempts in a row without progress or 2
//!   minutes in all fail it. A failure (`invalidateReplay`) resets the pod's entries in the
//!   pool, forgets what was handed on, and starts a 30 s cooldown (`replayCooldown`) during
//!   which no replay is asked and every live message is dropped. A reply that stops (2 s idle)
//!   is resumed from the next sequence after 100 ms.
//!
//! The pool (`pool.go`) is a recorder here: `AddTask` and `resetForSource` are what the
//! subscriber hands on, in order (the Go pool keeps one source's tasks in order on one
//! shard). It records every task, and applies the Mooncake events of each payload to an index
//! tenant -> key -> media (`stored` adds the medium, `removed` takes it away, `cleared`
//! empties the tenant; a reset empties the source's index, as `clearPod` does). It does not
//! transcribe `processEventBatch`, which turns vLLM's token blocks into prefix-cache keys.
//!
//! Where libzmq is not go-zeromq, the difference is said where it is made up for: libzmq
//! connects in the background and reconnects silently, so `dial` waits for the handshake (as
//! go-zeromq's `Dial` does, with its retries) and `recv` reports the connection's end (after
//! the messages it delivered) as go-zeromq's `Recv` does. The timeouts are the Go constants;
//! the 30 s cooldown is a parameter ([`Params::replay_cooldown`]), which the tests do not
//! shorten. Two test hooks that the Go code has not: [`Params::rcvhwm`] (libzmq's receive limit of
//! the SUB socket; go-zeromq has none, and holds back the publisher instead) and
//! the `hold` of [`Router::start`], which stops the receive loop before its next `Recv`, as a
//! slow process would, until [`Router::release`].

use super::demo::{within, Index, Scenario};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// The constants of zmq_subscriber.go (lines 31-39), and go-zeromq's dial defaults.

/// `retryInterval`: the wait between two runs of `runSubscriber`.
const RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// `replayTimeout`: one `requestReplay` in all.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(120);
/// `replayAttemptIdleTimeout`: one attempt without a reply message for this long ends.
const REPLAY_ATTEMPT_IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// `replayRetryBackoff`: between two attempts.
const REPLAY_RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// `replayCooldown`: after a failed replay, no replay and no live message for this long.
const REPLAY_COOLDOWN: Duration = Duration::from_secs(30);
/// `maxConcurrentReplay`: replays at once in the process (`processReplayLimiter`).
const MAX_CONCURRENT_REPLAY: usize = 8;
/// `maxReplayNoProgressAttempts`.
const MAX_REPLAY_NO_PROGRESS_ATTEMPTS: u32 = 3;
/// go-zeromq v0.17.0 (llm-d's go.mod), socket.go: `defaultRetry`, the wait between two
/// connection attempts of `Dial`...
const DIAL_RETRY: Duration = Duration::from_millis(250);
/// ... and `defaultMaxRetries`, after which `Dial` fails.
const DIAL_MAX_RETRIES: u32 = 10;

/// llm-d's default `TopicFilter` (`pool.go`, `DefaultConfig`).
const TOPIC_FILTER: &str = "kv@";
/// The topic the demos publish under: llm-d names pod and model in it (`kv@<pod>@<model>`).
const TOPIC: &str = "kv@pod-1@m";
/// The subscriber's `sourceEndpoint`: `<address>:<port>` of the pod's serving endpoint
/// (`extractor.go`, `ensureSubscriber`), which the pool's tasks carry.
const SOURCE_ENDPOINT: &str = "10.0.0.1:8000";

/// What the tests may change.
#[derive(Clone, Debug)]
pub struct Params {
    /// `replayCooldown` (30 s in the Go code; the tests keep it).
    pub replay_cooldown: Duration,
    /// The SUB socket's receive limit (libzmq's default, 1000, unless a test wants loss).
    pub rcvhwm: i32,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            replay_cooldown: REPLAY_COOLDOWN,
            rcvhwm: 1000,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The pool: what the subscriber hands on (pool.go, events.go).

/// `RawMessage` (events.go): what `AddTask` takes.
#[derive(Clone, Debug)]
pub struct RawMessage {
    /// `Topic`: the first frame (a Go string holds any bytes).
    pub topic: Vec<u8>,
    /// `Sequence`: the second frame, big-endian.
    pub sequence: u64,
    /// `Payload`: the third frame, undecoded.
    pub payload: Vec<u8>,
    /// `SourceEndpoint`: the serving endpoint the subscriber belongs to.
    pub source_endpoint: String,
}

/// One task of the pool's queue, in the order the subscriber added them.
#[derive(Clone, Debug)]
pub enum Task {
    /// `AddTask(&RawMessage{...})`: a message handed on.
    Message(RawMessage),
    /// `resetForSource(topic, sourceEndpoint)`: `RawMessage{reset: true}`, which clears the
    /// pod's entries (`clearPod`) before the messages queued after it.
    Reset {
        /// The topic filter the reset was made with.
        topic: Vec<u8>,
        /// The source whose entries are cleared.
        source_endpoint: String,
    },
}

/// The index the recorder builds: tenant -> key -> media.
type Media = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, BTreeSet<String>>>;

/// What the pool holds: every task, and the index they make.
#[derive(Debug, Default)]
pub struct PoolState {
    /// Every task, in order.
    pub tasks: Vec<Task>,
    /// The events applied so far.
    pub index: Media,
    /// Payloads the recorder could not decode (there should be none).
    pub decode_errors: Vec<String>,
}

/// The recorder that stands for the Go `Pool`.
#[derive(Debug, Default)]
pub struct Pool {
    state: Mutex<PoolState>,
}

impl Pool {
    /// `AddTask`: records the message and applies its events.
    fn add_task(&self, task: RawMessage) {
        let mut state = self.lock();
        if let Err(why) = apply(&mut state.index, &task.payload) {
            state
                .decode_errors
                .push(format!("sequence {}: {why}", task.sequence));
        }
        state.tasks.push(Task::Message(task));
    }

    /// `resetForSource`: a reset task; the worker clears the pod (`processRawMessage` ->
    /// `clearPod`). The demos are one source, so the whole index goes.
    fn reset_for_source(&self, topic: &[u8], source_endpoint: &str) {
        let mut state = self.lock();
        state.index.clear();
        state.tasks.push(Task::Reset {
            topic: topic.to_vec(),
            source_endpoint: source_endpoint.to_owned(),
        });
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sequences handed on, cut at each reset: one list per stretch between resets.
    fn stretches(&self) -> Vec<Vec<u64>> {
        let mut stretches = vec![Vec::new()];
        for task in &self.lock().tasks {
            match task {
                Task::Message(m) => stretches.last_mut().expect("one").push(m.sequence),
                Task::Reset { .. } => stretches.push(Vec::new()),
            }
        }
        stretches
    }

    /// The index as `--dump-index` gives it.
    fn index(&self) -> Index {
        let state = self.lock();
        state
            .index
            .iter()
            .map(|(tenant, keys)| {
                let keys = keys
                    .iter()
                    .map(|(key, media)| (key.clone(), media.iter().cloned().collect::<Vec<_>>()));
                (tenant.clone(), keys.collect())
            })
            .collect()
    }
}

/// Applies the events of one payload, `[timestamp_ms, [event, ...], dp_rank]`.
fn apply(index: &mut Media, payload: &[u8]) -> Result<(), String> {
    use rmpv::Value;
    let batch = rmpv::decode::read_value(&mut &payload[..]).map_err(|e| e.to_string())?;
    let events = batch
        .as_array()
        .and_then(|b| b.get(1))
        .and_then(Value::as_array)
        .ok_or_else(|| format!("not a batch: {batch}"))?;
    for event in events {
        let map = event
            .as_map()
            .ok_or_else(|| format!("not a map: {event}"))?;
        let field = |name: &str| {
            map.iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v)
        };
        let bytes = |name: &str| match field(name) {
            Some(Value::String(s)) => Ok(s.as_bytes().to_vec()),
            Some(Value::Binary(b)) => Ok(b.clone()),
            other => Err(format!("{name} is {other:?}")),
        };
        let medium = || match field("medium").and_then(Value::as_str) {
            Some(m) => Ok(m.to_owned()),
            None => Err(format!("no medium in {event}")),
        };
        let tenant = bytes("tenant_id")?;
        match field("event_type").and_then(Value::as_str) {
            Some("stored") => {
                let keys = index.entry(tenant).or_default();
                keys.entry(bytes("object_key")?)
                    .or_default()
                    .insert(medium()?);
            }
            Some("removed") => {
                let (key, medium) = (bytes("object_key")?, medium()?);
                if let Some(keys) = index.get_mut(&tenant) {
                    if let Some(media) = keys.get_mut(&key) {
                        media.remove(&medium);
                        if media.is_empty() {
                            keys.remove(&key);
                        }
                    }
                    if keys.is_empty() {
                        index.remove(&tenant);
                    }
                }
            }
            Some("cleared") => {
                index.remove(&tenant);
            }
            other => return Err(format!("event_type {other:?}")),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// What the Go code logs and counts, kept for the tests to read.

/// A log line or a metric of the Go code that the tests look at.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// "Connected subscriber socket" (or "Bound").
    Connected,
    /// `metrics.ZMQErrors` with this label ("connect", "recv", "replay-incomplete", ...) and
    /// the error logged with it.
    ZmqError(&'static str, String),
    /// "Requesting proactive replay on connect".
    ProactiveReplay,
    /// "Detected event sequence reset, rebuilding index".
    SequenceReset {
        /// `lastLiveSeq`.
        last_live_seq: u64,
        /// The sequence that went back.
        current_seq: u64,
    },
    /// "Dropping event while replay is in cooldown".
    CooldownDrop {
        /// `lastSeq`.
        last_seq: u64,
        /// The message dropped.
        current_seq: u64,
    },
    /// "Detected gap in event sequence, requesting replay".
    Gap {
        /// `lastSeq`.
        last_seq: u64,
        /// The message after the gap.
        current_seq: u64,
    },
    /// "Joining mid-stream, requesting full replay".
    MidStream {
        /// The first message seen.
        current_seq: u64,
    },
    /// What one `requestReplay` returned: "Replay complete" (`Ok`), or why it failed.
    Replay {
        /// `startSeq`.
        start_seq: u64,
        /// Messages it handed on.
        replayed: u64,
        /// Attempts it made.
        attempts: u32,
        /// `true`, or the error logged.
        outcome: Result<(), String>,
    },
}

/// The notes, shared with the test.
#[derive(Debug, Default)]
pub struct Notes(Mutex<Vec<Note>>);

impl Notes {
    fn add(&self, note: Note) {
        self.lock().push(note);
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Note>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn all(&self) -> Vec<Note> {
        self.lock().clone()
    }

    fn count(&self, matches: impl Fn(&Note) -> bool) -> usize {
        self.lock().iter().filter(|n| matches(n)).count()
    }

    /// The replays that failed.
    fn failed_replays(&self) -> Vec<Note> {
        let notes = self.lock();
        let failed = notes.iter().filter(|n| {
            matches!(
                n,
                Note::Replay {
                    outcome: Err(_),
                    ..
                }
            )
        });
        failed.cloned().collect()
    }
}

// ---------------------------------------------------------------------------------------
// Go's context.Context, as far as the subscriber uses it.

/// A context: cancelled by the test, and with a deadline once `WithTimeout` gave it one.
#[derive(Clone, Debug)]
struct Ctx {
    cancelled: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Ctx {
    /// `ctx.Err() != nil`.
    fn err(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// `context.WithTimeout(ctx, timeout)`.
    fn with_timeout(&self, timeout: Duration) -> Ctx {
        let deadline = Instant::now() + timeout;
        Ctx {
            cancelled: Arc::clone(&self.cancelled),
            deadline: Some(self.deadline.map_or(deadline, |d| d.min(deadline))),
        }
    }

    /// `select { case <-time.After(wait): case <-ctx.Done(): }`; true when `wait` passed.
    fn sleep(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if self.err() {
                return false;
            }
            thread::sleep((until - Instant::now()).min(Duration::from_millis(10)));
        }
        !self.err()
    }
}

// ---------------------------------------------------------------------------------------
// processReplayLimiter: semaphore.NewWeighted(maxConcurrentReplay), process-wide.

struct Limiter {
    free: Mutex<usize>,
    released: Condvar,
}

static PROCESS_REPLAY_LIMITER: Limiter = Limiter {
    free: Mutex::new(MAX_CONCURRENT_REPLAY),
    released: Condvar::new(),
};

impl Limiter {
    /// `Acquire(ctx, 1)`: false when the context ended first.
    fn acquire(&self, ctx: &Ctx) -> bool {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            if ctx.err() {
                return false;
            }
            free = self
                .released
                .wait_timeout(free, Duration::from_millis(10))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        *free -= 1;
        true
    }

    /// `Release(1)`.
    fn release(&self) {
        *self.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.released.notify_one();
    }
}

// ---------------------------------------------------------------------------------------
// go-zeromq's Dial and Recv on libzmq sockets.

/// A socket and the monitor that tells its connection's handshake and end.
struct Dialed {
    socket: zmq::Socket,
    monitor: zmq::Socket,
}

/// go-zeromq's `Dial`: connects, and returns once the ZMTP handshake is done; a peer that
/// cannot be reached after the first attempt and `defaultMaxRetries` more, `defaultRetry`
/// apart, is an error. libzmq connects in the background, so this waits for the handshake.
fn dial(
    context: &zmq::Context,
    socket: zmq::Socket,
    endpoint: &str,
    ctx: &Ctx,
) -> Result<Dialed, String> {
    static MONITORS: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "inproc://llmd-router-monitor-{}",
        MONITORS.fetch_add(1, Ordering::Relaxed)
    );
    let events =
        zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw() | zmq::SocketEvent::DISCONNECTED.to_raw();
    socket
        .monitor(&name, i32::from(events))
        .map_err(|e| e.to_string())?;
    let monitor = context.socket(zmq::PAIR).map_err(|e| e.to_string())?;
    monitor.connect(&name).map_err(|e| e.to_string())?;
    socket
        .set_reconnect_ivl(DIAL_RETRY.as_millis() as i32)
        .map_err(|e| e.to_string())?;
    socket.connect(endpoint).map_err(|e| e.to_string())?;
    let limit = DIAL_RETRY * (DIAL_MAX_RETRIES + 1);
    let deadline = Instant::now() + limit;
    loop {
        if ctx.err() {
            return Err("context canceled".into());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(format!(
                "zmq4: could not dial to {endpoint:?} (retry={DIAL_RETRY:?})"
            ));
        }
        let wait = (deadline - now).min(Duration::from_millis(20));
        if monitor
            .poll(zmq::POLLIN, wait.as_millis() as i64)
            .map_err(|e| e.to_string())?
            > 0
        {
            let event = monitor.recv_multipart(0).map_err(|e| e.to_string())?;
            if event_of(&event) == Some(zmq::SocketEvent::HANDSHAKE_SUCCEEDED) {
                return Ok(Dialed { socket, monitor });
            }
        }
    }
}

/// The event of a monitor message: its first frame starts with the event, 16 bits, little
/// endian.
fn event_of(frames: &[Vec<u8>]) -> Option<zmq::SocketEvent> {
    let first = frames.first()?;
    let raw = u16::from_le_bytes([*first.first()?, *first.get(1)?]);
    Some(zmq::SocketEvent::from_raw(raw))
}

/// go-zeromq's `Recv`: the next message; an error when `ctx` ends or `idle` passes (the
/// attempt context the Go code cancels with its idle timer), and an error once the
/// connection ended, after the messages it delivered (go-zeromq reads a closed connection to
/// its end, then queues the error).
fn recv(dialed: &Dialed, ctx: &Ctx, idle: Option<Instant>) -> Result<Vec<Vec<u8>>, String> {
    let mut ended = false;
    loop {
        match dialed.socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => return Ok(frames),
            Err(zmq::Error::EAGAIN) => {}
            Err(e) => return Err(e.to_string()),
        }
        if ended {
            return Err("EOF".into());
        }
        if ctx.err() || idle.is_some_and(|i| Instant::now() >= i) {
            return Err("context canceled".into());
        }
        while let Ok(event) = dialed.monitor.recv_multipart(zmq::DONTWAIT) {
            if event_of(&event) == Some(zmq::SocketEvent::DISCONNECTED) {
                ended = true;
            }
        }
        if ended {
            continue;
        }
        let mut wait = Duration::from_millis(20);
        if let Some(idle) = idle {
            wait = wait.min(idle.saturating_duration_since(Instant::now()));
        }
        let mut items = [
            dialed.socket.as_poll_item(zmq::POLLIN),
            dialed.monitor.as_poll_item(zmq::POLLIN),
        ];
        zmq::poll(&mut items, wait.as_millis() as i64).map_err(|e| e.to_string())?;
    }
}

/// `parseEventFrame`: topic, sequence and payload of a three-frame message whose second
/// frame has at least 8 bytes (its first 8 are the sequence).
fn parse_event_frame(frames: &[Vec<u8>]) -> Option<(&[u8], u64, &[u8])> {
    if frames.len() != 3 || frames[1].len() < 8 {
        return None;
    }
    let sequence = u64::from_be_bytes(frames[1][..8].try_into().expect("8 bytes"));
    Some((&frames[0], sequence, &frames[2]))
}

// ---------------------------------------------------------------------------------------
// zmqSubscriber.

/// `zmqSubscriber` (lines 43-59), with what the transcription adds: the libzmq context, the
/// parameters, the notes and the test's hold.
struct ZmqSubscriber {
    pool: Arc<Pool>,
    pod_identifier: String,
    source_endpoint: String,
    endpoint: String,
    replay_endpoint: String,
    remote: bool,
    topic_filter: String,

    // Replay state persists across reconnections within subscriber lifetime.
    last_seq: u64,
    has_last_seq: bool,
    last_live_seq: u64,
    has_last_live_seq: bool,
    /// `lastReplayFailure`; `None` is Go's zero `time.Time`.
    last_replay_failure: Option<Instant>,

    zmq: zmq::Context,
    params: Params,
    notes: Arc<Notes>,
    hold: Arc<AtomicBool>,
}

impl ZmqSubscriber {
    /// `Start` (lines 88-114): `runSubscriber` until the context ends, `retryInterval` apart.
    fn start(&mut self, ctx: &Ctx) {
        loop {
            if ctx.err() {
                return;
            }
            self.run_subscriber(ctx);
            // metrics.SubscriberReconnections once the wait is over; not needed here.
            if !ctx.sleep(RETRY_INTERVAL) {
                return;
            }
        }
    }

    /// `runSubscriber` (lines 116-245).
    fn run_subscriber(&mut self, ctx: &Ctx) {
        let sub = match self.zmq.socket(zmq::SUB) {
            Ok(sub) => sub,
            Err(e) => return self.zmq_error("connect", e.to_string()),
        };
        let _ = sub.set_linger(0);
        let _ = sub.set_rcvhwm(self.params.rcvhwm);
        // Bind for local endpoints, connect for remote ones.
        let sub = if !self.remote {
            if let Err(e) = sub.bind(&self.endpoint) {
                return self.zmq_error("bind", e.to_string());
            }
            // A bound socket has no single connection whose end go-zeromq would report.
            let monitor = match self.zmq.socket(zmq::PAIR) {
                Ok(m) => m,
                Err(e) => return self.zmq_error("bind", e.to_string()),
            };
            Dialed {
                socket: sub,
                monitor,
            }
        } else {
            match dial(&self.zmq, sub, &self.endpoint, ctx) {
                Ok(dialed) => dialed,
                Err(e) => return self.zmq_error("connect", e),
            }
        };
        self.note(Note::Connected);

        if let Err(e) = sub.socket.set_subscribe(self.topic_filter.as_bytes()) {
            return self.zmq_error("subscribe", e.to_string());
        }

        // Rebuild the index from buffered events without waiting for live traffic.
        if !self.replay_endpoint.is_empty() && !self.has_last_seq && self.can_attempt_replay() {
            self.note(Note::ProactiveReplay);
            self.request_replay(ctx, 0);
        }

        loop {
            // The test's hold (not in the Go code): a reader that does not come back to Recv.
            while self.hold.load(Ordering::SeqCst) && !ctx.err() {
                thread::sleep(Duration::from_millis(5));
            }
            let frames = match recv(&sub, ctx, None) {
                Ok(frames) => frames,
                Err(e) => {
                    if ctx.err() {
                        return;
                    }
                    return self.zmq_error("recv", e);
                }
            };
            // metrics.MessagesReceived.
            let Some((topic, seq, payload)) = parse_event_frame(&frames) else {
                // "Malformed event frame", at debug level.
                continue;
            };
            let topic = topic.to_vec();

            if self.replay_endpoint.is_empty() {
                self.add_task(&topic, seq, payload);
                continue;
            }

            let mut replay_attempted = false;
            if self.has_last_live_seq && seq < self.last_live_seq {
                self.note(Note::SequenceReset {
                    last_live_seq: self.last_live_seq,
                    current_seq: seq,
                });
                // z.pool.resetForSource(topic, z.sourceEndpoint): the message's topic.
                self.pool.reset_for_source(&topic, &self.source_endpoint);
                self.last_seq = 0;
                self.has_last_seq = false;
                self.last_replay_failure = None;
                replay_attempted = true;
                self.request_replay(ctx, 0);
            }

            if self.has_last_live_seq && seq == self.last_live_seq {
                continue;
            }
            self.last_live_seq = seq;
            self.has_last_live_seq = true;

            if self.has_last_seq && seq <= self.last_seq {
                continue;
            }

            if self.has_last_seq && seq > self.last_seq + 1 {
                if !self.can_attempt_replay() {
                    self.note(Note::CooldownDrop {
                        last_seq: self.last_seq,
                        current_seq: seq,
                    });
                    continue;
                }
                self.note(Note::Gap {
                    last_seq: self.last_seq,
                    current_seq: seq,
                });
                replay_attempted = true;
                if !self.request_replay(ctx, self.last_seq + 1) {
                    continue;
                }
            }

            if !self.has_last_seq && seq > 0 {
                if replay_attempted || !self.can_attempt_replay() {
                    continue;
                }
                self.note(Note::MidStream { current_seq: seq });
                if !self.request_replay(ctx, 0) {
                    continue;
                }
            }

            if self.has_last_seq && (seq <= self.last_seq || seq > self.last_seq + 1) {
                continue;
            }

            self.add_task(&topic, seq, payload);
            self.last_seq = seq;
            self.has_last_seq = true;
        }
    }

    /// `addTask` (lines 247-254).
    fn add_task(&self, topic: &[u8], seq: u64, payload: &[u8]) {
        self.pool.add_task(RawMessage {
            topic: topic.to_vec(),
            sequence: seq,
            payload: payload.to_vec(),
            source_endpoint: self.source_endpoint.clone(),
        });
    }

    /// `canAttemptReplay` (lines 256-258).
    fn can_attempt_replay(&self) -> bool {
        self.last_replay_failure
            .is_none_or(|failed| failed.elapsed() >= self.params.replay_cooldown)
    }

    /// `invalidateReplay` (lines 260-265).
    fn invalidate_replay(&mut self, topic: &str) {
        self.pool
            .reset_for_source(topic.as_bytes(), &self.source_endpoint);
        self.last_seq = 0;
        self.has_last_seq = false;
        self.last_replay_failure = Some(Instant::now());
    }

    /// `metrics.ZMQErrors.WithLabelValues(z.podIdentifier, label).Inc()` and the error logged.
    fn zmq_error(&self, label: &'static str, error: String) {
        self.note(Note::ZmqError(label, error));
    }

    /// A log line or metric of the Go code: kept for the test, and printed (shown when a test
    /// fails) as the logger would, with the pod.
    fn note(&self, note: Note) {
        eprintln!("llm-d router, pod {}: {note:?}", self.pod_identifier);
        self.notes.add(note);
    }

    /// `requestReplay` (lines 267-433): the outcome is noted, and returned as the Go code
    /// returns it.
    fn request_replay(&mut self, ctx: &Ctx, start_seq: u64) -> bool {
        let mut replayed = 0;
        let mut attempts = 0;
        let outcome = self.replay(ctx, start_seq, &mut replayed, &mut attempts);
        let ok = outcome.is_ok();
        self.note(Note::Replay {
            start_seq,
            replayed,
            attempts,
            outcome,
        });
        ok
    }

    /// The body of `requestReplay`: `Ok` where it returns true, the error it logs where it
    /// returns false.
    fn replay(
        &mut self,
        ctx: &Ctx,
        start_seq: u64,
        replayed: &mut u64,
        attempt: &mut u32,
    ) -> Result<(), String> {
        let replay_ctx = ctx.with_timeout(REPLAY_TIMEOUT);
        let topic_filter = self.topic_filter.clone();

        let mut next_seq = start_seq;
        let mut no_progress_attempts = 0;
        loop {
            if replay_ctx.err() {
                self.invalidate_replay(&topic_filter);
                return Err("Replay timed out".into());
            }
            *attempt += 1;

            // zmq4.NewDealer(attemptCtx, zmq4.WithTimeout(replayAttemptIdleTimeout)): the
            // timeout bounds a send.
            let dealer = self.zmq.socket(zmq::DEALER).map_err(|e| e.to_string())?;
            let _ = dealer.set_linger(0);
            let _ = dealer.set_sndtimeo(REPLAY_ATTEMPT_IDLE_TIMEOUT.as_millis() as i32);
            let dealer = match dial(&self.zmq, dealer, &self.replay_endpoint, &replay_ctx) {
                Ok(dealer) => dealer,
                Err(e) => {
                    self.invalidate_replay(&topic_filter);
                    self.zmq_error("replay-connect", e.clone());
                    return Err(format!("Failed to connect replay socket: {e}"));
                }
            };
            if replay_ctx.err() {
                drop(dealer);
                continue;
            }
            if !PROCESS_REPLAY_LIMITER.acquire(&replay_ctx) {
                drop(dealer);
                self.invalidate_replay(&topic_filter);
                self.zmq_error("replay-capacity", "timed out".into());
                return Err("Replay timed out waiting for process capacity".into());
            }

            let seq_bytes = next_seq.to_be_bytes();
            if let Err(e) = dealer.socket.send_multipart([&[][..], &seq_bytes[..]], 0) {
                drop(dealer);
                PROCESS_REPLAY_LIMITER.release();
                self.invalidate_replay(&topic_filter);
                self.zmq_error("replay-send", e.to_string());
                return Err(format!("Failed to send replay request: {e}"));
            }

            // idleTimer := time.AfterFunc(replayAttemptIdleTimeout, attemptCancel)
            let mut idle = Instant::now() + REPLAY_ATTEMPT_IDLE_TIMEOUT;
            let mut attempt_replayed = 0;
            let mut complete = false;
            let mut expected_seq = next_seq;
            let mut receive_err = None;
            let mut terminal_err = None;
            loop {
                let msg = match recv(&dealer, &replay_ctx, Some(idle)) {
                    Ok(msg) => msg,
                    Err(e) => {
                        receive_err = Some(e);
                        break;
                    }
                };
                idle = Instant::now() + REPLAY_ATTEMPT_IDLE_TIMEOUT;

                let mut frames = &msg[..];
                if !frames.is_empty() && frames[0].is_empty() {
                    frames = &frames[1..];
                }
                if frames.len() == 3 && frames[2].is_empty() {
                    complete = true;
                    break;
                }

                let Some((topic, seq, payload)) = parse_event_frame(frames) else {
                    terminal_err = Some(format!(
                        "malformed replay frame with {} frames",
                        frames.len()
                    ));
                    break;
                };
                if seq != expected_seq {
                    terminal_err = Some(format!(
                        "incomplete replay: expected sequence {expected_seq}, got {seq}"
                    ));
                    break;
                }

                self.add_task(topic, seq, payload);
                self.last_seq = seq;
                self.has_last_seq = true;
                *replayed += 1;
                attempt_replayed += 1;
                expected_seq += 1;
            }

            drop(dealer);
            PROCESS_REPLAY_LIMITER.release();
            if let Some(e) = terminal_err {
                self.invalidate_replay(&topic_filter);
                self.zmq_error("replay-incomplete", e.clone());
                return Err(e);
            }
            if complete {
                if *replayed == 0 && start_seq > 0 {
                    let e = format!("incomplete replay: sequence {start_seq} was not available");
                    self.invalidate_replay(&topic_filter);
                    self.zmq_error("replay-incomplete", e.clone());
                    return Err(e);
                }
                self.last_replay_failure = None;
                return Ok(());
            }
            if replay_ctx.err() {
                continue;
            }

            if attempt_replayed == 0 {
                no_progress_attempts += 1;
                if no_progress_attempts >= MAX_REPLAY_NO_PROGRESS_ATTEMPTS {
                    let e = receive_err
                        .unwrap_or_else(|| "replay response ended without progress".into());
                    self.invalidate_replay(&topic_filter);
                    self.zmq_error("replay-no-progress", e.clone());
                    return Err(format!("Replay stopped after no progress: {e}"));
                }
            } else {
                no_progress_attempts = 0;
                next_seq = expected_seq;
            }
            // "Replay response interrupted, resuming", at debug level.
            replay_ctx.sleep(REPLAY_RETRY_BACKOFF);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The router as the tests run it.

/// One subscriber, as `SubscriberManager.EnsureSubscriber` starts it for a discovered pod
/// (`remote`, a replay endpoint), on its own thread.
pub struct Router {
    pool: Arc<Pool>,
    notes: Arc<Notes>,
    hold: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Router {
    /// Starts the subscriber on `scenario`'s endpoints.
    pub fn start(scenario: &Scenario, params: Params, hold: bool) -> Router {
        let pool = Arc::new(Pool::default());
        let notes = Arc::new(Notes::default());
        let hold = Arc::new(AtomicBool::new(hold));
        let cancelled = Arc::new(AtomicBool::new(false));
        let mut subscriber = ZmqSubscriber {
            pool: Arc::clone(&pool),
            pod_identifier: "pod-1".into(),
            source_endpoint: SOURCE_ENDPOINT.into(),
            endpoint: scenario.stream.clone(),
            replay_endpoint: scenario.replay.clone(),
            remote: true,
            topic_filter: TOPIC_FILTER.into(),
            last_seq: 0,
            has_last_seq: false,
            last_live_seq: 0,
            has_last_live_seq: false,
            last_replay_failure: None,
            zmq: zmq::Context::new(),
            params,
            notes: Arc::clone(&notes),
            hold: Arc::clone(&hold),
        };
        let ctx = Ctx {
            cancelled: Arc::clone(&cancelled),
            deadline: None,
        };
        let thread = thread::Builder::new()
            .name("llm-d-zmq-subscriber".into())
            .spawn(move || subscriber.start(&ctx))
            .expect("the subscriber's thread starts");
        Router {
            pool,
            notes,
            hold,
            cancelled,
            thread: Some(thread),
        }
    }

    /// Lets the receive loop go on (see [`Router::start`]'s `hold`).
    pub fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
    }

    /// Whether, since the last reset before it, the pool was handed sequence `last`, or a
    /// replay failed (waiting longer would not help: the 30 s cooldown drops what comes).
    fn reached_or_failed(&self, resets: usize, last: u64) -> bool {
        let stretches = self.pool.stretches();
        let reached = stretches.len() > resets
            && stretches[resets..]
                .last()
                .and_then(|s| s.last())
                .is_some_and(|&s| s >= last);
        reached || !self.notes.failed_replays().is_empty()
    }

    /// Cancels the context and waits for the subscriber to return.
    fn stop(&mut self) {
        self.cancelled.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the subscriber did not panic");
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// The test's own look at the publisher: `info` on the replay socket.

/// What the tests read of `info`.
#[derive(Debug)]
struct Info {
    /// The sequence of the last message published: `next_sequence` - 1.
    last_sequence: u64,
    /// Connections to the PUB socket that ended.
    subscriber_disconnects: u64,
}

/// `["", "info"]` on the replay socket; `None` when no answer came within a second.
fn info(replay: &str) -> Option<Info> {
    let context = zmq::Context::new();
    let dealer = context.socket(zmq::DEALER).ok()?;
    dealer.set_linger(0).ok()?;
    dealer.connect(replay).ok()?;
    dealer.send_multipart([&b""[..], b"info"], 0).ok()?;
    if dealer.poll(zmq::POLLIN, 1000).ok()? == 0 {
        return None;
    }
    let frames = dealer.recv_multipart(0).ok()?;
    let map = rmpv::decode::read_value(&mut &frames.get(2)?[..]).ok()?;
    let field = |name: &str| {
        map.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .and_then(|(_, v)| v.as_u64())
    };
    // `next_sequence` since sequences start at 0; `last_sequence` before.
    let last_sequence = match field("next_sequence") {
        Some(next) => next.checked_sub(1)?,
        None => field("last_sequence")?,
    };
    Some(Info {
        last_sequence,
        subscriber_disconnects: field("subscriber_disconnects")?,
    })
}

/// Waits until the demo's own watcher left, which it does once the workload is done and it
/// read every event: the publisher's last sequence then is the workload's last.
fn workload_done(scenario: &Scenario) -> u64 {
    let mut last = None;
    let done = within(Duration::from_secs(40), || {
        last = info(&scenario.replay)
            .filter(|i| i.subscriber_disconnects >= 1)
            .map(|i| i.last_sequence);
        last.is_some()
    });
    assert!(done, "the demo's workload did not end within 40 s");
    last.expect("the last sequence")
}

// ---------------------------------------------------------------------------------------
// The assertions every scenario makes.

/// No replay was found incomplete (nor failed in any other way).
fn assert_no_failed_replay(router: &Router) {
    let failed = router.notes.failed_replays();
    assert!(
        failed.is_empty(),
        "a replay failed, and the router dropped what came during its cooldown: {failed:?}\n\
         handed on: {}\nnotes: {:?}",
        summary(&router.pool.stretches()),
        router.notes.all()
    );
}

/// The pool was handed, between resets, exactly the sequences of `expected` (each a
/// publisher run, 0 to its last), each once and in order, all under the demo's topic.
fn assert_handed_exactly_once(router: &Router, expected: &[std::ops::RangeInclusive<u64>]) {
    let stretches = router.pool.stretches();
    let expected: Vec<Vec<u64>> = expected.iter().map(|r| r.clone().collect()).collect();
    assert!(
        stretches == expected,
        "handed on {}, where each message once is {}\nnotes: {:?}",
        summary(&stretches),
        summary(&expected),
        router.notes.all()
    );
    let state = router.pool.lock();
    for task in &state.tasks {
        // Messages under the demo's topic; resets (of a restart) with the message's topic.
        let (topic, source) = match task {
            Task::Message(m) => (&m.topic, &m.source_endpoint),
            Task::Reset {
                topic,
                source_endpoint,
            } => (topic, source_endpoint),
        };
        assert_eq!(topic, TOPIC.as_bytes(), "{task:?}");
        assert_eq!(source, SOURCE_ENDPOINT, "{task:?}");
    }
    assert!(state.decode_errors.is_empty(), "{:?}", state.decode_errors);
}

/// The router's index is the demo's.
fn assert_index(router: &Router, expected: &Index) {
    let index = router.pool.index();
    if &index == expected {
        return;
    }
    let mut differences = Vec::new();
    let keys = |i: &Index| -> BTreeSet<(Vec<u8>, Vec<u8>)> {
        i.iter()
            .flat_map(|(t, keys)| keys.keys().map(|k| (t.clone(), k.clone())))
            .collect()
    };
    for (tenant, key) in keys(&index).union(&keys(expected)) {
        let held = index.get(tenant).and_then(|k| k.get(key));
        let truth = expected.get(tenant).and_then(|k| k.get(key));
        if held != truth {
            differences.push(format!(
                "{}/{}: {held:?}, expected {truth:?}",
                String::from_utf8_lossy(tenant),
                String::from_utf8_lossy(key)
            ));
        }
    }
    panic!(
        "the router's index has {} objects, the demo's {}; {} differ, the first: {:?}\n\
         notes: {:?}",
        index.values().map(|k| k.len()).sum::<usize>(),
        expected.values().map(|k| k.len()).sum::<usize>(),
        differences.len(),
        &differences[..differences.len().min(5)],
        router.notes.all()
    );
}

/// Sequences in short: each stretch between resets as its runs.
fn summary(stretches: &[Vec<u64>]) -> String {
    let runs = |s: &Vec<u64>| {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &n in s {
            match runs.last_mut() {
                Some((_, end)) if *end + 1 == n => *end = n,
                _ => runs.push((n, n)),
            }
        }
        let text: Vec<String> = runs.iter().map(|(a, b)| format!("{a}..={b}")).collect();
        format!("[{}] ({} messages)", text.join(", "), s.len())
    };
    let parts: Vec<String> = stretches.iter().map(runs).collect();
    parts.join(" | reset | ")
}

/// The demo's arguments: llm-d's topic, `objects` objects at `rate` calls a second.
fn workload<'a>(objects: &'a str, rate: &'a str) -> Vec<&'a str> {
    vec!["--topic", TOPIC, "--objects", objects, "--rate", rate]
}

// ---------------------------------------------------------------------------------------
// The scenarios.

#[test]
fn router_that_joins_before_the_workload_hands_on_every_message_once_and_ends_with_the_demo_index()
{
    let mut scenario = Scenario::new("llmd-router-before");
    let mut args = workload("1500", "3000");
    // The demo waits long enough for a router started on a loaded machine.
    args.extend(["--wait", "10", "--linger", "3"]);
    let demo = scenario.demo(&args);
    let mut router = Router::start(&scenario, Params::default(), false);
    // Connected, and its proactive replay from 0 answered, before the workload (--wait 10).
    let joined = within(Duration::from_secs(10), || {
        router.notes.count(|n| matches!(n, Note::Replay { .. })) >= 1
    });
    assert!(joined, "the router did not join: {:?}", router.notes.all());
    let last = workload_done(&scenario);
    within(Duration::from_secs(20), || {
        router.reached_or_failed(0, last)
    });
    let expected = demo.finish();
    router.stop();

    assert_no_failed_replay(&router);
    assert_handed_exactly_once(&router, &[0..=last]);
    assert_index(&router, &expected);
    // It joined before the first message: its first replay found nothing to send.
    assert!(
        matches!(
            router
                .notes
                .all()
                .iter()
                .find(|n| matches!(n, Note::Replay { .. })),
            Some(Note::Replay {
                start_seq: 0,
                replayed: 0,
                outcome: Ok(()),
                ..
            })
        ),
        "{:?}",
        router.notes.all()
    );
}

#[test]
fn router_that_joins_after_the_workload_rebuilds_the_whole_index_from_the_replay() {
    let mut scenario = Scenario::new("llmd-router-after");
    let mut args = workload("1500", "3000");
    args.extend(["--linger", "10"]);
    let demo = scenario.demo(&args);
    let last = workload_done(&scenario);
    let mut router = Router::start(&scenario, Params::default(), false);
    within(Duration::from_secs(30), || {
        router.reached_or_failed(0, last)
    });
    let expected = demo.finish();
    router.stop();

    assert_no_failed_replay(&router);
    assert_handed_exactly_once(&router, &[0..=last]);
    assert_index(&router, &expected);
    // Everything came from its proactive replay from 0: one replay, of every message.
    let replays: Vec<Note> = router
        .notes
        .all()
        .into_iter()
        .filter(|n| matches!(n, Note::Replay { .. }))
        .collect();
    assert!(
        matches!(
            &replays[..],
            [Note::Replay {
                start_seq: 0,
                outcome: Ok(()),
                replayed,
                ..
            }] if *replayed == last + 1
        ),
        "{replays:?}"
    );
}

#[test]
fn router_that_lost_messages_on_its_sub_socket_recovers_them_by_replay_on_the_gap() {
    let mut scenario = Scenario::new("llmd-router-loss");
    // The publisher holds 1,000 messages for a subscriber that does not read, the router's
    // SUB socket 1, the kernel's socket buffers a few hundred: the router, held during a
    // workload of a few thousand messages, loses most of them. Heartbeats then show the gap
    // after the workload, as they are meant to.
    let mut args = workload("3000", "4000");
    args.extend(["--wait", "10", "--linger", "10"]);
    args.extend(["--send-hwm", "1000", "--heartbeat-ms", "100"]);
    let demo = scenario.demo(&args);
    let params = Params {
        rcvhwm: 1,
        ..Params::default()
    };
    let mut router = Router::start(&scenario, params, true);
    let joined = within(Duration::from_secs(10), || {
        router.notes.count(|n| matches!(n, Note::Replay { .. })) >= 1
    });
    assert!(joined, "the router did not join: {:?}", router.notes.all());
    let last = workload_done(&scenario);
    router.release();
    within(Duration::from_secs(30), || {
        router.reached_or_failed(0, last)
    });
    router.stop();
    let expected = demo.finish();

    assert_no_failed_replay(&router);
    // Heartbeats come after the workload's last message: the router hands them on too.
    let handed = router.pool.stretches();
    let through = handed[0].last().copied().unwrap_or(0).max(last);
    assert_handed_exactly_once(&router, &[0..=through]);
    assert_index(&router, &expected);
    // It did lose messages, and it was its replay on the gap that brought them back.
    let notes = router.notes.all();
    let gap = notes.iter().position(|n| matches!(n, Note::Gap { .. }));
    let gap = gap.unwrap_or_else(|| panic!("no gap: the router lost nothing: {notes:?}"));
    assert!(
        matches!(
            notes.get(gap + 1),
            Some(Note::Replay { start_seq, replayed, outcome: Ok(()), .. })
                if *start_seq > 0 && *replayed > 0
        ),
        "{notes:?}"
    );
}

#[test]
fn router_across_a_publisher_restart_resets_the_source_and_ends_with_the_new_publisher_index() {
    let mut scenario = Scenario::new("llmd-router-restart");
    let mut first_args = workload("1500", "3000");
    first_args.extend(["--wait", "3", "--linger", "2"]);
    let first = scenario.demo(&first_args);
    let mut router = Router::start(&scenario, Params::default(), false);
    let first_last = workload_done(&scenario);
    within(Duration::from_secs(30), || {
        router.reached_or_failed(0, first_last)
    });
    assert_no_failed_replay(&router);
    let first_index = first.finish();

    // The restarted master holds fewer objects: what only the first one announced must go.
    // The router's SUB socket sees the end of the first, waits 5 s (retryInterval) and dials
    // the second, which waits 10 s before its workload.
    let mut second_args = workload("600", "3000");
    second_args.extend(["--wait", "10", "--linger", "10"]);
    let second = scenario.demo(&second_args);
    let reconnected = within(Duration::from_secs(25), || {
        router.notes.count(|n| *n == Note::Connected) >= 2
    });
    assert!(reconnected, "{:?}", router.notes.all());
    let second_last = workload_done(&scenario);
    within(Duration::from_secs(30), || {
        router.reached_or_failed(1, second_last)
    });
    let expected = second.finish();
    router.stop();

    assert_no_failed_replay(&router);
    // What the Go code does on a restart: the first message whose sequence is below the last
    // live one resets the source (`resetForSource`) and asks a replay from 0; the pool is
    // handed the first run whole, a reset, then the second run whole.
    assert_eq!(
        router
            .notes
            .count(|n| matches!(n, Note::SequenceReset { .. })),
        1,
        "{:?}",
        router.notes.all()
    );
    assert_handed_exactly_once(&router, &[0..=first_last, 0..=second_last]);
    assert_index(&router, &expected);
    assert_ne!(
        first_index, expected,
        "the two runs must end differently for the reset to show"
    );
}
