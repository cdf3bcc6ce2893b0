//! What the log says: the fold of every log message written so far, which is what a reader
//! of the stream holds, and the objects whose bucket entry still has to be written.

use mooncake_kv_events::subscriber::{json_bytes, Index, DEFAULT_TENANT};
use mooncake_kv_events::wire::field;
use mooncake_kv_events::{Medium, MediumSet};
use rmpv::Value;
use std::collections::HashMap;

/// A tenant and an object key, as bytes.
pub(crate) type Object = (Vec<u8>, Vec<u8>);

/// The log's state and what the bucket lacks of it.
#[derive(Debug, Default)]
pub(crate) struct Held {
    index: Index,
    /// Objects touched by log messages whose bucket entry may not say what `index` says,
    /// with the stream sequence of the last message that touched them: an entry the
    /// bucket holds as of a later message is known to be written.
    dirty: HashMap<Object, u64>,
}

/// The bytes of a `str` or `bin` field.
fn bytes(value: Option<&Value>) -> Option<&[u8]> {
    match value? {
        Value::String(text) => Some(text.as_bytes()),
        Value::Binary(bytes) => Some(bytes),
        _ => None,
    }
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
    /// The log's state.
    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    /// Applies the events of log message `stream_sequence`; returns how many the index could
    /// not take (malformed: counted, skipped, as every reader skips them).
    pub(crate) fn apply(&mut self, events: &[Value], stream_sequence: u64) -> u64 {
        let mut skipped = 0;
        for event in events {
            self.touch(event, stream_sequence);
            if self.index.apply(event).is_err() {
                skipped += 1;
            }
        }
        skipped
    }

    /// Marks what `event` changes as dirty: its object, or every object of the tenant a
    /// `cleared` empties (looked up before the event is applied).
    fn touch(&mut self, event: &Value, stream_sequence: u64) {
        let Some(tenant) = bytes(field(event, "tenant_id")).map(tenant_name) else {
            return;
        };
        let kind = field(event, "event_type").and_then(Value::as_str);
        if kind == Some("cleared") {
            let keys: Vec<Vec<u8>> = self
                .index
                .tenant(tenant)
                .map(|objects| objects.keys().cloned().collect())
                .unwrap_or_default();
            for key in keys {
                self.dirty.insert((tenant.to_vec(), key), stream_sequence);
            }
        } else if let Some(key) = bytes(field(event, "object_key")) {
            self.dirty
                .insert((tenant.to_vec(), key.to_vec()), stream_sequence);
        }
    }

    /// Takes an object the bucket holds, as it holds it (a relay starting from the bucket).
    pub(crate) fn load(&mut self, tenant: &[u8], key: &[u8], media: MediumSet) {
        for medium in media.iter() {
            self.index.store(tenant, key, medium);
        }
    }

    /// At most `limit` of the dirty objects.
    pub(crate) fn dirty(&self, limit: usize) -> Vec<Object> {
        self.dirty.keys().take(limit).cloned().collect()
    }

    /// Forgets `objects`: their entries were written as the index has them.
    pub(crate) fn clean(&mut self, objects: &[Object]) {
        for object in objects {
            self.dirty.remove(object);
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

    #[test]
    fn applied_events_mark_their_objects_dirty_until_the_bucket_has_them() {
        let mut held = Held::default();
        held.apply(
            &[
                event("stored", "t", Some(b"a")),
                event("stored", "t", Some(b"b")),
            ],
            1,
        );
        held.apply(&[event("removed", "t", Some(b"a"))], 2);
        assert_eq!(held.dirty_len(), 2);
        assert_eq!(held.entry(b"t", b"a"), None);
        held.clean_through(1);
        assert_eq!(held.dirty(10), vec![(b"t".to_vec(), b"a".to_vec())]);
        held.apply(&[event("cleared", "t", None)], 3);
        assert_eq!(
            held.dirty_len(),
            2,
            "the cleared tenant's objects are dirty"
        );
        assert!(held.index().is_empty());
        let some = held.dirty(1);
        held.clean(&some);
        assert_eq!(held.dirty_len(), 1);
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
