//! The replay protocol, both ways: what a subscriber asks the replay socket (a ROUTER beside
//! the PUB socket) and what it answers, as the publisher writes it and subscribers read it.
//! docs/spec.md section 11 is the contract.
//!
//! Requests are the frames a DEALER sends (the ROUTER sees them after the routing id):
//! - `["", start_seq]`, `start_seq` 8 bytes big-endian: every retained message with sequence
//!   at least `start_seq`, in order, in one of two forms (with the topic frame, vLLM's since
//!   0.26; or without: [`Replayed`]), then the end of the replay ([`END_OF_REPLAY`]).
//!   What the publisher no longer holds, or never sent, is absent.
//! - `["", "snapshot"]` or `["", "snapshot", tenant_id]`: every object readable now (of that
//!   tenant), as `["", "snapshot", batch]` messages, then `["", "snapshot-end", map]`
//!   ([`SnapshotEnd`]).
//! - `["", "info"]`: `["", "info", map]` ([`Info`]), where the stream stands.
//! - anything else: `["", "error", text]`; so is a request the publisher cannot serve now
//!   (`text` starts with "busy").
//!
//! The maps are msgpack maps with string keys; a reader ignores keys it does not know.

mod maps;
mod reply;
mod request;
pub mod verb;

pub use maps::{BadReply, Info, SnapshotEnd};
#[cfg(feature = "publisher")]
pub(crate) use reply::ReplyForm;
pub use reply::{Replayed, END_OF_REPLAY};
pub use request::{BadRequest, Request};
