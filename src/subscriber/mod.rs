//! The subscriber's side, for indexers, routers and the `kv-events` tool: reading the stream
//! and getting back to the truth when the stream alone cannot.
//!
//! - `watch`: [`Subscriber`], a SUB socket that reads the stream as an indexer would (CURVE
//!   when the publisher has it, a clear error when it refuses, loss shown as [`Continuity`]);
//! - `catchup`: [`ReplayClient`] for the publisher's replay socket, and [`Catchup`], which
//!   fills gaps and notices a loss at the end of a burst;
//! - `index`: [`Index`], what a subscriber holds of a master's state, built from events;
//! - `follow`: [`Follower`], an index that heals itself through snapshots, replays and
//!   incarnation changes;
//! - `stop`: [`catch_stop_signals`], Ctrl-C and SIGTERM as a flag a program's loop checks.
//!
//! Messages are decoded by [`crate::wire`].

mod catchup;
mod follow;
mod index;
mod stop;
mod watch;

pub use crate::wire::{Change, Field, Info};
pub use catchup::{Catchup, ReplayClient};
pub use follow::{
    AppliedMessage, Changes, Counters, FollowOptions, Follower, Happened, Keys, Notice, Status,
    Upstream,
};
pub use index::{json_bytes, Applied, Index, Objects, RejectedEvent, DEFAULT_TENANT};
pub use stop::{catch_stop_signals, stop_requested};
pub use watch::{
    connect_form, Batch, Continuity, CurveClient, Reach, Subscriber, SubscriberOptions, WatchError,
    DEFAULT_MAX_MESSAGE_BYTES,
};
