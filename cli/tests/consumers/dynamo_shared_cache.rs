//! Dynamo's Mooncake reader, as written, against the real `kv-events demo`.
//!
//! The reader is the HiCache shared cache that Dynamo's KV router keeps from the master's
//! stream (pull request ai-dynamo/dynamo#11239, "feat(kv-router): index Mooncake KV events"):
//!
//! - repository `ai-dynamo/dynamo`, commit `00e8e287bb824e1036981386cd8d13ac6a673b9f`, file
//!   `lib/llm/src/kv_router/shared_cache.rs` (`HicacheSharedKvCache`: `MooncakeObjectEvent`,
//!   `MooncakeEventBatch`, `run_subscriber`, `parse_mooncake_event_frames`, `apply_batch`,
//!   `clear`, `clear_if_index_too_large`, `record_subscriber_error`);
//! - the same repository, commit `4b7b2752c93955a6c86e151a531eaa99687a22ed`, file
//!   `lib/llm/src/utils/zmq.rs` (`connect_sub_socket` and the socket options it sets, over
//!   `tmq`, itself over the `zmq` crate used here; `multipart_message`).
//!
//! What is transcribed below is its receive, decode and apply path, with Dynamo's names, each
//! function under the name it has there. What is left out is what never touches the stream:
//! the runtime-config watch that finds the endpoint (the test gives it, as the frontend's
//! `DYN_MOONCAKE_KV_EVENTS_ENDPOINT` does: `frontend_kv_events_endpoint`), the layout checks
//! and the token -> page-hash -> key query path (`check_blocks`). `DashSet`/`DashMap` become a
//! `Mutex` each; the tokio task becomes a thread; the cancellation token becomes a flag.
//! Lines marked `// test:` only count what happens, for the assertions: they change nothing.
//!
//! What that code does with the stream (the claims of the issue, checked against it):
//!
//! - Decoding: `rmp_serde::from_slice::<(i64, Vec<MooncakeObjectEvent>, u32)>` of the third
//!   frame, after a check for exactly three frames and an 8-byte big-endian sequence. The
//!   event keeps `event_type: String`, `object_key: Option<String>`, `tenant_id: String` and
//!   `group_id: Option<String>`; every other key (`medium` among them) is skipped unread. A
//!   `bin` that is not UTF-8, or a `str` holding bytes that are not, in any of those four
//!   fields fails the whole message (rmp-serde's `Utf8Error`, or "invalid type: byte array").
//! - A message it cannot decode is dropped and counted (`record_subscriber_error`, "Dropping
//!   invalid Mooncake KV event frame"): its sequence is not recorded, so the next message
//!   looks like a gap and clears everything.
//! - Sequences (`apply_batch`): the first message after `clear()` (at start and at every
//!   reconnection) is accepted whatever its number: there is no expected first sequence,
//!   0 and 1 alike. Afterwards a repeated number drops the batch; any other number than the
//!   previous + 1 (a jump forward, or back as after a publisher restart) clears the whole
//!   index and then applies the batch. So a restart of the publisher, which starts over at a
//!   lower number, gives exactly the new life's objects, provided the reader sees its first
//!   message.
//! - Tenants: events whose `tenant_id` is neither empty nor `default` are skipped: only the
//!   default tenant is indexed, keyed by `object_key` alone.
//! - Apply: `stored` inserts the key, `removed` deletes it, whatever the medium; `cleared`
//!   (no `object_key`) and anything else are ignored. An index over 1,000,000 entries clears.
//! - The issue said a first message that is not the expected first one clears the index:
//!   that was an earlier revision in the pull request (`(previous == 0 && sequence != 1) ||
//!   (previous != 0 && sequence != previous + 1)`, which also reconnected after a message it
//!   could not decode, losing a second of stream); it is not what this commit does.
//!
//! So against this publisher it holds exactly the default tenant's keys when every key is
//! UTF-8 (or skipped) and a `removed` that leaves the object readable elsewhere is followed
//! by a `stored` for what is left (`--reannounce-remaining`); the tests show both, and what
//! it ends with otherwise.

use super::demo::{within, Demo, Index, Scenario};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// lib/llm/src/kv_router/shared_cache.rs @ 00e8e287, transcribed
// ---------------------------------------------------------------------------------------------

const MOONCAKE_EVENT_RECONNECT_DELAY: Duration = Duration::from_secs(1);
const MAX_MOONCAKE_INDEX_ENTRIES: usize = 1_000_000;

/// `MooncakeObjectEvent`, as Dynamo declares it.
#[derive(Debug, Deserialize, Serialize)]
struct MooncakeObjectEvent {
    event_type: String,
    #[serde(default)]
    object_key: Option<String>,
    #[serde(default)]
    tenant_id: String,
    #[serde(default)]
    group_id: Option<String>,
}

/// Mooncake KV publisher payload: `(timestamp_ms, events, dp_rank)` after the empty-topic and
/// big-endian sequence ZMQ frames.
type MooncakeEventBatch = (i64, Vec<MooncakeObjectEvent>, u32);

/// `HicacheSharedKvCache`, the fields its event path uses.
struct HicacheSharedKvCache {
    /// `present_keys: Arc<DashSet<String>>`
    present_keys: Mutex<HashSet<String>>,
    /// `group_states: Arc<DashMap<String, (u64, bool)>>`
    group_states: Mutex<HashMap<String, (u64, bool)>>,
    last_sequence: AtomicU64,
    has_sequence: AtomicBool,
    // test: what happened, for the assertions.
    observed: Mutex<Observed>,
}

impl HicacheSharedKvCache {
    fn new() -> HicacheSharedKvCache {
        HicacheSharedKvCache {
            present_keys: Mutex::new(HashSet::new()),
            group_states: Mutex::new(HashMap::new()),
            last_sequence: AtomicU64::new(0),
            has_sequence: AtomicBool::new(false),
            observed: Mutex::new(Observed::default()),
        }
    }

    /// `apply_batch`.
    fn apply_batch(&self, sequence: u64, events: Vec<MooncakeObjectEvent>) {
        // SGLang's ZmqEventPublisher increments this sequence once per published batch, so a
        // non-consecutive value means one or more whole batches were missed.
        let has_previous = self.has_sequence.swap(true, Ordering::AcqRel);
        let previous = self.last_sequence.swap(sequence, Ordering::AcqRel);
        if has_previous && sequence == previous {
            lock(&self.observed).duplicates += 1; // test
            return;
        }
        if has_previous && sequence != previous.wrapping_add(1) {
            lock(&self.present_keys).clear();
            lock(&self.group_states).clear();
            // tracing::warn!(previous, sequence,
            //     "Mooncake KV event sequence gap; cleared shared-cache state");
            lock(&self.observed).gap_clears.push((previous, sequence)); // test
        }

        for event in events {
            // The shared-cache query contract currently has no tenant input and
            // historically queried Mooncake's default tenant only.
            if !event.tenant_id.is_empty() && event.tenant_id != "default" {
                continue;
            }
            let Some(object_key) = event.object_key else {
                continue;
            };
            let group_id = event.group_id.filter(|id| !id.is_empty());
            match event.event_type.as_str() {
                "stored" => {
                    lock(&self.observed).note_applied(&object_key, "stored"); // test
                    lock(&self.present_keys).insert(object_key);
                    if let Some(group_id) = group_id {
                        lock(&self.group_states).insert(group_id, (sequence, false));
                    }
                }
                "removed" => {
                    lock(&self.observed).note_applied(&object_key, "removed"); // test
                    lock(&self.present_keys).remove(&object_key);
                    if let Some(group_id) = group_id {
                        lock(&self.group_states).remove(&group_id);
                    } else {
                        // An older Mooncake publisher may omit `group_id` on removal. Clearing
                        // all verified groups is conservative and prevents a stale group
                        // fast-path hit.
                        lock(&self.group_states).clear();
                    }
                }
                _ => {}
            }
        }

        self.clear_if_index_too_large(MAX_MOONCAKE_INDEX_ENTRIES);
    }

    /// `clear`.
    fn clear(&self) {
        lock(&self.present_keys).clear();
        lock(&self.group_states).clear();
        self.last_sequence.store(0, Ordering::Release);
        self.has_sequence.store(false, Ordering::Release);
    }

    /// `clear_if_index_too_large`.
    fn clear_if_index_too_large(&self, max_entries: usize) {
        let present_keys = lock(&self.present_keys).len();
        let group_states = lock(&self.group_states).len();
        if present_keys.saturating_add(group_states) > max_entries {
            self.clear();
            // tracing::warn!(..., "Mooncake KV event index exceeded its size limit; cleared
            //     shared-cache state");
        }
    }

    /// `record_subscriber_error`: `RoutingOverheadMetrics::inc_shared_cache_errors()`.
    fn record_subscriber_error(&self) {
        lock(&self.observed).subscriber_errors += 1;
    }

    /// `run_subscriber`, from the point where the endpoint is known (the loop that waits for
    /// one in the runtime configs, and the reconnection when it changes, are not reached).
    fn run_subscriber(&self, endpoint: &str, cancelled: &AtomicBool) {
        loop {
            self.clear();
            let socket = match connect_sub_socket(endpoint, None) {
                Ok(socket) => socket,
                Err(_error) => {
                    self.record_subscriber_error();
                    // "Failed to connect to Mooncake KV events; retrying"
                    if sleep_unless_cancelled(MOONCAKE_EVENT_RECONNECT_DELAY, cancelled) {
                        return;
                    }
                    continue;
                }
            };
            // tracing::info!(%endpoint, "Connected to Mooncake KV events");

            loop {
                // `_ = cancellation_token.cancelled() => return`
                if cancelled.load(Ordering::Acquire) {
                    return;
                }
                // `message = socket.next()`: tmq's stream waits for the next message; here the
                // receive timeout Dynamo sets (100 ms) bounds how late the flag is seen.
                let frames = match socket.recv_multipart(0) {
                    Ok(frames) => multipart_message(frames),
                    Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => continue,
                    Err(_error) => {
                        self.record_subscriber_error();
                        // "Mooncake KV event stream failed; reconnecting"
                        break;
                    }
                };
                lock(&self.observed).note_message(&frames); // test
                match parse_mooncake_event_frames(&frames) {
                    Ok((sequence, events)) => self.apply_batch(sequence, events),
                    Err(error) => {
                        self.record_subscriber_error();
                        // tracing::warn!(%error, "Dropping invalid Mooncake KV event frame");
                        lock(&self.observed).note_decode_failure(&frames, error);
                        // test
                    }
                }
            }

            if sleep_unless_cancelled(MOONCAKE_EVENT_RECONNECT_DELAY, cancelled) {
                return;
            }
        }
    }
}

/// `parse_mooncake_event_frames` (its `anyhow::Error` as text).
fn parse_mooncake_event_frames(
    frames: &[Vec<u8>],
) -> Result<(u64, Vec<MooncakeObjectEvent>), String> {
    let [_, sequence, payload] = frames else {
        return Err(format!("expected three frames, got {}", frames.len()));
    };
    let sequence = u64::from_be_bytes(
        sequence
            .as_slice()
            .try_into()
            .map_err(|_| "expected an 8-byte sequence frame".to_owned())?,
    );
    let (_, events, _) =
        rmp_serde::from_slice::<MooncakeEventBatch>(payload).map_err(|e| e.to_string())?;
    Ok((sequence, events))
}

// ---------------------------------------------------------------------------------------------
// lib/llm/src/utils/zmq.rs @ 4b7b2752, transcribed
// ---------------------------------------------------------------------------------------------

const ZMQ_RCVTIMEOUT_MS: i32 = 100;
const ZMQ_RECONNECT_IVL_MS: i32 = 100;
const ZMQ_RECONNECT_IVL_MAX_MS: i32 = 5000;
const ZMQ_TCP_KEEPALIVE: i32 = 1;
const ZMQ_LINGER_MS: i32 = 0;

/// `connect_sub_socket`: a context of its own, `configure_receive_builder` (linger, reconnect
/// interval and its maximum, TCP keepalive, receive timeout), connect, subscribe to `topic`
/// or to everything. The `zmq::Socket` keeps its context alive.
fn connect_sub_socket(endpoint: &str, topic: Option<&str>) -> zmq::Result<zmq::Socket> {
    let ctx = zmq::Context::new();
    let socket = ctx.socket(zmq::SUB)?;
    socket.set_linger(ZMQ_LINGER_MS)?;
    socket.set_reconnect_ivl(ZMQ_RECONNECT_IVL_MS)?;
    socket.set_reconnect_ivl_max(ZMQ_RECONNECT_IVL_MAX_MS)?;
    socket.set_tcp_keepalive(ZMQ_TCP_KEEPALIVE)?;
    socket.set_rcvtimeo(ZMQ_RCVTIMEOUT_MS)?;
    socket.connect(endpoint)?;
    socket.set_subscribe(topic.unwrap_or("").as_bytes())?;
    Ok(socket)
}

/// `multipart_message`: the frames as byte vectors (the `zmq` crate gives them so already).
fn multipart_message(frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    frames
}

/// `tokio::select! { _ = cancellation_token.cancelled() => return, _ = sleep(delay) => {} }`:
/// true when cancelled.
fn sleep_unless_cancelled(delay: Duration, cancelled: &AtomicBool) -> bool {
    within(delay, || cancelled.load(Ordering::Acquire))
}

// ---------------------------------------------------------------------------------------------
// The test's side: what the reader saw, the reader on a thread, the truth it should hold
// ---------------------------------------------------------------------------------------------

/// What the reader received and did, beside its index.
#[derive(Clone, Debug, Default)]
struct Observed {
    /// The sequence frame of each message received, in order (`None`: not 8 bytes).
    sequences: Vec<Option<u64>>,
    /// Messages it could not decode: their sequence frame, and why.
    decode_failures: Vec<(Option<u64>, String)>,
    /// Each clear for a sequence that was not the previous + 1: (previous, this one).
    gap_clears: Vec<(u64, u64)>,
    /// Batches dropped for repeating the previous sequence.
    duplicates: u64,
    /// `record_subscriber_error` calls.
    subscriber_errors: u64,
    /// Per default-tenant key, the last event applied to it: `stored` or `removed`.
    last_applied: HashMap<String, &'static str>,
    /// When the last message came.
    last_message: Option<Instant>,
}

impl Observed {
    fn note_message(&mut self, frames: &[Vec<u8>]) {
        self.sequences.push(sequence_frame(frames));
        self.last_message = Some(Instant::now());
    }

    fn note_decode_failure(&mut self, frames: &[Vec<u8>], why: String) {
        self.decode_failures.push((sequence_frame(frames), why));
    }

    fn note_applied(&mut self, key: &str, event: &'static str) {
        self.last_applied.insert(key.to_owned(), event);
    }
}

fn sequence_frame(frames: &[Vec<u8>]) -> Option<u64> {
    let frame = frames.get(1)?;
    Some(u64::from_be_bytes(frame.as_slice().try_into().ok()?))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long the stream must stay silent, once the demo has exited, for the reader to have
/// taken everything it will ever get.
const QUIET: Duration = Duration::from_millis(500);
/// The longest the tests wait for the reader to go quiet.
const LIMIT: Duration = Duration::from_secs(15);
/// The longest they wait for the demo to bind its endpoint (it takes well under a second; a
/// demo that refuses its arguments never does).
const BIND_LIMIT: Duration = Duration::from_secs(10);

/// Dynamo's reader running on a thread of its own, as its tokio task does.
struct Reader {
    cache: Arc<HicacheSharedKvCache>,
    cancelled: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    started: Instant,
}

impl Reader {
    fn start(endpoint: &str) -> Reader {
        let cache = Arc::new(HicacheSharedKvCache::new());
        let cancelled = Arc::new(AtomicBool::new(false));
        let thread = {
            let (cache, cancelled, endpoint) = (
                Arc::clone(&cache),
                Arc::clone(&cancelled),
                endpoint.to_owned(),
            );
            thread::Builder::new()
                .name("dynamo-shared-cache".into())
                .spawn(move || cache.run_subscriber(&endpoint, &cancelled))
                .expect("the reader's thread starts")
        };
        Reader {
            cache,
            cancelled,
            thread: Some(thread),
            started: Instant::now(),
        }
    }

    /// The keys it holds: `present_keys`.
    fn keys(&self) -> BTreeSet<String> {
        lock(&self.cache.present_keys).iter().cloned().collect()
    }

    fn observed(&self) -> Observed {
        lock(&self.cache.observed).clone()
    }

    /// Waits until nothing has come for [`QUIET`]: called once the demo has exited, it is
    /// when everything the publisher sent is in.
    fn settle(&self) {
        let settled = within(LIMIT, || {
            let last = lock(&self.cache.observed).last_message;
            last.unwrap_or(self.started).elapsed() >= QUIET
        });
        assert!(settled, "the stream never went quiet");
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.cancelled.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts Dynamo's reader once `demo` has bound the scenario's PUB endpoint, so that it is
/// connected well before the workload (`--wait`); a demo that never binds fails the test
/// with its own output.
fn reader_once_bound(scenario: &Scenario, demo: Demo) -> (Demo, Reader) {
    let path = scenario.stream.strip_prefix("ipc://").expect("ipc");
    if !within(BIND_LIMIT, || Path::new(path).exists()) {
        demo.finish();
        panic!("the demo exited without binding {}", scenario.stream);
    }
    (demo, Reader::start(&scenario.stream))
}

/// What Dynamo's reader should hold of an expected index: the keys of the default tenant.
struct Truth {
    /// Its keys, as the `String`s Dynamo decodes.
    keys: BTreeSet<String>,
    /// Its keys that are not UTF-8: no `String` can hold them.
    not_utf8: Vec<Vec<u8>>,
    /// Each UTF-8 key's media.
    media: BTreeMap<String, Vec<String>>,
}

fn truth(index: &Index) -> Truth {
    let mut truth = Truth {
        keys: BTreeSet::new(),
        not_utf8: Vec::new(),
        media: BTreeMap::new(),
    };
    for (key, media) in index.get(b"default".as_slice()).into_iter().flatten() {
        match String::from_utf8(key.clone()) {
            Ok(key) => {
                truth.keys.insert(key.clone());
                truth.media.insert(key, media.clone());
            }
            Err(_) => truth.not_utf8.push(key.clone()),
        }
    }
    truth
}

/// The first message received is the publisher's first (0 since sequences start at 0,
/// 1 before): the reader was there from the start.
fn assert_joined_at_first_message(first: Option<u64>, life: &str) {
    assert!(
        matches!(first, Some(0 | 1)),
        "the reader joined {life} late: its first message was {first:?}"
    );
}

/// The common arguments: a few hundred objects, flat out, a second for the reader to join.
fn demo_args<'a>(objects: &'a str, wait: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--objects", objects, "--wait", wait, "--linger", "0.5"];
    args.extend_from_slice(more);
    args
}

/// What a settled reader that decoded every message holds: exactly `truth`, with no clear.
fn assert_holds_exactly(reader: &Reader, truth: &Truth, life: &str) {
    let observed = reader.observed();
    assert!(
        observed.decode_failures.is_empty(),
        "{life}: messages Dynamo's reader cannot decode: {:?}",
        observed.decode_failures
    );
    assert!(
        truth.not_utf8.is_empty(),
        "{life}: the demo expects default-tenant keys that are not UTF-8 ({:?}), which no \
         reader decoding keys as String can hold",
        truth.not_utf8
    );
    let keys = reader.keys();
    let missing: Vec<_> = truth.keys.difference(&keys).collect();
    let extra: Vec<_> = keys.difference(&truth.keys).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{life}: Dynamo's reader holds {} keys, the demo expects {}; missing {missing:?}, \
         extra {extra:?}; clears {:?}",
        keys.len(),
        truth.keys.len(),
        observed.gap_clears
    );
}

/// The failure mode of a message Dynamo cannot decode: it is dropped, the next one looks like
/// a gap, and the whole index goes; so it ends with a part of the truth only.
fn assert_undecodable_messages_clear_the_index(reader: &Reader, truth: &Truth) {
    let observed = reader.observed();
    let keys = reader.keys();
    assert!(
        !observed.decode_failures.is_empty(),
        "every message decoded: {} messages",
        observed.sequences.len()
    );
    assert_joined_at_first_message(observed.sequences.first().copied().flatten(), "the demo");
    let last = observed.sequences.last().copied().flatten();
    for (sequence, why) in &observed.decode_failures {
        let sequence = sequence.expect("an 8-byte sequence frame");
        assert!(
            why.contains("utf") || why.contains("byte array"),
            "message {sequence} failed for another reason: {why}"
        );
        // The message after it (if any) finds the previous decoded one's number + 2 or more.
        if Some(sequence) != last {
            assert!(
                observed
                    .gap_clears
                    .iter()
                    .any(|&(previous, next)| previous < sequence && sequence < next),
                "no clear after the undecodable message {sequence}: {:?}",
                observed.gap_clears
            );
        }
    }
    // And nothing else made a gap: the publisher lost nothing.
    for &(previous, next) in &observed.gap_clears {
        assert!(
            observed
                .decode_failures
                .iter()
                .any(|(s, _)| s.is_some_and(|s| previous < s && s < next)),
            "a clear at {previous} -> {next} that no undecodable message explains"
        );
    }
    assert!(
        keys.is_subset(&truth.keys),
        "keys the master no longer holds: {:?}",
        keys.difference(&truth.keys).collect::<Vec<_>>()
    );
    let lost: Vec<_> = truth.keys.difference(&keys).collect();
    assert!(
        !lost.is_empty(),
        "the clears lost nothing: {} keys held",
        keys.len()
    );
    eprintln!(
        "Dynamo's reader: {} undecodable messages of {}, {} clears, {} of {} default-tenant \
         keys held at the end",
        observed.decode_failures.len(),
        observed.sequences.len(),
        observed.gap_clears.len(),
        keys.len(),
        truth.keys.len()
    );
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

/// Required. With `stored` re-announced after a partial `removed` and keys that are not UTF-8
/// left out, Dynamo's reader, there from the first message, ends with exactly the default
/// tenant's keys, every message decoded and no clear.
#[test]
fn from_the_start_it_holds_the_default_tenants_keys() {
    let mut scenario = Scenario::new("dynamo-from-start");
    let demo = scenario.demo(&demo_args(
        "600",
        "1",
        &["--reannounce-remaining", "--non-utf8", "skip"],
    ));
    let (demo, reader) = reader_once_bound(&scenario, demo);
    let expected = truth(&demo.finish());
    reader.settle();

    let observed = reader.observed();
    assert_joined_at_first_message(observed.sequences.first().copied().flatten(), "the demo");
    assert_holds_exactly(&reader, &expected, "from the start");
    assert!(
        observed.gap_clears.is_empty() && observed.duplicates == 0,
        "clears {:?}, duplicates {}",
        observed.gap_clears,
        observed.duplicates
    );
    assert_eq!(observed.subscriber_errors, 0);
    assert!(
        !expected.keys.is_empty(),
        "the demo left no default-tenant object"
    );
}

/// Required. Two demos in turn on the same endpoints are a publisher restart: the second
/// starts its numbers over, Dynamo clears its index at that first message (a number that is
/// not the previous + 1) and applies it, and ends with the second life's keys alone. The
/// first demo has more objects, so that keys of the first life survive in the reader unless
/// the restart clears them.
#[test]
fn across_a_publisher_restart_it_holds_the_new_lifes_keys() {
    let flags = ["--reannounce-remaining", "--non-utf8", "skip"];
    let mut scenario = Scenario::new("dynamo-restart");
    let first = scenario.demo(&demo_args("600", "1", &flags));
    let (first, reader) = reader_once_bound(&scenario, first);
    let first = truth(&first.finish());
    reader.settle();
    assert_holds_exactly(&reader, &first, "the first life");
    let first_life = reader.observed();

    // The SUB socket reconnects by itself (every 100 ms, backing off to 5 s): the second
    // demo waits 3 s before its workload, long enough for it.
    let second = scenario.demo(&demo_args("300", "3", &flags));
    let second = truth(&second.finish());
    reader.settle();

    let observed = reader.observed();
    let restart = first_life.sequences.len();
    assert_joined_at_first_message(observed.sequences.first().copied().flatten(), "life 1");
    assert_joined_at_first_message(observed.sequences.get(restart).copied().flatten(), "life 2");
    let last_of_first = first_life
        .sequences
        .last()
        .copied()
        .flatten()
        .expect("life 1");
    let first_of_second = observed.sequences[restart].expect("life 2");
    assert_eq!(
        observed.gap_clears,
        vec![(last_of_first, first_of_second)],
        "one clear, at the restart"
    );
    assert_holds_exactly(&reader, &second, "after the restart");
    assert!(
        first.keys.difference(&second.keys).next().is_some(),
        "the first life left no key the second lacks: the test shows nothing"
    );
}

/// `--non-utf8 bin`, with re-announcement on: the loss comes from the undecodable messages
/// alone.
#[test]
fn with_non_utf8_bin_each_undecodable_message_clears_its_index() {
    let mut scenario = Scenario::new("dynamo-bin");
    let demo = scenario.demo(&demo_args(
        "600",
        "1",
        &["--reannounce-remaining", "--non-utf8", "bin"],
    ));
    let (demo, reader) = reader_once_bound(&scenario, demo);
    let expected = truth(&demo.finish());
    reader.settle();
    assert_undecodable_messages_clear_the_index(&reader, &expected);
}

/// `--non-utf8 str` (a msgpack `str` holding the raw bytes): rmp-serde refuses it as a
/// `String` just the same, with the same result.
#[test]
fn with_non_utf8_str_each_undecodable_message_clears_its_index() {
    let mut scenario = Scenario::new("dynamo-str");
    let demo = scenario.demo(&demo_args(
        "600",
        "1",
        &["--reannounce-remaining", "--non-utf8", "str"],
    ));
    let (demo, reader) = reader_once_bound(&scenario, demo);
    let expected = truth(&demo.finish());
    reader.settle();
    assert_undecodable_messages_clear_the_index(&reader, &expected);
}

/// Without `--reannounce-remaining` (the library's default, as `--non-utf8 skip` is): a
/// `removed` for the medium that went away, while the object stays readable on the other,
/// deletes the key (Dynamo never reads `medium`), and nothing brings it back. Every message decodes and no clear happens; the keys it lacks are
/// exactly those whose last event was such a `removed`, all still held by the master.
#[test]
fn without_reannouncement_objects_still_readable_are_missing() {
    let mut scenario = Scenario::new("dynamo-no-reannounce");
    let demo = scenario.demo(&demo_args("600", "1", &["--non-utf8", "skip"]));
    let (demo, reader) = reader_once_bound(&scenario, demo);
    let expected = truth(&demo.finish());
    reader.settle();

    let observed = reader.observed();
    let keys = reader.keys();
    assert_joined_at_first_message(observed.sequences.first().copied().flatten(), "the demo");
    assert!(
        observed.decode_failures.is_empty() && observed.gap_clears.is_empty(),
        "decode failures {:?}, clears {:?}",
        observed.decode_failures,
        observed.gap_clears
    );
    assert!(
        keys.is_subset(&expected.keys),
        "keys the master no longer holds: {:?}",
        keys.difference(&expected.keys).collect::<Vec<_>>()
    );
    let missing: BTreeSet<&String> = expected.keys.difference(&keys).collect();
    assert!(!missing.is_empty(), "no object went missing");
    let removed_last: BTreeSet<&String> = expected
        .keys
        .iter()
        .filter(|key| observed.last_applied.get(*key) == Some(&"removed"))
        .collect();
    assert_eq!(
        missing, removed_last,
        "the missing keys are those whose last event was a removed"
    );
    let still_readable: Vec<_> = missing
        .iter()
        .map(|key| (key.as_str(), &expected.media[*key]))
        .collect();
    eprintln!(
        "Dynamo's reader lacks {} of {} default-tenant keys, still readable: {:?}",
        missing.len(),
        expected.keys.len(),
        &still_readable[..still_readable.len().min(5)]
    );
}
