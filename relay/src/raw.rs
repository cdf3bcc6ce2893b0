//! The master's messages as they came, for the log: the [`Follower`] keeps the truth but
//! does not hand out the batches it applies, so the relay reads the stream a second time,
//! on a SUB socket of its own per publisher, and holds the batches until the follower
//! confirms them (same incarnation, sequence applied) and they are written. They are held
//! as they arrived (checked, in libzmq's buffers) and decoded only when written, so that a
//! master sending faster than the relay writes costs a bounded amount of memory, and
//! reading its stream costs little beside the follower's.
//!
//! [`Follower`]: mooncake_kv_events::subscriber::Follower

use mooncake_kv_events::subscriber::{Subscriber, SubscriberOptions, WatchError};
use mooncake_kv_events::wire::Checked;
use rmpv::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// Payload bytes held per publisher at most (about 650,000 events of the stream's usual
/// size); past it the oldest messages are dropped, and the gap they leave is written as a
/// difference instead.
const MAX_HELD_BYTES: usize = 256 << 20;
/// Messages taken per turn at most: a master sending flat out must not keep the relay
/// reading forever, away from its follower and its writes.
const MAX_DRAIN: usize = 4096;

/// A message as it arrived.
type Held = Checked<zmq::Message>;

/// One publisher's stream, read for the log.
pub(crate) struct Raw {
    subscriber: Subscriber,
    held: BTreeMap<u64, Held>,
    /// Their payloads' bytes.
    held_bytes: usize,
    /// The most `held_bytes` may be after a drain: [`MAX_HELD_BYTES`].
    max_held_bytes: usize,
    /// Messages refused by the SUB socket (malformed, too large).
    pub(crate) refused: u64,
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw")
            .field("held", &self.held.len())
            .field("held_bytes", &self.held_bytes)
            .finish_non_exhaustive()
    }
}

/// Consecutive master messages taken for one log message.
#[derive(Default)]
pub(crate) struct Run {
    /// The first sequence.
    pub(crate) first: u64,
    /// The last.
    pub(crate) last: u64,
    /// The last one's timestamp.
    pub(crate) timestamp_ms: u64,
    /// The first one's dp_rank.
    pub(crate) dp_rank: u64,
    /// Their events, in order.
    pub(crate) events: Vec<Value>,
    /// The messages, to put back if the write fails.
    messages: Vec<Held>,
}

impl Raw {
    /// Subscribes to `endpoint`.
    pub(crate) fn open(endpoint: &str, options: &SubscriberOptions) -> Result<Raw, String> {
        let subscriber = Subscriber::open(endpoint, options)
            .map_err(|e| format!("cannot subscribe to {endpoint}: {e}"))?;
        Ok(Raw {
            subscriber,
            held: BTreeMap::new(),
            held_bytes: 0,
            max_held_bytes: MAX_HELD_BYTES,
            refused: 0,
        })
    }

    /// Takes the messages waiting on the socket (up to [`MAX_DRAIN`]), without waiting;
    /// returns how many.
    pub(crate) fn drain(&mut self) -> usize {
        let mut taken = 0;
        while taken < MAX_DRAIN {
            match self.subscriber.recv_checked(Duration::ZERO) {
                Ok(Some((message, _))) => {
                    self.hold(message);
                    taken += 1;
                }
                Ok(None) => break,
                // A refused handshake is the follower's to say; a refused message is a gap.
                Err(WatchError::Refused(_)) => break,
                Err(_) => self.refused += 1,
            }
        }
        while self.held_bytes > self.max_held_bytes {
            let Some((_, oldest)) = self.held.pop_first() else {
                break;
            };
            self.held_bytes -= oldest.payload_bytes();
        }
        taken
    }

    fn hold(&mut self, message: Held) {
        self.held_bytes += message.payload_bytes();
        if let Some(replaced) = self.held.insert(message.sequence, message) {
            self.held_bytes -= replaced.payload_bytes();
        }
    }

    /// Forgets the messages up to `sequence`: written, or covered by a difference.
    pub(crate) fn drop_through(&mut self, sequence: u64) {
        let kept = self.held.split_off(&(sequence + 1));
        for dropped in std::mem::replace(&mut self.held, kept).into_values() {
            self.held_bytes -= dropped.payload_bytes();
        }
    }

    /// The held messages `from`, `from + 1`, ... up to `through` at most, as long as they
    /// follow each other, with at most `max_events` events (at least one message); `None`
    /// when `from` is not held.
    pub(crate) fn take(&mut self, from: u64, through: u64, max_events: usize) -> Option<Run> {
        let mut run = Run::default();
        let mut next = from;
        while next <= through {
            let fits = self.held.get(&next).is_some_and(|m| {
                run.messages.is_empty() || run.events.len() + m.len() <= max_events
            });
            if !fits {
                break;
            }
            let message = self.held.remove(&next)?;
            self.held_bytes -= message.payload_bytes();
            let Some(events) = events_of(message.payload()) else {
                // Checked, so never; a gap the difference covers if it were.
                self.refused += 1;
                break;
            };
            if run.messages.is_empty() {
                run.first = next;
                run.dp_rank = message.dp_rank;
            }
            run.last = next;
            run.timestamp_ms = message.timestamp_ms;
            run.events.extend(events);
            run.messages.push(message);
            next += 1;
        }
        (!run.messages.is_empty()).then_some(run)
    }

    /// Puts back the messages of a run that could not be written.
    pub(crate) fn put_back(&mut self, run: Run) {
        for message in run.messages {
            self.hold(message);
        }
    }

    /// How many messages are held.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}

/// The events of a checked payload, `[timestamp_ms, [event, ...], dp_rank]`, as values.
fn events_of(mut payload: &[u8]) -> Option<Vec<Value>> {
    match rmpv::decode::read_value(&mut payload).ok()? {
        Value::Array(mut fields) if fields.len() >= 2 => match fields.swap_remove(1) {
            Value::Array(events) => Some(events),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv_events_testing::{config, eventually, publish};
    use mooncake_kv_events::subscriber::Reach;
    use mooncake_kv_events::wire::field;
    use mooncake_kv_events::{Medium, MediumSet, Publisher};

    /// A publisher that has sent ten messages, one `stored` of key `k<i>` each, and a
    /// `Raw` that read them all.
    fn ten_messages_held() -> (Publisher, Raw) {
        let (publisher, endpoint) = publish(config(""));
        let mut raw = Raw::open(&endpoint, &SubscriberOptions::default()).unwrap();
        assert!(eventually(|| matches!(
            raw.subscriber.reach(),
            Ok(Reach::Reached)
        )));
        // The subscription crosses to the PUB socket after the handshake.
        std::thread::sleep(Duration::from_millis(300));
        for i in 0..10 {
            publisher.on_put_commit("t", format!("k{i}"), "g", MediumSet::from([Medium::Cpu]));
            assert!(publisher.flush(Duration::from_secs(5)));
        }
        assert!(eventually(|| {
            raw.drain();
            raw.len() == 10
        }));
        (publisher, raw)
    }

    fn keys(events: &[Value]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                field(e, "object_key")
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn held_messages_are_counted_in_bytes_decoded_when_taken_and_put_back_whole() {
        let (_publisher, mut raw) = ten_messages_held();
        let held_bytes = raw.held_bytes;
        assert!(held_bytes > 0);
        let (&first, _) = raw.held.first_key_value().unwrap();
        let run = raw
            .take(first, first + 9, 1000)
            .expect("ten messages that follow");
        assert_eq!((run.first, run.last), (first, first + 9));
        let expected: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
        assert_eq!(keys(&run.events), expected);
        assert_eq!((raw.len(), raw.held_bytes), (0, 0));
        raw.put_back(run);
        assert_eq!((raw.len(), raw.held_bytes), (10, held_bytes));
        // At most 4 events: the run stops before the message that would pass it.
        let run = raw.take(first, first + 9, 4).unwrap();
        assert_eq!(keys(&run.events), expected[..4]);
        raw.drop_through(first + 9);
        assert_eq!((raw.len(), raw.held_bytes), (0, 0));
    }

    #[test]
    fn past_the_bound_in_bytes_the_oldest_messages_are_dropped() {
        let (_publisher, mut raw) = ten_messages_held();
        let (&first, _) = raw.held.first_key_value().unwrap();
        // The ten messages are the same size: room for three of them.
        raw.max_held_bytes = raw.held_bytes * 3 / 10;
        raw.drain();
        let kept: Vec<u64> = raw.held.keys().copied().collect();
        assert_eq!(kept, [first + 7, first + 8, first + 9]);
        assert!(raw.held_bytes <= raw.max_held_bytes);
        assert!(
            raw.take(first, first + 9, 1000).is_none(),
            "the oldest is gone"
        );
    }
}
