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
    /// The last transport sequence taken: by the last message sent, or by the events
    /// dropped since it (the gap the next message shows); 0 before any.
    pub last_sequence: u64,
    /// Subscriber handshakes refused since creation: a key or address not on an allow-list,
    /// no CURVE or CURVE against a plain publisher, a CURVE handshake that does not decrypt
    /// (the wrong server key). One per handshake; a refused subscriber that retries adds one
    /// per attempt. The log line of each says why. A connection that closes before its
    /// handshake (a TCP health check, a port scan) is not a refused handshake.
    pub refused_handshakes: u64,
    /// The random 64-bit id of this publisher's life: a restart, or another master taking
    /// over, shows a new one. 0 when disabled.
    pub incarnation: u64,
    /// Connections the publisher's sockets hold now, handshaking or subscribed.
    pub connections: u64,
    /// Connections closed as soon as they were accepted: over `kv_events_max_connections` or
    /// `kv_events_max_connections_per_address`, or accepted while the process had no
    /// descriptor to spare.
    pub connections_refused: u64,
    /// Connections closed because their handshake did not finish within
    /// `kv_events_handshake_timeout_ms`.
    pub handshake_timeouts: u64,
    /// Subscriptions to anything but the stream's one topic (the empty one), which can never
    /// match: the peer that sent one is disconnected.
    pub subscriptions_refused: u64,
    /// Requests the replay socket answered (`info`, replays).
    pub replay_requests: u64,
    /// Messages the replay socket sent again.
    pub replayed_messages: u64,
    /// Replay requests the socket could not read (unknown verb, wrong frames), each answered
    /// with an error.
    pub bad_requests: u64,
    /// Replays given up because the requester stopped reading.
    pub replays_abandoned: u64,
    /// Bytes of payloads the replay buffer holds now.
    pub replay_buffer_bytes: u64,
    /// The oldest sequence a replay can send now; 0 when the buffer is empty.
    pub replay_oldest_sequence: u64,
    /// Snapshots sent whole, each ended by its `snapshot-end`.
    pub snapshots_served: u64,
    /// Snapshots given up: the requester stopped reading, or the publisher stopped.
    pub snapshots_abandoned: u64,
    /// Objects the snapshots sent whole held.
    pub snapshot_objects: u64,
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
    /// What the threads that watch connections and serve replays count; their own
    /// allocation, so the callers' counters stay where they were.
    pub(crate) peers: Arc<PeerCounters>,
}

/// The counters of connections, handshakes and replays, kept by the threads `kv-events-zap`
/// and `kv-events-replay` and the publishing thread.
#[derive(Debug, Default)]
pub(crate) struct PeerCounters {
    pub(crate) refused_handshakes: AtomicU64,
    pub(crate) connections: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) handshake_timeouts: AtomicU64,
    pub(crate) subscriptions_refused: AtomicU64,
    pub(crate) replay_requests: AtomicU64,
    pub(crate) replayed_messages: AtomicU64,
    pub(crate) bad_requests: AtomicU64,
    pub(crate) replays_abandoned: AtomicU64,
    pub(crate) replay_buffer_bytes: AtomicU64,
    pub(crate) replay_oldest_sequence: AtomicU64,
    pub(crate) snapshots_served: AtomicU64,
    pub(crate) snapshots_abandoned: AtomicU64,
    pub(crate) snapshot_objects: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Relaxed);
    }

    pub(crate) fn snapshot(
        &self,
        queue_depth: usize,
        queue_capacity: usize,
        incarnation: u64,
    ) -> Stats {
        let peers = &*self.peers;
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
            refused_handshakes: peers.refused_handshakes.load(Relaxed),
            incarnation,
            connections: peers.connections.load(Relaxed),
            connections_refused: peers.connections_refused.load(Relaxed),
            handshake_timeouts: peers.handshake_timeouts.load(Relaxed),
            subscriptions_refused: peers.subscriptions_refused.load(Relaxed),
            replay_requests: peers.replay_requests.load(Relaxed),
            replayed_messages: peers.replayed_messages.load(Relaxed),
            bad_requests: peers.bad_requests.load(Relaxed),
            replays_abandoned: peers.replays_abandoned.load(Relaxed),
            replay_buffer_bytes: peers.replay_buffer_bytes.load(Relaxed),
            replay_oldest_sequence: peers.replay_oldest_sequence.load(Relaxed),
            snapshots_served: peers.snapshots_served.load(Relaxed),
            snapshots_abandoned: peers.snapshots_abandoned.load(Relaxed),
            snapshot_objects: peers.snapshot_objects.load(Relaxed),
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

const METRICS: [Metric; 24] = [
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
        "Last transport sequence taken: by a message, or by events dropped since.",
        |s| s.last_sequence,
    ),
    (
        "refused_handshakes_total",
        "counter",
        "Subscriber handshakes refused: not on an allow-list, wrong mechanism, wrong CURVE key.",
        |s| s.refused_handshakes,
    ),
    (
        "connections",
        "gauge",
        "Connections the publisher's sockets hold now.",
        |s| s.connections,
    ),
    (
        "connections_refused_total",
        "counter",
        "Connections closed at once: over a connection bound, or no descriptor to spare.",
        |s| s.connections_refused,
    ),
    (
        "handshake_timeouts_total",
        "counter",
        "Connections closed because their handshake did not finish in time.",
        |s| s.handshake_timeouts,
    ),
    (
        "subscriptions_refused_total",
        "counter",
        "Subscriptions to a topic that can never match; the peer is disconnected.",
        |s| s.subscriptions_refused,
    ),
    (
        "replay_requests_total",
        "counter",
        "Requests the replay socket answered.",
        |s| s.replay_requests,
    ),
    (
        "replayed_messages_total",
        "counter",
        "Messages sent again by the replay socket.",
        |s| s.replayed_messages,
    ),
    (
        "bad_requests_total",
        "counter",
        "Replay socket requests that could not be read, each answered with an error.",
        |s| s.bad_requests,
    ),
    (
        "replays_abandoned_total",
        "counter",
        "Replays given up because the requester stopped reading.",
        |s| s.replays_abandoned,
    ),
    (
        "replay_buffer_bytes",
        "gauge",
        "Bytes of payloads the replay buffer holds.",
        |s| s.replay_buffer_bytes,
    ),
    (
        "replay_oldest_sequence",
        "gauge",
        "Oldest sequence a replay can send; 0 when the buffer is empty.",
        |s| s.replay_oldest_sequence,
    ),
    (
        "snapshots_served_total",
        "counter",
        "Snapshots sent whole on the replay socket.",
        |s| s.snapshots_served,
    ),
    (
        "snapshots_abandoned_total",
        "counter",
        "Snapshots given up because the requester stopped reading or the publisher stopped.",
        |s| s.snapshots_abandoned,
    ),
    (
        "snapshot_objects_total",
        "counter",
        "Objects held by the snapshots sent whole.",
        |s| s.snapshot_objects,
    ),
];

impl Stats {
    /// The same values in the Prometheus text exposition format (version 0.0.4), every name
    /// prefixed `mooncake_kv_events_`, for the master to append to its `/metrics`.
    pub fn to_prometheus(&self) -> String {
        let mut text: String = METRICS
            .iter()
            .map(|(name, kind, help, value)| {
                let name = format!("mooncake_kv_events_{name}");
                format!(
                    "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}\n",
                    value(self)
                )
            })
            .collect();
        // A label, not a value: a sample is a float64, which would round a 64-bit id.
        let name = "mooncake_kv_events_incarnation_info";
        text.push_str(&format!(
            "# HELP {name} The random id of this publisher's life, which changes at every \
             restart or takeover, as the label incarnation.\n# TYPE {name} gauge\n\
             {name}{{incarnation=\"{}\"}} 1\n",
            self.incarnation
        ));
        text
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
        assert_eq!(json.as_object().unwrap().len(), 25);
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
        assert_eq!(samples, METRICS.len() + 1);
        assert_eq!(
            text.lines().filter(|l| l.starts_with("# HELP")).count(),
            METRICS.len() + 1
        );
    }
}
