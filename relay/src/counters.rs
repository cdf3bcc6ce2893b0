//! What the relay counts, for its status line and its exit.

/// What the relay counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RelayCounters {
    /// The master's events written to the log as they came.
    pub(crate) events_written: u64,
    /// The master's messages those were.
    pub(crate) master_messages: u64,
    /// Log messages of those events.
    pub(crate) messages_written: u64,
    /// Differences written after a discontinuity (a new incarnation, a gap a snapshot
    /// filled, a restart of the relay, messages dropped while NATS was away).
    pub(crate) diffs: u64,
    /// Events in those differences.
    pub(crate) diff_events: u64,
    /// Times the applied messages held for the log passed their bound and were dropped.
    pub(crate) dropped: u64,
    /// Snapshots written.
    pub(crate) snapshots: u64,
    /// Snapshots that failed (written again later).
    pub(crate) snapshot_failures: u64,
    /// The last snapshot: its objects (when started), events and bytes (when written).
    pub(crate) snapshot_objects: u64,
    pub(crate) snapshot_events: u64,
    pub(crate) snapshot_bytes: u64,
    /// How long the last snapshot took to write, milliseconds.
    pub(crate) snapshot_ms: u64,
    /// Writes another relay won (this one then stood by).
    pub(crate) races_lost: u64,
    /// Times this relay took over as the writer after the other fell silent.
    pub(crate) takeovers: u64,
    /// NATS requests that failed (retried).
    pub(crate) nats_failures: u64,
    /// From the master's timestamp of the last message written to its write, milliseconds.
    pub(crate) lag_ms: u64,
}

impl RelayCounters {
    /// `events` of `messages` master messages written in one log message, `lag_ms` after the
    /// master sent the last of them.
    pub(crate) fn written(&mut self, events: u64, messages: u64, lag_ms: u64) {
        self.events_written += events;
        self.master_messages += messages;
        self.messages_written += 1;
        self.lag_ms = lag_ms;
    }
}
