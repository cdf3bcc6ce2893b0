//! What the publisher has done so far, for `stats()`, `status_json()` and metrics.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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
    /// Subscriber handshakes refused or failed since creation (CURVE or an allow-list on):
    /// a key or address not admitted, no CURVE or the wrong server key, a connection that
    /// ended mid-handshake. One per handshake; a refused subscriber that retries adds one
    /// per attempt.
    pub refused_handshakes: u64,
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
    /// Its own allocation, shared with the thread `kv-events-zap` that counts it, so the
    /// callers' counters stay where they were.
    pub(crate) refused_handshakes: Arc<AtomicU64>,
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
            refused_handshakes: self.refused_handshakes.load(Relaxed),
        }
    }
}

impl Stats {
    /// The same values as one JSON object, for the master's `GET /kv_events/status`.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// One metric of [`Stats::to_prometheus`]: name (after the `mooncake_kv_events_` prefix),
/// type, help, and the field it reads.
type Metric = (&'static str, &'static str, &'static str, fn(&Stats) -> u64);

const METRICS: [Metric; 11] = [
    (
        "enabled",
        "gauge",
        "1 when events are published, 0 when disabled.",
        |s| u64::from(s.enabled),
    ),
    (
        "published_batches_total",
        "counter",
        "Messages handed to the PUB socket.",
        |s| s.published_batches,
    ),
    (
        "published_events_total",
        "counter",
        "Events in published messages.",
        |s| s.published_events,
    ),
    (
        "dropped_events_total",
        "counter",
        "Events lost before encoding (full queue, shutdown, oversized); each is a sequence gap.",
        |s| s.dropped_events,
    ),
    (
        "skipped_keyless_events_total",
        "counter",
        "stored/removed not emitted: empty key or emit_object_key=false.",
        |s| s.skipped_keyless_events,
    ),
    (
        "cleared_suppressed_total",
        "counter",
        "RemoveAll results that emitted no cleared.",
        |s| s.cleared_suppressed,
    ),
    (
        "send_failures_total",
        "counter",
        "Messages the socket refused.",
        |s| s.send_failures,
    ),
    (
        "queue_depth",
        "gauge",
        "Calls whose events wait in the queue.",
        |s| s.queue_depth,
    ),
    (
        "queue_capacity",
        "gauge",
        "Calls the queue holds before dropping the oldest.",
        |s| s.queue_capacity,
    ),
    (
        "last_sequence",
        "gauge",
        "Transport sequence of the last message sent.",
        |s| s.last_sequence,
    ),
    (
        "refused_handshakes_total",
        "counter",
        "Subscriber handshakes refused or failed (CURVE, allow-lists).",
        |s| s.refused_handshakes,
    ),
];

impl Stats {
    /// The same values in the Prometheus text exposition format (version 0.0.4), every name
    /// prefixed `mooncake_kv_events_`, for the master to append to its `/metrics`.
    pub fn to_prometheus(&self) -> String {
        METRICS
            .iter()
            .map(|(name, kind, help, value)| {
                let name = format!("mooncake_kv_events_{name}");
                format!(
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}\n",
                    value(self)
                )
            })
            .collect()
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
        assert_eq!(json.as_object().unwrap().len(), 11);
    }

    #[test]
    fn prometheus_text_has_one_typed_documented_sample_per_metric() {
        let stats = Stats {
            enabled: true,
            dropped_events: 7,
            queue_depth: 2,
            ..Stats::default()
        };
        let text = stats.to_prometheus();
        assert!(text.contains("# TYPE mooncake_kv_events_dropped_events_total counter\n"));
        assert!(text.contains("\nmooncake_kv_events_dropped_events_total 7\n"));
        assert!(text.contains("\nmooncake_kv_events_queue_depth 2\n"));
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, 11);
        assert_eq!(text.lines().filter(|l| l.starts_with("# HELP")).count(), 11);
    }
}
