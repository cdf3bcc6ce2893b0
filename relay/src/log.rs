//! The log as the relay writes it: a backend's subject in the stream, where every message
//! goes on top of the one the relay read last (JetStream's expected last subject sequence),
//! so that two relays never interleave, and carries a message id, so that a write retried
//! after a lost acknowledgement is kept once.

use crate::error::StoreError;
use crate::held::Held;
use crate::store::{Appended, LogMessage, Logged, Store};

/// The header of the master's incarnation a log message brings the log to (16 hex digits).
pub(crate) const INCARNATION: &str = "Kv-Events-Incarnation";
/// The header of the master's next sequence after it: the log holds the master's state
/// before that message.
pub(crate) const NEXT_SEQUENCE: &str = "Kv-Events-Next-Sequence";
/// `events` (the master's own) or `diff` (a difference after a resync).
pub(crate) const KIND: &str = "Kv-Events-Kind";
/// For a difference, `part/parts`, from 1.
pub(crate) const PART: &str = "Kv-Events-Part";
/// The stream sequence of the message before it on the subject, 0 for the first.
pub(crate) const PREVIOUS: &str = "Kv-Events-Previous";
/// JetStream's message id header.
const MSG_ID: &str = "Nats-Msg-Id";

/// Where the log stands in the master's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// The master's incarnation.
    pub(crate) incarnation: u64,
    /// The master's next sequence: the log holds its state before that message.
    pub(crate) next: u64,
    /// False in the middle of a difference, or after a hole in the log: the log is not
    /// the master's state before `next`, and the next write is a difference.
    pub(crate) complete: bool,
}

/// One message to append.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The message id.
    pub(crate) id: String,
    /// Where the log stands once it is applied.
    pub(crate) position: Position,
    /// `events` or `diff`.
    pub(crate) kind: &'static str,
    /// For a difference, (part, parts).
    pub(crate) part: Option<(usize, usize)>,
    /// Its batches.
    pub(crate) payload: Vec<u8>,
}

/// What became of an append.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// Written and applied to what the log holds; it held this many events.
    Yes(u64),
    /// Another writer got there first, or the id was written before: the log was read
    /// again instead. `true` when another relay wrote meanwhile.
    ReadInstead(bool),
}

/// A backend's log: its subject and the last message the relay knows of on it.
#[derive(Debug)]
pub(crate) struct Log {
    /// The subject, `kv-events.<backend token>`.
    pub(crate) subject: String,
    /// The stream sequence of the last message known on the subject, 0: none.
    pub(crate) last: u64,
    /// Where that message left the log; `None` before any.
    pub(crate) position: Option<Position>,
    /// Log messages read back that were not batches (counted; their events are lost to
    /// the relay too, and the next write is a difference).
    pub(crate) unreadable: u64,
    /// The ids of the appends since the last message known whose outcome is unknown (no
    /// acknowledgement: NATS restarted, a timeout), each on top of that message: if the log
    /// moved by them alone, it is this relay's own.
    in_doubt: Vec<String>,
}

impl Log {
    /// A log known up to stream sequence `last`, where it stood at `position`.
    pub(crate) fn new(subject: String, last: u64, position: Option<Position>) -> Log {
        Log {
            subject,
            last,
            position,
            unreadable: 0,
            in_doubt: Vec::new(),
        }
    }

    /// Appends `entry` on top of the last message known; on success `apply` applies it to
    /// `held` (given its batches and stream sequence, returns how many events they hold).
    /// On a race lost or a duplicate, reads what is there instead ([`Log::read`]).
    pub(crate) fn append(
        &mut self,
        store: &mut impl Store,
        held: &mut Held,
        entry: Entry,
        apply: impl FnOnce(&mut Held, &bytes::Bytes, u64) -> u64,
    ) -> Result<Written, StoreError> {
        let mut headers = vec![
            (INCARNATION, format!("{:016x}", entry.position.incarnation)),
            (NEXT_SEQUENCE, entry.position.next.to_string()),
            (KIND, entry.kind.to_owned()),
            (PREVIOUS, self.last.to_string()),
        ];
        if let Some((part, parts)) = entry.part {
            headers.push((PART, format!("{part}/{parts}")));
        }
        let payload = bytes::Bytes::from(entry.payload);
        let id = entry.id;
        let message = LogMessage {
            id: id.clone(),
            headers,
            payload: payload.clone(),
        };
        match store.append(&self.subject, message, self.last) {
            Ok(Appended::Written(sequence)) => {
                self.in_doubt.clear();
                let events = apply(held, &payload, sequence);
                self.last = sequence;
                self.position = Some(entry.position);
                Ok(Written::Yes(events))
            }
            Ok(Appended::Duplicate) => self.read(store, held).map(|_| Written::ReadInstead(false)),
            Err(StoreError::NotLast) => {
                let doubted = std::mem::take(&mut self.in_doubt);
                let ids = match self.read_ids(store, held) {
                    Ok(ids) => ids,
                    Err(e) => {
                        self.in_doubt = doubted;
                        return Err(e);
                    }
                };
                // Only this relay's own writes, whose acknowledgements were lost (and which
                // it retried regrouped, under other ids), are no race: one normally, as each
                // went on top of the same message, or more where the server let a retry in
                // on top of one still in flight.
                let own = !ids.is_empty()
                    && ids
                        .iter()
                        .all(|id| id.as_ref().is_some_and(|id| doubted.contains(id)));
                Ok(Written::ReadInstead(!own))
            }
            Err(e) => {
                if matches!(e, StoreError::Failed { .. }) {
                    self.in_doubt.push(id);
                }
                Err(e)
            }
        }
    }

    /// Reads the messages written after the last one known (by another relay, or by this
    /// one before it restarted) and applies them to `held`; returns how many.
    pub(crate) fn read(
        &mut self,
        store: &mut impl Store,
        held: &mut Held,
    ) -> Result<usize, StoreError> {
        self.read_ids(store, held).map(|ids| ids.len())
    }

    /// As [`Log::read`]; returns the message ids (`Nats-Msg-Id`) of the messages read.
    fn read_ids(
        &mut self,
        store: &mut impl Store,
        held: &mut Held,
    ) -> Result<Vec<Option<String>>, StoreError> {
        let messages = store.read_after(&self.subject, self.last)?;
        for message in &messages {
            self.take(message, held);
        }
        self.in_doubt.clear();
        Ok(messages
            .iter()
            .map(|m| m.header(MSG_ID).map(str::to_owned))
            .collect())
    }

    /// Applies one message read back, and moves the log's position past it.
    fn take(&mut self, message: &Logged, held: &mut Held) {
        let previous = message.header(PREVIOUS).and_then(|v| v.parse::<u64>().ok());
        let mut position = position_of(message);
        if held
            .apply(&message.payload, message.stream_sequence)
            .is_err()
        {
            self.unreadable += 1;
            position = None;
        }
        // A message not written on top of the one before it: something between them is
        // gone (the stream's retention, a purge); the next write is a difference.
        if previous != Some(self.last) {
            position = position.map(|p| Position {
                complete: false,
                ..p
            });
        }
        self.last = message.stream_sequence;
        self.position = position;
    }
}

/// The position a log message's headers give; `None` when they give none.
pub(crate) fn position_of(message: &Logged) -> Option<Position> {
    let incarnation = u64::from_str_radix(message.header(INCARNATION)?, 16).ok()?;
    let next = message.header(NEXT_SEQUENCE)?.parse().ok()?;
    let complete = match message.header(PART) {
        None => true,
        Some(part) => {
            let (part, parts) = part.split_once('/')?;
            part == parts
        }
    };
    Some(Position {
        incarnation,
        next,
        complete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_position_is_complete_after_events_or_the_last_part_of_a_difference() {
        let p = |part: Option<&str>, incarnation: Option<&str>| {
            let mut headers = BTreeMap::new();
            headers.insert(NEXT_SEQUENCE.to_owned(), "7".to_owned());
            if let Some(i) = incarnation {
                headers.insert(INCARNATION.to_owned(), i.to_owned());
            }
            if let Some(part) = part {
                headers.insert(PART.to_owned(), part.to_owned());
            }
            position_of(&Logged {
                stream_sequence: 1,
                headers,
                payload: bytes::Bytes::new(),
            })
        };
        let ff = Some("00000000000000ff");
        assert_eq!(
            p(None, ff),
            Some(Position {
                incarnation: 255,
                next: 7,
                complete: true
            })
        );
        assert!(!p(Some("1/2"), ff).unwrap().complete);
        assert!(p(Some("2/2"), ff).unwrap().complete);
        assert_eq!(p(None, None), None);
    }
}
