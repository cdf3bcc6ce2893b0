//! The master's messages as they came, for the log: the [`Follower`] keeps the truth but
//! does not hand out the batches it applies, so the relay reads the stream a second time,
//! on a SUB socket of its own per publisher, and holds the batches until the follower
//! confirms them (same incarnation, sequence applied) and they are written.
//!
//! [`Follower`]: mooncake_kv_events::subscriber::Follower

use mooncake_kv_events::subscriber::{Batch, Subscriber, SubscriberOptions, WatchError};
use rmpv::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// Batches held per publisher at most; past it the oldest are dropped, and the gap they
/// leave is written as a difference instead.
const MAX_HELD: usize = 200_000;
/// Messages taken per turn at most: a master sending flat out must not keep the relay
/// reading forever, away from its follower and its writes.
const MAX_DRAIN: usize = 20_000;

/// One publisher's stream, read for the log.
pub(crate) struct Raw {
    subscriber: Subscriber,
    held: BTreeMap<u64, Batch>,
    /// Messages refused by the SUB socket (malformed, too large).
    pub(crate) refused: u64,
}

impl std::fmt::Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw")
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

/// Consecutive master messages taken for one log message.
#[derive(Debug, Default)]
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
    /// The batches, to put back if the write fails.
    batches: Vec<Batch>,
}

impl Raw {
    /// Subscribes to `endpoint`.
    pub(crate) fn open(endpoint: &str, options: &SubscriberOptions) -> Result<Raw, String> {
        let subscriber = Subscriber::open(endpoint, options)
            .map_err(|e| format!("cannot subscribe to {endpoint}: {e}"))?;
        Ok(Raw {
            subscriber,
            held: BTreeMap::new(),
            refused: 0,
        })
    }

    /// Takes the messages waiting on the socket (up to [`MAX_DRAIN`]), without waiting;
    /// returns how many.
    pub(crate) fn drain(&mut self) -> usize {
        let mut taken = 0;
        while taken < MAX_DRAIN {
            match self.subscriber.recv(Duration::ZERO) {
                Ok(Some(batch)) => {
                    self.held.insert(batch.sequence, batch);
                    taken += 1;
                }
                Ok(None) => break,
                // A refused handshake is the follower's to say; a refused message is a gap.
                Err(WatchError::Refused(_)) => break,
                Err(_) => self.refused += 1,
            }
        }
        while self.held.len() > MAX_HELD {
            self.held.pop_first();
        }
        taken
    }

    /// Forgets the messages up to `sequence`: written, or covered by a difference.
    pub(crate) fn drop_through(&mut self, sequence: u64) {
        self.held = self.held.split_off(&(sequence + 1));
    }

    /// The held messages `from`, `from + 1`, ... up to `through` at most, as long as they
    /// follow each other, with at most `max_events` events (at least one message); `None`
    /// when `from` is not held.
    pub(crate) fn take(&mut self, from: u64, through: u64, max_events: usize) -> Option<Run> {
        let mut run = Run::default();
        let mut next = from;
        while next <= through {
            let fits = self.held.get(&next).is_some_and(|b| {
                run.batches.is_empty() || run.events.len() + b.events.len() <= max_events
            });
            if !fits {
                break;
            }
            let batch = self.held.remove(&next)?;
            if run.batches.is_empty() {
                run.first = next;
                run.dp_rank = batch.dp_rank;
            }
            run.last = next;
            run.timestamp_ms = batch.timestamp_ms;
            run.events.extend(batch.events.iter().cloned());
            run.batches.push(batch);
            next += 1;
        }
        (!run.batches.is_empty()).then_some(run)
    }

    /// Puts back the messages of a run that could not be written.
    pub(crate) fn put_back(&mut self, run: Run) {
        for batch in run.batches {
            self.held.insert(batch.sequence, batch);
        }
    }

    /// How many messages are held.
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }
}
