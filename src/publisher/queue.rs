//! The bounded queue between the master's threads and the publishing thread.

use super::record::Record;
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::OnceLock;
use std::thread::{self, Thread};
use std::time::Duration;

/// A lock-free bounded queue of [`Record`]s that drops its oldest record when full, and wakes
/// the publishing thread only when that thread is asleep.
///
/// A push is one `ArrayQueue` slot claim (a compare-and-swap) plus one load of the sleeping
/// flag. While calls keep coming the consumer only naps, unseen by producers, so in steady
/// state a producer makes no system call to wake it (only crossbeam's backoff may yield when
/// producers keep colliding on the tail); it wakes the consumer after an idle spell, or when
/// the queue is full. Capacity counts records, one per call, so the events of one call never
/// straddle a drop.
#[derive(Debug)]
pub(crate) struct EventQueue {
    records: ArrayQueue<Record>,
    sleeping: AtomicBool,
    consumer: OnceLock<Thread>,
}

impl EventQueue {
    /// # Panics
    /// If `capacity` is zero (`Config::validate` refuses it first).
    pub(crate) fn new(capacity: usize) -> EventQueue {
        EventQueue {
            records: ArrayQueue::new(capacity),
            sleeping: AtomicBool::new(false),
            consumer: OnceLock::new(),
        }
    }

    /// Names the thread that [`EventQueue::wait`]s; pushes wake it.
    pub(crate) fn set_consumer(&self, consumer: Thread) {
        let _ = self.consumer.set(consumer);
    }

    /// Pushes `record`, pushing out and returning the oldest record when the queue is full.
    /// A full queue also wakes a napping consumer: producers must not drop for a whole nap.
    pub(crate) fn push(&self, record: Record) -> Option<Record> {
        let displaced = self.records.force_push(record);
        if displaced.is_some() {
            self.wake();
        } else {
            self.wake_if_sleeping();
        }
        displaced
    }

    /// Pushes `record` only if there is room, so a marker never pushes out an event.
    #[expect(
        clippy::result_large_err,
        reason = "records are large by design (strings inline); the caller retries with it"
    )]
    pub(crate) fn push_if_room(&self, record: Record) -> Result<(), Record> {
        self.records.push(record)?;
        self.wake_if_sleeping();
        Ok(())
    }

    pub(crate) fn pop(&self) -> Option<Record> {
        self.records.pop()
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.records.capacity()
    }

    /// Consumer side, while calls keep coming: sleeps until `timeout` passes or the queue
    /// fills, without telling producers, so that they make no system call to wake it.
    pub(crate) fn nap(&self, timeout: Duration) {
        if self.records.is_empty() {
            thread::park_timeout(timeout);
        }
    }

    /// Consumer side, once idle: sleeps until a push arrives, `wake` is called, or `timeout`
    /// passes.
    ///
    /// The flag is raised before the emptiness check and read by producers after their slot
    /// claim, both sequentially consistent (as is `ArrayQueue`'s claim itself), so either the
    /// consumer sees the record or the producer sees the flag. The timeout only bounds the
    /// damage should that reasoning ever fail.
    pub(crate) fn sleep(&self, timeout: Duration) {
        self.sleeping.store(true, SeqCst);
        if self.records.is_empty() {
            thread::park_timeout(timeout);
        }
        self.sleeping.store(false, SeqCst);
    }

    /// Wakes the consumer whether or not it sleeps.
    pub(crate) fn wake(&self) {
        if let Some(consumer) = self.consumer.get() {
            consumer.unpark();
        }
    }

    fn wake_if_sleeping(&self) {
        if self.sleeping.load(SeqCst) && self.sleeping.swap(false, SeqCst) {
            self.wake();
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::media::MediumSet;
    use crate::publisher::pool::StringPool;
    use crate::publisher::record::ObjectEvents;
    use std::sync::Arc;

    /// A record of one object's call with `media` events (1: cpu; 2: cpu and disk).
    pub(in crate::publisher) fn object(key: &str, media: usize) -> Record {
        let stored = MediumSet::from_bits(if media == 2 { 3 } else { 1 });
        Record::Object(
            ObjectEvents::new(
                b"t",
                key.as_bytes(),
                b"",
                MediumSet::EMPTY,
                stored,
                StringPool::for_tests(),
            )
            .unwrap(),
        )
    }

    fn key_of(record: &Record) -> Vec<u8> {
        match record {
            Record::Object(o) => o.events().next().unwrap().key.to_vec(),
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn drops_oldest_when_full() {
        let queue = EventQueue::new(2);
        assert!(queue.push(object("a", 2)).is_none());
        assert!(queue.push(object("b", 1)).is_none());
        let displaced = queue
            .push(object("c", 1))
            .expect("the oldest is pushed out");
        assert_eq!(
            (key_of(&displaced), displaced.event_count()),
            (b"a".to_vec(), 2)
        );
        assert_eq!(key_of(&queue.pop().unwrap()), b"b");
        assert_eq!(key_of(&queue.pop().unwrap()), b"c");
        assert!(queue.pop().is_none());
    }

    #[test]
    fn a_queued_call_is_128_bytes() {
        // The memory budget of a queued event (docs/performance.md) counts on it.
        assert_eq!(std::mem::size_of::<Record>(), 128);
    }

    #[test]
    fn a_marker_never_pushes_out_an_event() {
        let queue = EventQueue::new(1);
        assert!(queue.push(object("a", 1)).is_none());
        assert!(queue.push_if_room(Record::ScanBegin(1)).is_err());
        assert_eq!(queue.len(), 1);
        assert_eq!(Record::ScanBegin(1).event_count(), 0);
    }

    #[test]
    fn a_push_wakes_a_sleeping_consumer() {
        let queue = Arc::new(EventQueue::new(4));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let consumer = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || {
                ready_tx.send(()).unwrap();
                // Far longer than any test runs: only a wake-up ends this wait in time.
                while queue.len() == 0 {
                    queue.sleep(Duration::from_secs(3600));
                }
                queue.pop().is_some()
            })
        };
        queue.set_consumer(consumer.thread().clone());
        ready_rx.recv().unwrap();
        queue.push(object("a", 1));
        assert!(consumer.join().unwrap());
    }
}
