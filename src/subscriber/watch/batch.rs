//! A message as a subscriber received it, and how its sequence follows the one before.

use crate::wire::Message;
use rmpv::Value;

/// One message of the stream as a [`Subscriber`] received it: decoded, and placed after the
/// one before. Its events are `rmpv` values (every field as received) from
/// [`Subscriber::recv`], or `E` from [`Subscriber::recv_as`].
///
/// [`Subscriber`]: super::Subscriber
/// [`Subscriber::recv`]: super::Subscriber::recv
/// [`Subscriber::recv_as`]: super::Subscriber::recv_as
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
