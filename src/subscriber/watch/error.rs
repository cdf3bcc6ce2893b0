//! Why a subscriber could not read a message.

use crate::wire::{BadReply, Malformed};
use std::fmt;

/// Why a message could not be read. [`WatchError::Malformed`] and [`WatchError::TooLarge`]
/// concern one message: the subscriber goes on with the next, whose sequence shows the
/// refused one as a gap.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchError {
    /// The socket failed.
    Socket(zmq::Error),
    /// The message does not follow the wire format.
    Malformed(Malformed),
    /// The message is larger than [`SubscriberOptions::max_message_bytes`]: it was received
    /// (libzmq bounds each frame, not their sum) and dropped undecoded.
    ///
    /// [`SubscriberOptions::max_message_bytes`]: super::SubscriberOptions::max_message_bytes
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
    /// The replay socket's `info` or `snapshot-end` map does not decode.
    BadReply(BadReply),
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
            WatchError::Malformed(why) => write!(f, "{why}"),
            WatchError::Replay(why) => write!(f, "replay: {why}"),
            WatchError::BadReply(why) => write!(f, "replay: {why}"),
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
    fn from(why: Malformed) -> Self {
        WatchError::Malformed(why)
    }
}

impl From<zmq::Error> for WatchError {
    fn from(e: zmq::Error) -> Self {
        WatchError::Socket(e)
    }
}
