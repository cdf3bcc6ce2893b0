//! What the publisher has done so far, for `stats()`, `status_json()` and metrics.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the publisher's counters. Every count starts at 0 when the publisher is
/// created; a disabled publisher reports `enabled: false` and zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Whether events are published at all.
    pub enabled: bool,
    /// Messages handed to the PUB socket.
    pub published_batches: u64,
    /// Events in those messages.
    pub published_events: u64,
    /// Events lost before encoding: pushed out of a full queue, made during or after
    /// shutdown, or too large to encode. Each reserved one sequence number, so subscribers
    /// see them as gaps.
    pub dropped_events: u64,
    /// `stored`/`removed` not emitted because the key was empty or `emit_object_key` is off.
    pub skipped_keyless_events: u64,
    /// RemoveAll results that emitted no `cleared`: nothing removed, something skipped, or a
    /// medium added to the tenant since the scan began.
    pub cleared_suppressed: u64,
    /// Messages the socket refused; each still consumed its sequence number.
    pub send_failures: u64,
    /// Calls whose events wait in the queue now.
    pub queue_depth: u64,
    /// How many calls' events the queue holds before dropping the oldest.
    pub queue_capacity: u64,
    /// The transport sequence of the last message sent, 0 before the first.
    pub last_sequence: u64,
}

/// The counters behind [`Stats`], shared by the callers and the publishing thread.
/// Each is a monotonic count read without ordering: a snapshot is a set of recent values,
/// not one instant.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) published_batches: AtomicU64,
    pub(crate) published_events: AtomicU64,
    pub(crate) dropped_events: AtomicU64,
    pub(crate) skipped_keyless_events: AtomicU64,
    pub(crate) cleared_suppressed: AtomicU64,
    pub(crate) send_failures: AtomicU64,
    pub(crate) last_sequence: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn snapshot(&self, queue_depth: usize, queue_capacity: usize) -> Stats {
        Stats {
            enabled: true,
            published_batches: self.published_batches.load(Relaxed),
            published_events: self.published_events.load(Relaxed),
            dropped_events: self.dropped_events.load(Relaxed),
            skipped_keyless_events: self.skipped_keyless_events.load(Relaxed),
            cleared_suppressed: self.cleared_suppressed.load(Relaxed),
            send_failures: self.send_failures.load(Relaxed),
            queue_depth: queue_depth as u64,
            queue_capacity: queue_capacity as u64,
            last_sequence: self.last_sequence.load(Relaxed),
        }
    }
}

impl Stats {
    /// The same values as one JSON object, for the master's `GET /kv_events/status`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_carries_every_field_by_name() {
        let stats = Stats {
            enabled: true,
            dropped_events: 3,
            queue_capacity: 64,
            ..Stats::default()
        };
        let json: serde_json::Value = serde_json::from_str(&stats.to_json()).unwrap();
        assert_eq!(json["enabled"], true);
        assert_eq!(json["dropped_events"], 3);
        assert_eq!(json["queue_capacity"], 64);
        assert_eq!(json.as_object().unwrap().len(), 10);
    }
}
