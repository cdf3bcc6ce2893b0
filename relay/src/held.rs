//! What the log says: the fold of every log message written so far, which is what a reader
//! of the stream holds, and (with a bucket) the objects whose bucket entry still has to be
//! written.

use crate::batch;
use mooncake_kv_events::subscriber::{json_bytes, Index, DEFAULT_TENANT};
use mooncake_kv_events::wire::{Change, Malformed};
use mooncake_kv_events::{Medium, MediumSet};
use std::collections::HashMap;

/// A tenant and an object key, as bytes.
pub(crate) type Object = (Vec<u8>, Vec<u8>);

/// The log's state and what the bucket lacks of it.
#[derive(Debug, Default)]
pub(crate) struct Held {
    index: Index,
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

    /// The log's state.
    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// Applies the batches of log message `stream_sequence`; returns how many events they
    /// hold, or why the payload is not batches. An event the index cannot take is skipped
    /// (malformed: as every reader skips it).
    pub(crate) fn apply(&mut self, payload: &[u8], stream_sequence: u64) -> Result<u64, Malformed> {
        let mut events = 0;
        for batch in batch::checked(payload)? {
            events += batch.len() as u64;
            for change in batch.changes() {
                if self.tracks {
                    self.touch(&change, stream_sequence);
                }
                let _ = self.index.apply_change(&change);
            }
        }
        Ok(events)
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
                self.touch(&change, stream_sequence);
            }
        }
        Ok(())
    }

    /// Marks what `event` changes as dirty: its object, or every object of the tenant a
    /// `cleared` empties (looked up before the event is applied).
    fn touch(&mut self, event: &Change<'_>, stream_sequence: u64) {
        let Some(tenant) = event.tenant_id.bytes().map(tenant_name) else {
            return;
        };
        if event.event_type.bytes() == Some(b"cleared") {
            let keys: Vec<Vec<u8>> = self
                .index
                .tenant(tenant)
                .map(|objects| objects.keys().cloned().collect())
                .unwrap_or_default();
            for key in keys {
                self.dirty.insert((tenant.to_vec(), key), stream_sequence);
            }
        } else if let Some(key) = event.object_key.bytes() {
            self.dirty
                .insert((tenant.to_vec(), key.to_vec()), stream_sequence);
        }
    }

    /// Marks `object` dirty as of `stream_sequence`.
    pub(crate) fn mark(&mut self, object: Object, stream_sequence: u64) {
        self.dirty.insert(object, stream_sequence);
    }

    /// Takes an object as a bucket entry holds it.
    #[cfg(test)]
    pub(crate) fn load(&mut self, tenant: &[u8], key: &[u8], media: MediumSet) {
        for medium in media.iter() {
            self.index.store(tenant, key, medium);
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
    fn payload(events: Vec<Value>) -> Vec<u8> {
        let mut out = Vec::new();
        let batch = Value::Array(vec![Value::from(1), Value::Array(events), Value::from(0)]);
        rmpv::encode::write_value(&mut out, &batch).unwrap();
        out.extend(crate::batch::empty(2, 0));
        out
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
        assert!(held.apply(b"\x93", 4).is_err(), "not a batch");

        let mut untracked = Held::new(false);
        untracked.apply(&two, 1).unwrap();
        assert_eq!(untracked.dirty_len(), 0);
        assert_eq!(untracked.index().objects(), 2);
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
