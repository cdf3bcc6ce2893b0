//! The relay's status line on stderr.

use crate::relay::{Relay, Role};
use std::time::Duration;

/// The status line: where the relay follows, where the log stands, and the counters.
pub(crate) fn line(relay: &Relay, names: &[String], elapsed: Duration) -> String {
    let follower = &relay.follower;
    let source = match relay.following() {
        Some(i) => {
            let status = follower.status(i);
            let state = if status.in_sync {
                "in sync"
            } else {
                "recovering"
            };
            format!(
                "{}: {state} at {}, incarnation {:016x}",
                names[i],
                status.sequence.unwrap_or_default(),
                status.incarnation.unwrap_or_default()
            )
        }
        None => "no publisher in sync yet".to_owned(),
    };
    let log = match relay.log.position {
        Some(p) => format!(
            "log at {}{} (stream sequence {})",
            p.sequence,
            if p.complete { "" } else { " (partial)" },
            relay.log.last
        ),
        None => "log empty".to_owned(),
    };
    let behind = relay.following().map_or(0, |i| {
        let status = follower.status(i);
        match (status.sequence, relay.log.position) {
            (Some(s), Some(p)) if status.incarnation == Some(p.incarnation) => {
                s.saturating_sub(p.sequence)
            }
            _ => 0,
        }
    });
    let c = &relay.counters;
    let role = match relay.role {
        Role::Writer => "writer",
        Role::Standby { .. } => "standby",
    };
    format!(
        "kv-events-relay: {:.1}s: {source}; {log}; {role}\n  events in {}, events written {} \
         in {} messages, diffs after resyncs {} ({} events), bucket entries written {}, \
         acks pending {}, lag {behind} messages / {} ms, held {}, races lost {}, takeovers \
         {}, NATS failures {}\n",
        elapsed.as_secs_f64(),
        follower.counters().events,
        c.events_written,
        c.messages_written,
        c.diffs,
        c.diff_events,
        c.entries,
        relay.pending(),
        c.lag_ms,
        relay.held_messages(),
        c.races_lost,
        c.takeovers,
        c.nats_failures,
    )
}
