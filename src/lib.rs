//! The KV event publisher of Mooncake's metadata master.
//!
//! The master calls a [`Publisher`] whenever an object becomes readable or stops being
//! readable on a logical medium (`cpu` or `disk`); the publisher turns those calls into
//! `stored`, `removed` and `cleared` events and publishes them, in msgpack batches, on a
//! ZeroMQ PUB socket from its own thread, so that KV-aware routers and indexers can follow
//! what the store holds. docs/spec.md is the contract; docs/design.md maps this crate.
//!
//! The rooms, each with its contract in its module documentation:
//! - `config`: the flags, validated once into [`Settings`] (key files read there);
//! - `publisher`: the handle, the queue and the string pool, the state the callers share
//!   with the publishing thread, the RemoveAll rule, the publishing thread;
//! - [`wire`]: the wire format, encoded and decoded;
//! - `transport`: the sockets, CURVE and ZAP, the connection watch, ipc binding;
//! - `recovery`: the replay socket and snapshots;
//! - [`subscriber`]: reading the stream and getting back to the truth;
//! - beside them, the vocabulary every room uses: media, events, CURVE [`keys`], stats, the
//!   log, creation errors; and `ffi`, the `cxx` bridge through which the C API of
//!   `include/mooncake/kv_events_c.h` (the only exports of `libmooncake_kv_events.so`)
//!   reaches the publisher.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unsafe_op_in_unsafe_fn
)]

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
mod config;
mod error;
mod event;
mod ffi;
pub mod keys;
mod log;
mod media;
mod publisher;
mod recovery;
mod stats;
pub mod subscriber;
mod transport;
pub mod wire;

pub use config::{Config, Settings};
pub use error::CreateError;
pub use event::EventKind;
pub use log::{remove_log_sink, set_log_sink, Level};
pub use media::{Medium, MediumSet, ReplicaKind};
pub use publisher::{Publisher, RemoveAllScan};
pub use recovery::{Abandoned, ObjectSource, Objects};
pub use stats::{BuildInfo, Stats};
