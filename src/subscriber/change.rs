//! One event as an [`Index`](super::Index) takes it: its type, tenant, key and medium, and
//! nothing else. Decoded straight from the payload by `rmp-serde` (the other fields are
//! skipped unread), so that a follower applies millions of events a second; every value is
//! kept as the wire sent it, so that an event the index cannot take is skipped alone, with
//! its reason, as with the `rmpv` path.

use rmpv::Value;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// The fields of an event an index reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Change {
    /// `event_type`: `stored`, `removed` or `cleared`.
    pub event_type: Field,
    /// `tenant_id`.
    pub tenant_id: Field,
    /// `object_key`, absent on `cleared`.
    pub object_key: Field,
    /// `medium`, `cpu` or `disk`; absent on `cleared`.
    pub medium: Field,
}

/// One value as the wire sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Field {
    /// The key is not in the event.
    #[default]
    Absent,
    /// A `str` or a `bin`, as its bytes.
    Bytes(Vec<u8>),
    /// Anything else, described for an error message.
    Other(String),
}

impl Field {
    /// The bytes of a `str` or `bin`.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Field::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Absent => f.write_str("absent"),
            Field::Bytes(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Field::Other(what) => f.write_str(what),
        }
    }
}

impl Change {
    /// The same fields of an event decoded as an `rmpv` value.
    pub fn from_value(event: &Value) -> Change {
        let field = |name: &str| match crate::wire::field(event, name) {
            None => Field::Absent,
            Some(Value::String(s)) => Field::Bytes(s.as_bytes().to_vec()),
            Some(Value::Binary(b)) => Field::Bytes(b.clone()),
            Some(other) => Field::Other(other.to_string()),
        };
        Change {
            event_type: field("event_type"),
            tenant_id: field("tenant_id"),
            object_key: field("object_key"),
            medium: field("medium"),
        }
    }
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Field, D::Error> {
        deserializer.deserialize_any(FieldVisitor)
    }
}

struct FieldVisitor;

impl<'de> Visitor<'de> for FieldVisitor {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any msgpack value")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
        Ok(Field::Bytes(v.as_bytes().to_vec()))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Field, E> {
        Ok(Field::Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Field, E> {
        Ok(Field::Bytes(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Field, E> {
        Ok(Field::Other("nil".into()))
    }

    fn visit_none<E: de::Error>(self) -> Result<Field, E> {
        Ok(Field::Other("nil".into()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Field, E> {
        Ok(Field::Other(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Field, E> {
        Ok(Field::Other(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Field, E> {
        Ok(Field::Other(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Field, E> {
        Ok(Field::Other(v.to_string()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Field, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::Other("an array".into()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Field, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Field::Other("a map".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    #[test]
    fn the_four_fields_are_read_as_sent_and_the_rest_skipped() {
        let event = Value::Map(vec![
            ("event_id".into(), 7.into()),
            ("event_type".into(), "stored".into()),
            ("tenant_id".into(), Value::Binary(vec![0xff, 0])),
            ("object_key".into(), 5.into()),
            ("seq_hashes".into(), Value::Array(vec![1.into(), 2.into()])),
            ("medium".into(), Value::Nil),
        ]);
        let change: Change = rmp_serde::from_slice(&encoded(&event)).unwrap();
        assert_eq!(change, Change::from_value(&event));
        assert_eq!(change.event_type.bytes(), Some(&b"stored"[..]));
        assert_eq!(change.tenant_id.bytes(), Some(&[0xff, 0][..]));
        assert_eq!(change.object_key, Field::Other("5".into()));
        assert_eq!(change.medium, Field::Other("nil".into()));
        let cleared = Value::Map(vec![("event_type".into(), "cleared".into())]);
        let change: Change = rmp_serde::from_slice(&encoded(&cleared)).unwrap();
        assert_eq!(change.object_key, Field::Absent);
    }
}
