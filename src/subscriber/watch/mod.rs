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

mod batch;
mod error;
mod handshake;
mod options;

pub use batch::{Batch, Continuity};
pub use error::WatchError;
pub use handshake::Reach;
pub use options::{CurveClient, SubscriberOptions, DEFAULT_MAX_MESSAGE_BYTES};

use crate::transport::monitor::{
    EVENT_CONNECTED, EVENT_CONNECT_RETRIED, EVENT_DISCONNECTED, EVENT_HANDSHAKE_FAILED_AUTH,
    EVENT_HANDSHAKE_FAILED_NO_DETAIL, EVENT_HANDSHAKE_FAILED_PROTOCOL, EVENT_HANDSHAKE_SUCCEEDED,
};
use crate::wire::{decode_message, Checked, Malformed, Message};
use handshake::REJOIN_AFTER;
use serde::de::DeserializeOwned;
use std::fmt;
use std::time::{Duration, Instant};

/// Where a subscriber's own socket monitor publishes, in its own context.
const MONITOR_ENDPOINT: &str = "inproc://kv-events-subscriber-monitor";

/// A SUB socket connected to a publisher, subscribed to its topic (everything by default).
///
/// ```no_run
/// use mooncake_kv_events::subscriber::{
///     Continuity, CurveClient, Reach, Subscriber, SubscriberOptions, WatchError,
/// };
/// use std::path::Path;
/// use std::time::Duration;
///
/// let curve = CurveClient::from_files(Path::new("master-0.pub"), Path::new("indexer-a.key"))?;
/// let options = SubscriberOptions {
///     rcvhwm: 100_000,
///     curve: Some(curve),
///     ..SubscriberOptions::default()
/// };
/// let mut subscriber = Subscriber::open("tcp://master-0:5557", &options)?;
/// loop {
///     match subscriber.recv(Duration::from_secs(5)) {
///         Ok(Some(batch)) => {
///             if let Continuity::Gap { missed } = batch.continuity {
///                 eprintln!("{missed} sequence numbers lost before {}", batch.sequence);
///             }
///             println!("{} events", batch.events.len());
///         }
///         // Quiet for 5 s: a publisher never reached says why.
///         Ok(None) => match subscriber.reach()? {
///             Reach::Reached => {}
///             Reach::NoHandshake => eprintln!("no ZeroMQ publisher answers there"),
///             Reach::Unreached { failed_attempts } => {
///                 eprintln!("{failed_attempts} connection attempts failed")
///             }
///         },
///         // One message refused; the next one shows it as a gap.
///         Err(e @ (WatchError::Malformed(_) | WatchError::TooLarge { .. })) => eprintln!("{e}"),
///         // The publisher refused this subscriber, or the socket failed.
///         Err(e) => return Err(e.into()),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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

    /// The SUB socket as an item for `zmq::poll`, for a reader that waits on several
    /// sockets at once; [`Subscriber::recv`] with a zero timeout then takes what arrived.
    pub fn poll_item(&self) -> zmq::PollItem<'_> {
        self.socket.as_poll_item(zmq::POLLIN)
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
            return Err(Malformed::Frames { count }.into());
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
