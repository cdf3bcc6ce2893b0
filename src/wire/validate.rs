//! The stream's format checked before anything is decoded: the envelope (three frames, a
//! topic of at most [`MAX_TOPIC_BYTES`], an 8-byte sequence), then the payload byte by byte, every length it claims
//! held to a bound or to the bytes left. Both decoders start here, so they are equally strict
//! and equally bounded.

use rmp::Marker;
use std::fmt;
use std::ops::{Deref, Range};

/// Why a message is not one of the stream's: what was wrong, and where. It concerns that
/// message alone: a reader refuses it and goes on with the next.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Malformed {
    /// The message has not 3 frames (topic, sequence, payload).
    Frames {
        /// The frames it has.
        count: usize,
    },
    /// The topic frame is longer than [`MAX_TOPIC_BYTES`].
    Topic {
        /// Its length.
        bytes: usize,
    },
    /// The sequence frame is not 8 bytes.
    Sequence {
        /// Its length.
        bytes: usize,
    },
    /// The payload is 4 GiB or more, beyond what the format's offsets address.
    PayloadTooLarge {
        /// Its length.
        bytes: usize,
    },
    /// The payload is not a batch of the format: what is wrong and at which byte, for people.
    Payload(String),
    /// The payload follows the format, but an event does not deserialize into the reader's
    /// type ([`Message::decode`](super::Message::decode)).
    Event {
        /// The event's place in the batch, from 0.
        index: u32,
        /// The events in the batch.
        events: u32,
        /// The message's sequence.
        sequence: u64,
        /// The type it does not fit.
        into: &'static str,
        /// serde's reason.
        why: String,
    },
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed message: ")?;
        match self {
            Malformed::Frames { count } => {
                write!(f, "{count} frames, expected 3 (topic, sequence, payload)")
            }
            Malformed::Topic { bytes } => write!(
                f,
                "a topic of {bytes} bytes, expected at most {MAX_TOPIC_BYTES}"
            ),
            Malformed::Sequence { bytes } => write!(f, "a sequence of {bytes} bytes, expected 8"),
            Malformed::PayloadTooLarge { bytes } => {
                write!(f, "a payload of {bytes} bytes, more than 4 GiB")
            }
            Malformed::Payload(why) => f.write_str(why),
            Malformed::Event {
                index,
                events,
                sequence,
                into,
                why,
            } => write!(
                f,
                "event {index} of {events} (sequence {sequence}) does not decode into {into}: {why}"
            ),
        }
    }
}

impl std::error::Error for Malformed {}

/// The frames of one message checked against the wire format: its sequence, its payload and
/// the payload's shape, whose events are then decoded one way or another.
pub(super) fn envelope<F: Deref<Target = [u8]>>(
    frames: &[F],
) -> Result<(u64, &[u8], Shape), Malformed> {
    envelope_with(frames, &mut |_, _, _| {})
}

/// [`envelope`], telling `field` where each value of each event lies as the check meets it:
/// the event's index, the key, and the value's place in the payload (its marker included).
pub(super) fn envelope_with<'f, F: Deref<Target = [u8]>>(
    frames: &'f [F],
    field: &mut impl FnMut(u32, &'f [u8], Range<usize>),
) -> Result<(u64, &'f [u8], Shape), Malformed> {
    let [topic, sequence, payload] = frames else {
        return Err(Malformed::Frames {
            count: frames.len(),
        });
    };
    if topic.len() > MAX_TOPIC_BYTES {
        return Err(Malformed::Topic { bytes: topic.len() });
    }
    let Ok(sequence) = <[u8; 8]>::try_from(&sequence[..]) else {
        return Err(Malformed::Sequence {
            bytes: sequence.len(),
        });
    };
    let shape = Payload::check(payload, field).map_err(Malformed::Payload)?;
    Ok((u64::from_be_bytes(sequence), payload, shape))
}

/// The most events a message may hold: the wire format's batches hold 1 to 64, and a
/// heartbeat none.
pub const MAX_BATCH_EVENTS: u32 = 64;
/// The longest topic frame a publisher sends (`kv_events_topic`): a subscription to it, one
/// byte longer, fits in what the PUB socket takes from a peer in one message (512 bytes).
pub const MAX_TOPIC_BYTES: usize = 255;
/// The most keys an event map may have: the largest map of the format has 20 (a legacy
/// `stored`), so this leaves room for fields added later.
pub const MAX_EVENT_KEYS: u32 = 32;
/// The most items the arrays of one event may hold in all. The format's arrays
/// (`seq_hashes`, `block_hashes`) are empty; this leaves room for hashes a later version may
/// send while bounding the values one message decodes into.
pub const MAX_EVENT_ARRAY_ITEMS: u32 = 256;

/// The payload's shape, for the errors that must say what was expected.
const SHAPE: &str = "an array of 3 [timestamp_ms, events, dp_rank]";

/// Checks a payload against the wire format byte by byte, before anything is decoded from
/// it: every length it claims is held to a bound or to the bytes left, so that no
/// allocation follows an untrusted length and what [`decode_message`](super::decode_message) builds stays within a
/// fixed number of values plus the payload's own bytes.
struct Payload<'p> {
    bytes: &'p [u8],
    at: usize,
}

/// What the validator found: the batch's scalars and where its events lie.
pub(super) struct Shape {
    pub(super) timestamp_ms: u64,
    /// The byte offset of the first event, and how many there are.
    pub(super) events_at: usize,
    pub(super) events: u32,
    pub(super) dp_rank: u64,
}

impl<'p> Payload<'p> {
    fn check(
        bytes: &'p [u8],
        field: &mut impl FnMut(u32, &'p [u8], Range<usize>),
    ) -> Result<Shape, String> {
        let mut p = Payload { bytes, at: 0 };
        let (at, marker) = p.marker("the payload")?;
        match array_len(&mut p, marker)? {
            Some(3) => {}
            Some(n) => return Err(format!("the payload is an array of {n}, expected {SHAPE}")),
            None => {
                return Err(format!(
                    "the payload is not a msgpack batch: byte {at} (0x{:02x}) is {}, expected \
                     {SHAPE}",
                    bytes[at],
                    kind(marker)
                ))
            }
        }
        let timestamp_ms = p.uint("timestamp_ms")?;
        let (at, marker) = p.marker("events")?;
        let events = match array_len(&mut p, marker)? {
            Some(n @ 0..=MAX_BATCH_EVENTS) => n,
            Some(n) => {
                return Err(format!(
                    "events (byte {at}) is an array of {n}, expected 0 (a heartbeat) to \
                     {MAX_BATCH_EVENTS} events"
                ))
            }
            None => {
                return Err(format!(
                    "events (byte {at}) is {}, expected an array of 0 (a heartbeat) to \
                     {MAX_BATCH_EVENTS} events",
                    kind(marker)
                ))
            }
        };
        let events_at = p.at;
        for index in 0..events {
            p.event(index, field)?;
        }
        let dp_rank = p.uint("dp_rank")?;
        match bytes.len() - p.at {
            0 => Ok(Shape {
                timestamp_ms,
                events_at,
                events,
                dp_rank,
            }),
            extra => Err(format!("the payload has {extra} bytes after the array")),
        }
    }

    /// The next marker and its offset; `what` names the value for the error at the end.
    fn marker(&mut self, what: &(impl fmt::Display + ?Sized)) -> Result<(usize, Marker), String> {
        let at = self.at;
        let byte = *self
            .bytes
            .get(at)
            .ok_or_else(|| format!("the payload ends at byte {at}, where {what} should begin"))?;
        self.at += 1;
        Ok((at, Marker::from_u8(byte)))
    }

    /// The next `n` bytes, which `what` needs.
    fn take(&mut self, n: u64, what: &(impl fmt::Display + ?Sized)) -> Result<&'p [u8], String> {
        let left = self.bytes.len() - self.at;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                self.at += n;
                Ok(&self.bytes[self.at - n..self.at])
            }
            _ => Err(format!(
                "the payload ends inside {what}: {n} bytes wanted at byte {}, {left} left",
                self.at
            )),
        }
    }

    /// A big-endian unsigned integer of `n` bytes (1 to 8).
    fn be(&mut self, n: u64, what: &(impl fmt::Display + ?Sized)) -> Result<u64, String> {
        let bytes = self.take(n, what)?;
        Ok(bytes.iter().fold(0, |v, &b| (v << 8) | u64::from(b)))
    }

    fn uint(&mut self, what: &(impl fmt::Display + ?Sized)) -> Result<u64, String> {
        let (at, marker) = self.marker(what)?;
        match marker {
            Marker::FixPos(v) => Ok(u64::from(v)),
            Marker::U8 => self.be(1, what),
            Marker::U16 => self.be(2, what),
            Marker::U32 => self.be(4, what),
            Marker::U64 => self.be(8, what),
            other => Err(format!(
                "{what} (byte {at}) is {}, expected an unsigned integer",
                kind(other)
            )),
        }
    }

    /// One event: a map of at most [`MAX_EVENT_KEYS`] string keys whose values are scalars
    /// or arrays of scalars, [`MAX_EVENT_ARRAY_ITEMS`] items in all.
    fn event(
        &mut self,
        index: u32,
        field: &mut impl FnMut(u32, &'p [u8], Range<usize>),
    ) -> Result<(), String> {
        let what = EventAt(index);
        let (at, marker) = self.marker(&what)?;
        let keys = match marker {
            Marker::FixMap(n) => u32::from(n),
            Marker::Map16 => self.be(2, &what)? as u32,
            Marker::Map32 => self.be(4, &what)? as u32,
            other => {
                return Err(format!(
                    "{what} (byte {at}) is {}, expected a map",
                    kind(other)
                ))
            }
        };
        if keys > MAX_EVENT_KEYS {
            return Err(format!(
                "{what} (byte {at}) has {keys} keys, at most {MAX_EVENT_KEYS} expected"
            ));
        }
        let mut items = 0;
        for _ in 0..keys {
            let (at, marker) = self.marker(&what)?;
            if !matches!(
                marker,
                Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32
            ) {
                return Err(format!(
                    "{what} has a key (byte {at}) that is {}, expected a string",
                    kind(marker)
                ));
            }
            let key = self.bytes_of(marker, &what)?.unwrap_or_default();
            let what = KeyAt { event: index, key };
            let (at, marker) = self.marker(&what)?;
            let value = at;
            match array_len(self, marker)? {
                Some(n) => {
                    items += n;
                    if items > MAX_EVENT_ARRAY_ITEMS {
                        return Err(format!(
                            "{what} (byte {at}) is an array of {n}, more than the \
                             {MAX_EVENT_ARRAY_ITEMS} array items an event may hold"
                        ));
                    }
                    for _ in 0..n {
                        let (at, marker) = self.marker(&what)?;
                        self.scalar(at, marker, &what)?;
                    }
                }
                None => self.scalar(at, marker, &what)?,
            }
            field(index, key, value..self.at);
        }
        Ok(())
    }

    /// Skips the scalar `marker` begins: anything but an array or a map, which the format
    /// never nests this deep.
    fn scalar(
        &mut self,
        at: usize,
        marker: Marker,
        what: &(impl fmt::Display + ?Sized),
    ) -> Result<(), String> {
        let size = match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                0
            }
            Marker::U8 | Marker::I8 => 1,
            Marker::U16 | Marker::I16 => 2,
            Marker::U32 | Marker::I32 | Marker::F32 => 4,
            Marker::U64 | Marker::I64 | Marker::F64 => 8,
            Marker::FixExt1 => 2,
            Marker::FixExt2 => 3,
            Marker::FixExt4 => 5,
            Marker::FixExt8 => 9,
            Marker::FixExt16 => 17,
            Marker::Ext8 => 1 + self.be(1, what)?,
            Marker::Ext16 => 1 + self.be(2, what)?,
            Marker::Ext32 => 1 + self.be(4, what)?,
            Marker::Reserved => {
                return Err(format!("{what}: byte {at} (0xc1) is no msgpack value"))
            }
            other => match self.bytes_of(other, what)? {
                Some(_) => 0,
                None => {
                    return Err(format!(
                        "{what} (byte {at}) is {} inside a value, deeper than the format nests",
                        kind(other)
                    ))
                }
            },
        };
        self.take(size, what).map(drop)
    }

    /// The bytes of a string or bin `marker` begins; `None` for any other marker.
    fn bytes_of(
        &mut self,
        marker: Marker,
        what: &(impl fmt::Display + ?Sized),
    ) -> Result<Option<&'p [u8]>, String> {
        let len = match marker {
            Marker::FixStr(n) => u64::from(n),
            Marker::Str8 | Marker::Bin8 => self.be(1, what)?,
            Marker::Str16 | Marker::Bin16 => self.be(2, what)?,
            Marker::Str32 | Marker::Bin32 => self.be(4, what)?,
            _ => return Ok(None),
        };
        self.take(len, what).map(Some)
    }
}

/// Event `n`, as an error names it; written only when there is an error to write.
struct EventAt(u32);

impl fmt::Display for EventAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event {}", self.0)
    }
}

/// The value of `key` in event `event`, as an error names it.
struct KeyAt<'p> {
    event: u32,
    key: &'p [u8],
}

impl fmt::Display for KeyAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = String::from_utf8_lossy(self.key);
        write!(f, "event {}, key {key:?}", self.event)
    }
}

/// The length of the array `marker` begins, `None` when it begins something else.
fn array_len(p: &mut Payload<'_>, marker: Marker) -> Result<Option<u32>, String> {
    Ok(match marker {
        Marker::FixArray(n) => Some(u32::from(n)),
        Marker::Array16 => Some(p.be(2, "an array's length")? as u32),
        Marker::Array32 => Some(p.be(4, "an array's length")? as u32),
        _ => None,
    })
}

/// What a marker begins, for people.
fn kind(marker: Marker) -> &'static str {
    match marker {
        Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64 => {
            "a positive integer"
        }
        Marker::FixNeg(_) => "a negative integer",
        Marker::I8 | Marker::I16 | Marker::I32 | Marker::I64 => "a signed integer",
        Marker::Null => "nil",
        Marker::True | Marker::False => "a boolean",
        Marker::F32 | Marker::F64 => "a float",
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => "a string",
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => "a bin",
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => "an array",
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => "a map",
        Marker::Reserved => "the byte msgpack never uses",
        _ => "an ext",
    }
}
