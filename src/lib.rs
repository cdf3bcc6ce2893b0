//! The KV event publisher of Mooncake's metadata master.
//!
//! The master calls a `Publisher` whenever an object becomes readable or stops being
//! readable on a logical medium (`cpu` or `disk`); the publisher turns those calls into
//! `stored`, `removed` and `cleared` events and publishes them, in msgpack batches, on a
//! ZeroMQ PUB socket from its own thread, so that KV-aware routers and indexers can follow
//! what the store holds. docs/spec.md is the contract; docs/design.md maps this crate.
//!
//! The rooms, each with its contract in its module documentation:
//! - `config`: the flags, validated once into `Settings` (key files read there);
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
//!
//! Features: `publisher` (the default) is all of the above; `subscriber` alone (with
//! `default-features = false`) is [`subscriber`], [`wire`]'s decoders, [`keys`] and the
//! vocabulary they use, built without a C++ compiler (no `cxx`, no bridge, no libstdc++).
//! docs/glossary.md names each term of this crate in every language and surface.
//!
//! A publisher and a subscriber in one process (with the `publisher` feature): the master's
//! call becomes a `stored` event that the subscriber reads from the stream.
//!
//! ```
//! # #[cfg(feature = "publisher")]
//! # {
//! use mooncake_kv_events::subscriber::Subscriber;
//! use mooncake_kv_events::{Config, EventKind, Medium, MediumSet, Publisher};
//! use mooncake_kv_events::wire::Event;
//! use std::time::{Duration, Instant};
//!
//! let endpoint = format!("ipc:///tmp/kv-events-doc-{}.sock", std::process::id());
//! let publisher = Publisher::create(&Config {
//!     enable_kv_events: true,
//!     bind_endpoint: endpoint.clone(),
//!     backend_id: "store-a".into(),
//!     ..Config::default()
//! })?;
//! let mut subscriber = Subscriber::connect(&endpoint, 100_000)?;
//! // A SUB socket's subscription reaches the publisher a little after it connects: until
//! // then what the publisher sends is not for it, so the call is made again until it arrives.
//! let deadline = Instant::now() + Duration::from_secs(60);
//! let event = loop {
//!     assert!(Instant::now() < deadline, "nothing arrived");
//!     publisher.on_put_commit("tenant-a", "object-1", "group-1", MediumSet::from([Medium::Cpu]));
//!     if let Some(batch) = subscriber.recv_as::<Event>(Duration::from_millis(100))? {
//!         break batch.events.into_iter().next().expect("a batch holds events");
//!     }
//! };
//! assert_eq!(event.event_type, EventKind::Stored);
//! assert_eq!(event.medium, Some(Medium::Cpu));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// missing_docs is denied for the whole workspace (Cargo.toml's [workspace.lints]).
#![warn(missing_debug_implementations, unreachable_pub, unsafe_op_in_unsafe_fn)]

#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
#[cfg(feature = "publisher")]
mod config;
#[cfg(feature = "publisher")]
mod error;
mod event;
#[cfg(feature = "publisher")]
mod ffi;
pub mod keys;
#[cfg(feature = "publisher")]
mod logging;
mod media;
#[cfg(feature = "publisher")]
mod publisher;
#[cfg(feature = "publisher")]
mod recovery;
#[cfg(feature = "publisher")]
mod stats;
#[cfg(feature = "subscriber")]
pub mod subscriber;
#[cfg(feature = "publisher")]
mod threads;
#[cfg(feature = "publisher")]
mod transport;
/// The subscriber side needs only libzmq's monitor events of the publisher's transport.
#[cfg(all(feature = "subscriber", not(feature = "publisher")))]
mod transport {
    #[allow(dead_code)] // libzmq's table, of which a subscriber reads a few entries
    pub(crate) mod monitor;
}
pub mod wire;

#[cfg(feature = "publisher")]
pub use config::{Config, NonUtf8, Settings, UnknownNonUtf8};
#[cfg(feature = "publisher")]
pub use error::CreateError;
pub use event::EventKind;
#[cfg(feature = "publisher")]
pub use logging::{remove_log_sink, set_log_sink, Level};
pub use media::{Medium, MediumSet, ReplicaKind};
#[cfg(feature = "publisher")]
pub use publisher::{Publisher, RemoveAllScan};
#[cfg(feature = "publisher")]
pub use recovery::{Abandoned, ObjectSource, Snapshot, SourceError};
#[cfg(feature = "publisher")]
pub use stats::{BuildInfo, Stats};
