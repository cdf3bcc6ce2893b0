//! The relay's counters and its status line on stderr.

use crate::relay::{Relay, Role};
use std::time::Duration;

/// What the relay counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// The master's events written to the log as they came.
    pub(crate) events_written: u64,
    /// Log messages of those events.
    pub(crate) messages_written: u64,
    /// Differences written after a resync (a new incarnation, a gap a snapshot filled, a
    /// restart of the relay).
    pub(crate) diffs: u64,
    /// Events in those differences.
    pub(crate) diff_events: u64,
    /// Bucket entries written (puts and deletes).
    pub(crate) entries: u64,
    /// Writes another relay won (this one then stood by).
    pub(crate) races_lost: u64,
    /// Times this relay took over as the writer after the other fell silent.
    pub(crate) takeovers: u64,
    /// NATS requests that failed (retried).
    pub(crate) nats_failures: u64,
    /// From the master's timestamp of the last message written to its write, milliseconds.
    pub(crate) lag_ms: u64,
}

impl Counters {
    /// `events` of the master written in one log message, `lag_ms` after the master sent
    /// the last of them.
    pub(crate) fn written(&mut self, events: u64, lag_ms: u64) {
        self.events_written += events;
        self.messages_written += 1;
        self.lag_ms = lag_ms;
    }
}

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
