//! The subscriber's side: a SUB socket that reads the stream the way an indexer would, with
//! CURVE keys when the publisher has them, and a clear error when the publisher refuses it.
//! A message decodes two ways, neither sharing code with the encoder: into named, typed
//! values with `rmp-serde` ([`Message`] of [`Event`]s, or of a reader's own serde type;
//! [`Subscriber::recv_as`]), or with every field as received, as `rmpv` values
//! ([`decode_message`], [`Subscriber::recv`]), which is how `kv-events` prints them.
//!
//! A publisher is not trusted to stay within the format: a message is bounded in size
//! before libzmq buffers it, and its payload is checked against the format before any
//! value is built, so a hostile or broken publisher costs a subscriber a bounded amount of
//! memory and one refused message, never the process.

use crate::keys::{self, Key, KeyPair};
use crate::transport::monitor::{
    monitor_event, EVENT_CONNECTED, EVENT_CONNECT_RETRIED, EVENT_DISCONNECTED,
    EVENT_HANDSHAKE_FAILED_AUTH, EVENT_HANDSHAKE_FAILED_NO_DETAIL, EVENT_HANDSHAKE_FAILED_PROTOCOL,
    EVENT_HANDSHAKE_SUCCEEDED, PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC,
    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
};
use crate::wire::{decode_message, wrong_frames, Checked, Malformed, Message};
use rmpv::Value;
use serde::de::DeserializeOwned;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

/// One message of the stream as a [`Subscriber`] received it: decoded, and placed after the
/// one before. Its events are `rmpv` values (every field as received) from
/// [`Subscriber::recv`], or `E` from [`Subscriber::recv_as`].
#[derive(Clone, Debug, PartialEq)]
pub struct Batch<E = Value> {
    /// The transport sequence (frame 2).
    pub sequence: u64,
    /// How this sequence follows the previous one this subscriber saw.
    pub continuity: Continuity,
    /// The batch timestamp, Unix milliseconds.
    pub timestamp_ms: u64,
    /// The trailer's data-parallel rank.
    pub dp_rank: u64,
    /// The events, as decoded.
    pub events: Vec<E>,
}

impl<E> Batch<E> {
    /// `message`, which follows the one before as `continuity` says.
    pub fn new(message: Message<E>, continuity: Continuity) -> Batch<E> {
        Batch {
            sequence: message.sequence,
            continuity,
            timestamp_ms: message.timestamp_ms,
            dp_rank: message.dp_rank,
            events: message.events,
        }
    }
}

/// How a message's sequence relates to the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continuity {
    /// The first message seen; `missed` messages or dropped events came before it
    /// (0 when the sequence is 0, the first a publisher sends).
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
    /// The sequence went back (to 0, or to any number not above the last one): the publisher
    /// restarted.
    Restart,
}

impl Continuity {
    /// How `sequence` follows `last`.
    pub fn after(last: u64, sequence: u64) -> Continuity {
        match sequence.checked_sub(last) {
            Some(1) => Continuity::Next,
            Some(step) if step > 1 => Continuity::Gap { missed: step - 1 },
            _ => Continuity::Restart,
        }
    }
}

/// Why a message could not be read. [`WatchError::Malformed`] and [`WatchError::TooLarge`]
/// concern one message: the subscriber goes on with the next, whose sequence shows the
/// refused one as a gap.
#[derive(Debug)]
pub enum WatchError {
    /// The socket failed.
    Socket(zmq::Error),
    /// The message does not follow the wire format.
    Malformed(String),
    /// The message is larger than [`SubscriberOptions::max_message_bytes`]: it was received
    /// (libzmq bounds each frame, not their sum) and dropped undecoded.
    TooLarge {
        /// The message's size, all its frames together.
        bytes: usize,
        /// The bound it exceeds.
        limit: usize,
        /// Its sequence, when its second frame holds one.
        sequence: Option<u64>,
    },
    /// The publisher refused this subscriber's handshake, or the handshake cannot succeed;
    /// says why, as far as ZeroMQ lets a subscriber know.
    Refused(String),
    /// The replay socket answered with an error, or broke its protocol.
    Replay(String),
    /// The replay socket at this endpoint did not answer in time: nothing listens there,
    /// or the publisher does not serve it.
    Unanswered(String),
}

impl WatchError {
    /// Whether the replay socket gave no answer at all.
    pub fn is_unanswered(&self) -> bool {
        matches!(self, WatchError::Unanswered(_))
    }
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchError::Socket(e) => write!(f, "socket error: {e}"),
            WatchError::Malformed(why) => write!(f, "malformed message: {why}"),
            WatchError::Replay(why) => write!(f, "replay: {why}"),
            WatchError::Unanswered(endpoint) => {
                write!(f, "replay: {endpoint} did not answer in time")
            }
            WatchError::TooLarge {
                bytes,
                limit,
                sequence,
            } => {
                let sequence = sequence.map_or_else(String::new, |s| format!(" (sequence {s})"));
                write!(
                    f,
                    "a message of {bytes} bytes{sequence} is {} bytes over the bound of \
                     {limit}: dropped",
                    bytes - limit
                )
            }
            WatchError::Refused(why) => write!(f, "the publisher refused this subscriber: {why}"),
        }
    }
}

impl std::error::Error for WatchError {}

impl From<Malformed> for WatchError {
    fn from(Malformed(why): Malformed) -> Self {
        WatchError::Malformed(why)
    }
}

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

/// How long after a lost connection libzmq has to schedule its reconnection (it does within
/// milliseconds) before the subscriber connects again itself. libzmq 4.3 never reconnects
/// after a protocol error, and a frame over `ZMQ_MAXMSGSIZE` is one: without this, one
/// oversized message would end the stream for good.
const REJOIN_AFTER: Duration = Duration::from_secs(1);
/// Where a subscriber's own socket monitor publishes, in its own context.
const MONITOR_ENDPOINT: &str = "inproc://kv-events-subscriber-monitor";
/// Handshakes in a row that end with the publisher closing the connection before that is
/// taken for a refusal (a wrong server key, CURVE asked of a plain subscriber) rather than
/// a publisher that went away in the middle of one.
const CLOSED_HANDSHAKES_REFUSED: u32 = 2;

/// The default of [`SubscriberOptions::max_message_bytes`]: 16 MiB, about 250 times the
/// largest batch the master sends with keys of 1 KiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How a [`Subscriber`] connects, and the largest message it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberOptions {
    /// The receive high-water mark, in messages; default 1000 (libzmq's). Raise it so a
    /// subscriber that keeps up loses nothing to its own buffer.
    pub rcvhwm: i32,
    /// CURVE keys, for a publisher that speaks CURVE; default none: plain.
    pub curve: Option<CurveClient>,
    /// The largest message accepted, in bytes, all frames together; default
    /// [`DEFAULT_MAX_MESSAGE_BYTES`]. libzmq closes a connection that sends a frame over
    /// it before buffering the frame (`ZMQ_MAXMSGSIZE`) and the subscriber connects again
    /// about a second later: the message and any sent meanwhile are lost, the next one
    /// shows the gap, and [`Subscriber::connections_lost`] counts the closing. A message
    /// whose frames are each under it but together over is received and refused with
    /// [`WatchError::TooLarge`].
    pub max_message_bytes: usize,
    /// What to subscribe to: the publisher's topic (`kv_events_topic`) or a prefix of it;
    /// default empty: every message.
    pub topic: Vec<u8>,
}

impl Default for SubscriberOptions {
    fn default() -> SubscriberOptions {
        SubscriberOptions {
            rcvhwm: 1000,
            curve: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            topic: Vec::new(),
        }
    }
}

/// How far a [`Subscriber`] got towards its publisher, from its socket's monitor:
/// [`Subscriber::reach`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// No connection was ever established: nothing accepted one at the endpoint (nothing
    /// listening, the connection refused, no such ipc socket file) in `failed_attempts`
    /// attempts; none has failed yet while the first is pending (a host that does not
    /// answer keeps it pending).
    Unreached {
        /// Connection attempts that failed, after each of which libzmq tried again.
        failed_attempts: u64,
    },
    /// Connections were established, but no ZeroMQ handshake ever completed on one: what
    /// listens there is not a ZeroMQ publisher, or has not answered yet.
    NoHandshake,
    /// A handshake completed at least once: the publisher was reached.
    Reached,
}

/// A SUB socket connected to a publisher, subscribed to its topic (everything by default).
pub struct Subscriber {
    _context: zmq::Context,
    socket: zmq::Socket,
    /// Receives the SUB socket's handshake and disconnection events, so a refusal is an
    /// error, not silence, and a closed connection is counted.
    monitor: zmq::Socket,
    curve: bool,
    max_message_bytes: usize,
    closed_handshakes: u32,
    /// Whether a handshake succeeded since the last disconnection: only then is a
    /// disconnection a connection lost rather than a handshake that failed.
    connected: bool,
    /// How far it ever got: a connection established, a handshake completed.
    ever_connected: bool,
    ever_reached: bool,
    /// Connection attempts that failed before any connection was established.
    failed_attempts: u64,
    connections_lost: u64,
    /// When the last connection was lost, until libzmq says it reconnects.
    lost_at: Option<Instant>,
    endpoint: String,
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
        Subscriber::open(
            endpoint,
            &SubscriberOptions {
                rcvhwm,
                curve: curve.cloned(),
                ..SubscriberOptions::default()
            },
        )
    }

    /// Connects to `endpoint` as `options` say.
    pub fn open(endpoint: &str, options: &SubscriberOptions) -> Result<Subscriber, zmq::Error> {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::SUB)?;
        socket.set_rcvhwm(options.rcvhwm)?;
        socket.set_maxmsgsize(i64::try_from(options.max_message_bytes).unwrap_or(i64::MAX))?;
        socket.set_linger(0)?;
        socket.set_subscribe(&options.topic)?;
        if let Some(curve) = &options.curve {
            socket.set_curve_serverkey(&curve.server_key.0)?;
            socket.set_curve_publickey(&curve.keys.public.0)?;
            socket.set_curve_secretkey(&curve.keys.secret.0)?;
        }
        let events = EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | EVENT_HANDSHAKE_SUCCEEDED
            | EVENT_HANDSHAKE_FAILED_PROTOCOL
            | EVENT_HANDSHAKE_FAILED_AUTH
            | EVENT_DISCONNECTED
            | EVENT_CONNECT_RETRIED
            | EVENT_CONNECTED;
        socket.monitor(MONITOR_ENDPOINT, events as i32)?;
        let monitor = context.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(MONITOR_ENDPOINT)?;
        socket.connect(endpoint)?;
        Ok(Subscriber {
            _context: context,
            socket,
            monitor,
            curve: options.curve.is_some(),
            max_message_bytes: options.max_message_bytes,
            closed_handshakes: 0,
            connected: false,
            ever_connected: false,
            ever_reached: false,
            failed_attempts: 0,
            connections_lost: 0,
            lost_at: None,
            endpoint: endpoint.to_owned(),
            last_sequence: None,
        })
    }

    /// Connections to the publisher that closed after their handshake succeeded: the
    /// publisher stopped or restarted, or libzmq closed one that sent a frame over
    /// [`SubscriberOptions::max_message_bytes`]. The subscriber reconnects by itself; a
    /// message lost meanwhile shows as a gap. Counted as [`Subscriber::recv`] sees them.
    pub fn connections_lost(&self) -> u64 {
        self.connections_lost
    }

    /// How far this subscriber ever got towards its publisher, the socket's events so far
    /// taken: a subscriber that never reached it can say why. [`WatchError::Refused`] when
    /// an event says the publisher refuses this subscriber, as [`Subscriber::recv`] would.
    pub fn reach(&mut self) -> Result<Reach, WatchError> {
        self.check_handshakes()?;
        Ok(if self.ever_reached {
            Reach::Reached
        } else if self.ever_connected {
            Reach::NoHandshake
        } else {
            Reach::Unreached {
                failed_attempts: self.failed_attempts,
            }
        })
    }

    /// The SUB socket as an item for `zmq::poll`, for a reader that waits on several
    /// sockets at once; [`Subscriber::recv`] with a zero timeout then takes what arrived.
    pub fn poll_item(&self) -> zmq::PollItem<'_> {
        self.socket.as_poll_item(zmq::POLLIN)
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
                    self.connected = true;
                    self.ever_reached = true;
                    continue;
                }
                EVENT_CONNECTED => {
                    self.ever_connected = true;
                    continue;
                }
                EVENT_DISCONNECTED => {
                    if std::mem::take(&mut self.connected) {
                        self.connections_lost += 1;
                        self.lost_at = Some(Instant::now());
                    }
                    continue;
                }
                EVENT_CONNECT_RETRIED => {
                    self.lost_at = None;
                    if !self.ever_connected {
                        self.failed_attempts += 1;
                    }
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
                            "it probably requires CURVE (--curve-server-key, --curve-secret-key), \
                             or it is no PUB socket (a master's replay endpoint is a ROUTER)"
                        }
                    )
                }
                _ => continue,
            };
            return Err(WatchError::Refused(why));
        }
        if self.lost_at.is_some_and(|at| at.elapsed() >= REJOIN_AFTER) {
            self.lost_at = None;
            // The endpoint stays registered after its connection ended, and libzmq ignores
            // a SUB socket's second connect to an endpoint it holds.
            match self.socket.disconnect(&self.endpoint) {
                Ok(()) | Err(zmq::Error::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
            self.socket.connect(&self.endpoint)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for the next message, its events as `rmpv` values
    /// ([`decode_message`]): `Ok(None)` when none came; [`WatchError::Refused`] as soon as a
    /// handshake says the publisher refuses this subscriber; [`WatchError::Malformed`] or
    /// [`WatchError::TooLarge`] for a message it refused, after which it goes on (the next
    /// message shows the refused one as a gap).
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Batch>, WatchError> {
        self.recv_decoded(timeout, decode_message)
    }

    /// [`Subscriber::recv`], with each event deserialized into `E` by `rmp-serde`
    /// ([`Message::decode`]): [`Event`](crate::wire::Event) for the contract's fields, or a type of the
    /// reader's. A message whose events do not all fit `E` is refused with
    /// [`WatchError::Malformed`], and the next message shows it as a gap.
    ///
    /// ```no_run
    /// use mooncake_kv_events::wire::Event;
    /// use mooncake_kv_events::subscriber::{Continuity, Subscriber, WatchError};
    /// use mooncake_kv_events::EventKind;
    /// use std::time::Duration;
    ///
    /// let mut subscriber = Subscriber::connect("tcp://master-0:5557", 100_000)?;
    /// loop {
    ///     let batch = match subscriber.recv_as::<Event>(Duration::from_secs(1)) {
    ///         Ok(Some(batch)) => batch,
    ///         Ok(None) => continue, // quiet: a replay socket's `info` tells whether the end was lost
    ///         // One message refused: the next one shows it as a gap.
    ///         Err(WatchError::Malformed(_) | WatchError::TooLarge { .. }) => continue,
    ///         Err(e) => return Err(e.into()), // the socket failed, or the publisher refused us
    ///     };
    ///     if !matches!(batch.continuity, Continuity::Next | Continuity::First { missed: 0 }) {
    ///         // A gap, a late join or a restart: resync this backend.
    ///     }
    ///     for event in &batch.events {
    ///         let (tenant, key) = (&event.tenant_id, &event.object_key); // bytes, str or bin
    ///         match event.event_type {
    ///             EventKind::Stored => { /* (backend_id, tenant, key) is on event.medium */ }
    ///             EventKind::Removed => { /* it is not on event.medium any more */ }
    ///             EventKind::Cleared => { /* every object of (backend_id, tenant) is gone */ }
    ///         }
    ///     }
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn recv_as<E: DeserializeOwned>(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Batch<E>>, WatchError> {
        self.recv_decoded(timeout, |frames| Message::decode(frames))
    }

    /// [`Subscriber::recv`], the message only checked against the wire format: its payload
    /// stays in libzmq's buffer and its events are decoded when the reader gets to them
    /// ([`Checked::changes`](crate::wire::Checked::changes)), into types that may borrow from
    /// it. For a reader that holds messages before applying them, or applies millions of
    /// events a second.
    pub fn recv_checked(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<(Checked<zmq::Message>, Continuity)>, WatchError> {
        if !self.wait(timeout)? {
            return Ok(None);
        }
        let message = Checked::new(self.recv_frames()?)?;
        let continuity = self.follows(message.sequence);
        Ok(Some((message, continuity)))
    }

    /// Waits for the next message and decodes it with `decode`.
    fn recv_decoded<E>(
        &mut self,
        timeout: Duration,
        decode: impl FnOnce(&[zmq::Message]) -> Result<Message<E>, Malformed>,
    ) -> Result<Option<Batch<E>>, WatchError> {
        if !self.wait(timeout)? {
            return Ok(None);
        }
        let message = decode(&self.recv_frames()?)?;
        let continuity = self.follows(message.sequence);
        Ok(Some(Batch::new(message, continuity)))
    }

    /// Waits up to `timeout` for a message to arrive, watching the handshakes meanwhile:
    /// whether one did.
    fn wait(&mut self, timeout: Duration) -> Result<bool, WatchError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_handshakes()?;
            let mut left = deadline.saturating_duration_since(Instant::now());
            if let Some(at) = self.lost_at {
                left = left.min((at + REJOIN_AFTER).saturating_duration_since(Instant::now()));
            }
            let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
            ];
            zmq::poll(&mut items, millis)?;
            if items[0].is_readable() {
                return Ok(true);
            }
            if !items[1].is_readable() && Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }

    /// How `sequence`, just received, follows the one before it.
    fn follows(&mut self, sequence: u64) -> Continuity {
        let continuity = match self.last_sequence {
            None => Continuity::First { missed: sequence },
            Some(last) => Continuity::after(last, sequence),
        };
        self.last_sequence = Some(sequence);
        continuity
    }

    /// The frames of the next message, which has arrived. Keeps at most 4 (enough to say
    /// there are too many) and none past the size bound; counts the rest, so a message of
    /// many small frames costs no more than its frames in libzmq.
    fn recv_frames(&mut self) -> Result<Vec<zmq::Message>, WatchError> {
        let (mut frames, mut count, mut bytes) = (Vec::with_capacity(4), 0, 0);
        loop {
            let frame = self.socket.recv_msg(0)?;
            let more = frame.get_more();
            count += 1;
            bytes += frame.len();
            if frames.len() < 4 && bytes <= self.max_message_bytes {
                frames.push(frame);
            }
            if !more {
                break;
            }
        }
        if bytes > self.max_message_bytes {
            let sequence = frames
                .get(1)
                .and_then(|f| <[u8; 8]>::try_from(&f[..]).ok())
                .map(u64::from_be_bytes);
            return Err(WatchError::TooLarge {
                bytes,
                limit: self.max_message_bytes,
                sequence,
            });
        }
        if count > 3 {
            return Err(WatchError::Malformed(wrong_frames(count)));
        }
        Ok(frames)
    }
}

/// The address a subscriber connects to for a publisher bound on `endpoint`: a TCP wildcard
/// host (`*`, `0.0.0.0`) means this machine, the rest is used as given.
pub fn connect_form(endpoint: &str) -> String {
    ["tcp://*:", "tcp://0.0.0.0:"]
        .iter()
        .find_map(|wildcard| endpoint.strip_prefix(wildcard))
        .map_or_else(
            || endpoint.to_owned(),
            |port| format!("tcp://127.0.0.1:{port}"),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_tcp_hosts_connect_to_this_machine() {
        assert_eq!(connect_form("tcp://*:5557"), "tcp://127.0.0.1:5557");
        assert_eq!(connect_form("tcp://0.0.0.0:1"), "tcp://127.0.0.1:1");
        assert_eq!(connect_form("tcp://10.0.0.2:1"), "tcp://10.0.0.2:1");
        assert_eq!(connect_form("ipc:///run/kv.sock"), "ipc:///run/kv.sock");
    }
}
