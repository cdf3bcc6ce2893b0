//! What the relay counts, for its status line and its exit.

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
