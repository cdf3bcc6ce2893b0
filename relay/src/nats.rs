//! The relay's side of NATS: the JetStream stream that holds the log, the bucket that holds
//! the current state, and the small bucket where the relay notes which log message the
//! bucket reflects. The relay's loop is synchronous (ZeroMQ); each call here runs its
//! requests on a one-thread Tokio runtime, whose worker also keeps the connection alive
//! (pings, reconnects) while the loop waits on ZeroMQ.

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::{Publish, PublishErrorKind};
use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use futures::StreamExt;
use std::future::Future;
use std::time::Duration;
use tokio::runtime::Runtime;

/// How long a JetStream request may wait for its answer: a server that is down is noticed
/// this late, and the write retried.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long loading the bucket may wait for an answer or the next value: to start a
/// consumer from the last value of each key, nats-server first finds them, which for
/// millions of keys takes tens of seconds.
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// Messages one fetch of a read asks for.
const BATCH: usize = 4096;
/// How long the server keeps a read's consumer after its last fetch.
const INACTIVE: Duration = Duration::from_secs(60);
/// The stream's duplicate window: a message id seen within it is written once.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Where the log and the state go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// The stream, e.g. `KV_EVENTS`; it takes the subjects `kv-events.>`.
    pub(crate) stream: String,
    /// The bucket of present objects, e.g. `kv-events`.
    pub(crate) bucket: String,
}

impl Names {
    /// The bucket of the relays' positions: one entry per backend, beside the objects'
    /// bucket so that this one holds nothing but objects.
    pub(crate) fn positions(&self) -> String {
        format!("{}-positions", self.bucket)
    }
}

/// A log message read back from the stream.
#[derive(Debug)]
pub(crate) struct Logged {
    /// Its sequence in the stream.
    pub(crate) stream_sequence: u64,
    /// Its headers (the relay's position, the previous message on the subject).
    pub(crate) headers: HeaderMap,
    /// The batch.
    pub(crate) payload: bytes::Bytes,
}

/// Why a write to the log did not happen.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The subject's last message is not the one the relay wrote on top of: another relay
    /// wrote meanwhile.
    NotLast,
    /// The server did not take it (down, restarting, timed out): try again later.
    Failed(String),
}

/// A connection to NATS with the stream and the buckets in place.
pub(crate) struct Nats {
    runtime: Runtime,
    context: jetstream::Context,
    /// Another connection, whose requests wait up to [`LOAD_TIMEOUT`].
    loader: jetstream::Context,
    names: Names,
    stream: stream::Stream,
}

impl std::fmt::Debug for Nats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nats")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Nats {
    /// Connects to `url` and makes the stream and the buckets if they are not there.
    pub(crate) fn connect(url: &str, names: Names) -> Result<Nats, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the NATS client's runtime: {e}"))?;
        let (context, loader, stream) = runtime.block_on(async {
            let client = async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .connect(url)
                .await
                .map_err(|e| format!("cannot connect to NATS at {url}: {e}"))?;
            let mut context = jetstream::new(client);
            context.set_timeout(TIMEOUT);
            // A connection of its own: JetStream requests wait as long as their client's
            // request timeout says.
            let loading = async_nats::ConnectOptions::new()
                .request_timeout(Some(LOAD_TIMEOUT))
                .connect(url)
                .await
                .map_err(|e| format!("cannot connect to NATS at {url}: {e}"))?;
            let mut loader = jetstream::new(loading);
            loader.set_timeout(LOAD_TIMEOUT);
            let stream = ensure(&context, &names).await?;
            Ok::<_, String>((context, loader, stream))
        })?;
        Ok(Nats {
            runtime,
            context,
            loader,
            names,
            stream,
        })
    }

    fn run<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Appends a message to `subject` if its last message is still `expected` (0: none),
    /// with id `id`; returns its stream sequence, or `None` when the id was written before
    /// (a duplicate JetStream dropped).
    pub(crate) fn append(
        &self,
        subject: &str,
        payload: Vec<u8>,
        headers: HeaderMap,
        id: &str,
        expected: u64,
    ) -> Result<Option<u64>, Refused> {
        let publish = Publish::build()
            .payload(payload.into())
            .headers(headers)
            .message_id(id)
            .expected_last_subject_sequence(expected);
        let outcome = self.run(async {
            self.context
                .send_publish(subject.to_owned(), publish)
                .await?
                .await
        });
        match outcome {
            Ok(ack) if ack.duplicate => Ok(None),
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(Refused::NotLast),
            Err(e) => Err(Refused::Failed(format!("cannot write to the stream: {e}"))),
        }
    }

    /// The stream sequence of the last message on `subject`, 0 when it has none.
    pub(crate) fn last_on(&self, subject: &str) -> Result<u64, String> {
        let last = self.run(self.stream.get_last_raw_message_by_subject(subject));
        match last {
            Ok(message) => Ok(message.sequence),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(e) => Err(format!("cannot read the stream: {e}")),
        }
    }

    /// The messages of `subject` after stream sequence `after`, in order.
    pub(crate) fn read_after(&self, subject: &str, after: u64) -> Result<Vec<Logged>, String> {
        let policy = DeliverPolicy::ByStartSequence {
            start_sequence: after + 1,
        };
        let messages = self.run(read_all(&self.stream, subject, policy, TIMEOUT))?;
        Ok(messages
            .into_iter()
            .map(|m| Logged {
                stream_sequence: m.1,
                headers: m.0.headers.unwrap_or_default(),
                payload: m.0.payload,
            })
            .collect())
    }

    /// Every entry of the objects' bucket under `prefix` (a backend's token and a dot):
    /// keys and values, deleted ones left out.
    pub(crate) fn load(&self, prefix: &str) -> Result<Vec<bytes::Bytes>, String> {
        let bucket = &self.names.bucket;
        let values = self.run(async {
            let stream = self
                .loader
                .get_stream(format!("KV_{bucket}"))
                .await
                .map_err(|e| failed("cannot open the bucket")(&e))?;
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

    /// Puts (`Some`) or deletes (`None`) entries of `bucket`, every write sent before any
    /// acknowledgement is awaited; `Err` when one was not acknowledged (all are written
    /// again later: a put or a delete is idempotent).
    pub(crate) fn write(
        &self,
        bucket: &str,
        entries: Vec<(String, Option<String>)>,
    ) -> Result<(), String> {
        self.run(async {
            let mut acks = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                let subject = format!("$KV.{bucket}.{key}");
                let publish = match value {
                    Some(value) => Publish::build().payload(value.into()),
                    None => Publish::build().header("KV-Operation", "DEL"),
                };
                let ack = self
                    .context
                    .send_publish(subject, publish)
                    .await
                    .map_err(|e| failed("cannot write to the bucket")(&e))?;
                acks.push(ack);
            }
            let acks = acks.into_iter().map(std::future::IntoFuture::into_future);
            for ack in futures::future::join_all(acks).await {
                ack.map_err(|e| failed("the bucket did not acknowledge a write")(&e))?;
            }
            Ok(())
        })
    }

    /// The value of `key` in the positions' bucket.
    pub(crate) fn position(&self, key: &str) -> Result<Option<bytes::Bytes>, String> {
        let bucket = self.names.positions();
        self.run(async {
            let store = self
                .context
                .get_key_value(&bucket)
                .await
                .map_err(|e| failed("cannot open the positions' bucket")(&e))?;
            store
                .get(key)
                .await
                .map_err(|e| failed("cannot read a position")(&e))
        })
    }

    /// The names in use.
    pub(crate) fn names(&self) -> &Names {
        &self.names
    }
}

/// Makes the stream and both buckets unless they exist; returns the stream.
async fn ensure(context: &jetstream::Context, names: &Names) -> Result<stream::Stream, String> {
    let stream = context
        .get_or_create_stream(stream::Config {
            name: names.stream.clone(),
            subjects: vec!["kv-events.>".into()],
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(&format!("cannot open or make the stream {}", names.stream))(&e))?;
    for bucket in [names.bucket.clone(), names.positions()] {
        // The bucket's stream as `create_key_value` makes it (history 1), made directly:
        // that call first asks for the account's limits in a form a 2.9 server does not
        // answer.
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
                ..Default::default()
            })
            .await
            .map_err(|e| failed(&format!("cannot open or make the bucket {bucket}"))(&e))?;
    }
    Ok(stream)
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
) -> Result<Vec<(async_nats::Message, u64)>, String> {
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subject.to_owned(),
            deliver_policy: policy,
            ack_policy: AckPolicy::None,
            inactive_threshold: INACTIVE,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(&format!("cannot make a consumer of {subject}"))(&e))?;
    let mut pending = consumer.cached_info().num_pending;
    let mut out = Vec::with_capacity(usize::try_from(pending).unwrap_or(0));
    while pending > 0 {
        let mut batch = consumer
            .fetch()
            .max_messages(BATCH)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| failed("cannot read the stream")(&e))?;
        let before = out.len();
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| format!("cannot read the stream: {e}"))?;
            let info = message
                .info()
                .map_err(|e| format!("a message without its stream sequence: {e}"))?;
            pending = info.pending;
            let sequence = info.stream_sequence;
            out.push((message.message, sequence));
        }
        if out.len() == before {
            return Err("the stream stopped delivering".into());
        }
    }
    Ok(out)
}
