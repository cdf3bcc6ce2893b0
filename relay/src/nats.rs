//! The store in NATS JetStream: the stream that holds the log, the Object Store bucket of
//! the snapshots, and (opt-in) the key-value bucket of objects with its positions' bucket.
//! The relay's loop is synchronous (ZeroMQ): appends and reads run on a one-thread Tokio
//! runtime (`block_on`), whose worker also keeps the connection alive while the loop waits
//! on ZeroMQ, and runs the snapshot and bucket writes as tasks beside the loop.

use crate::batch::Snapshot;
use crate::error::StoreError;
use crate::store::{Appended, Entry, LogMessage, Logged, SnapshotMeta, SnapshotWritten, Store};
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::{Publish, PublishErrorKind};
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use base64::engine::general_purpose::URL_SAFE;
use base64::Engine;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// How long a JetStream request may wait for its answer: a server that is down is noticed
/// this late, and the write retried.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long loading a bucket of millions of keys may wait for an answer or the next
/// value: to start a consumer from the last value of each key, nats-server first finds
/// them, which takes tens of seconds.
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a snapshot's chunk may wait for its acknowledgement. A chunk sent to a server
/// that died (a cluster's leader killed) is never acknowledged: the write fails after this
/// and is made again, instead of holding the log's messages (and the bucket) back for
/// [`LOAD_TIMEOUT`].
const SNAPSHOT_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages one fetch of a read asks for.
const BATCH: usize = 4096;
/// How long the server keeps a read's consumer after its last fetch.
const INACTIVE: Duration = Duration::from_secs(60);
/// The stream's duplicate window: a message id seen within it is written once.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// The chunks of a snapshot object.
const CHUNK_BYTES: usize = 256 * 1024;
/// Chunks (or bucket entries) sent before the oldest acknowledgement is awaited.
const WINDOW: usize = 64;
/// The most delete markers noted for a later purge; past it the oldest are purged early.
const MAX_MARKERS: usize = 200_000;
/// The snapshot's headers, in the object's info (`headers`, and `metadata` for clients
/// that know no object headers).
pub(crate) const STREAM_SEQUENCE: &str = "Kv-Events-Stream-Sequence";

/// Where the log and the state go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// The stream, e.g. `KV_EVENTS`; it takes the subjects `<subject_prefix>.>`.
    pub(crate) stream: String,
    /// The subjects' prefix, e.g. `kv-events`.
    pub(crate) subject_prefix: String,
    /// The Object Store bucket of the snapshots, e.g. `kv-events-snapshots`.
    pub(crate) snapshots: String,
    /// The key-value bucket of present objects, if asked for.
    pub(crate) bucket: Option<String>,
    /// The replicas of what the relay makes (on a cluster: 3).
    pub(crate) replicas: usize,
    /// How long the bucket's delete markers stay before the relay purges them.
    pub(crate) marker_age: Duration,
}

impl Names {
    /// The bucket of the relays' positions: one entry per backend, beside the objects'
    /// bucket so that this one holds nothing but objects.
    fn positions(bucket: &str) -> String {
        format!("{bucket}-positions")
    }
}

/// A connection to NATS with the stream and the buckets in place.
pub(crate) struct Nats {
    runtime: Runtime,
    context: jetstream::Context,
    /// Another connection, whose requests wait up to [`LOAD_TIMEOUT`]: loads, and the
    /// snapshots' writes.
    loader: jetstream::Context,
    names: Names,
    stream: stream::Stream,
    objects: stream::Stream,
    snapshot: Option<JoinHandle<Result<SnapshotWritten, StoreError>>>,
    bucket: Option<JoinHandle<Result<(), StoreError>>>,
    /// The bucket's delete markers this relay wrote, oldest first, until purged.
    markers: Markers,
    /// The last stream sequence of the bucket's stream as this relay's writes left it;
    /// `None` when not known (read again before the next writes).
    bucket_last: BucketLast,
    /// What this relay knows of the log, for its bucket writes.
    log_seen: std::sync::Arc<LogSeen>,
    /// The log's subject, once this relay wrote or read it.
    log_subject: Option<String>,
}

/// See [`Nats::bucket_last`].
type BucketLast = std::sync::Arc<std::sync::Mutex<Option<u64>>>;

/// What this relay knows of the log. Bucket entries are written from what the relay holds of
/// the log; they go to the bucket only while the log holds nothing the relay has not seen.
/// Then no other relay wrote the log since, and whatever another relay wrote to the bucket
/// before reflects no later state than these entries.
#[derive(Debug, Default)]
struct LogSeen {
    /// The last stream sequence of the log this relay appended or read.
    seen: AtomicU64,
    /// The last stream sequence this relay appended.
    appended: AtomicU64,
    /// Bumped at each read of the log: the appends since the last bump follow one another.
    reads: AtomicU64,
}

/// Delete markers written: when, the subject, its stream sequence.
type Markers = std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<(Instant, String, u64)>>>;

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl Nats {
    /// Connects to `url` and makes the stream and the buckets if they are not there.
    pub(crate) fn connect(url: &str, names: Names) -> Result<Nats, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| StoreError::failed("the NATS client's runtime", e))?;
        let (context, loader, stream, objects) = runtime.block_on(async {
            let said = url.to_owned();
            let client = async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .event_callback(move |event| {
                    let url = said.clone();
                    async move { say(&url, &event) }
                })
                .connect(url)
                .await
                .map_err(|e| StoreError::failed("connecting to NATS", e))?;
            let mut context = jetstream::new(client);
            context.set_timeout(TIMEOUT);
            // A connection of its own: JetStream requests wait as long as their client's
            // request timeout says.
            let loading = async_nats::ConnectOptions::new()
                .request_timeout(Some(LOAD_TIMEOUT))
                .connect(url)
                .await
                .map_err(|e| StoreError::failed("connecting to NATS", e))?;
            let mut loader = jetstream::new(loading);
            loader.set_timeout(LOAD_TIMEOUT);
            let (stream, objects) = ensure(&context, &names).await?;
            Ok::<_, StoreError>((context, loader, stream, objects))
        })?;
        Ok(Nats {
            runtime,
            context,
            loader,
            names,
            stream,
            objects,
            snapshot: None,
            bucket: None,
            markers: Markers::default(),
            bucket_last: BucketLast::default(),
            log_seen: std::sync::Arc::default(),
            log_subject: None,
        })
    }

    fn run<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// The outcome of a task, once it is done.
    fn done<O>(
        &self,
        task: &mut Option<JoinHandle<Result<O, StoreError>>>,
    ) -> Option<Result<O, StoreError>> {
        if !task.as_ref().is_some_and(JoinHandle::is_finished) {
            return None;
        }
        let handle = task.take()?;
        Some(
            self.run(handle)
                .unwrap_or_else(|e| Err(StoreError::failed("a task beside the loop", e))),
        )
    }
}

impl Store for Nats {
    fn append(
        &mut self,
        subject: &str,
        message: LogMessage,
        expected: u64,
    ) -> Result<Appended, StoreError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            headers.insert(*name, value.as_str());
        }
        let publish = Publish::build()
            .payload(message.payload)
            .headers(headers)
            .message_id(message.id)
            .expected_last_subject_sequence(expected);
        let outcome = self.run(async {
            self.context
                .send_publish(subject.to_owned(), publish)
                .await?
                .await
        });
        self.log_subject = Some(subject.to_owned());
        match outcome {
            Ok(ack) if ack.duplicate => Ok(Appended::Duplicate),
            Ok(ack) => {
                self.log_seen.appended.store(ack.sequence, Ordering::SeqCst);
                self.log_seen.seen.fetch_max(ack.sequence, Ordering::SeqCst);
                Ok(Appended::Written(ack.sequence))
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(StoreError::NotLast),
            Err(e) => Err(StoreError::failed("writing to the stream", e)),
        }
    }

    fn last_on(&mut self, subject: &str) -> Result<u64, StoreError> {
        let last = self.run(self.stream.get_last_raw_message_by_subject(subject));
        match last {
            Ok(message) => Ok(message.sequence),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => Err(StoreError::failed("reading the stream", e)),
        }
    }

    fn read_after(&mut self, subject: &str, after: u64) -> Result<Vec<Logged>, StoreError> {
        let policy = DeliverPolicy::ByStartSequence {
            start_sequence: after + 1,
        };
        let messages = self.run(read_all(&self.stream, subject, policy, TIMEOUT))?;
        self.log_subject = Some(subject.to_owned());
        self.log_seen.reads.fetch_add(1, Ordering::SeqCst);
        if let Some((_, last)) = messages.last() {
            self.log_seen.seen.fetch_max(*last, Ordering::SeqCst);
        }
        Ok(messages.into_iter().map(logged).collect())
    }

    fn load_snapshot(&mut self, name: &str) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StoreError> {
        let bucket = self.names.snapshots.clone();
        let meta_subject = format!("$O.{bucket}.M.{}", URL_SAFE.encode(name));
        let info = self.run(self.objects.get_last_raw_message_by_subject(&meta_subject));
        let info = match info {
            Ok(message) => message.payload,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(None)
            }
            Err(e) => return Err(StoreError::failed("reading the snapshots' bucket", e)),
        };
        let unreadable = |why: &str| StoreError::Unreadable {
            what: format!("the snapshot {bucket}/{name}: {why}"),
        };
        let info: serde_json::Value =
            serde_json::from_slice(&info).map_err(|e| unreadable(&e.to_string()))?;
        if info["deleted"].as_bool() == Some(true) {
            return Ok(None);
        }
        let meta = snapshot_meta(&info).ok_or_else(|| unreadable("no Kv-Events headers"))?;
        let nuid = info["nuid"].as_str().ok_or_else(|| unreadable("no nuid"))?;
        let chunks = format!("$O.{bucket}.C.{nuid}");
        let messages = self.run(async {
            let objects = self
                .loader
                .get_stream(format!("OBJ_{bucket}"))
                .await
                .map_err(|e| StoreError::failed("opening the snapshots' bucket", e))?;
            read_all(&objects, &chunks, DeliverPolicy::All, LOAD_TIMEOUT).await
        })?;
        let mut content = Vec::with_capacity(info["size"].as_u64().unwrap_or(0) as usize);
        for (message, _) in messages {
            content.extend_from_slice(&message.payload);
        }
        if Some(content.len() as u64) != info["size"].as_u64() {
            return Err(unreadable("its chunks do not add up to its size"));
        }
        Ok(Some((meta, content)))
    }

    fn start_snapshot(&mut self, name: &str, meta: SnapshotMeta, content: Snapshot) {
        // On the other connection: a snapshot's chunks in flight would queue ahead of the
        // log's appends on this one.
        let mut context = self.loader.clone();
        context.set_timeout(SNAPSHOT_ACK_TIMEOUT);
        let objects = self.objects.clone();
        let bucket = self.names.snapshots.clone();
        let name = name.to_owned();
        self.snapshot = Some(self.runtime.spawn(async move {
            put_snapshot(&context, &objects, &bucket, &name, meta, &content).await
        }));
    }

    fn snapshot_busy(&self) -> bool {
        self.snapshot.is_some()
    }

    fn snapshot_done(&mut self) -> Option<Result<SnapshotWritten, StoreError>> {
        let mut task = self.snapshot.take();
        let done = self.done(&mut task);
        self.snapshot = task;
        done
    }

    fn start_bucket(&mut self, entries: Vec<Entry>, note: Option<Entry>) {
        let Some(bucket) = self.names.bucket.clone() else {
            return;
        };
        let context = self.context.clone();
        let (markers, age) = (self.markers.clone(), self.names.marker_age);
        let known = self.bucket_last.clone();
        let log = self.log_subject.clone().map(|subject| {
            let seen = self.log_seen.clone();
            let at = (
                seen.seen.load(Ordering::SeqCst),
                seen.reads.load(Ordering::SeqCst),
            );
            (self.stream.clone(), subject, seen, at)
        });
        self.bucket = Some(self.runtime.spawn(async move {
            purge_markers(&context, &bucket, &markers, age).await?;
            // Known again after a failure: the writes of another relay (or of this one's
            // unacknowledged ones) may have moved it.
            let noted = *known.lock().unwrap_or_else(|e| e.into_inner());
            let last = match noted {
                Some(last) => last,
                None => bucket_last(&context, &bucket).await?,
            };
            // After the bucket's last sequence is known: a bucket write of another relay
            // since then makes these refused; one before, the log check below covers.
            if let Some((stream, subject, seen, (at, reads))) = log {
                log_unchanged(&stream, &subject, &seen, at, reads).await?;
            }
            let fence = Fence { last };
            match write_entries(&context, &bucket, entries, Some(&markers), Some(fence)).await {
                Ok(last) => *known.lock().unwrap_or_else(|e| e.into_inner()) = last,
                Err(e) => {
                    *known.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    return Err(e);
                }
            }
            if let Some(note) = note {
                write_entries(&context, &Names::positions(&bucket), vec![note], None, None).await?;
            }
            Ok(())
        }));
    }

    fn bucket_busy(&self) -> bool {
        self.bucket.is_some()
    }

    fn bucket_done(&mut self) -> Option<Result<(), StoreError>> {
        let mut task = self.bucket.take();
        let done = self.done(&mut task);
        self.bucket = task;
        done
    }

    fn bucket_position(&mut self, key: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        let Some(bucket) = &self.names.bucket else {
            return Ok(None);
        };
        let positions = Names::positions(bucket);
        self.run(async {
            let store = self
                .context
                .get_key_value(&positions)
                .await
                .map_err(|e| StoreError::failed("opening the positions' bucket", e))?;
            store
                .get(key)
                .await
                .map_err(|e| StoreError::failed("reading a position", e))
        })
    }

    fn bucket_load(&mut self, prefix: &str) -> Result<Vec<bytes::Bytes>, StoreError> {
        let Some(bucket) = self.names.bucket.clone() else {
            return Ok(Vec::new());
        };
        let values = self.run(async {
            let stream = self
                .loader
                .get_stream(format!("KV_{bucket}"))
                .await
                .map_err(|e| StoreError::failed("opening the bucket", e))?;
            let subject = format!("$KV.{bucket}.{prefix}>");
            read_all(
                &stream,
                &subject,
                DeliverPolicy::LastPerSubject,
                LOAD_TIMEOUT,
            )
            .await
        })?;
        Ok(values
            .into_iter()
            .filter(|(m, _)| !is_deletion(m.headers.as_ref()))
            .map(|(m, _)| m.payload)
            .collect())
    }
}

/// A message read back as the relay's [`Logged`].
fn logged((message, stream_sequence): (async_nats::Message, u64)) -> Logged {
    let mut headers = BTreeMap::new();
    for (name, values) in message.headers.iter().flat_map(|h| h.iter()) {
        if let Some(value) = values.first() {
            headers.insert(name.to_string(), value.as_str().to_owned());
        }
    }
    Logged {
        stream_sequence,
        headers,
        payload: message.payload,
    }
}

/// A snapshot's meta from its object info: the headers, else the metadata.
fn snapshot_meta(info: &serde_json::Value) -> Option<SnapshotMeta> {
    let value = |name: &str| -> Option<String> {
        let header = &info["headers"][name];
        let text = header
            .as_array()
            .and_then(|v| v.first())
            .or(Some(header))
            .and_then(serde_json::Value::as_str)
            .or_else(|| info["metadata"][name].as_str())?;
        Some(text.to_owned())
    };
    Some(SnapshotMeta {
        stream_sequence: value(STREAM_SEQUENCE)?.parse().ok()?,
        incarnation: u64::from_str_radix(&value(crate::log::INCARNATION)?, 16).ok()?,
        next_sequence: value(crate::log::NEXT_SEQUENCE)?.parse().ok()?,
    })
}

/// Writes snapshot object `name` as the Object Store's clients do (chunks under a new
/// nuid on `$O.<bucket>.C.<nuid>`, then the info on `$O.<bucket>.M.<name in base64>`, which
/// rolls up the one before, then the old chunks purged), the chunks sent [`WINDOW`] ahead
/// of their acknowledgements. The info's `headers` are in the clients' form
/// (`{"Name": ["value"]}`), as nats.go and nats.py read them; the same in `metadata`.
async fn put_snapshot(
    context: &jetstream::Context,
    objects: &stream::Stream,
    bucket: &str,
    name: &str,
    meta: SnapshotMeta,
    content: &Snapshot,
) -> Result<SnapshotWritten, StoreError> {
    let failed = |e: &dyn std::fmt::Display| StoreError::failed("writing a snapshot", e);
    let meta_subject = format!("$O.{bucket}.M.{}", URL_SAFE.encode(name));
    let old = match objects.get_last_raw_message_by_subject(&meta_subject).await {
        Ok(message) => serde_json::from_slice::<serde_json::Value>(&message.payload)
            .ok()
            .and_then(|v| v["nuid"].as_str().map(str::to_owned)),
        Err(_) => None,
    };
    let nuid = nuid::next().to_string();
    let chunk_subject = format!("$O.{bucket}.C.{nuid}");
    let mut acks = std::collections::VecDeque::new();
    let (mut chunks, mut size) = (0, 0);
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut encoded = content.chunks(CHUNK_BYTES);
    // Encoded a chunk at a time, each sent before the next is made: what the snapshot
    // takes in memory is the window's chunks, whatever the index's size.
    for chunk in encoded.by_ref() {
        digest.update(&chunk);
        size += chunk.len();
        let ack = context
            .publish(chunk_subject.clone(), chunk.into())
            .await
            .map_err(|e| failed(&e))?;
        acks.push_back(ack);
        chunks += 1;
        if acks.len() >= WINDOW {
            if let Some(ack) = acks.pop_front() {
                ack.await.map_err(|e| failed(&e))?;
            }
        }
    }
    let events = encoded.events();
    drop(encoded);
    for ack in acks {
        ack.await.map_err(|e| failed(&e))?;
    }
    let digest = digest.finish();
    let values = serde_json::json!({
        STREAM_SEQUENCE: meta.stream_sequence.to_string(),
        crate::log::INCARNATION: format!("{:016x}", meta.incarnation),
        crate::log::NEXT_SEQUENCE: meta.next_sequence.to_string(),
    });
    let headers: serde_json::Map<String, serde_json::Value> = values
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), serde_json::json!([v])))
        .collect();
    let info = serde_json::json!({
        "name": name,
        "description": "kv-events relay: the log's state at Kv-Events-Stream-Sequence",
        "headers": headers,
        "metadata": values,
        "options": {"max_chunk_size": CHUNK_BYTES},
        "bucket": bucket,
        "nuid": nuid,
        "size": size,
        "chunks": chunks,
        "digest": format!("SHA-256={}", URL_SAFE.encode(digest.as_ref())),
    });
    let mut rollup = HeaderMap::new();
    rollup.insert("Nats-Rollup", "sub");
    context
        .publish_with_headers(meta_subject, rollup, info.to_string().into())
        .await
        .map_err(|e| failed(&e))?
        .await
        .map_err(|e| failed(&e))?;
    if let Some(old) = old.filter(|old| *old != nuid) {
        objects
            .purge()
            .filter(format!("$O.{bucket}.C.{old}"))
            .await
            .map_err(|e| failed(&e))?;
    }
    Ok(SnapshotWritten {
        meta,
        bytes: size as u64,
        events,
    })
}

/// Where the bucket's stream stood after this relay's last writes to it: each entry is
/// written only on top of the one before (`Nats-Expected-Last-Sequence`), so that once
/// another relay wrote the bucket, no write of this one lands after it: a writer that
/// stalled and was taken over cannot put back an entry the new writer wrote since.
#[derive(Clone, Copy, Debug)]
struct Fence {
    /// The bucket stream's last sequence before the first entry.
    last: u64,
}

/// Whether the log still ends where this relay knows it (`at`, when it took the entries to
/// write), or at one of its appends since, with no read of the log in between (`reads`):
/// else another relay wrote the log, and the entries may be older than what it wrote to
/// the bucket.
async fn log_unchanged(
    stream: &stream::Stream,
    subject: &str,
    seen: &LogSeen,
    at: u64,
    reads: u64,
) -> Result<(), StoreError> {
    let last = match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => message.sequence,
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => 0,
        Err(e) => return Err(StoreError::failed("reading the stream", e)),
    };
    let ours =
        seen.reads.load(Ordering::SeqCst) == reads && last <= seen.appended.load(Ordering::SeqCst);
    if last == at || ours {
        Ok(())
    } else {
        Err(StoreError::NotLast)
    }
}

/// The last sequence of `bucket`'s stream now.
async fn bucket_last(context: &jetstream::Context, bucket: &str) -> Result<u64, StoreError> {
    let failed = |e: &dyn std::fmt::Display| StoreError::failed("reading the bucket's state", e);
    let mut stream = context
        .get_stream(format!("KV_{bucket}"))
        .await
        .map_err(|e| failed(&e))?;
    Ok(stream
        .info()
        .await
        .map_err(|e| failed(&e))?
        .state
        .last_sequence)
}

/// Puts (`Some`) or deletes (`None`) entries of `bucket`, [`WINDOW`] sent ahead of their
/// acknowledgements; with a `fence`, each on top of the one before. Returns the stream
/// sequence of the last entry (the fence's when there are none).
async fn write_entries(
    context: &jetstream::Context,
    bucket: &str,
    entries: Vec<Entry>,
    markers: Option<&Markers>,
    fence: Option<Fence>,
) -> Result<Option<u64>, StoreError> {
    let failed = |e: &dyn std::fmt::Display| StoreError::failed("writing to the bucket", e);
    let mut acks = std::collections::VecDeque::new();
    // A delete marker's subject and stream sequence, noted for its purge.
    let note = |subject: Option<String>, sequence: u64| {
        if let (Some(subject), Some(markers)) = (subject, markers) {
            if let Ok(mut markers) = markers.lock() {
                markers.push_back((Instant::now(), subject, sequence));
            }
        }
    };
    let mut last = fence.map(|f| f.last);
    for (k, (key, value)) in entries.into_iter().enumerate() {
        let subject = format!("$KV.{bucket}.{key}");
        let (mut publish, marker) = match value {
            Some(value) => (Publish::build().payload(value.into()), None),
            None => (
                Publish::build().header("KV-Operation", "DEL"),
                Some(subject.clone()),
            ),
        };
        if let Some(fence) = fence {
            publish = publish.expected_last_sequence(fence.last + k as u64);
        }
        let ack = context
            .send_publish(subject, publish)
            .await
            .map_err(|e| failed(&e))?;
        acks.push_back((marker, ack));
        if acks.len() >= WINDOW {
            if let Some((marker, ack)) = acks.pop_front() {
                let sequence = ack.await.map_err(|e| failed(&e))?.sequence;
                note(marker, sequence);
                last = Some(sequence);
            }
        }
    }
    for (marker, ack) in acks {
        let sequence = ack.await.map_err(|e| failed(&e))?.sequence;
        note(marker, sequence);
        last = Some(sequence);
    }
    Ok(last)
}

/// Purges from `bucket` the delete markers older than `age` (and the oldest past
/// [`MAX_MARKERS`]): each marker's subject up to and including it, so that a value written
/// on that key since stays. A watcher of the bucket has `age` to see a deletion; a reader
/// that loads the bucket finds the key absent either way.
async fn purge_markers(
    context: &jetstream::Context,
    bucket: &str,
    markers: &Markers,
    age: Duration,
) -> Result<(), StoreError> {
    let due: Vec<(String, u64)> = match markers.lock() {
        Ok(markers) => {
            let over = markers.len().saturating_sub(MAX_MARKERS);
            markers
                .iter()
                .enumerate()
                .take_while(|(k, (at, _, _))| *k < over || at.elapsed() >= age)
                .map(|(_, (_, subject, sequence))| (subject.clone(), *sequence))
                .collect()
        }
        Err(_) => return Ok(()),
    };
    if due.is_empty() {
        return Ok(());
    }
    let failed = |e: &dyn std::fmt::Display| StoreError::failed("purging delete markers", e);
    let stream = context
        .get_stream(format!("KV_{bucket}"))
        .await
        .map_err(|e| failed(&e))?;
    let mut purges = std::collections::VecDeque::new();
    let mut purged = 0;
    let count = due.len();
    for (k, (subject, sequence)) in due.into_iter().enumerate() {
        let stream = stream.clone();
        purges.push_back(tokio::spawn(async move {
            stream.purge().filter(subject).sequence(sequence + 1).await
        }));
        while purges.len() >= WINDOW || (k + 1 == count && !purges.is_empty()) {
            if let Some(purge) = purges.pop_front() {
                purge
                    .await
                    .map_err(|e| failed(&e))?
                    .map_err(|e| failed(&e))?;
                purged += 1;
            }
        }
    }
    if let Ok(mut markers) = markers.lock() {
        // Only this task (one bucket task at a time) removes from the front.
        let purged = purged.min(markers.len());
        markers.drain(..purged);
    }
    Ok(())
}

/// Makes the stream, the snapshots' bucket and (if asked for) the key-value buckets unless
/// they exist; returns the stream and the snapshots' stream.
async fn ensure(
    context: &jetstream::Context,
    names: &Names,
) -> Result<(stream::Stream, stream::Stream), StoreError> {
    let open = |what: &'static str| move |e: &dyn std::fmt::Display| StoreError::failed(what, e);
    let stream = context
        .get_or_create_stream(stream::Config {
            name: names.stream.clone(),
            subjects: vec![format!("{}.>", names.subject_prefix)],
            duplicate_window: DUPLICATE_WINDOW,
            num_replicas: names.replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| open("opening or making the stream")(&e))?;
    // An existing stream of that name may hold other subjects (another deployment's).
    let subjects = &stream.cached_info().config.subjects;
    if !covers(subjects, &names.subject_prefix) {
        return Err(StoreError::Unusable {
            what: format!(
                "the stream {} exists with the subjects {subjects:?}, which do not hold \
                 {}.>: give --stream another name, or --subject-prefix the prefix of its \
                 subjects",
                names.stream, names.subject_prefix
            ),
        });
    }
    // The Object Store's stream as `create_object_store` makes it, made directly so that
    // an existing one is opened as it is.
    let bucket = &names.snapshots;
    let objects = context
        .get_or_create_stream(stream::Config {
            name: format!("OBJ_{bucket}"),
            subjects: vec![format!("$O.{bucket}.C.>"), format!("$O.{bucket}.M.>")],
            discard: stream::DiscardPolicy::New,
            allow_rollup: true,
            allow_direct: true,
            num_replicas: names.replicas,
            ..Default::default()
        })
        .await
        .map_err(|e| open("opening or making the snapshots' bucket")(&e))?;
    if let Some(bucket) = &names.bucket {
        for bucket in [bucket.clone(), Names::positions(bucket)] {
            // The bucket's stream as `create_key_value` makes it (history 1), made
            // directly: that call first asks for the account's limits in a form a 2.9
            // server does not answer.
            context
                .get_or_create_stream(stream::Config {
                    name: format!("KV_{bucket}"),
                    subjects: vec![format!("$KV.{bucket}.>")],
                    max_messages_per_subject: 1,
                    allow_rollup: true,
                    deny_delete: true,
                    allow_direct: true,
                    discard: stream::DiscardPolicy::New,
                    duplicate_window: DUPLICATE_WINDOW,
                    num_replicas: names.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|e| open("opening or making the bucket")(&e))?;
        }
    }
    Ok((stream, objects))
}

/// Says on stderr what the NATS client tells of its connection to `url`: that NATS cannot be
/// reached (and the client goes on trying), that it is back.
fn say(url: &str, event: &async_nats::Event) {
    use async_nats::Event;
    let what = match event {
        Event::Disconnected => "connection lost (NATS unreachable?); reconnecting".to_owned(),
        Event::Connected => "connected".to_owned(),
        Event::LameDuckMode => "the server is going away (lame duck mode)".to_owned(),
        Event::ServerError(e) => format!("the server says: {e}"),
        // Each reconnection attempt that fails is one (an IO error): said by the
        // `Disconnected` before them, and by the relay's own failures.
        Event::ClientError(_) | Event::Draining | Event::Closed | Event::SlowConsumer(_) => return,
    };
    eprintln!("kv-events relay: NATS at {url}: {what}");
}

/// Whether one of a stream's `subjects` takes every subject `<prefix>.<token>` (the
/// backend is one token).
fn covers(subjects: &[String], prefix: &str) -> bool {
    let wanted: Vec<&str> = prefix.split('.').collect();
    subjects.iter().any(|subject| {
        let tokens: Vec<&str> = subject.split('.').collect();
        let matches = |(filter, token): (&&str, &&str)| *filter == "*" || filter == token;
        match tokens.split_last() {
            // `a.>` takes `a.b.c` when `a` matches the prefix's start.
            Some((&">", head)) => {
                head.len() <= wanted.len() && head.iter().zip(&wanted).all(matches)
            }
            // `a.*` takes `a.b`: the backend is one token.
            Some((&"*", head)) => {
                head.len() == wanted.len() && head.iter().zip(&wanted).all(matches)
            }
            _ => false,
        }
    })
}

/// Whether a bucket message is a deletion or a purge rather than a value.
fn is_deletion(headers: Option<&HeaderMap>) -> bool {
    headers
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
}

/// Every message a consumer of `stream` filtered on `subject` and starting at `policy`
/// delivers, until none is pending: with their stream sequences. A batch may take `wait`
/// to come. A plain consumer fetched in batches, not an ordered one: an ordered consumer
/// that hears nothing for seconds is made again with a timeout of 5 s, and a server
/// finding the last value of millions of keys is silent longer than that.
async fn read_all(
    stream: &stream::Stream,
    subject: &str,
    policy: DeliverPolicy,
    wait: Duration,
) -> Result<Vec<(async_nats::Message, u64)>, StoreError> {
    let failed = |e: &dyn std::fmt::Display| StoreError::failed("reading the stream", e);
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subject.to_owned(),
            deliver_policy: policy,
            ack_policy: AckPolicy::None,
            inactive_threshold: INACTIVE,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(&e))?;
    let mut pending = consumer.cached_info().num_pending;
    let mut out = Vec::with_capacity(usize::try_from(pending).unwrap_or(0));
    while pending > 0 {
        let mut batch = consumer
            .fetch()
            .max_messages(BATCH)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| failed(&e))?;
        let before = out.len();
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| failed(&e))?;
            let info = message.info().map_err(|e| failed(&e))?;
            pending = info.pending;
            let sequence = info.stream_sequence;
            out.push((message.message, sequence));
        }
        if out.len() == before {
            return Err(failed(&"the stream stopped delivering"));
        }
    }
    // The consumer is not needed any more (its inactivity would remove it later).
    let _ = stream.delete_consumer(&consumer.cached_info().name).await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn a_stream_covers_a_prefix_when_a_wildcard_takes_all_its_subjects() {
        let own = |s: &[&str], prefix| {
            covers(
                &s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
                prefix,
            )
        };
        assert!(own(&["kv-events.>"], "kv-events"));
        assert!(own(&["orders.*", ">"], "kv-events"));
        assert!(own(&["prod.>"], "prod.kv"));
        assert!(own(&["*.kv.>"], "prod.kv"));
        assert!(!own(&["orders.>"], "kv-events"));
        assert!(
            own(&["kv-events.*"], "kv-events"),
            "the backend is one token"
        );
        assert!(!own(&["kv-events"], "kv-events"));
        assert!(!own(&["prod.kv.x.>"], "prod.kv"));
    }
}
