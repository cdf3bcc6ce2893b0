//! The wire format, both ways: the encoder the publishing thread writes every message with, and
//! the strict decoders subscribers read them with (every field as an `rmpv` value, or named and
//! typed with `rmp-serde`). docs/spec.md section 5 is the format; the two sides share no code,
//! so a test that decodes what the encoder wrote checks the encoder against the contract.

mod change;
mod decode;
#[cfg(feature = "publisher")]
pub(crate) mod encode;
pub mod replay;
mod typed;
mod validate;

pub use change::{Change, Field};
pub use decode::{decode_message, field, to_json};
pub use replay::{BadReply, BadRequest, Info, Replayed, Request, SnapshotEnd, END_OF_REPLAY};
pub use typed::{Bytes, Checked, Event, Message};
pub use validate::{
    Malformed, MAX_BATCH_EVENTS, MAX_EVENT_ARRAY_ITEMS, MAX_EVENT_KEYS, MAX_TOPIC_BYTES,
};
