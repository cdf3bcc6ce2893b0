//! One event as an index takes it: its type, tenant, key and medium, and nothing else,
//! borrowed from the payload. [`Checked::changes`](super::Checked::changes) finds the four
//! values while it checks the payload, so that a follower applies millions of events a
//! second without decoding the other fields or allocating anything; [`Change::from_value`]
//! reads the same from an `rmpv` event. Every value is kept as the wire sent it, so that an
//! event an index cannot take is skipped alone, with its reason.

use rmp::Marker;
use rmpv::Value;
use std::fmt;

/// The fields of an event an index reads, borrowed from where they were read.
///
/// A key sent twice counts once, the first time, as [`field`](super::field) reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change<'a> {
    /// `event_type`: `stored`, `removed` or `cleared`.
    pub event_type: Field<'a>,
    /// `tenant_id`.
    pub tenant_id: Field<'a>,
    /// `object_key`, absent on `cleared`.
    pub object_key: Field<'a>,
    /// `medium`, `cpu` or `disk`; absent on `cleared`.
    pub medium: Field<'a>,
}

/// One value as the wire sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Field<'a> {
    /// The key is not in the event.
    #[default]
    Absent,
    /// A `str` or a `bin`, as its bytes.
    Bytes(&'a [u8]),
    /// Anything else, described for an error message.
    Other(String),
}

impl<'a> Field<'a> {
    /// The bytes of a `str` or `bin`.
    pub fn bytes(&self) -> Option<&'a [u8]> {
        match self {
            Field::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The value whose encoding is `raw`, exactly: its marker, then its data, as the
    /// payload's check found it.
    pub(super) fn from_raw(raw: &'a [u8]) -> Field<'a> {
        let header = match raw.first().map(|&b| Marker::from_u8(b)) {
            Some(Marker::FixStr(_)) => 1,
            Some(Marker::Str8 | Marker::Bin8) => 2,
            Some(Marker::Str16 | Marker::Bin16) => 3,
            Some(Marker::Str32 | Marker::Bin32) => 5,
            // Described only when an event is refused: the rare path may decode.
            _ => {
                return Field::Other(match rmpv::decode::read_value(&mut &raw[..]) {
                    Ok(value) => describe(&value),
                    Err(e) => format!("undecodable ({e})"),
                })
            }
        };
        raw.get(header..).map_or(Field::Absent, Field::Bytes)
    }
}

impl<'a> From<&'a Value> for Field<'a> {
    fn from(value: &'a Value) -> Field<'a> {
        match value {
            Value::String(s) => Field::Bytes(s.as_bytes()),
            Value::Binary(b) => Field::Bytes(b),
            other => Field::Other(describe(other)),
        }
    }
}

/// A value that is neither `str` nor `bin`, for an error message.
fn describe(value: &Value) -> String {
    match value {
        Value::Ext(..) => "an extension".into(),
        other => other.to_string(),
    }
}

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Absent => f.write_str("absent"),
            Field::Bytes(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Field::Other(what) => f.write_str(what),
        }
    }
}

impl<'a> Change<'a> {
    /// The same fields of an event decoded as an `rmpv` value.
    pub fn from_value(event: &'a Value) -> Change<'a> {
        let field = |name: &str| super::field(event, name).map_or(Field::Absent, Field::from);
        Change {
            event_type: field("event_type"),
            tenant_id: field("tenant_id"),
            object_key: field("object_key"),
            medium: field("medium"),
        }
    }

    /// The slot (0 to 3, in the order of the fields) of the value `key` names, if a
    /// `Change` reads it.
    pub(super) fn slot_of(key: &[u8]) -> Option<usize> {
        match key {
            b"event_type" => Some(0),
            b"tenant_id" => Some(1),
            b"object_key" => Some(2),
            b"medium" => Some(3),
            _ => None,
        }
    }

    /// The field in `slot`.
    pub(super) fn slot(&mut self, slot: usize) -> &mut Field<'a> {
        match slot {
            0 => &mut self.event_type,
            1 => &mut self.tenant_id,
            2 => &mut self.object_key,
            _ => &mut self.medium,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_message, Checked};
    use super::*;
    use proptest::prelude::*;

    fn frames(events: Vec<Value>) -> Vec<Vec<u8>> {
        let mut payload = Vec::new();
        let batch = Value::Array(vec![7.into(), Value::Array(events), 0.into()]);
        rmpv::encode::write_value(&mut payload, &batch).unwrap();
        vec![vec![], 1u64.to_be_bytes().to_vec(), payload]
    }

    /// A `str` of any bytes, as `rmpv` decodes one.
    fn raw_str(bytes: Vec<u8>) -> Value {
        let mut encoded = Vec::new();
        rmp::encode::write_str_len(&mut encoded, bytes.len() as u32).unwrap();
        encoded.extend(bytes);
        rmpv::decode::read_value(&mut &encoded[..]).unwrap()
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(vec!["stored", "removed", "cleared", "cpu", "disk", ""])
                .prop_map(Value::from),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
            // A `str` whose bytes need not be UTF-8.
            prop::collection::vec(any::<u8>(), 0..40).prop_map(raw_str),
            any::<i64>().prop_map(Value::from),
            Just(Value::Nil),
            (any::<i8>(), prop::collection::vec(any::<u8>(), 0..20))
                .prop_map(|(t, d)| Value::Ext(t, d)),
            prop::collection::vec(any::<u32>().prop_map(Value::from), 0..4).prop_map(Value::Array),
        ]
    }

    fn event() -> impl Strategy<Value = Value> {
        let key = prop::sample::select(vec![
            "event_type",
            "tenant_id",
            "object_key",
            "medium",
            "event_id",
            "seq_hashes",
            "lora_name",
        ]);
        prop::collection::vec((key, value()), 0..12).prop_map(|entries| {
            Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
        })
    }

    proptest! {
        /// What the check finds is what a reader of `rmpv` values finds: for any event
        /// maps, keys sent twice, absent, `str` that is not UTF-8, `bin`, nil, integers,
        /// extensions and arrays.
        #[test]
        fn checked_changes_equal_those_read_from_rmpv_values(
            events in prop::collection::vec(event(), 0..8)
        ) {
            let frames = frames(events);
            let values = decode_message(&frames).unwrap();
            let checked = Checked::new(frames.clone()).unwrap();
            let changes: Vec<Change> = checked.changes().collect();
            let expected: Vec<Change> = values.events.iter().map(Change::from_value).collect();
            prop_assert_eq!(changes, expected);
        }
    }

    #[test]
    fn a_key_sent_twice_counts_the_first_time_and_other_values_are_described() {
        let event = Value::Map(vec![
            ("medium".into(), Value::Ext(5, vec![1, 2, 3])),
            ("event_type".into(), "removed".into()),
            ("event_type".into(), "stored".into()),
            ("object_key".into(), raw_str(vec![b'k', 0xff])),
            ("tenant_id".into(), Value::Nil),
        ]);
        let checked = Checked::new(frames(vec![event])).unwrap();
        let change = checked.changes().next().unwrap();
        assert_eq!(change.medium, Field::Other("an extension".into()));
        assert_eq!(change.event_type.bytes(), Some(&b"removed"[..]));
        assert_eq!(change.object_key.bytes(), Some(&[b'k', 0xff][..]));
        assert_eq!(change.tenant_id, Field::Other("nil".into()));
    }
}
