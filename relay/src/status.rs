//! The relay's status line on stderr.

use crate::relay::{Relay, Role};
use crate::source::Source;
use crate::store::Store;
use std::time::Duration;

/// The status line: where the relay follows, where the log stands, and the counters.
pub(crate) fn line<S: Source, T: Store>(
    relay: &Relay<S, T>,
    names: &[String],
    elapsed: Duration,
) -> String {
    let source = match relay.following() {
        Some(i) => {
            let status = relay.source.status(i);
            match (status.in_sync, status.next_sequence, status.incarnation) {
                (true, Some(next), Some(incarnation)) => format!(
                    "{}: in sync before {next}, incarnation {incarnation:016x}",
                    names[i]
                ),
                // While it recovers (a restart: a new incarnation), the sequence it had
                // is not where it stands.
                (_, _, Some(incarnation)) => {
                    format!("{}: recovering, incarnation {incarnation:016x}", names[i])
                }
                _ => format!("{}: recovering", names[i]),
            }
        }
        None => "no publisher in sync yet".to_owned(),
    };
    let log = match relay.log.position {
        Some(p) => format!(
            "log before {}{} (stream sequence {})",
            p.next,
            if p.complete { "" } else { " (partial)" },
            relay.log.last
        ),
        None => "log empty".to_owned(),
    };
    let behind = relay.following().map_or(0, |i| {
        let status = relay.source.status(i);
        match (status.next_sequence, relay.log.position) {
            (Some(next), Some(p)) if status.incarnation == Some(p.incarnation) => {
                next.saturating_sub(p.next)
            }
            _ => 0,
        }
    });
    let c = &relay.counters;
    let role = match relay.role {
        Role::Writer if relay.wrote => "writer",
        Role::Writer => "ready to write (nothing to write yet)",
        Role::Standby { .. } => "standby (another relay writes)",
    };
    let bucket = match (relay.bucket_written(), relay.bucket_pending()) {
        (Some(written), Some(pending)) => {
            format!(", bucket entries written {written}, bucket entries to write {pending}")
        }
        _ => String::new(),
    };
    format!(
        "kv-events-relay: {:.1}s: {source}; {log}; {role}\n  events in {}, events written {} \
         in {} messages ({} of the master's), diffs after resyncs {} ({} events), \
         snapshots {} (last {} objects, {} bytes, {} ms{}), lag {behind} messages / {} ms, \
         held {}, objects {}, races lost {}, takeovers {}, NATS failures {}, \
         snapshot failures {}{bucket}\n",
        elapsed.as_secs_f64(),
        relay.source.events_in(),
        c.events_written,
        c.messages_written,
        c.master_messages,
        c.diffs,
        c.diff_events,
        c.snapshots,
        c.snapshot_objects,
        c.snapshot_bytes,
        c.snapshot_ms,
        if relay.snapshot_writing() {
            ", writing"
        } else {
            ""
        },
        relay.lag_ms(),
        relay.pending_messages(),
        relay.objects(),
        c.races_lost,
        c.takeovers,
        c.nats_failures,
        c.snapshot_failures,
    )
}
