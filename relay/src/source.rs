//! The seam between the relay's decisions and the master: what the relay asks of the
//! library's [`Follower`] (the truth, and the messages it applied), so that the tests of
//! those decisions drive a follower of their own making.

use mooncake_kv_events::subscriber::{AppliedMessage, Changes, Follower, Index, Notice, Status};
use std::time::Duration;

/// What the relay reads the master through.
pub(crate) trait Source {
    /// Reads for up to `wait`; returns early when something happened or was applied.
    fn poll(&mut self, wait: Duration) -> Vec<Notice>;
    /// The messages applied since the last call, each publisher's in order.
    fn take_applied(&mut self) -> Vec<AppliedMessage>;
    /// The objects of publisher `i`'s index that may have changed since the last call.
    fn take_changes(&mut self, i: usize) -> Changes;
    /// Publisher `i`'s index: its master's state before its next sequence.
    fn index(&self, i: usize) -> &Index;
    /// Where publisher `i`'s index stands.
    fn status(&self, i: usize) -> Status;
    /// The publisher in sync heard from last.
    fn freshest(&self) -> Option<usize>;
    /// How many publishers.
    fn upstreams(&self) -> usize;
    /// Events applied so far, all publishers together.
    fn events_in(&self) -> u64;
}

impl Source for Follower {
    fn poll(&mut self, wait: Duration) -> Vec<Notice> {
        Follower::poll(self, wait)
    }

    fn take_applied(&mut self) -> Vec<AppliedMessage> {
        Follower::take_applied(self)
    }

    fn take_changes(&mut self, i: usize) -> Changes {
        Follower::take_changes(self, i)
    }

    fn index(&self, i: usize) -> &Index {
        Follower::index(self, i)
    }

    fn status(&self, i: usize) -> Status {
        Follower::status(self, i)
    }

    fn freshest(&self) -> Option<usize> {
        Follower::freshest(self)
    }

    fn upstreams(&self) -> usize {
        Follower::upstreams(self)
    }

    fn events_in(&self) -> u64 {
        self.counters().events
    }
}
