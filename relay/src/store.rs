//! The seam between the relay's decisions and NATS: what the relay asks of a store, whether
//! JetStream ([`crate::nats::Nats`]) or memory (`memory::Memory`, for the tests of those
//! decisions). Appends to the log are synchronous (each goes on top of the last message
//! the relay knows of); snapshots and bucket writes are started, run beside the loop, and
//! their outcome collected later, so that neither ever holds the log back.

use crate::batch::Snapshot;
use crate::error::StoreError;
use std::collections::BTreeMap;

/// A message to append to a log subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LogMessage {
    /// `Nats-Msg-Id`: a second message with the same id within the duplicate window is
    /// dropped by the store.
    pub(crate) id: String,
    /// The relay's headers (`Kv-Events-*`).
    pub(crate) headers: Vec<(&'static str, String)>,
    /// One or more batches, one after another.
    pub(crate) payload: bytes::Bytes,
}

/// What became of an append that was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Written, at this stream sequence.
    Written(u64),
    /// Its id was written before: dropped.
    Duplicate,
}

/// A log message read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Logged {
    /// Its stream sequence.
    pub(crate) stream_sequence: u64,
    /// Its headers, by name.
    pub(crate) headers: BTreeMap<String, String>,
    /// Its payload.
    pub(crate) payload: bytes::Bytes,
}

impl Logged {
    /// A header's value.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// What a snapshot object says of itself (its headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotMeta {
    /// `Kv-Events-Stream-Sequence`: the subject's message whose state it holds.
    pub(crate) stream_sequence: u64,
    /// `Kv-Events-Incarnation`: the master's incarnation there.
    pub(crate) incarnation: u64,
    /// `Kv-Events-Next-Sequence`: the master's next sequence there.
    pub(crate) next_sequence: u64,
}

/// A snapshot written: what it says of itself, its size and its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotWritten {
    pub(crate) meta: SnapshotMeta,
    pub(crate) bytes: u64,
    pub(crate) events: u64,
}

/// A bucket entry to put (`Some`) or delete (`None`).
pub(crate) type Entry = (String, Option<String>);

/// What the relay needs of NATS.
pub(crate) trait Store {
    /// Appends `message` to `subject` if its last message is still `expected` (0: none).
    fn append(
        &mut self,
        subject: &str,
        message: LogMessage,
        expected: u64,
    ) -> Result<Appended, StoreError>;

    /// The stream sequence of the last message on `subject`, 0 when none.
    fn last_on(&mut self, subject: &str) -> Result<u64, StoreError>;

    /// The messages of `subject` after stream sequence `after`, in order.
    fn read_after(&mut self, subject: &str, after: u64) -> Result<Vec<Logged>, StoreError>;

    /// The snapshot object `name`, if there is one.
    fn load_snapshot(&mut self, name: &str) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StoreError>;

    /// Starts writing snapshot object `name`, encoding `content` as it goes; its outcome
    /// comes from [`Store::snapshot_done`], and `content`'s index is let go by then.
    fn start_snapshot(&mut self, name: &str, meta: SnapshotMeta, content: Snapshot);

    /// Whether a snapshot is being written.
    fn snapshot_busy(&self) -> bool;

    /// The outcome of the last snapshot started, once, when it is done.
    fn snapshot_done(&mut self) -> Option<Result<SnapshotWritten, StoreError>>;

    /// Starts writing `entries` into the objects' bucket, then (once they are all
    /// acknowledged) `note` into the positions' bucket; the outcome comes from
    /// [`Store::bucket_done`]. Only with a bucket.
    fn start_bucket(&mut self, entries: Vec<Entry>, note: Option<Entry>);

    /// Whether bucket writes are under way.
    fn bucket_busy(&self) -> bool;

    /// The outcome of the last bucket writes started, once, when they are done.
    fn bucket_done(&mut self) -> Option<Result<(), StoreError>>;

    /// The value of `key` in the positions' bucket.
    fn bucket_position(&mut self, key: &str) -> Result<Option<bytes::Bytes>, StoreError>;

    /// Every value of the objects' bucket under `prefix` (deleted ones left out).
    fn bucket_load(&mut self, prefix: &str) -> Result<Vec<bytes::Bytes>, StoreError>;
}
