//! What the publisher has done so far, for `stats()`, `status_json()` and metrics.
//!
//! A field of [`Stats`] is written twice in this file, and only here: in the struct, which the
//! `cxx` bridge shares with the C++ layer as it is (`cxx_build` reads it from this file's text,
//! so no macro can write it), and in the list [`stats_fields!`] is given below, one line per
//! field, from which the atomics, the snapshot and the metrics are made. A field missing from
//! the list does not compile (the snapshot names every field); the test
//! `the_list_has_every_field_of_stats_in_order` checks the order. The C side's list is
//! `KV_EVENTS_STATS_FIELDS` in include/mooncake/kv_events_c.h; tests/c_api.rs checks it against
//! this one.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[cxx::bridge(namespace = "mooncake::kv_events::bridge")]
mod bridge {
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
        /// The transport sequence the next message takes: every number below it was taken,
        /// by a message sent or by the events dropped since (the gap the next message shows);
        /// 0 before any, since the first message is 0.
        pub next_sequence: u64,
        /// Subscriber handshakes refused since creation: a key or address not on an allow-list,
        /// no CURVE or CURVE against a plain publisher, a CURVE handshake that does not decrypt
        /// (the wrong server key). One per handshake; a refused subscriber that retries adds one
        /// per attempt. The log line of each says why. A connection that closes before its
        /// handshake (a TCP health check, a port scan) is not a refused handshake.
        pub refused_handshakes: u64,
        /// The random 64-bit id of this publisher's life: a restart, or another master taking
        /// over, shows a new one. 0 when disabled. Serialized as a string of its decimal
        /// digits: JSON readers that hold numbers as doubles would round most ids.
        #[serde(serialize_with = "crate::stats::decimal_string")]
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
        /// The oldest sequence a replay can send now; `next_sequence` when the buffer is
        /// empty, 0 without a replay socket.
        pub replay_oldest_sequence: u64,
        /// Snapshots sent whole, each ended by its `snapshot-end`.
        pub snapshots_served: u64,
        /// Snapshots given up: the requester stopped reading, or the publisher stopped.
        pub snapshots_abandoned: u64,
        /// Objects the snapshots sent whole held.
        pub snapshot_objects: u64,
        /// Subscribers connected now: connections to the PUB socket whose handshake succeeded
        /// and that have not closed since (the replay socket's are not counted).
        pub subscribers: u64,
        /// Connections to the PUB socket whose handshake succeeded, since creation.
        pub subscriber_connects: u64,
        /// Those connections closed since creation, by the subscriber, the network, or the
        /// publisher (a refused subscription, shutdown).
        pub subscriber_disconnects: u64,
        /// Event calls whose media the contract does not allow: a bit other than cpu and disk
        /// (possible through the C API only; such bits are ignored), or a put commit with no
        /// medium at all (it publishes nothing). Each is a bug in the master's wiring.
        pub invalid_media_calls: u64,
        /// Bytes of replayed messages that the replay socket's connections hold now, not yet
        /// written to their requesters: at most 16 MiB, 2 MiB per requester. (A snapshot's
        /// batches are shared by its requesters and bounded where they are kept.)
        pub replay_bytes_in_flight: u64,
        /// Messages with no event sent after `kv_events_heartbeat_ms` without a message
        /// (not counted in `published_batches`).
        pub heartbeats: u64,
        /// Events not published because their tenant, key or group is not UTF-8 and
        /// `kv_events_non_utf8` is `skip`; they took no sequence number.
        pub skipped_non_utf8_events: u64,
    }
}

pub use bridge::Stats;

/// `id` as a JSON string of its decimal digits: above 2^53 a double cannot hold every
/// integer, and a random 64-bit id is almost always above it.
fn decimal_string<S: serde::Serializer>(id: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(id)
}

/// What a field of [`Stats`] is, which decides its metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A yes or no, the gauge `mooncake_kv_events_<name>` at 0 or 1.
    Flag,
    /// A count that only grows, the counter `mooncake_kv_events_<name>_total`.
    Counter,
    /// A level that goes up and down, the gauge `mooncake_kv_events_<name>`.
    Gauge,
    /// An id, too wide for a sample (a float64 would round it): the label `<name>` of the
    /// gauge `mooncake_kv_events_<name>_info`, always 1, written after all the others.
    Info,
}

/// One metric of [`Stats::to_prometheus`]: the field's name, what it is, the help text, and
/// how to read it.
struct Metric {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&Stats) -> u64,
}

/// Makes, from one line per field of [`Stats`] (`name, kind, kept_by, "help";`, in the
/// struct's order):
/// - the atomics: `Counters` holds those kept by `callers`, `PeerCounters` those kept by
///   `peers`; a field kept by `given` is no atomic but a value the caller of `Counters::stats`
///   passes;
/// - `Counters::read`, the `Stats` now, which names every field, so the list cannot miss one;
/// - `METRICS`, the table of `Stats::to_prometheus`.
///
/// `kind` is `flag`, `counter`, `gauge` or `info` ([`Kind`]).
macro_rules! stats_fields {
    ($($name:ident, $kind:ident, $kept_by:ident, $help:literal;)*) => {
        stats_fields!(@atomics [] [] $($name $kept_by)*);

        impl Counters {
            /// The fields kept by `given` from `given`, every other from its atomic.
            fn read(&self, given: &Stats) -> Stats {
                Stats {
                    $($name: stats_fields!(@read self given $kept_by $name),)*
                }
            }
        }

        const METRICS: &[Metric] = &[$(Metric {
            name: stringify!($name),
            kind: stats_fields!(@kind $kind),
            help: $help,
            value: |s| u64::from(s.$name),
        },)*];
    };

    // Sorts the fields by who keeps them, then declares the two sets of atomics.
    (@atomics [$($c:ident)*] [$($p:ident)*] $name:ident callers $($rest:tt)*) => {
        stats_fields!(@atomics [$($c)* $name] [$($p)*] $($rest)*);
    };
    (@atomics [$($c:ident)*] [$($p:ident)*] $name:ident peers $($rest:tt)*) => {
        stats_fields!(@atomics [$($c)*] [$($p)* $name] $($rest)*);
    };
    (@atomics [$($c:ident)*] [$($p:ident)*] $name:ident given $($rest:tt)*) => {
        stats_fields!(@atomics [$($c)*] [$($p)*] $($rest)*);
    };
    (@atomics [$($c:ident)*] [$($p:ident)*]) => {
        /// The counters behind [`Stats`], shared by the callers and the publishing thread.
        /// Each is a monotonic count read without ordering: a snapshot is a set of recent
        /// values, not one instant.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $c: AtomicU64,)*
            /// What the threads that watch connections and serve replays count; their own
            /// allocation, so the callers' counters stay where they were.
            pub(crate) peers: Arc<PeerCounters>,
        }

        /// The counters of connections, handshakes and replays, kept by the threads
        /// `kv-events-zap` and `kv-events-replay` and the publishing thread.
        #[derive(Debug, Default)]
        pub(crate) struct PeerCounters {
            $(pub(crate) $p: AtomicU64,)*
        }
    };

    (@read $self:ident $given:ident callers $name:ident) => { $self.$name.load(Relaxed) };
    (@read $self:ident $given:ident peers $name:ident) => { $self.peers.$name.load(Relaxed) };
    (@read $self:ident $given:ident given $name:ident) => { $given.$name };

    (@kind flag) => { Kind::Flag };
    (@kind counter) => { Kind::Counter };
    (@kind gauge) => { Kind::Gauge };
    (@kind info) => { Kind::Info };
}

stats_fields! {
    enabled, flag, given, "1 when events are published, 0 when disabled.";
    published_batches, counter, callers, "Messages handed to the PUB socket.";
    published_events, counter, callers, "Events in published messages.";
    dropped_events, counter, callers,
        "Events lost before encoding (full queue, shutdown, oversized); each is a sequence gap.";
    skipped_keyless_events, counter, callers,
        "stored/removed not emitted: empty key or emit_object_key=false.";
    cleared_suppressed, counter, callers, "RemoveAll results that emitted no cleared.";
    send_failures, counter, callers, "Messages the socket refused.";
    queue_depth, gauge, given, "Calls whose events wait in the queue.";
    queue_capacity, gauge, given, "Calls the queue holds before dropping the oldest.";
    next_sequence, gauge, callers,
        "Transport sequence of the next message; every number below it was taken.";
    refused_handshakes, counter, peers,
        "Subscriber handshakes refused: not on an allow-list, wrong mechanism, wrong CURVE key.";
    incarnation, info, given,
        "The random id of this publisher's life, which changes at every restart or takeover, \
         as the label incarnation.";
    connections, gauge, peers, "Connections the publisher's sockets hold now.";
    connections_refused, counter, peers,
        "Connections closed at once: over a connection bound, or no descriptor to spare.";
    handshake_timeouts, counter, peers,
        "Connections closed because their handshake did not finish in time.";
    subscriptions_refused, counter, peers,
        "Subscriptions to a topic that can never match; the peer is disconnected.";
    replay_requests, counter, peers, "Requests the replay socket answered.";
    replayed_messages, counter, peers, "Messages sent again by the replay socket.";
    bad_requests, counter, peers,
        "Replay socket requests that could not be read, each answered with an error.";
    replays_abandoned, counter, peers, "Replays given up because the requester stopped reading.";
    replay_buffer_bytes, gauge, peers, "Bytes of payloads the replay buffer holds.";
    replay_oldest_sequence, gauge, peers,
        "Oldest sequence a replay can send; the next sequence when the buffer is empty.";
    snapshots_served, counter, peers, "Snapshots sent whole on the replay socket.";
    snapshots_abandoned, counter, peers,
        "Snapshots given up because the requester stopped reading or the publisher stopped.";
    snapshot_objects, counter, peers, "Objects held by the snapshots sent whole.";
    subscribers, gauge, peers,
        "Subscribers connected now: PUB connections whose handshake succeeded.";
    subscriber_connects, counter, peers, "PUB connections whose handshake succeeded.";
    subscriber_disconnects, counter, peers, "PUB connections closed after their handshake.";
    invalid_media_calls, counter, callers,
        "Event calls with a media bit other than cpu and disk, or a put commit with no medium.";
    replay_bytes_in_flight, gauge, peers,
        "Bytes of replayed messages not yet written to their requesters.";
    heartbeats, counter, callers, "Messages with no event sent after a silence.";
    skipped_non_utf8_events, counter, callers,
        "Events not published: a tenant, key or group not UTF-8 with kv_events_non_utf8=skip.";
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Relaxed);
    }

    /// The counters now, with what the queue and the publisher's life say.
    pub(crate) fn stats(
        &self,
        queue_depth: usize,
        queue_capacity: usize,
        incarnation: u64,
    ) -> Stats {
        self.read(&Stats {
            enabled: true,
            queue_depth: queue_depth as u64,
            queue_capacity: queue_capacity as u64,
            incarnation,
            ..Stats::default()
        })
    }
}

/// The status object: which build this is, then the stats.
#[derive(Serialize)]
struct Status<'a> {
    built_with_kv_events: bool,
    #[serde(flatten)]
    stats: &'a Stats,
}

impl Stats {
    /// Every field by name with its value, in the order of the struct, of [`Stats::to_json`]
    /// and of the metrics, from the list both are made from: a new field is here too. Each
    /// value is the number the metrics give (`enabled` is 0 or 1; the incarnation is whole).
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        METRICS.iter().map(move |m| (m.name, (m.value)(self)))
    }

    /// The same values as one JSON object, for the master's `GET /kv_events/status`, after
    /// `"built_with_kv_events":true` (the stub of a master built without events, which has
    /// no Rust behind it, writes false).
    pub fn to_json(&self) -> String {
        let status = Status {
            built_with_kv_events: true,
            stats: self,
        };
        serde_json::to_string(&status).unwrap_or_default()
    }

    /// The same values in the Prometheus text exposition format (version 0.0.4), every name
    /// prefixed `mooncake_kv_events_`, for the master to append to its `/metrics`.
    pub fn to_prometheus(&self) -> String {
        let (samples, ids): (Vec<&Metric>, Vec<&Metric>) =
            METRICS.iter().partition(|m| m.kind != Kind::Info);
        let mut text = String::new();
        for m in samples.into_iter().chain(ids) {
            let value = (m.value)(self);
            let (name, kind, sample) = match m.kind {
                Kind::Flag | Kind::Gauge => (m.name.to_owned(), "gauge", format!(" {value}")),
                Kind::Counter => (format!("{}_total", m.name), "counter", format!(" {value}")),
                Kind::Info => (
                    format!("{}_info", m.name),
                    "gauge",
                    format!("{{{}=\"{value}\"}} 1", m.name),
                ),
            };
            let name = format!("mooncake_kv_events_{name}");
            text.push_str(&format!(
                "# HELP {name} {}\n# TYPE {name} {kind}\n{name}{sample}\n",
                m.help
            ));
        }
        text
    }
}

/// What this build of the library runs with: the metric `mooncake_kv_events_build_info`, and
/// what `kv-events --version` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The library's version (its package's, which the C header's
    /// `MOONCAKE_KV_EVENTS_VERSION_*` macros repeat).
    pub version: &'static str,
    /// The version of the libzmq the process runs with, `major.minor.patch`; empty in a build
    /// without events, which has none.
    pub libzmq: String,
    /// Whether that libzmq has CURVE (libsodium or its own TweetNaCl); without it, a
    /// publisher with a CURVE key cannot start.
    pub curve: bool,
}

impl BuildInfo {
    /// The help line of the metric, which the stub (`cpp/kv_events_stub.cc`) writes too.
    const HELP: &'static str = "The library's version, its libzmq's (empty in a build without \
                                events) and whether that has CURVE, as labels.";

    /// This process's: the library's version, and the libzmq it loaded.
    pub fn current() -> BuildInfo {
        let (major, minor, patch) = zmq::version();
        BuildInfo {
            version: env!("CARGO_PKG_VERSION"),
            libzmq: format!("{major}.{minor}.{patch}"),
            curve: zmq::has("curve").unwrap_or(false),
        }
    }

    /// The gauge `mooncake_kv_events_build_info`, always 1, its values as labels, in the
    /// Prometheus text format: written after the stats' metrics.
    pub fn to_prometheus(&self) -> String {
        let name = "mooncake_kv_events_build_info";
        format!(
            "# HELP {name} {}\n# TYPE {name} gauge\n{name}{{version=\"{}\",libzmq=\"{}\",\
             curve=\"{}\"}} 1\n",
            Self::HELP,
            self.version,
            self.libzmq,
            self.curve
        )
    }
}

impl std::fmt::Display for BuildInfo {
    /// `0.1.0 (libzmq 4.3.4, CURVE available)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let curve = if self.curve {
            "available"
        } else {
            "not available"
        };
        write!(
            f,
            "{} (libzmq {}, CURVE {curve})",
            self.version, self.libzmq
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_has_every_field_of_stats_in_order() {
        let debug = format!("{:#?}", Stats::default());
        let fields: Vec<&str> = debug
            .lines()
            .filter_map(|line| Some(line.trim().split_once(": ")?.0))
            .collect();
        let listed: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        assert_eq!(listed, fields);
    }

    #[test]
    fn fields_are_the_lists_names_and_values_in_order() {
        let stats = Stats {
            enabled: true,
            published_events: 5,
            incarnation: u64::MAX,
            ..Stats::default()
        };
        let fields: Vec<(&str, u64)> = stats.fields().collect();
        let names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        assert_eq!(fields.iter().map(|(n, _)| *n).collect::<Vec<_>>(), names);
        assert_eq!(fields[0], ("enabled", 1));
        assert!(fields.contains(&("published_events", 5)));
        assert!(fields.contains(&("incarnation", u64::MAX)));
    }

    #[test]
    fn json_carries_the_build_then_every_field_by_name() {
        let stats = Stats {
            enabled: true,
            dropped_events: 3,
            queue_capacity: 64,
            ..Stats::default()
        };
        let text = stats.to_json();
        assert!(
            text.starts_with(r#"{"built_with_kv_events":true,"enabled":true,"#),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["dropped_events"], 3);
        assert_eq!(json["queue_capacity"], 64);
        assert_eq!(json.as_object().unwrap().len(), 1 + METRICS.len());
    }

    #[test]
    fn json_writes_the_incarnation_as_a_string_of_its_digits() {
        // 2^64 - 1 and 2^63 + 1: a double holds neither.
        for id in [u64::MAX, (1 << 63) + 1] {
            let text = Stats {
                incarnation: id,
                ..Stats::default()
            }
            .to_json();
            assert!(
                text.contains(&format!(",\"incarnation\":\"{id}\",")),
                "{text}"
            );
        }
        assert!(Stats::default()
            .to_json()
            .contains(",\"incarnation\":\"0\","));
    }

    #[test]
    fn prometheus_text_has_one_typed_documented_sample_per_metric() {
        let stats = Stats {
            enabled: true,
            dropped_events: 7,
            queue_depth: 2,
            incarnation: u64::MAX,
            ..Stats::default()
        };
        let text = stats.to_prometheus();
        assert!(text.contains("# TYPE mooncake_kv_events_dropped_events_total counter\n"));
        assert!(text.contains("\nmooncake_kv_events_dropped_events_total 7\n"));
        assert!(text.contains("\nmooncake_kv_events_queue_depth 2\n"));
        assert!(text.contains("\nmooncake_kv_events_enabled 1\n"));
        assert!(text.ends_with(
            "\nmooncake_kv_events_incarnation_info{incarnation=\"18446744073709551615\"} 1\n"
        ));
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, METRICS.len());
        assert_eq!(
            text.lines().filter(|l| l.starts_with("# HELP")).count(),
            METRICS.len()
        );
    }

    #[test]
    fn build_info_is_one_sample_with_the_versions_as_labels() {
        let info = BuildInfo {
            version: "1.2.3",
            libzmq: "4.3.4".into(),
            curve: true,
        };
        let text = info.to_prometheus();
        assert!(
            text.starts_with("# HELP mooncake_kv_events_build_info "),
            "{text}"
        );
        assert!(text.ends_with(
            "\n# TYPE mooncake_kv_events_build_info gauge\nmooncake_kv_events_build_info\
             {version=\"1.2.3\",libzmq=\"4.3.4\",curve=\"true\"} 1\n"
        ));
        assert_eq!(info.to_string(), "1.2.3 (libzmq 4.3.4, CURVE available)");
        let current = BuildInfo::current();
        assert_eq!(current.version, env!("CARGO_PKG_VERSION"));
        assert!(current.libzmq.starts_with("4."), "{current:?}");
    }
}
