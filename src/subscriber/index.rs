//! What a subscriber holds of a master's state: for each tenant, each object key readable on
//! some medium, and the media it is readable on. Built from the stream's events, which are
//! absolute: `stored` (tenant, key, medium) means present, `removed` means absent, `cleared`
//! (tenant) means every object of that tenant gone.
//!
//! [`super::Follower`] keeps one [`Index`] per publisher it follows, and heals it
//! through snapshots and replays when the stream loses something.

use super::objects::Objects;
use crate::event::EventKind;
use crate::media::{Medium, MediumSet};
use crate::wire::{Change, Field};
use rmpv::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};

/// The tenant the wire names when the master's tenant is empty.
pub const DEFAULT_TENANT: &[u8] = b"default";

/// Tenant → key → media, keys and tenants as bytes (the wire sends `str` or `bin`; both are
/// taken as their bytes). An object is present only while its media set is not empty, and a
/// tenant only while it holds an object, so two indexes that hold the same objects are
/// equal.
///
/// ```
/// use mooncake_kv_events::subscriber::{Applied, Index, RejectedEvent};
/// use mooncake_kv_events::{EventKind, Medium};
/// use rmpv::Value;
///
/// // An event as `Subscriber::recv` hands it: a map, every field as received.
/// let event = |fields: &[(&str, &str)]| {
///     Value::Map(fields.iter().map(|&(k, v)| (k.into(), v.into())).collect())
/// };
/// let mut index = Index::new();
/// let stored = event(&[
///     ("event_type", "stored"),
///     ("tenant_id", "default"),
///     ("object_key", "llama/0"),
///     ("medium", "cpu"),
/// ]);
/// assert_eq!(index.apply(&stored), Ok(Applied::Stored));
/// // The master's empty tenant is "default" on the wire.
/// assert!(index.get(b"", b"llama/0").contains(Medium::Cpu));
///
/// // An event the index cannot take changes nothing, and says why.
/// let keyless = event(&[("event_type", "removed"), ("tenant_id", "default"), ("medium", "cpu")]);
/// match index.apply(&keyless) {
///     Err(RejectedEvent::Missing { event: EventKind::Removed, field }) => {
///         assert_eq!(field, "object_key")
///     }
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(index.objects(), 1);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Index {
    tenants: BTreeMap<Vec<u8>, Objects>,
    objects: usize,
}

/// What one event did to an [`Index`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A `stored`: the object is readable on the medium.
    Stored,
    /// A `removed`: the object is no longer readable on the medium.
    Removed,
    /// A `cleared`: the tenant's objects are gone; how many there were.
    Cleared(usize),
}

impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index")
            .field("tenants", &self.tenants.len())
            .field("objects", &self.objects)
            .finish()
    }
}

/// Why an [`Index`] did not take an event: [`Index::apply`] changed nothing. Concerns that
/// event alone; a reader skips it and goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectedEvent {
    /// The event has no `event_type`, or one that is not a string.
    NoEventType,
    /// The `event_type` is none of `stored`, `removed`, `cleared`.
    UnknownType(String),
    /// A field the event needs (`tenant_id`, `object_key`) is absent.
    Missing {
        /// The event's type.
        event: EventKind,
        /// The field.
        field: &'static str,
    },
    /// A field the event needs is neither a `str` nor a `bin`.
    NotBytes {
        /// The event's type.
        event: EventKind,
        /// The field.
        field: &'static str,
        /// What it holds instead, described.
        found: String,
    },
    /// A `stored` or `removed` event has no `medium`, or one other than `cpu` or `disk`.
    UnknownMedium {
        /// The event's type.
        event: EventKind,
    },
}

impl fmt::Display for RejectedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectedEvent::NoEventType => f.write_str("an event without an event_type string"),
            RejectedEvent::UnknownType(other) => write!(f, "an event of unknown type {other:?}"),
            RejectedEvent::Missing { event, field } => {
                write!(f, "a {} event without {field}", event.as_str())
            }
            RejectedEvent::NotBytes {
                event,
                field,
                found,
            } => write!(f, "a {} event whose {field} is {found}", event.as_str()),
            RejectedEvent::UnknownMedium { event } => {
                write!(
                    f,
                    "a {} event without a medium of cpu or disk",
                    event.as_str()
                )
            }
        }
    }
}

impl std::error::Error for RejectedEvent {}

/// The bytes of `field`, named `name`, of an `event`, or why there are none.
fn known<'e>(
    event: EventKind,
    name: &'static str,
    field: &Field<'e>,
) -> Result<&'e [u8], RejectedEvent> {
    match field {
        Field::Bytes(b) => Ok(b),
        Field::Other(found) => Err(RejectedEvent::NotBytes {
            event,
            field: name,
            found: found.clone(),
        }),
        Field::Absent => Err(RejectedEvent::Missing { event, field: name }),
    }
}

/// The tenant an empty name stands for, as on the wire.
pub(crate) fn tenant_name(tenant: &[u8]) -> &[u8] {
    if tenant.is_empty() {
        DEFAULT_TENANT
    } else {
        tenant
    }
}

impl Index {
    /// An empty index.
    pub fn new() -> Index {
        Index::default()
    }

    /// The objects held, all tenants together.
    pub fn objects(&self) -> usize {
        self.objects
    }

    /// Whether no object is held.
    pub fn is_empty(&self) -> bool {
        self.objects == 0
    }

    /// The media `key` of `tenant` is readable on; empty when it is not held. An empty
    /// `tenant` is `default`, as on the wire.
    pub fn get(&self, tenant: &[u8], key: &[u8]) -> MediumSet {
        self.tenants
            .get(tenant_name(tenant))
            .and_then(|objects| objects.get(key))
            .unwrap_or(MediumSet::EMPTY)
    }

    /// The objects of `tenant`, if it holds any.
    pub fn tenant(&self, tenant: &[u8]) -> Option<&Objects> {
        self.tenants.get(tenant_name(tenant))
    }

    /// The tenants that hold an object, in byte order.
    pub fn tenants(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.tenants.keys().map(Vec::as_slice)
    }

    /// Every object: tenant, key and media, in byte order of tenant then key.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8], MediumSet)> + '_ {
        self.tenants.iter().flat_map(|(tenant, objects)| {
            let mut sorted: Vec<(&[u8], MediumSet)> = objects.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            sorted
                .into_iter()
                .map(move |(key, media)| (tenant.as_slice(), key, media))
        })
    }

    /// `key` of `tenant` is readable on `medium` (a `stored`).
    pub fn store(&mut self, tenant: &[u8], key: &[u8], medium: Medium) {
        // Looked up before inserted: the names are copied only for a new tenant or object.
        let tenant = tenant_name(tenant);
        let objects = match self.tenants.get_mut(tenant) {
            Some(objects) => objects,
            None => self.tenants.entry(tenant.to_vec()).or_default(),
        };
        if objects.update(key, |media| media.with(medium)).is_empty() {
            self.objects += 1;
        }
    }

    /// `key` of `tenant` is no longer readable on `medium` (a `removed`); the object goes
    /// when it is readable nowhere.
    pub fn remove(&mut self, tenant: &[u8], key: &[u8], medium: Medium) {
        let tenant = tenant_name(tenant);
        let Some(objects) = self.tenants.get_mut(tenant) else {
            return;
        };
        let gone = MediumSet::EMPTY.with(medium);
        let before = objects.update(key, |media| media.minus(gone));
        if !before.is_empty() && before.minus(gone).is_empty() {
            self.objects -= 1;
            if objects.is_empty() {
                self.tenants.remove(tenant);
            }
        }
    }

    /// Every object of `tenant` is gone (a `cleared`); returns how many there were.
    pub fn clear(&mut self, tenant: &[u8]) -> usize {
        let gone = self
            .tenants
            .remove(tenant_name(tenant))
            .map_or(0, |objects| objects.len());
        self.objects -= gone;
        gone
    }

    /// Takes every object of `other`'s `tenant` in place of this index's own; `None`: every
    /// tenant, the whole index replaced.
    pub fn replace(&mut self, tenant: Option<&[u8]>, other: Index) {
        match tenant {
            None => *self = other,
            Some(tenant) => {
                self.clear(tenant);
                let name = tenant_name(tenant);
                if let Some((name, objects)) = other.tenants.into_iter().find(|(t, _)| t == name) {
                    self.objects += objects.len();
                    self.tenants.insert(name, objects);
                }
            }
        }
    }

    /// Adds every object of `other`: an object held by both is readable on the media of
    /// either.
    pub fn merge(&mut self, other: &Index) {
        for (tenant, key, media) in other.iter() {
            for medium in media.iter() {
                self.store(tenant, key, medium);
            }
        }
    }

    /// Applies one event map as the wire carries it. An event the index cannot take (an
    /// unknown `event_type`, a `stored` or `removed` without a key or a medium it knows, no
    /// tenant) changes nothing; the error says why.
    pub fn apply(&mut self, event: &Value) -> Result<Applied, RejectedEvent> {
        self.apply_change(&Change::from_value(event))
    }

    /// [`Index::apply`] of an event decoded as a [`Change`], its four fields alone.
    pub fn apply_change(&mut self, event: &Change<'_>) -> Result<Applied, RejectedEvent> {
        let kind = event
            .event_type
            .bytes()
            .and_then(|kind| std::str::from_utf8(kind).ok())
            .ok_or(RejectedEvent::NoEventType)?;
        let kind = match kind {
            "stored" => EventKind::Stored,
            "removed" => EventKind::Removed,
            "cleared" => EventKind::Cleared,
            other => return Err(RejectedEvent::UnknownType(other.to_owned())),
        };
        let tenant = known(kind, "tenant_id", &event.tenant_id)?;
        if kind == EventKind::Cleared {
            return Ok(Applied::Cleared(self.clear(tenant)));
        }
        let key = known(kind, "object_key", &event.object_key)?;
        let medium = match event.medium.bytes() {
            Some(b"cpu") => Medium::Cpu,
            Some(b"disk") => Medium::Disk,
            _ => return Err(RejectedEvent::UnknownMedium { event: kind }),
        };
        if kind == EventKind::Stored {
            self.store(tenant, key, medium);
            Ok(Applied::Stored)
        } else {
            self.remove(tenant, key, medium);
            Ok(Applied::Removed)
        }
    }

    /// Per tenant: objects, objects readable on `cpu`, objects readable on `disk`.
    pub fn summary(&self) -> BTreeMap<&[u8], [usize; 3]> {
        self.tenants
            .iter()
            .map(|(tenant, objects)| {
                let mut counts = [objects.len(), 0, 0];
                for media in objects.values() {
                    counts[1] += usize::from(media.contains(Medium::Cpu));
                    counts[2] += usize::from(media.contains(Medium::Disk));
                }
                (tenant.as_slice(), counts)
            })
            .collect()
    }

    /// Writes one JSON object per line and per object, in byte order of tenant then key:
    /// `{"tenant": T, "key": K, "media": ["cpu", "disk"]}`. A tenant or key that is UTF-8 is a
    /// JSON string; one that is not is `{"hex": "..."}`, its bytes in lowercase hex, as
    /// `kv-events tail` writes them.
    pub fn write_json_lines(&self, out: &mut impl Write) -> io::Result<()> {
        for (tenant, key, media) in self.iter() {
            let line = serde_json::json!({
                "tenant": json_bytes(tenant),
                "key": json_bytes(key),
                "media": media.iter().map(Medium::as_str).collect::<Vec<_>>(),
            });
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

impl<'a> FromIterator<(&'a [u8], &'a [u8], MediumSet)> for Index {
    /// The index holding these objects (an empty media set adds nothing).
    fn from_iter<I: IntoIterator<Item = (&'a [u8], &'a [u8], MediumSet)>>(objects: I) -> Index {
        let mut index = Index::new();
        for (tenant, key, media) in objects {
            for medium in media.iter() {
                index.store(tenant, key, medium);
            }
        }
        index
    }
}

/// Bytes as JSON: a string when they are UTF-8, `{"hex": "..."}` when not.
pub fn json_bytes(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::Value::from(text),
        Err(_) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            serde_json::json!({ "hex": hex })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, tenant: Value, key: Option<Value>, medium: Option<&str>) -> Value {
        let mut map = vec![
            (Value::from("event_type"), Value::from(kind)),
            (Value::from("tenant_id"), tenant),
        ];
        if let Some(key) = key {
            map.push((Value::from("object_key"), key));
        }
        map.push((
            Value::from("medium"),
            medium.map_or(Value::Nil, Value::from),
        ));
        Value::Map(map)
    }

    #[test]
    fn events_are_absolute() {
        let mut index = Index::new();
        let stored =
            |key: &str, medium| event("stored", "t".into(), Some(key.into()), Some(medium));
        assert_eq!(index.apply(&stored("a", "cpu")), Ok(Applied::Stored));
        // A stored of a medium already held changes nothing.
        index.apply(&stored("a", "cpu")).unwrap();
        index.apply(&stored("a", "disk")).unwrap();
        index.apply(&stored("b", "disk")).unwrap();
        assert_eq!(index.objects(), 2);
        assert_eq!(
            index.get(b"t", b"a"),
            MediumSet::from([Medium::Cpu, Medium::Disk])
        );
        let removed = event("removed", "t".into(), Some("a".into()), Some("cpu"));
        assert_eq!(index.apply(&removed), Ok(Applied::Removed));
        index.apply(&removed).unwrap();
        assert_eq!(index.get(b"t", b"a"), MediumSet::from([Medium::Disk]));
        let removed = event("removed", "t".into(), Some("a".into()), Some("disk"));
        index.apply(&removed).unwrap();
        assert_eq!(index.get(b"t", b"a"), MediumSet::EMPTY);
        assert_eq!(index.objects(), 1);
        let cleared = event("cleared", "t".into(), None, None);
        assert_eq!(index.apply(&cleared), Ok(Applied::Cleared(1)));
        assert!(index.is_empty());
        assert_eq!(index, Index::new(), "no empty tenant is left behind");
    }

    #[test]
    fn str_and_bin_are_their_bytes_and_the_empty_tenant_is_default() {
        let mut index = Index::new();
        let key = Value::Binary(vec![0xff, 0x00]);
        index
            .apply(&event("stored", "default".into(), Some(key), Some("cpu")))
            .unwrap();
        index
            .apply(&event(
                "stored",
                Value::Binary(b"x".to_vec()),
                Some("k".into()),
                Some("disk"),
            ))
            .unwrap();
        assert_eq!(index.get(b"", &[0xff, 0]), MediumSet::from([Medium::Cpu]));
        assert_eq!(index.get(b"x", b"k"), MediumSet::from([Medium::Disk]));
        index.store(b"", b"plain", Medium::Disk);
        assert_eq!(index.tenant(b"default").map(Objects::len), Some(2));
        let mut out = Vec::new();
        index.write_json_lines(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"key\":\"plain\",\"media\":[\"disk\"],\"tenant\":\"default\"}\n\
             {\"key\":{\"hex\":\"ff00\"},\"media\":[\"cpu\"],\"tenant\":\"default\"}\n\
             {\"key\":\"k\",\"media\":[\"disk\"],\"tenant\":\"x\"}\n"
        );
    }

    #[test]
    fn an_event_the_index_cannot_take_changes_nothing_and_says_why() {
        let mut index = Index::new();
        index.store(b"t", b"a", Medium::Cpu);
        let before = index.clone();
        for (bad, why) in [
            (Value::from(3), "without an event_type"),
            (
                event("evicted", "t".into(), None, None),
                "unknown type \"evicted\"",
            ),
            (
                event("stored", "t".into(), None, Some("cpu")),
                "without object_key",
            ),
            (
                event("stored", "t".into(), Some("a".into()), Some("gpu")),
                "without a medium",
            ),
            (
                event("removed", Value::from(7), Some("a".into()), Some("cpu")),
                "whose tenant_id is 7",
            ),
        ] {
            let err = index.apply(&bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        assert_eq!(index, before);
        // A reader branches on the kind, not on the text.
        assert_eq!(
            index.apply(&event("stored", "t".into(), None, Some("cpu"))),
            Err(RejectedEvent::Missing {
                event: EventKind::Stored,
                field: "object_key"
            })
        );
        assert_eq!(
            index.apply(&event("moved", "t".into(), None, None)),
            Err(RejectedEvent::UnknownType("moved".into()))
        );
    }

    #[test]
    fn replace_merge_and_summary() {
        let mut index: Index = [
            (&b"a"[..], &b"1"[..], MediumSet::from([Medium::Cpu])),
            (b"b", b"1", MediumSet::from([Medium::Disk])),
        ]
        .into_iter()
        .collect();
        let fresh: Index = [(&b"a"[..], &b"2"[..], MediumSet::from([Medium::Disk]))]
            .into_iter()
            .collect();
        let mut tenant_a = index.clone();
        tenant_a.replace(Some(b"a"), fresh.clone());
        assert_eq!(tenant_a.objects(), 2);
        assert_eq!(tenant_a.get(b"a", b"1"), MediumSet::EMPTY);
        assert_eq!(tenant_a.get(b"b", b"1"), MediumSet::from([Medium::Disk]));
        index.merge(&fresh);
        index.store(b"a", b"2", Medium::Cpu);
        assert_eq!(index.objects(), 3);
        let summary = index.summary();
        assert_eq!(summary[&b"a"[..]], [2, 2, 1]);
        assert_eq!(summary[&b"b"[..]], [1, 0, 1]);
        let mut whole = index.clone();
        whole.replace(None, fresh.clone());
        assert_eq!(whole, fresh);
    }
}
