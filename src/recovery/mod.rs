//! The way back to the truth for a subscriber that lost messages, joined late, or outlived a
//! restart: the replay socket (`replay`: `info`, replays of recent messages from a bounded
//! ring, snapshot requests) and snapshots of every object the master holds (`snapshot`, fed by
//! the master's [`ObjectSource`]). docs/spec.md section 11 is the protocol.

mod fanout;
pub(crate) mod replay;
mod requester;
pub(crate) mod snapshot;

pub use snapshot::{Abandoned, ObjectSource, Snapshot, SourceError};
