//! The opt-in key-value bucket (`--bucket NAME`): one entry per object present, written
//! from what the log holds, beside the loop and never on the log's path. Its position (the
//! log message the bucket reflects) goes to `NAME-positions`, so that a relay that starts
//! again knows which entries may be stale.

use crate::error::StoreError;
use crate::held::{parse_entry, Held, Object};
use crate::log::Position;
use crate::names::{object_key, token};
use crate::store::{Logged, Store};
use mooncake_kv_events::subscriber::Index;
use serde::{Deserialize, Serialize};

/// Entries written together, their acknowledgements awaited together beside the loop.
const CHUNK: usize = 4096;

/// What the positions' bucket says of a backend: the log message the objects' bucket
/// reflects, and where that message left the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Reflected {
    /// The stream sequence of the last log message whose effects are in the bucket.
    pub(crate) stream_sequence: u64,
    /// The master's incarnation there, 16 hex digits.
    pub(crate) incarnation: String,
    /// The master's next sequence there.
    pub(crate) next_sequence: u64,
    /// Whether the log was the master's state there (not in the middle of a difference).
    pub(crate) complete: bool,
}

/// What the positions' bucket says of `backend` (the default, stream sequence 0, when it
/// never heard of it).
pub(crate) fn reflected(store: &mut impl Store, backend: &str) -> Result<Reflected, StoreError> {
    match store.bucket_position(&token(backend.as_bytes()))? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| StoreError::Unreadable {
            what: format!("the position of {backend} in the positions' bucket: {e}"),
        }),
        None => Ok(Reflected::default()),
    }
}

/// Marks dirty what the bucket may lack of `held` (which holds the log up to the snapshot
/// at `snapshot`, the log not read further yet): the objects of the log messages after the
/// bucket's position, and when the log no longer reaches back there, every object that
/// differs between the bucket and `held` (the bucket loaded whole). Returns the bucket's
/// position.
pub(crate) fn catch_up(
    store: &mut impl Store,
    backend: &str,
    subject: &str,
    held: &mut Held,
    snapshot: u64,
) -> Result<u64, StoreError> {
    let at = reflected(store, backend)?.stream_sequence;
    if at >= snapshot {
        return Ok(at);
    }
    let messages: Vec<Logged> = store
        .read_after(subject, at)?
        .into_iter()
        .take_while(|m| m.stream_sequence <= snapshot)
        .collect();
    let reaches = messages.first().is_some_and(|m| {
        m.header(crate::log::PREVIOUS)
            .and_then(|v| v.parse::<u64>().ok())
            == Some(at)
    });
    if reaches
        && messages
            .iter()
            .all(|m| held.touch_all(&m.payload, m.stream_sequence).is_ok())
    {
        return Ok(at);
    }
    // The log no longer holds what the bucket lacks: compare the bucket with `held`.
    let mut bucket = Index::new();
    for value in store.bucket_load(&format!("{}.", token(backend.as_bytes())))? {
        if let Some((tenant, key, media)) = parse_entry(&value) {
            for medium in media.iter() {
                bucket.store(&tenant, &key, medium);
            }
        }
    }
    let mut stale: Vec<Object> = Vec::new();
    for (tenant, key, media) in held.index().iter() {
        if bucket.get(tenant, key) != media {
            stale.push((tenant.to_vec(), key.to_vec()));
        }
    }
    for (tenant, key, _) in bucket.iter() {
        if held.index().get(tenant, key).is_empty() {
            stale.push((tenant.to_vec(), key.to_vec()));
        }
    }
    for object in stale {
        held.mark(object, snapshot);
    }
    Ok(at)
}

/// The bucket's writes under way, and where it stands.
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    /// The objects whose entries are being written, each with the message that last
    /// touched it (dirty again if the write fails).
    in_flight: Vec<(Object, u64)>,
    /// The position noted with them, if any.
    noting: Option<u64>,
    /// The log message the bucket reflects, as last noted.
    pub(crate) reflected: u64,
    /// Entries written (acknowledged).
    pub(crate) written: u64,
    /// Writes that failed (their objects written again later).
    pub(crate) failures: u64,
}

impl Bucket {
    /// A bucket that reflects log message `reflected`.
    pub(crate) fn new(reflected: u64) -> Bucket {
        Bucket {
            reflected,
            ..Bucket::default()
        }
    }

    /// Collects the outcome of the writes under way: why they failed, if they did (their
    /// entries are dirty again).
    pub(crate) fn collect(
        &mut self,
        store: &mut impl Store,
        held: &mut Held,
    ) -> Option<StoreError> {
        match store.bucket_done() {
            Some(Ok(())) => {
                self.written += self.in_flight.len() as u64;
                self.in_flight.clear();
                if let Some(at) = self.noting.take() {
                    self.reflected = at;
                }
            }
            Some(Err(why)) => {
                self.failures += 1;
                held.put_back(std::mem::take(&mut self.in_flight));
                self.noting = None;
                return Some(why);
            }
            None => {}
        }
        None
    }

    /// Whether writes are under way.
    pub(crate) fn busy(&self, store: &impl Store) -> bool {
        store.bucket_busy() || !self.in_flight.is_empty() || self.noting.is_some()
    }

    /// Starts writing the next dirty entries as `held` has them, unless writes are under
    /// way; with the last of them, the position of the log (`last`, at `position`).
    pub(crate) fn flush(
        &mut self,
        store: &mut impl Store,
        backend: &str,
        held: &mut Held,
        last: u64,
        position: Option<Position>,
    ) {
        if self.busy(store) || (held.dirty_len() == 0 && self.reflected == last) {
            return;
        }
        let taken = held.take_dirty(CHUNK);
        let entries = taken
            .iter()
            .map(|((tenant, key), _)| (object_key(backend, tenant, key), held.entry(tenant, key)))
            .collect();
        let note = (held.dirty_len() == 0).then(|| {
            let note = Reflected {
                stream_sequence: last,
                incarnation: position
                    .map_or_else(String::new, |p| format!("{:016x}", p.incarnation)),
                next_sequence: position.map_or(0, |p| p.next),
                complete: position.is_some_and(|p| p.complete),
            };
            // A struct of plain fields always serializes.
            let value = serde_json::to_string(&note).unwrap_or_default();
            (token(backend.as_bytes()), Some(value))
        });
        self.noting = note.as_ref().map(|_| last);
        self.in_flight = taken;
        store.start_bucket(entries, note);
    }
}
