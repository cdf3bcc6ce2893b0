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
//!
//! A router's view of one master: a [`Follower`] of its upstream (the PUB endpoint and the
//! replay endpoint), polled in the router's loop, asked where an object is.
//!
//! ```no_run
//! use mooncake_kv_events::subscriber::{FollowOptions, Follower, Upstream};
//! use mooncake_kv_events::Medium;
//! use std::time::Duration;
//!
//! let upstream = Upstream::new("tcp://master-0:5557", "tcp://master-0:5558");
//! let mut follower = Follower::new(vec![upstream], FollowOptions::default())?;
//! loop {
//!     // Notices say what the follower did to stay right: a snapshot, a replayed gap, a restart.
//!     for notice in follower.poll(Duration::from_millis(100)) {
//!         eprintln!("{notice:?}");
//!     }
//!     if follower.in_sync() {
//!         let media = follower.index(0).get(b"tenant-a", b"object-1");
//!         if media.contains(Medium::Cpu) {
//!             // route the request for object-1 to this master's backend
//!         }
//!     }
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod catchup;
mod follow;
mod index;
mod objects;
mod stop;
mod watch;

pub use crate::wire::{Change, Field, Info};
pub use catchup::{Catchup, ReplayClient};
pub use follow::{
    AppliedMessage, Changes, FollowError, FollowOptions, Follower, FollowerCounters, Keys, Notice,
    NoticeKind, Status, Upstream,
};
pub use index::{json_bytes, Applied, Index, RejectedEvent, DEFAULT_TENANT};
pub use objects::Objects;
pub use stop::{catch_stop_signals, stop_requested};
pub use watch::{
    connect_form, Batch, Continuity, CurveClient, Reach, Subscriber, SubscriberOptions, WatchError,
    DEFAULT_MAX_MESSAGE_BYTES,
};
