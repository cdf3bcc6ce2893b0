//! The log as the relay writes it: a backend's subject in the stream, where every message
//! goes on top of the one the relay read last (JetStream's expected last subject sequence),
//! so that two relays never interleave, and carries a message id, so that a write retried
//! after a lost acknowledgement is kept once.

use crate::batch;
use crate::held::Held;
use crate::nats::{Nats, Refused};
use async_nats::HeaderMap;
use rmpv::Value;

/// The header of the master's incarnation a log message brings the log to (16 hex digits).
pub(crate) const INCARNATION: &str = "Kv-Events-Incarnation";
/// The header of the master's last sequence it covers.
pub(crate) const SEQUENCE: &str = "Kv-Events-Sequence";
/// `events` (the master's own) or `diff` (a difference after a resync).
pub(crate) const KIND: &str = "Kv-Events-Kind";
/// For a difference, `part/parts`, from 1.
pub(crate) const PART: &str = "Kv-Events-Part";
/// The stream sequence of the message before it on the subject, 0 for the first.
pub(crate) const PREVIOUS: &str = "Kv-Events-Previous";

/// Where the log stands in the master's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    /// The master's incarnation.
    pub(crate) incarnation: u64,
    /// The last master sequence the log covers.
    pub(crate) sequence: u64,
    /// False in the middle of a difference, or after a hole in the log: the log is not
    /// the master's state at `sequence`, and the next write is a difference.
    pub(crate) complete: bool,
}

/// One message to append.
#[derive(Debug)]
pub(crate) struct Entry<'a> {
    /// The message id.
    pub(crate) id: String,
    /// Where the log stands once it is applied.
    pub(crate) position: Position,
    /// `events` or `diff`.
    pub(crate) kind: &'a str,
    /// For a difference, (part, parts).
    pub(crate) part: Option<(usize, usize)>,
    /// The batch's timestamp and dp_rank.
    pub(crate) timestamp_ms: u64,
    /// The batch's dp_rank.
    pub(crate) dp_rank: u64,
    /// Its events.
    pub(crate) events: Vec<Value>,
}

/// What became of an append.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Appended {
    /// Written and applied to what the log holds.
    Written,
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
}

impl Log {
    /// A log known up to stream sequence `last`, where it stood at `position`.
    pub(crate) fn new(subject: String, last: u64, position: Option<Position>) -> Log {
        Log {
            subject,
            last,
            position,
            unreadable: 0,
        }
    }

    /// Appends `entry` on top of the last message known; on success applies its events to
    /// `held`. On a race lost or a duplicate, reads what is there instead ([`Log::read`]).
    pub(crate) fn append(
        &mut self,
        nats: &Nats,
        held: &mut Held,
        entry: Entry<'_>,
    ) -> Result<Appended, String> {
        let mut headers = HeaderMap::new();
        headers.insert(
            INCARNATION,
            format!("{:016x}", entry.position.incarnation).as_str(),
        );
        headers.insert(SEQUENCE, entry.position.sequence.to_string().as_str());
        headers.insert(KIND, entry.kind);
        if let Some((part, parts)) = entry.part {
            headers.insert(PART, format!("{part}/{parts}").as_str());
        }
        headers.insert(PREVIOUS, self.last.to_string().as_str());
        let payload = batch::encode(entry.timestamp_ms, entry.events.clone(), entry.dp_rank);
        match nats.append(&self.subject, payload, headers, &entry.id, self.last) {
            Ok(Some(sequence)) => {
                held.apply(&entry.events, sequence);
                self.last = sequence;
                self.position = Some(entry.position);
                Ok(Appended::Written)
            }
            Ok(None) => self.read(nats, held).map(|_| Appended::ReadInstead(false)),
            Err(Refused::NotLast) => self.read(nats, held).map(|_| Appended::ReadInstead(true)),
            Err(Refused::Failed(why)) => Err(why),
        }
    }

    /// Reads the messages written after the last one known (by another relay, or by this
    /// one before it restarted) and applies them to `held`; returns how many.
    pub(crate) fn read(&mut self, nats: &Nats, held: &mut Held) -> Result<usize, String> {
        let messages = nats.read_after(&self.subject, self.last)?;
        for message in &messages {
            let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned());
            let previous = header(PREVIOUS).and_then(|v| v.parse::<u64>().ok());
            let mut position = position_of(header(INCARNATION), header(SEQUENCE), header(PART));
            match batch::decode(&message.payload) {
                Ok(events) => {
                    held.apply(&events, message.stream_sequence);
                }
                Err(_) => {
                    self.unreadable += 1;
                    position = None;
                }
            }
            // A message not written on top of the one before it: something between them
            // is gone (a limit of the stream, a purge); the next write is a difference.
            if previous != Some(self.last) {
                position = position.map(|p| Position {
                    complete: false,
                    ..p
                });
            }
            self.last = message.stream_sequence;
            self.position = position;
        }
        Ok(messages.len())
    }
}

/// The position a log message's headers give; `None` when they give none.
fn position_of(
    incarnation: Option<String>,
    sequence: Option<String>,
    part: Option<String>,
) -> Option<Position> {
    let incarnation = u64::from_str_radix(&incarnation?, 16).ok()?;
    let sequence = sequence?.parse().ok()?;
    let complete = match part {
        None => true,
        Some(part) => {
            let (part, parts) = part.split_once('/')?;
            part == parts
        }
    };
    Some(Position {
        incarnation,
        sequence,
        complete,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_is_complete_after_events_or_the_last_part_of_a_difference() {
        let p = |part: Option<&str>| {
            position_of(
                Some("00000000000000ff".into()),
                Some("7".into()),
                part.map(Into::into),
            )
        };
        assert_eq!(
            p(None),
            Some(Position {
                incarnation: 255,
                sequence: 7,
                complete: true
            })
        );
        assert!(!p(Some("1/2")).unwrap().complete);
        assert!(p(Some("2/2")).unwrap().complete);
        assert_eq!(position_of(None, Some("7".into()), None), None);
    }
}
