//! What the master's calling threads and the publishing thread share: the queue, the string
//! pool, the counters, and the shutdown protocol (`close`, then the thread's last look, then
//! `finish`), kept here in one place so that no call is ever left queued, neither sent nor
//! counted.

use super::pool::StringPool;
use super::queue::EventQueue;
use super::record::Record;
use crate::stats::Counters;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

/// What the callers and the publishing thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) queue: EventQueue,
    /// Blocks for strings too long for a record.
    pub(crate) strings: StringPool,
    pub(crate) counters: Counters,
    pub(crate) emit_object_key: bool,
    /// `kv_events_reannounce_remaining`: a `removed` brings a `stored` of each medium left.
    pub(crate) reannounce_remaining: bool,
    closing: AtomicBool,
    /// Set once the publishing thread is joined: nothing will take records off the queue.
    stopped: AtomicBool,
}

impl Shared {
    pub(crate) fn new(
        queue: EventQueue,
        emit_object_key: bool,
        reannounce_remaining: bool,
    ) -> Shared {
        Shared {
            strings: StringPool::for_queue(queue.capacity()),
            queue,
            counters: Counters::default(),
            emit_object_key,
            reannounce_remaining,
            closing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(SeqCst)
    }

    /// The hot path: push one call's record, or count why it was not pushed.
    pub(crate) fn push(&self, record: Record) {
        if self.is_closing() {
            Counters::add(&self.counters.dropped_events, record.event_count());
            record.recycle(&self.strings);
            return;
        }
        if let Some(displaced) = self.queue.push(record) {
            Counters::add(&self.counters.dropped_events, displaced.event_count());
            displaced.recycle(&self.strings);
        }
        // A call that saw the publisher open but pushed after shutdown's last look would stay
        // queued, neither sent nor counted. `stopped` is stored before that look and read
        // after the push (both sequentially consistent, as the queue's claim), so either the
        // look finds the record or this call sees `stopped`.
        if self.stopped.load(SeqCst) {
            self.drop_queued();
        }
    }

    /// The first step of shutdown: calls from now on are dropped and counted, and the
    /// publishing thread, woken, sends what is queued within its linger and returns.
    pub(crate) fn close(&self) {
        self.closing.store(true, SeqCst);
        self.queue.wake();
    }

    /// The last step of shutdown, once the publishing thread is joined: a call that saw the
    /// publisher open may have pushed after the thread's last look, so whatever is still
    /// queued is counted as dropped. Returns how many events that was.
    pub(crate) fn finish(&self) -> usize {
        self.stopped.store(true, SeqCst);
        self.drop_queued()
    }

    /// Counts every queued record's events as dropped and returns how many there were; only
    /// once the publishing thread is gone.
    fn drop_queued(&self) -> usize {
        let mut late = 0;
        while let Some(record) = self.queue.pop() {
            late += record.event_count();
            record.recycle(&self.strings);
        }
        if late > 0 {
            Counters::add(&self.counters.dropped_events, late);
        }
        late
    }
}

impl Drop for Shared {
    /// Gives the blocks of what is still queued back to the pool, which frees its memory only
    /// once every block is back.
    fn drop(&mut self) {
        while let Some(record) = self.queue.pop() {
            record.recycle(&self.strings);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::queue::tests::object;
    use super::super::queue::EventQueue;
    use super::super::record::ObjectEvents;
    use super::*;
    use crate::{Medium, MediumSet};
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn a_push_that_lands_after_shutdown_drained_the_queue_is_counted_as_dropped() {
        // The state a caller meets when it passed the closing check, then was descheduled
        // while shutdown joined the thread and drained: its push must not stay queued.
        let shared = Shared::new(EventQueue::new(4), true, false);
        shared.push(object("before", 2));
        shared.finish();
        shared.push(object("late", 2));
        assert_eq!(shared.queue.len(), 0);
        assert_eq!(shared.counters.dropped_events.load(Relaxed), 4);
    }

    #[test]
    fn while_running_a_push_stays_queued() {
        let shared = Shared::new(EventQueue::new(4), true, false);
        shared.push(object("k", 2));
        assert_eq!(shared.queue.len(), 1);
        assert_eq!(shared.counters.dropped_events.load(Relaxed), 0);
    }

    #[test]
    fn every_block_comes_back_from_calls_pushed_out_and_calls_left_queued() {
        let shared = Shared::new(EventQueue::new(4), true, false);
        let cpu = MediumSet::EMPTY.with(Medium::Cpu);
        for _ in 0..10 {
            let long = ObjectEvents::new(
                b"t",
                &[b'k'; 200],
                b"",
                MediumSet::EMPTY,
                cpu,
                &shared.strings,
            );
            shared.push(Record::Object(long.unwrap()));
        }
        assert_eq!(shared.strings.free(), shared.strings.blocks() - 4);
        shared.stopped.store(true, SeqCst);
        assert_eq!(shared.drop_queued(), 4);
        assert_eq!(shared.strings.free(), shared.strings.blocks());
    }
}
