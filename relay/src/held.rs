//! What the log says: the fold of every log message written so far, which is what a reader
//! of the stream holds, and (with a bucket) the objects whose bucket entry still has to be
//! written. While a snapshot is written from the fold, the fold stays as it was and the
//! log messages taken meanwhile wait, to be applied once the snapshot lets it go: the
//! snapshot is encoded as it is sent, not copied.

use crate::batch::{self, Kind};
use crate::diff::Event;
use mooncake_kv_events::subscriber::{json_bytes, Index, DEFAULT_TENANT};
use mooncake_kv_events::wire::{Change, Checked, Malformed};
use mooncake_kv_events::{Medium, MediumSet};
use std::collections::HashMap;
use std::sync::Arc;

/// A tenant and an object key, as bytes.
pub(crate) type Object = (Vec<u8>, Vec<u8>);

/// The log's state and what the bucket lacks of it.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// The fold, shared with a snapshot being written.
    index: Arc<Index>,
    /// Log messages (payload, stream sequence) taken while a snapshot shared the fold, in
    /// order: not applied yet.
    deferred: Vec<(bytes::Bytes, u64)>,
    /// Whether the bucket is written: only then are objects marked dirty.
    tracks: bool,
    /// Objects touched by log messages whose bucket entry may not say what `index` says,
    /// with the stream sequence of the last message that touched them: an entry the
    /// bucket holds as of a later message is known to be written.
    dirty: HashMap<Object, u64>,
}

/// The tenant an empty name stands for, as on the wire.
fn tenant_name(tenant: &[u8]) -> &[u8] {
    if tenant.is_empty() {
        DEFAULT_TENANT
    } else {
        tenant
    }
}

impl Held {
    /// A state that marks objects dirty for a bucket when `tracks`.
    pub(crate) fn new(tracks: bool) -> Held {
        Held {
            tracks,
            ..Held::default()
        }
    }

    /// The log's state, without the messages deferred while a snapshot is written
    /// ([`Held::settle`] applies them once it is written).
    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// Applies the batches of log message `stream_sequence` (later, while a snapshot shares
    /// the fold); returns how many events they hold, or why the payload is not batches. An
    /// event the index cannot take is skipped (malformed: as every reader skips it).
    pub(crate) fn apply(
        &mut self,
        payload: &bytes::Bytes,
        stream_sequence: u64,
    ) -> Result<u64, Malformed> {
        let batches = batch::checked(payload)?;
        let events = batches.iter().map(|b| b.len() as u64).sum();
        if !self.settle() {
            self.deferred.push((payload.clone(), stream_sequence));
            return Ok(events);
        }
        self.fold(batches, stream_sequence);
        Ok(events)
    }

    /// Applies `batches` to the fold, which no snapshot shares ([`Held::settle`] said so).
    fn fold(&mut self, batches: Vec<Checked<&[u8]>>, stream_sequence: u64) {
        let index = Arc::make_mut(&mut self.index);
        for batch in batches {
            for change in batch.changes() {
                if self.tracks {
                    touch(index, &mut self.dirty, &change, stream_sequence);
                }
                let _ = index.apply_change(&change);
            }
        }
    }

    /// Applies the events of a difference's log message `stream_sequence`, as its batches
    /// say them (a difference is written while no snapshot shares the fold: the messages
    /// deferred before it are applied first, and the fold is copied only if one did).
    pub(crate) fn apply_events(&mut self, events: &[Event<'_>], stream_sequence: u64) -> u64 {
        self.settle();
        let index = Arc::make_mut(&mut self.index);
        for &(kind, tenant, key, medium) in events {
            if self.tracks {
                let object = (kind != Kind::Cleared).then_some(key);
                mark(index, &mut self.dirty, tenant, object, stream_sequence);
            }
            match (kind, medium) {
                (Kind::Cleared, _) => {
                    index.clear(tenant);
                }
                (Kind::Stored, Some(medium)) => index.store(tenant, key, medium),
                (Kind::Removed, Some(medium)) => index.remove(tenant, key, medium),
                _ => {}
            }
        }
        events.len() as u64
    }

    /// Applies the deferred messages once no snapshot shares the fold; returns whether the
    /// fold is then the log's state, shared with none (messages are applied at once).
    pub(crate) fn settle(&mut self) -> bool {
        if Arc::get_mut(&mut self.index).is_none() {
            return false;
        }
        for (payload, stream_sequence) in std::mem::take(&mut self.deferred) {
            // Checked when it was taken.
            if let Ok(batches) = batch::checked(&payload) {
                self.fold(batches, stream_sequence);
            }
        }
        true
    }

    /// Whether messages wait for a snapshot to let the fold go: the fold, and the dirty
    /// objects, are behind the log.
    pub(crate) fn deferring(&self) -> bool {
        !self.deferred.is_empty()
    }

    /// The fold, to write a snapshot of: it stays as it is while shared. `None` while
    /// another snapshot shares it.
    pub(crate) fn share(&mut self) -> Option<Arc<Index>> {
        self.settle().then(|| Arc::clone(&self.index))
    }

    /// Marks the objects of a log message as dirty without applying it (its effects are
    /// held already; the bucket may lack them).
    pub(crate) fn touch_all(
        &mut self,
        payload: &[u8],
        stream_sequence: u64,
    ) -> Result<(), Malformed> {
        for batch in batch::checked(payload)? {
            for change in batch.changes() {
                touch(&self.index, &mut self.dirty, &change, stream_sequence);
            }
        }
        Ok(())
    }

    /// Marks `object` dirty as of `stream_sequence`.
    pub(crate) fn mark(&mut self, object: Object, stream_sequence: u64) {
        self.dirty.insert(object, stream_sequence);
    }

    /// Takes an object as a bucket entry holds it.
    #[cfg(test)]
    pub(crate) fn load(&mut self, tenant: &[u8], key: &[u8], media: MediumSet) {
        for medium in media.iter() {
            Arc::make_mut(&mut self.index).store(tenant, key, medium);
        }
    }

    /// Takes at most `limit` of the dirty objects, with the stream sequence that last
    /// touched each: their entries are about to be written as the index has them.
    pub(crate) fn take_dirty(&mut self, limit: usize) -> Vec<(Object, u64)> {
        let taken: Vec<Object> = self.dirty.keys().take(limit).cloned().collect();
        taken
            .into_iter()
            .filter_map(|o| self.dirty.remove_entry(&o))
            .collect()
    }

    /// Marks `objects` dirty again (their write failed), unless touched since.
    pub(crate) fn put_back(&mut self, objects: Vec<(Object, u64)>) {
        for (object, touched) in objects {
            self.dirty.entry(object).or_insert(touched);
        }
    }

    /// How many objects are dirty.
    pub(crate) fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// Forgets the dirty objects last touched at or before `stream_sequence`: the bucket
    /// holds them as of that message or later.
    pub(crate) fn clean_through(&mut self, stream_sequence: u64) {
        self.dirty.retain(|_, touched| *touched > stream_sequence);
    }

    /// The bucket entry of an object: the JSON object `kv-events mirror --dump` writes for
    /// it, or `None` when it is not present (its entry is deleted).
    pub(crate) fn entry(&self, tenant: &[u8], key: &[u8]) -> Option<String> {
        let media = self.index.get(tenant, key);
        if media == MediumSet::EMPTY {
            return None;
        }
        let line = serde_json::json!({
            "tenant": json_bytes(tenant),
            "key": json_bytes(key),
            "media": media.iter().map(Medium::as_str).collect::<Vec<_>>(),
        });
        Some(line.to_string())
    }
}

/// Marks what `event` changes as dirty: its object, or every object of the tenant a
/// `cleared` empties (looked up in `index` before the event is applied).
fn touch(
    index: &Index,
    dirty: &mut HashMap<Object, u64>,
    event: &Change<'_>,
    stream_sequence: u64,
) {
    let Some(tenant) = event.tenant_id.bytes() else {
        return;
    };
    if event.event_type.bytes() == Some(b"cleared") {
        mark(index, dirty, tenant, None, stream_sequence);
    } else if let Some(key) = event.object_key.bytes() {
        mark(index, dirty, tenant, Some(key), stream_sequence);
    }
}

/// Marks `object` of `tenant` as dirty, or with `None` every object `index` holds of it.
fn mark(
    index: &Index,
    dirty: &mut HashMap<Object, u64>,
    tenant: &[u8],
    object: Option<&[u8]>,
    stream_sequence: u64,
) {
    let tenant = tenant_name(tenant);
    match object {
        Some(key) => {
            dirty.insert((tenant.to_vec(), key.to_vec()), stream_sequence);
        }
        None => {
            for key in index.tenant(tenant).into_iter().flat_map(|o| o.keys()) {
                dirty.insert((tenant.to_vec(), key.to_vec()), stream_sequence);
            }
        }
    }
}

/// An entry's JSON back to its object: the tenant, the key and the media; `None` when it is
/// not one the relay writes.
pub(crate) fn parse_entry(value: &[u8]) -> Option<(Vec<u8>, Vec<u8>, MediumSet)> {
    let json: serde_json::Value = serde_json::from_slice(value).ok()?;
    let tenant = unjson_bytes(json.get("tenant")?)?;
    let key = unjson_bytes(json.get("key")?)?;
    let mut media = MediumSet::EMPTY;
    for name in json.get("media")?.as_array()? {
        media = media.with(match name.as_str()? {
            "cpu" => Medium::Cpu,
            "disk" => Medium::Disk,
            _ => return None,
        });
    }
    Some((tenant, key, media))
}

/// The bytes [`json_bytes`] wrote: a string, or `{"hex": "..."}`.
fn unjson_bytes(value: &serde_json::Value) -> Option<Vec<u8>> {
    if let Some(text) = value.as_str() {
        return Some(text.as_bytes().to_vec());
    }
    let hex = value.get("hex")?.as_str()?;
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn event(kind: &str, tenant: &str, key: Option<&[u8]>) -> Value {
        let mut map = vec![
            (Value::from("event_type"), Value::from(kind)),
            (Value::from("tenant_id"), Value::from(tenant)),
            (Value::from("medium"), Value::from("cpu")),
        ];
        if let Some(key) = key {
            map.push((Value::from("object_key"), Value::Binary(key.to_vec())));
        }
        Value::Map(map)
    }

    /// One batch of `events`, then a second batch of none: a payload of two batches.
    fn payload(events: Vec<Value>) -> bytes::Bytes {
        let mut out = Vec::new();
        let batch = Value::Array(vec![Value::from(1), Value::Array(events), Value::from(0)]);
        rmpv::encode::write_value(&mut out, &batch).unwrap();
        out.extend(crate::batch::empty(2, 0));
        out.into()
    }

    #[test]
    fn applied_events_mark_their_objects_dirty_until_the_bucket_has_them() {
        let mut held = Held::new(true);
        let two = payload(vec![
            event("stored", "t", Some(b"a")),
            event("stored", "t", Some(b"b")),
        ]);
        assert_eq!(held.apply(&two, 1), Ok(2));
        held.apply(&payload(vec![event("removed", "t", Some(b"a"))]), 2)
            .unwrap();
        assert_eq!(held.dirty_len(), 2);
        assert_eq!(held.entry(b"t", b"a"), None);
        held.clean_through(1);
        let taken = held.take_dirty(10);
        assert_eq!(taken, vec![((b"t".to_vec(), b"a".to_vec()), 2)]);
        held.put_back(taken);
        held.apply(&payload(vec![event("cleared", "t", None)]), 3)
            .unwrap();
        assert_eq!(
            held.dirty_len(),
            2,
            "the cleared tenant's objects are dirty"
        );
        assert!(held.index().is_empty());
        assert_eq!(held.take_dirty(1).len(), 1);
        assert_eq!(held.dirty_len(), 1);
        let not_a_batch = bytes::Bytes::from_static(b"\x93");
        assert!(held.apply(&not_a_batch, 4).is_err(), "not a batch");

        let mut untracked = Held::new(false);
        untracked.apply(&two, 1).unwrap();
        assert_eq!(untracked.dirty_len(), 0);
        assert_eq!(untracked.index().objects(), 2);
    }

    #[test]
    fn while_a_snapshot_shares_the_fold_it_stays_as_shared_and_messages_wait_in_order() {
        let mut held = Held::new(true);
        held.apply(&payload(vec![event("stored", "t", Some(b"a"))]), 1)
            .unwrap();
        let shared = held.share().expect("nothing deferred");
        let later = payload(vec![
            event("removed", "t", Some(b"a")),
            event("stored", "t", Some(b"b")),
        ]);
        assert_eq!(held.apply(&later, 2), Ok(2), "counted when taken");
        held.apply(&payload(vec![event("cleared", "t", None)]), 3)
            .unwrap();
        assert!(held.deferring());
        assert!(
            held.share().is_none(),
            "no snapshot of a fold behind the log"
        );
        assert_eq!(held.index(), &*shared, "the snapshot's fold is unchanged");
        assert_eq!(held.dirty_len(), 1, "marked dirty when applied");
        assert!(!held.settle(), "still shared");
        drop(shared);
        assert!(held.settle());
        assert!(
            held.index().is_empty(),
            "removed, stored, cleared: in order"
        );
        assert_eq!(held.dirty_len(), 2);
    }

    #[test]
    fn an_entry_parses_back_to_its_object() {
        let mut held = Held::default();
        held.load(b"t", &[0xff, 0x01], MediumSet::EMPTY.with(Medium::Disk));
        let entry = held.entry(b"t", &[0xff, 0x01]).expect("present");
        assert_eq!(
            entry,
            r#"{"key":{"hex":"ff01"},"media":["disk"],"tenant":"t"}"#
        );
        assert_eq!(
            parse_entry(entry.as_bytes()),
            Some((
                b"t".to_vec(),
                vec![0xff, 0x01],
                MediumSet::EMPTY.with(Medium::Disk)
            ))
        );
    }
}
