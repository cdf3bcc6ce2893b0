//! A store in memory, for the tests of the relay's decisions: one stream, one snapshot
//! bucket, one key-value bucket, shared by every handle cloned from the first (two relays
//! of one master), with JetStream's rules for appends (the expected last subject sequence,
//! message ids) and a switch that makes every request fail (NATS down).

use crate::batch::Snapshot;
use crate::error::StoreError;
use crate::store::{Appended, Entry, LogMessage, Logged, SnapshotMeta, SnapshotWritten, Store};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::rc::Rc;

/// What every handle shares.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// The stream: (subject, message), stream sequence = place + 1.
    pub(crate) stream: Vec<(String, Logged)>,
    ids: HashSet<String>,
    /// Snapshot objects by name.
    pub(crate) snapshots: BTreeMap<String, (SnapshotMeta, Vec<u8>)>,
    /// The objects' bucket.
    pub(crate) bucket: BTreeMap<String, String>,
    /// The positions' bucket.
    pub(crate) positions: BTreeMap<String, String>,
    /// Every request fails while set.
    pub(crate) down: bool,
    /// Appends taken (written or duplicate).
    pub(crate) appends: u64,
    /// The next append is written but its acknowledgement lost (a NATS restart).
    pub(crate) lose_ack: bool,
    /// The next append skips the expected-last check (a clustered nats-server 2.9 checks it
    /// against what its leader applied, not what it has in flight, around a leader change).
    pub(crate) stale_check: bool,
    /// The append after this many more fails, unwritten (NATS gone in the middle of a
    /// difference).
    pub(crate) fail_append_in: Option<u32>,
    /// Snapshots stay being written until [`Memory::finish_snapshot`] (a slow NATS).
    pub(crate) slow_snapshots: bool,
    /// The next snapshot fails (its chunks unacknowledged: a cluster node killed).
    pub(crate) fail_snapshot: bool,
    /// The snapshot being written while `slow_snapshots`.
    writing: Option<(String, SnapshotMeta, Snapshot)>,
    /// The snapshot [`Memory::finish_snapshot`] wrote, not collected yet.
    done: Option<SnapshotWritten>,
}

/// A handle on a store in memory; clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Memory {
    pub(crate) shared: Rc<RefCell<Shared>>,
    snapshot: Option<Result<SnapshotWritten, StoreError>>,
    bucket: Option<Result<(), StoreError>>,
}

fn down() -> StoreError {
    StoreError::failed("a request", "the store is down")
}

impl Memory {
    /// The messages of `subject`, in order.
    pub(crate) fn subject(&self, subject: &str) -> Vec<Logged> {
        let shared = self.shared.borrow();
        shared
            .stream
            .iter()
            .filter(|(s, _)| s == subject)
            .map(|(_, m)| m.clone())
            .collect()
    }
}

impl Memory {
    /// Writes the snapshot being written (with `slow_snapshots`); false when there is none.
    pub(crate) fn finish_snapshot(&self) -> bool {
        let Some((name, meta, content)) = self.shared.borrow_mut().writing.take() else {
            return false;
        };
        let written = self.write_snapshot(&name, meta, &content);
        self.shared.borrow_mut().done = Some(written);
        true
    }

    fn write_snapshot(
        &self,
        name: &str,
        meta: SnapshotMeta,
        content: &Snapshot,
    ) -> SnapshotWritten {
        let mut chunks = content.chunks(64 * 1024);
        let bytes: Vec<u8> = chunks.by_ref().flatten().collect();
        let written = SnapshotWritten {
            meta,
            bytes: bytes.len() as u64,
            events: chunks.events(),
        };
        self.shared
            .borrow_mut()
            .snapshots
            .insert(name.to_owned(), (meta, bytes));
        written
    }
}

impl Store for Memory {
    fn append(
        &mut self,
        subject: &str,
        message: LogMessage,
        expected: u64,
    ) -> Result<Appended, StoreError> {
        let mut shared = self.shared.borrow_mut();
        let fails = match &mut shared.fail_append_in {
            Some(0) => true,
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        };
        if fails {
            shared.fail_append_in = None;
        }
        if shared.down || fails {
            return Err(down());
        }
        if shared.ids.contains(&message.id) {
            shared.appends += 1;
            return Ok(Appended::Duplicate);
        }
        let last = shared
            .stream
            .iter()
            .rposition(|(s, _)| s == subject)
            .map_or(0, |i| i as u64 + 1);
        if last != expected && !std::mem::take(&mut shared.stale_check) {
            return Err(StoreError::NotLast);
        }
        let stream_sequence = shared.stream.len() as u64 + 1;
        let mut headers: BTreeMap<String, String> = message
            .headers
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        headers.insert("Nats-Msg-Id".into(), message.id.clone());
        shared.ids.insert(message.id);
        shared.appends += 1;
        shared.stream.push((
            subject.to_owned(),
            Logged {
                stream_sequence,
                headers,
                payload: message.payload,
            },
        ));
        if std::mem::take(&mut shared.lose_ack) {
            return Err(StoreError::failed(
                "writing to the stream",
                "no acknowledgement",
            ));
        }
        Ok(Appended::Written(stream_sequence))
    }

    fn last_on(&mut self, subject: &str) -> Result<u64, StoreError> {
        let shared = self.shared.borrow();
        if shared.down {
            return Err(down());
        }
        Ok(shared
            .stream
            .iter()
            .rposition(|(s, _)| s == subject)
            .map_or(0, |i| i as u64 + 1))
    }

    fn read_after(&mut self, subject: &str, after: u64) -> Result<Vec<Logged>, StoreError> {
        if self.shared.borrow().down {
            return Err(down());
        }
        Ok(self
            .subject(subject)
            .into_iter()
            .filter(|m| m.stream_sequence > after)
            .collect())
    }

    fn load_snapshot(&mut self, name: &str) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StoreError> {
        let shared = self.shared.borrow();
        if shared.down {
            return Err(down());
        }
        Ok(shared.snapshots.get(name).cloned())
    }

    fn start_snapshot(&mut self, name: &str, meta: SnapshotMeta, content: Snapshot) {
        let (is_down, slow) = {
            let mut shared = self.shared.borrow_mut();
            let fail = std::mem::take(&mut shared.fail_snapshot);
            (shared.down || fail, shared.slow_snapshots)
        };
        if is_down {
            self.snapshot = Some(Err(down()));
        } else if slow {
            self.shared.borrow_mut().writing = Some((name.to_owned(), meta, content));
        } else {
            self.snapshot = Some(Ok(self.write_snapshot(name, meta, &content)));
        }
    }

    fn snapshot_busy(&self) -> bool {
        let shared = self.shared.borrow();
        shared.writing.is_some() || shared.done.is_some()
    }

    fn snapshot_done(&mut self) -> Option<Result<SnapshotWritten, StoreError>> {
        let finished = self.shared.borrow_mut().done.take().map(Ok);
        self.snapshot.take().or(finished)
    }

    fn start_bucket(&mut self, entries: Vec<Entry>, note: Option<Entry>) {
        let mut shared = self.shared.borrow_mut();
        if shared.down {
            self.bucket = Some(Err(down()));
            return;
        }
        for (key, value) in entries {
            match value {
                Some(value) => shared.bucket.insert(key, value),
                None => shared.bucket.remove(&key),
            };
        }
        if let Some((key, Some(value))) = note {
            shared.positions.insert(key, value);
        }
        self.bucket = Some(Ok(()));
    }

    fn bucket_busy(&self) -> bool {
        false
    }

    fn bucket_done(&mut self) -> Option<Result<(), StoreError>> {
        self.bucket.take()
    }

    fn bucket_position(&mut self, key: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        let shared = self.shared.borrow();
        if shared.down {
            return Err(down());
        }
        Ok(shared
            .positions
            .get(key)
            .map(|v| bytes::Bytes::from(v.clone())))
    }

    fn bucket_load(&mut self, prefix: &str) -> Result<Vec<bytes::Bytes>, StoreError> {
        let shared = self.shared.borrow();
        if shared.down {
            return Err(down());
        }
        Ok(shared
            .bucket
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| bytes::Bytes::from(v.clone()))
            .collect())
    }
}
