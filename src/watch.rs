//! The subscriber's side: a SUB socket that reads the stream the way an indexer would,
//! decoding each message with `rmpv`, a reader that shares nothing with the encoder; with
//! CURVE keys when the publisher has them, and a clear error when the publisher refuses it.

use crate::keys::{self, Key, KeyPair};
use crate::security::{
    monitor_event, EVENT_HANDSHAKE_FAILED_AUTH, EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    EVENT_HANDSHAKE_FAILED_PROTOCOL, EVENT_HANDSHAKE_SUCCEEDED, PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC,
    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
};
use rmpv::Value;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One message of the stream, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// The transport sequence (frame 2).
    pub sequence: u64,
    /// How this sequence follows the previous one this subscriber saw.
    pub continuity: Continuity,
    /// The batch timestamp, Unix milliseconds.
    pub timestamp_ms: u64,
    /// The trailer's data-parallel rank.
    pub dp_rank: u64,
    /// The event maps, as decoded.
    pub events: Vec<Value>,
}

/// How a message's sequence relates to the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continuity {
    /// The first message seen; `missed` messages or dropped events came before it
    /// (0 when the sequence is 1).
    First {
        /// Sequence numbers before this one.
        missed: u64,
    },
    /// The next number: nothing lost.
    Next,
    /// `missed` sequence numbers were skipped: dropped events or lost messages.
    Gap {
        /// The size of the gap.
        missed: u64,
    },
    /// The sequence went back to 1 or below the last one: the publisher restarted.
    Restart,
}

/// Why a message could not be read.
#[derive(Debug)]
pub enum WatchError {
    /// The socket failed.
    Socket(zmq::Error),
    /// The message does not follow the wire format.
    Malformed(String),
    /// The publisher refused this subscriber's handshake, or the handshake cannot succeed;
    /// says why, as far as ZeroMQ lets a subscriber know.
    Refused(String),
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::Socket(e) => write!(f, "socket error: {e}"),
            WatchError::Malformed(why) => write!(f, "malformed message: {why}"),
            WatchError::Refused(why) => write!(f, "the publisher refused this subscriber: {why}"),
        }
    }
}

impl std::error::Error for WatchError {}

impl From<zmq::Error> for WatchError {
    fn from(e: zmq::Error) -> Self {
        WatchError::Socket(e)
    }
}

/// The keys a subscriber presents to a publisher that speaks CURVE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurveClient {
    /// The publisher's public key (its `NAME.pub`).
    pub server_key: Key,
    /// The subscriber's own key pair (its `NAME.key`), whose public half the publisher's
    /// allow-list must hold.
    pub keys: KeyPair,
}

impl CurveClient {
    /// Reads the publisher's `.pub` file and the subscriber's own `.key` file. The error
    /// names the file and what is wrong, never a key.
    pub fn from_files(server_key: &Path, secret_key: &Path) -> Result<CurveClient, String> {
        keys::curve_available()?;
        Ok(CurveClient {
            server_key: keys::read_public_key(server_key)?,
            keys: keys::read_key_pair(secret_key)?,
        })
    }
}

/// Where a subscriber's own socket monitor publishes, in its own context.
const MONITOR_ENDPOINT: &str = "inproc://kv-events-subscriber-monitor";
/// Handshakes in a row that end with the publisher closing the connection before that is
/// taken for a refusal (a wrong server key, CURVE asked of a plain subscriber) rather than
/// a publisher that went away in the middle of one.
const CLOSED_HANDSHAKES_REFUSED: u32 = 2;

/// A SUB socket connected to a publisher, subscribed to everything.
pub struct Subscriber {
    _context: zmq::Context,
    socket: zmq::Socket,
    /// Receives the SUB socket's handshake events, so a refusal is an error, not silence.
    monitor: zmq::Socket,
    curve: bool,
    closed_handshakes: u32,
    last_sequence: Option<u64>,
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("last_sequence", &self.last_sequence)
            .finish_non_exhaustive()
    }
}

impl Subscriber {
    /// Connects to `endpoint`. The receive high-water mark is raised to `rcvhwm` messages so
    /// a subscriber that keeps up loses nothing to its own buffer.
    pub fn connect(endpoint: &str, rcvhwm: i32) -> Result<Subscriber, zmq::Error> {
        Subscriber::connect_with(endpoint, rcvhwm, None)
    }

    /// [`Subscriber::connect`], as a CURVE client with `curve`'s keys when given.
    pub fn connect_with(
        endpoint: &str,
        rcvhwm: i32,
        curve: Option<&CurveClient>,
    ) -> Result<Subscriber, zmq::Error> {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::SUB)?;
        socket.set_rcvhwm(rcvhwm)?;
        socket.set_linger(0)?;
        socket.set_subscribe(b"")?;
        if let Some(curve) = curve {
            socket.set_curve_serverkey(&curve.server_key.0)?;
            socket.set_curve_publickey(&curve.keys.public.0)?;
            socket.set_curve_secretkey(&curve.keys.secret.0)?;
        }
        let events = EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | EVENT_HANDSHAKE_SUCCEEDED
            | EVENT_HANDSHAKE_FAILED_PROTOCOL
            | EVENT_HANDSHAKE_FAILED_AUTH;
        socket.monitor(MONITOR_ENDPOINT, events as i32)?;
        let monitor = context.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(MONITOR_ENDPOINT)?;
        socket.connect(endpoint)?;
        Ok(Subscriber {
            _context: context,
            socket,
            monitor,
            curve: curve.is_some(),
            closed_handshakes: 0,
            last_sequence: None,
        })
    }

    /// Takes the handshake events that arrived; an error when one says the publisher will
    /// not let this subscriber in.
    fn check_handshakes(&mut self) -> Result<(), WatchError> {
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let Some((event, value)) = monitor_event(&frames) else {
                continue;
            };
            let why = match event {
                EVENT_HANDSHAKE_SUCCEEDED => {
                    self.closed_handshakes = 0;
                    continue;
                }
                EVENT_HANDSHAKE_FAILED_AUTH => format!(
                    "it answered the handshake with status {value}: this subscriber's public \
                     key or address is not on its allow-list"
                ),
                EVENT_HANDSHAKE_FAILED_PROTOCOL => match value {
                    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH if self.curve => {
                        "it does not use CURVE (connect without CURVE keys)".to_owned()
                    }
                    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH => {
                        "it requires CURVE: give its public key and a key pair of this \
                         subscriber's (--curve-server-key, --curve-secret-key)"
                            .to_owned()
                    }
                    PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC => {
                        "the CURVE handshake does not decrypt: the server key is not the \
                         publisher's"
                            .to_owned()
                    }
                    other => format!("ZMTP protocol error 0x{other:08x} in the handshake"),
                },
                EVENT_HANDSHAKE_FAILED_NO_DETAIL => {
                    self.closed_handshakes += 1;
                    if self.closed_handshakes < CLOSED_HANDSHAKES_REFUSED {
                        continue;
                    }
                    format!(
                        "it closed the connection during the handshake {} times in a row: {}",
                        self.closed_handshakes,
                        if self.curve {
                            "the server key is not the publisher's, or it does not use CURVE"
                        } else {
                            "it probably requires CURVE (--curve-server-key, --curve-secret-key)"
                        }
                    )
                }
                _ => continue,
            };
            return Err(WatchError::Refused(why));
        }
        Ok(())
    }

    /// Waits up to `timeout` for the next message: `Ok(None)` when none came;
    /// [`WatchError::Refused`] as soon as a handshake says the publisher refuses this
    /// subscriber.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Batch>, WatchError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_handshakes()?;
            let left = deadline.saturating_duration_since(Instant::now());
            let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
            ];
            zmq::poll(&mut items, millis)?;
            if items[0].is_readable() {
                break;
            }
            if !items[1].is_readable() && Instant::now() >= deadline {
                return Ok(None);
            }
        }
        let frames = self.socket.recv_multipart(0)?;
        let (sequence, timestamp_ms, events, dp_rank) = decode_message(&frames)?;
        let continuity = match self.last_sequence {
            None => Continuity::First {
                missed: sequence.saturating_sub(1),
            },
            Some(last) if sequence == last + 1 => Continuity::Next,
            Some(last) if sequence > last => Continuity::Gap {
                missed: sequence - last - 1,
            },
            Some(_) => Continuity::Restart,
        };
        self.last_sequence = Some(sequence);
        Ok(Some(Batch {
            sequence,
            continuity,
            timestamp_ms,
            dp_rank,
            events,
        }))
    }
}

/// Decodes the three frames of one message into sequence, timestamp, events and dp rank.
pub fn decode_message(frames: &[Vec<u8>]) -> Result<(u64, u64, Vec<Value>, u64), WatchError> {
    let malformed = |why: String| Err(WatchError::Malformed(why));
    let [topic, sequence, payload] = frames else {
        return malformed(format!("{} frames, expected 3", frames.len()));
    };
    if !topic.is_empty() {
        return malformed(format!("a topic of {} bytes, expected none", topic.len()));
    }
    let Ok(sequence) = <[u8; 8]>::try_from(sequence.as_slice()) else {
        return malformed(format!(
            "a sequence of {} bytes, expected 8",
            sequence.len()
        ));
    };
    let mut cursor = payload.as_slice();
    let value = rmpv::decode::read_value(&mut cursor)
        .map_err(|e| WatchError::Malformed(format!("payload is not msgpack: {e}")))?;
    if !cursor.is_empty() {
        return malformed(format!("{} bytes after the payload", cursor.len()));
    }
    let Value::Array(mut parts) = value else {
        return malformed("payload is not an array".into());
    };
    let (Some(dp_rank), Some(Value::Array(events)), Some(timestamp)) = (
        parts.pop().and_then(|v| v.as_u64()),
        parts.pop(),
        parts.pop().and_then(|v| v.as_u64()),
    ) else {
        return malformed("payload is not [uint timestamp_ms, [event...], uint dp_rank]".into());
    };
    if !parts.is_empty() {
        return malformed("payload has more than 3 elements".into());
    }
    Ok((u64::from_be_bytes(sequence), timestamp, events, dp_rank))
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
mod tests {
    use super::*;

    fn payload(value: &Value) -> Vec<u8> {
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
        let (sequence, ts, events, dp) = decode_message(&frames).unwrap();
        assert_eq!((sequence, ts, dp), (9, 5, 2));
        assert_eq!(
            field(&events[0], "event_type"),
            Some(&Value::from("cleared"))
        );
        assert_eq!(field(&events[0], "medium"), None);
    }

    #[test]
    fn malformed_messages_say_why() {
        let body = payload(&Value::Array(vec![]));
        for (frames, why) in [
            (vec![vec![]], "1 frames"),
            (vec![b"t".to_vec(), vec![0; 8], body.clone()], "topic"),
            (vec![vec![], vec![0; 4], body.clone()], "sequence of 4"),
            (vec![vec![], vec![0; 8], body], "payload is not [uint"),
        ] {
            let err = decode_message(&frames).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn binary_becomes_marked_hex_in_json() {
        let json = to_json(&Value::Binary(vec![0xff, 0x00]));
        assert_eq!(json, serde_json::json!({ "hex": "ff00" }));
    }
}
