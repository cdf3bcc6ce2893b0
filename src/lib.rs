//! The KV event publisher of Mooncake's metadata master.
//!
//! The master calls a [`Publisher`] whenever an object becomes readable or stops being
//! readable on a logical medium (`cpu` or `disk`); the publisher turns those calls into
//! `stored`, `removed` and `cleared` events and publishes them, in msgpack batches, on a
//! ZeroMQ PUB socket from its own thread, so that KV-aware routers and indexers can follow
//! what the store holds. The wire format is written in `encode.rs`; docs/spec.md is the contract.
//!
//! The master links this crate as `libmooncake_kv_events.so`, whose only exports are the C API
//! of `include/mooncake/kv_events_c.h` (C++ masters include its inline wrapper
//! `include/mooncake/kv_events.h`); the C++ layer behind that API reaches Rust through the `cxx`
//! bridge in `ffi.rs`.
#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unsafe_op_in_unsafe_fn
)]

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
pub mod catchup;
mod config;
mod connections;
mod encode;
mod event;
mod ffi;
pub mod follow;
pub mod index;
pub mod keys;
mod log;
mod media;
mod pool;
mod publisher;
mod queue;
mod replay;
mod scan;
mod security;
mod snapshot;
mod stats;
pub mod watch;
mod worker;

pub use config::{Config, CreateError};
pub use event::EventKind;
pub use log::{remove_log_sink, set_log_sink, Level};
pub use media::{Medium, MediumSet, ReplicaKind};
pub use publisher::{Publisher, RemoveAllScan};
pub use snapshot::{Abandoned, ObjectSource, Objects};
pub use stats::Stats;
