//! The stream decoded with every field as received, as `rmpv` values ([`decode_message`]),
//! and those values read for people ([`field`], [`to_json`]). Nothing here shares code with
//! the encoder: a decoder written from the contract is what catches the encoder straying
//! from it.

use super::typed::Message;
use super::validate::{envelope, Malformed};
#[cfg(doc)]
use super::validate::{MAX_BATCH_EVENTS, MAX_EVENT_ARRAY_ITEMS, MAX_EVENT_KEYS};
use rmpv::Value;
use std::ops::Deref;

/// Decodes the three frames of one message, every event as the `rmpv` value it is on the
/// wire (for a reader that wants every field as received; [`Message::decode`] gives typed
/// events).
///
/// The payload is checked against the wire format before any value is built (at most
/// [`MAX_BATCH_EVENTS`] events of at most [`MAX_EVENT_KEYS`] keys, arrays of scalars holding
/// [`MAX_EVENT_ARRAY_ITEMS`] items per event, nothing nested deeper), so what it allocates
/// is the payload's strings and bins plus a bounded number of values, whatever lengths the
/// payload claims. The error says what was wrong and at which byte.
pub fn decode_message<F: Deref<Target = [u8]>>(frames: &[F]) -> Result<Message<Value>, Malformed> {
    let (sequence, payload, shape) = envelope(frames)?;
    let mut cursor = &payload[shape.events_at..];
    let events = (0..shape.events)
        .map(|_| rmpv::decode::read_value(&mut cursor))
        .collect::<Result<Vec<_>, _>>()
        // Unreachable after the check; an error rather than a panic all the same.
        .map_err(|e| Malformed::Payload(format!("an event does not decode: {e}")))?;
    Ok(Message {
        sequence,
        timestamp_ms: shape.timestamp_ms,
        events,
        dp_rank: shape.dp_rank,
    })
}

/// The value of `key` in an event map; `None` when the key is absent.
pub fn field<'v>(event: &'v Value, key: &str) -> Option<&'v Value> {
    event
        .as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

/// An event as JSON for people: `bin` values become `{"hex": "..."}` so they stay readable
/// and are never mistaken for text.
pub fn to_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => i
            .as_u64()
            .map(J::from)
            .or_else(|| i.as_i64().map(J::from))
            .unwrap_or(J::Null),
        Value::F32(f) => J::from(f64::from(*f)),
        Value::F64(f) => J::from(*f),
        Value::String(s) => match s.as_str() {
            Some(s) => J::from(s),
            None => serde_json::json!({ "hex": hex(s.as_bytes()) }),
        },
        Value::Binary(b) => serde_json::json!({ "hex": hex(b) }),
        Value::Array(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => J::Object(
            entries
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                        to_json(v),
                    )
                })
                .collect(),
        ),
        Value::Ext(tag, bytes) => serde_json::json!({ "ext": tag, "hex": hex(bytes) }),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `value` as msgpack, by rmpv.
    pub(crate) fn payload(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    #[test]
    fn a_well_formed_message_decodes() {
        let event = Value::Map(vec![(Value::from("event_type"), Value::from("cleared"))]);
        let body = Value::Array(vec![
            Value::from(5u64),
            Value::Array(vec![event.clone()]),
            Value::from(2u64),
        ]);
        let frames = vec![vec![], 9u64.to_be_bytes().to_vec(), payload(&body)];
        let message = decode_message(&frames).unwrap();
        let Message {
            sequence,
            timestamp_ms,
            events,
            dp_rank,
        } = &message;
        assert_eq!((*sequence, *timestamp_ms, *dp_rank), (9, 5, 2));
        assert_eq!(
            field(&events[0], "event_type"),
            Some(&Value::from("cleared"))
        );
        assert_eq!(field(&events[0], "medium"), None);
    }

    #[test]
    fn malformed_messages_say_why() {
        let body = payload(&Value::Array(vec![]));
        for (frames, kind, why) in [
            (vec![vec![]], Malformed::Frames { count: 1 }, "1 frames"),
            (
                vec![vec![b't'; 256], vec![0; 8], body.clone()],
                Malformed::Topic { bytes: 256 },
                "topic of 256",
            ),
            (
                vec![vec![], vec![0; 4], body.clone()],
                Malformed::Sequence { bytes: 4 },
                "sequence of 4",
            ),
        ] {
            let err = decode_message(&frames).unwrap_err();
            assert_eq!(err, kind);
            assert!(err.to_string().contains(why), "{err}");
        }
        let err = decode_message(&[vec![], vec![0; 8], body]).unwrap_err();
        assert!(
            matches!(&err, Malformed::Payload(why)
            if why.starts_with("the payload is an array of 0, expected")),
            "{err}"
        );
    }

    /// A batch of one event holding `value` under the key "k".
    fn holding(value: Value) -> Vec<u8> {
        payload(&Value::Array(vec![
            Value::from(5u64),
            Value::Array(vec![Value::Map(vec![(Value::from("k"), value)])]),
            Value::from(2u64),
        ]))
    }

    #[test]
    fn a_payload_outside_the_format_is_refused_before_any_value_is_built_and_says_where() {
        let decode = |payload: Vec<u8>| {
            decode_message(&[vec![], vec![0; 8], payload])
                .unwrap_err()
                .to_string()
        };
        let mut trailing = holding(Value::Nil);
        trailing.extend([0; 5]);
        let mut truncated = holding(Value::Nil);
        truncated.pop();
        let nested = holding(Value::Array(vec![Value::Array(vec![])]));
        let many_events = payload(&Value::Array(vec![
            Value::from(5u64),
            Value::Array(vec![Value::Map(vec![]); 65]),
            Value::from(2u64),
        ]));
        for (payload, why) in [
            (
                b"{}".to_vec(),
                "the payload is not a msgpack batch: byte 0 (0x7b) is a positive integer, \
                 expected an array of 3 [timestamp_ms, events, dp_rank]",
            ),
            (
                vec![0xdd, 0xff, 0xff, 0xff, 0xff],
                "the payload is an array of 4294967295",
            ),
            (trailing, "the payload has 5 bytes after the array"),
            (
                truncated,
                "the payload ends at byte 7, where dp_rank should begin",
            ),
            (
                nested,
                "event 0, key \"k\" (byte 7) is an array inside a value, deeper",
            ),
            (
                many_events,
                "events (byte 2) is an array of 65, expected 0 (a heartbeat) to 64 events",
            ),
            (
                vec![0x93, 0xa1, b'x'],
                "timestamp_ms (byte 1) is a string, expected an unsigned integer",
            ),
            (
                vec![0x93, 0x05, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff],
                "event 0 (byte 3) has 4294967295 keys, at most 32 expected",
            ),
            (
                vec![0x93, 0x05, 0x91, 0x81, 0xdb, 0xff, 0xff, 0xff, 0xff],
                "the payload ends inside event 0: 4294967295 bytes wanted at byte 9, 0 left",
            ),
            (
                holding(Value::Array(vec![Value::Nil; 257])),
                "more than the 256 array items an event may hold",
            ),
        ] {
            let err = decode(payload);
            assert!(err.contains(why), "{err}\nwanted: {why}");
        }
    }

    #[test]
    fn arrays_of_scalars_within_the_bounds_decode() {
        let hashes = Value::Array(vec![Value::from(7u64); 256]);
        let frames = vec![vec![], 1u64.to_be_bytes().to_vec(), holding(hashes.clone())];
        let events = decode_message(&frames).unwrap().events;
        assert_eq!(field(&events[0], "k"), Some(&hashes));
    }

    #[test]
    fn binary_becomes_marked_hex_in_json() {
        let json = to_json(&Value::Binary(vec![0xff, 0x00]));
        assert_eq!(json, serde_json::json!({ "hex": "ff00" }));
    }
}
