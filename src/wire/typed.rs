//! The stream decoded into named, typed values with `rmp-serde`: [`Message`] for one message,
//! [`Event`] for the contract's fields of an event, [`Bytes`] for the master's bytes (tenant,
//! key, group), which arrive as `str` or as `bin`.
//!
//! A payload is checked against the wire format by the same validator as the `rmpv` path
//! before `rmp-serde` reads it, so decoding stays as strict and as bounded as
//! [`decode_message`](super::decode_message); then each event is deserialized into the type
//! asked for, and the first one that does not fit refuses the message, naming it.

use super::change::{Change, Field};
use super::validate::{envelope, envelope_with, Malformed};
use crate::event::EventKind;
use crate::media::Medium;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::ops::{Deref, Range};

/// One message of the stream, decoded: its transport sequence, the batch's timestamp, its
/// events and the trailer's `dp_rank`.
///
/// `E` is what each event is deserialized into: [`Event`] by default, or any type of the
/// reader's that implements `serde::Deserialize` (a struct with the fields it needs; unknown
/// keys are ignored by serde's derive). [`decode_message`](super::decode_message) gives the
/// same shape with every event as an `rmpv` value.
///
/// ```no_run
/// use mooncake_kv_events::wire::{Event, Message};
/// use mooncake_kv_events::subscriber::Subscriber;
/// use std::time::Duration;
///
/// let mut subscriber = Subscriber::connect("tcp://127.0.0.1:5557", 100_000)?;
/// while let Some(batch) = subscriber.recv_as::<Event>(Duration::from_secs(5))? {
///     for event in &batch.events {
///         println!("{} {:?} {:?} {:?}", batch.sequence, event.event_type, event.medium, event.object_key);
///     }
/// }
/// # let frames: Vec<Vec<u8>> = Vec::new();
/// // Or from the three frames of a message received some other way:
/// let message: Message = Message::decode(&frames)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Message<E = Event> {
    /// The transport sequence (frame 2).
    pub sequence: u64,
    /// The batch timestamp, Unix milliseconds.
    pub timestamp_ms: u64,
    /// The events, 1 to 64, in the order they were published.
    pub events: Vec<E>,
    /// The trailer's data-parallel rank.
    pub dp_rank: u64,
}

impl<E: DeserializeOwned> Message<E> {
    /// Decodes the three frames of one message, each event into `E`.
    ///
    /// The frames and the payload must be the wire format's, exactly as for
    /// [`decode_message`](super::decode_message): three frames, a topic of at most
    /// [`MAX_TOPIC_BYTES`](super::MAX_TOPIC_BYTES) bytes, a sequence of 8 bytes, a msgpack
    /// array of 3 whose events are 0 to 64 maps within the same bounds. Then each event must
    /// deserialize into `E`; the first that does not refuses the message with [`Malformed`],
    /// naming the event, the sequence and serde's reason. Nothing panics, whatever the bytes.
    pub fn decode<F: Deref<Target = [u8]>>(frames: &[F]) -> Result<Message<E>, Malformed> {
        let (sequence, payload, shape) = envelope(frames)?;
        let mut events = Vec::with_capacity(shape.events as usize);
        let mut reader = rmp_serde::Deserializer::from_read_ref(&payload[shape.events_at..]);
        for index in 0..shape.events {
            let event = E::deserialize(&mut reader).map_err(|e| Malformed::Event {
                index,
                events: shape.events,
                sequence,
                into: std::any::type_name::<E>(),
                why: e.to_string(),
            })?;
            events.push(event);
        }
        Ok(Message {
            sequence,
            timestamp_ms: shape.timestamp_ms,
            events,
            dp_rank: shape.dp_rank,
        })
    }
}

/// One message whose frames passed the wire format's checks, kept as it arrived (libzmq's
/// buffer, say) with, for each event, where the four values an index reads lie: a reader
/// that holds messages before it applies them, or applies millions of events a second,
/// allocates nothing per event and decodes nothing it does not read.
pub struct Checked<P> {
    /// The transport sequence (frame 2).
    pub sequence: u64,
    /// The batch timestamp, Unix milliseconds.
    pub timestamp_ms: u64,
    /// The trailer's data-parallel rank.
    pub dp_rank: u64,
    payload: P,
    /// Per event, where the values a [`Change`] reads lie in the payload (start, length;
    /// length 0 when the key is absent).
    changes: Vec<[(u32, u32); 4]>,
}

impl<P: Deref<Target = [u8]>> Checked<P> {
    /// Checks the frames of one message as [`Message::decode`] does, and keeps its payload
    /// (the last frame).
    pub fn new(mut frames: Vec<P>) -> Result<Checked<P>, Malformed> {
        if let Some(payload) = frames.last().filter(|p| u32::try_from(p.len()).is_err()) {
            return Err(Malformed::PayloadTooLarge {
                bytes: payload.len(),
            });
        }
        let mut changes: Vec<[(u32, u32); 4]> = Vec::new();
        let found = |event: u32, key: &[u8], value: Range<usize>| {
            let Some(slot) = Change::slot_of(key) else {
                return;
            };
            let event = event as usize;
            if changes.len() <= event {
                changes.resize(event + 1, [(0, 0); 4]);
            }
            // Below 4 GiB, as checked above. A key sent twice counts the first time.
            if changes[event][slot].1 == 0 {
                changes[event][slot] = (value.start as u32, value.len() as u32);
            }
        };
        let (sequence, _, shape) = envelope_with(&frames, &mut { found })?;
        changes.resize(shape.events as usize, [(0, 0); 4]);
        // Three frames: the envelope checked it.
        let payload = frames.pop().ok_or(Malformed::Frames { count: 0 })?;
        Ok(Checked {
            sequence,
            timestamp_ms: shape.timestamp_ms,
            dp_rank: shape.dp_rank,
            payload,
            changes,
        })
    }

    /// How many events the message holds (0 for a heartbeat).
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// Whether the message holds no event (a heartbeat).
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The payload's size in bytes.
    pub fn payload_bytes(&self) -> usize {
        self.payload.len()
    }

    /// The payload as it arrived, `[timestamp_ms, [event, ...], dp_rank]`: for a reader that
    /// passes the message on, or decodes it whole later.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Each event's [`Change`]: the four values an index reads, found while the payload
    /// was checked, borrowed from it.
    pub fn changes(&self) -> impl ExactSizeIterator<Item = Change<'_>> + '_ {
        self.changes.iter().map(|slots| {
            let mut change = Change::default();
            for (slot, &(start, len)) in slots.iter().enumerate() {
                if len > 0 {
                    let (start, end) = (start as usize, start as usize + len as usize);
                    *change.slot(slot) = self
                        .payload
                        .get(start..end)
                        .map_or(Field::Absent, Field::from_raw);
                }
            }
            change
        })
    }
}

impl<P> fmt::Debug for Checked<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checked")
            .field("sequence", &self.sequence)
            .field("events", &self.changes.len())
            .finish_non_exhaustive()
    }
}

/// One event with the contract's fields, as the master's publisher sends them.
///
/// Every event has the 11 common fields; `group_id` and `object_key` are absent (`None`) on
/// `cleared`; `legacy_type` is the legacy `type`, present when the publisher sends the legacy
/// fields. The fields the contract keeps empty or nil (`seq_hashes`, `block_hashes`,
/// `base_block_idx`, `token_ids`, `parent_hash`, `parent_block_hash`) and keys added later
/// are not decoded: read them through [`decode_message`](super::decode_message).
///
/// Decoding is strict where the contract is: an `event_type` other than `stored`, `removed`
/// or `cleared`, a `medium` other than `cpu`, `disk` or nil, a missing common field or a
/// value of the wrong type refuses the message (treat it like a gap: resync).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Event {
    /// 1 for the first event the publisher encoded, +1 per event, no gaps.
    pub event_id: u64,
    /// The batch timestamp, Unix milliseconds.
    pub timestamp: u64,
    /// `stored`, `removed` or `cleared`.
    pub event_type: EventKind,
    /// The legacy name of the same thing (`BlockStored`, `BlockRemoved`,
    /// `AllBlocksCleared`), when the publisher sends the legacy fields.
    #[serde(rename = "type", default)]
    pub legacy_type: Option<String>,
    /// The master's model name; `None` when it sets none.
    pub model_name: Option<String>,
    /// The block size in tokens; `None` when 0.
    pub block_size: Option<u64>,
    /// The additional salt; `None` when empty.
    pub additional_salt: Option<String>,
    /// The LoRA name; `None` when empty.
    pub lora_name: Option<String>,
    /// The tenant, never empty (the master's empty tenant is `default`).
    pub tenant_id: Bytes,
    /// Which store (master) this is.
    pub backend_id: String,
    /// The medium of a `stored` or `removed`; `None` on `cleared`.
    pub medium: Option<Medium>,
    /// The publisher's data-parallel rank.
    pub dp_rank: u64,
    /// The object's group; `None` when it has none, and on `cleared`.
    #[serde(default)]
    pub group_id: Option<Bytes>,
    /// The object's key; `None` on `cleared`.
    #[serde(default)]
    pub object_key: Option<Bytes>,
}

/// The master's bytes, verbatim: a `tenant_id`, `object_key` or `group_id`, which arrive as
/// msgpack `str` when they are UTF-8 and as `bin` when they are not. Deserializes from
/// either (and from a `str` whose bytes are not UTF-8), so no key is lost to its encoding.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes as text, when they are UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The bytes, owned.
    pub fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(bytes: Vec<u8>) -> Bytes {
        Bytes(bytes)
    }
}

impl From<&[u8]> for Bytes {
    fn from(bytes: &[u8]) -> Bytes {
        Bytes(bytes.to_vec())
    }
}

impl From<&str> for Bytes {
    fn from(text: &str) -> Bytes {
        Bytes(text.as_bytes().to_vec())
    }
}

impl PartialEq<[u8]> for Bytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.0 == other
    }
}

impl PartialEq<&[u8]> for Bytes {
    fn eq(&self, other: &&[u8]) -> bool {
        self.0 == *other
    }
}

impl PartialEq<str> for Bytes {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for Bytes {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

/// UTF-8 as a quoted string, anything else as `b"..."` with escapes.
impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_str() {
            Some(text) => fmt::Debug::fmt(text, f),
            None => write!(f, "b\"{}\"", self.0.escape_ascii()),
        }
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        deserializer.deserialize_bytes(BytesVisitor)
    }
}

struct BytesVisitor;

impl Visitor<'_> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a msgpack str or bin")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Bytes, E> {
        Ok(Bytes::from(text))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Bytes, E> {
        Ok(Bytes(text.into_bytes()))
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes::from(bytes))
    }

    fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::tests::payload;
    use super::*;
    use rmpv::Value;

    fn frames(sequence: u64, events: Vec<Value>) -> Vec<Vec<u8>> {
        let body = Value::Array(vec![
            Value::from(1_700_000_000_000u64),
            Value::Array(events),
            Value::from(3u64),
        ]);
        vec![vec![], sequence.to_be_bytes().to_vec(), payload(&body)]
    }

    fn map(entries: &[(&str, Value)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    /// The 11 common fields of an event, as a publisher without legacy fields sends them.
    fn common(event_type: &str, tenant: Value, medium: Value) -> Vec<(&'static str, Value)> {
        vec![
            ("event_id", Value::from(7u64)),
            ("timestamp", Value::from(1_700_000_000_000u64)),
            ("event_type", Value::from(event_type)),
            ("model_name", Value::from("llama")),
            ("block_size", Value::from(16u64)),
            ("additional_salt", Value::Nil),
            ("lora_name", Value::Nil),
            ("tenant_id", tenant),
            ("backend_id", Value::from("store-a")),
            ("medium", medium),
            ("dp_rank", Value::from(3u64)),
        ]
    }

    fn stored(key: Value) -> Value {
        let mut fields = common("stored", Value::from("default"), Value::from("disk"));
        fields.extend([
            ("type", Value::from("BlockStored")),
            ("group_id", Value::Nil),
            ("object_key", key),
            ("seq_hashes", Value::Array(vec![])),
            ("a_key_added_later", Value::from(true)),
        ]);
        map(&fields)
    }

    #[test]
    fn events_decode_into_their_fields_and_keys_as_bytes_from_str_or_bin() {
        let cleared = map(&common(
            "cleared",
            Value::Binary(b"t\xff".to_vec()),
            Value::Nil,
        ));
        let message = Message::<Event>::decode(&frames(
            42,
            vec![
                stored(Value::from("k/1")),
                stored(Value::Binary(b"k\0\xff".to_vec())),
                cleared,
            ],
        ))
        .unwrap();
        assert_eq!(
            (message.sequence, message.timestamp_ms, message.dp_rank),
            (42, 1_700_000_000_000, 3)
        );
        let [first, second, third] = &message.events[..] else {
            panic!("{message:?}");
        };
        assert_eq!(first.event_type, EventKind::Stored);
        assert_eq!(first.legacy_type.as_deref(), Some("BlockStored"));
        assert_eq!(first.medium, Some(Medium::Disk));
        assert_eq!(first.object_key, Some(Bytes::from("k/1")));
        assert_eq!(first.tenant_id, "default");
        assert_eq!(first.group_id, None);
        assert_eq!(
            (first.event_id, first.block_size, first.dp_rank),
            (7, Some(16), 3)
        );
        assert_eq!(first.model_name.as_deref(), Some("llama"));
        assert_eq!(second.object_key.as_deref(), Some(&b"k\0\xff"[..]));
        assert_eq!(third.event_type, EventKind::Cleared);
        assert_eq!(
            (
                third.medium,
                &third.object_key,
                third.legacy_type.as_deref()
            ),
            (None, &None, None)
        );
        assert_eq!(third.tenant_id.as_bytes(), b"t\xff");
        assert_eq!(third.tenant_id.to_str(), None);
        assert_eq!(format!("{:?}", third.tenant_id), r#"b"t\xff""#);
        assert_eq!(format!("{:?}", first.tenant_id), r#""default""#);
    }

    #[test]
    fn a_str_that_is_not_utf8_still_decodes_as_bytes() {
        // msgpack `str` with bytes that are not UTF-8: a broken writer, but the key survives.
        let mut body = Vec::new();
        rmp::encode::write_str_len(&mut body, 2).unwrap();
        body.extend([b'k', 0xff]);
        let bytes: Bytes = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(bytes, &b"k\xff"[..]);
    }

    #[test]
    fn an_event_outside_the_contract_refuses_the_message_and_says_which() {
        let mut wrong_type = common("evicted", Value::from("t"), Value::Nil);
        wrong_type.push(("object_key", Value::from("k")));
        let mut no_tenant = common("stored", Value::from("t"), Value::from("cpu"));
        no_tenant.retain(|(k, _)| *k != "tenant_id");
        let mut tape = common("stored", Value::from("t"), Value::from("tape"));
        tape.push(("object_key", Value::from("k")));
        let mut number_key = common("stored", Value::from("t"), Value::from("cpu"));
        number_key.push(("object_key", Value::from(5u64)));
        for (event, why) in [
            (map(&wrong_type), "unknown variant `evicted`"),
            (map(&no_tenant), "missing field `tenant_id`"),
            (map(&tape), "unknown variant `tape`"),
            (map(&number_key), "expected a msgpack str or bin"),
        ] {
            let err = Message::<Event>::decode(&frames(9, vec![stored(Value::from("k")), event]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("event 1 of 2 (sequence 9) does not decode into"),
                "{err}"
            );
            assert!(err.contains(why), "{err}\nwanted: {why}");
        }
    }

    #[test]
    fn a_reader_may_bring_its_own_event_type() {
        /// A reader that wants text keys and nothing else.
        #[derive(Debug, Deserialize)]
        struct Keys {
            object_key: String,
        }
        let two = frames(1, vec![stored(Value::from("k")), stored(Value::from("j"))]);
        let message = Message::<Keys>::decode(&two).unwrap();
        let keys: Vec<&str> = message
            .events
            .iter()
            .map(|e| e.object_key.as_str())
            .collect();
        assert_eq!(keys, ["k", "j"]);
        let bin = frames(
            1,
            vec![stored(Value::from("k")), stored(Value::Binary(vec![0xff]))],
        );
        let err = Message::<Keys>::decode(&bin).unwrap_err().to_string();
        assert!(err.contains("event 1 of 2"), "{err}");
    }

    /// A batch as the publisher's own encoder writes it: `count` events of every kind, some
    /// keys not UTF-8.
    fn encoded(count: usize, legacy: bool) -> Vec<u8> {
        use crate::event::Event as Encoded;
        use crate::wire::encode::Encoder;
        let config = crate::Config {
            enable_kv_events: true,
            bind_endpoint: "inproc://unused".into(),
            backend_id: "store-a".into(),
            emit_legacy_compat: legacy,
            ..crate::Config::default()
        };
        let keys: [&[u8]; 3] = [b"k", b"k\xff", b""];
        let events = (0..count).map(|i| Encoded {
            kind: [EventKind::Stored, EventKind::Removed, EventKind::Cleared][i % 3],
            medium: (i % 3 != 2).then_some(Medium::ALL[i % 2]),
            tenant: keys[i % 3],
            key: if i % 3 == 2 { b"" } else { keys[(i + 1) % 2] },
            group: keys[i % 2],
        });
        let mut out = Vec::new();
        Encoder::new(&config).encode_batch(1_700_000_000_000, count, events, &mut out);
        out
    }

    /// Decodes `frames` both ways; panics only if a decoder does, or if the two disagree on
    /// a message both accept.
    fn decode_both(frames: &[Vec<u8>]) -> (bool, bool) {
        let values = super::super::decode::decode_message(frames);
        let typed = Message::<Event>::decode(frames);
        if let (Ok(values), Ok(typed)) = (&values, &typed) {
            assert_eq!(
                (values.sequence, values.timestamp_ms, values.dp_rank),
                (typed.sequence, typed.timestamp_ms, typed.dp_rank)
            );
            assert_eq!(values.events.len(), typed.events.len());
        }
        (values.is_ok(), typed.is_ok())
    }

    #[test]
    fn what_the_encoder_writes_decodes_both_ways() {
        for legacy in [false, true] {
            for count in [1, 2, 3, 63, 64] {
                let frames = vec![vec![], 5u64.to_be_bytes().to_vec(), encoded(count, legacy)];
                assert_eq!(
                    decode_both(&frames),
                    (true, true),
                    "{count} legacy={legacy}"
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any bytes, in any frames: an error or a message, never a panic.
        #[test]
        fn hostile_frames_never_panic(
            frames in proptest::collection::vec(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                0..5,
            ),
        ) {
            decode_both(&frames);
        }

        /// A real batch with bytes changed, cut or added: an error or a message, never a
        /// panic; and both decoders read the same envelope.
        #[test]
        fn a_damaged_batch_never_panics(
            count in 1usize..=64,
            legacy in proptest::prelude::any::<bool>(),
            edits in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>(), 0u8..3),
                1..8,
            ),
        ) {
            let mut payload = encoded(count, legacy);
            for (at, byte, how) in edits {
                let at = at.index(payload.len().max(1));
                match how {
                    0 if at < payload.len() => payload[at] = byte,
                    1 => payload.insert(at.min(payload.len()), byte),
                    _ => payload.truncate(at),
                }
            }
            decode_both(&[vec![], 7u64.to_be_bytes().to_vec(), payload]);
        }
    }

    #[test]
    fn the_envelope_is_as_strict_as_the_value_path() {
        let good = frames(1, vec![stored(Value::from("k"))]);
        let mut long_sequence = good.clone();
        long_sequence[1].push(0);
        let mut topic = good.clone();
        topic[0] = vec![b't'; 256];
        let many = frames(1, vec![stored(Value::from("k")); 65]);
        for (frames, why) in [
            (good[..2].to_vec(), "2 frames, expected 3"),
            (long_sequence, "a sequence of 9 bytes, expected 8"),
            (topic, "a topic of 256 bytes, expected at most 255"),
            (
                many,
                "an array of 65, expected 0 (a heartbeat) to 64 events",
            ),
        ] {
            let err = Message::<Event>::decode(&frames).unwrap_err().to_string();
            assert!(err.contains(why), "{err}\nwanted: {why}");
        }
    }
}
