//! How a subscriber connects: its CURVE keys, its buffer, its bound on a message, its topic.

use crate::keys::{self, Key, KeyError, KeyPair};
use std::path::Path;

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
    pub fn from_files(server_key: &Path, secret_key: &Path) -> Result<CurveClient, KeyError> {
        keys::curve_available()?;
        Ok(CurveClient {
            server_key: keys::read_public_key(server_key)?,
            keys: keys::read_key_pair(secret_key)?,
        })
    }
}

/// The default of [`SubscriberOptions::max_message_bytes`]: 16 MiB, about 250 times the
/// largest batch the master sends with keys of 1 KiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How a [`Subscriber`](super::Subscriber) connects, and the largest message it takes.
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
    /// [`WatchError::TooLarge`](super::WatchError::TooLarge).
    ///
    /// [`Subscriber::connections_lost`]: super::Subscriber::connections_lost
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
