//! The events the stream carries: their kinds, and one event as the encoder sees it.

#[cfg(feature = "publisher")]
use crate::media::Medium;

/// What an event announces. Deserializes from its `event_type` on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// The object became readable on a medium.
    Stored,
    /// The object stopped being readable on a medium.
    Removed,
    /// Every object of a tenant on this backend is gone.
    Cleared,
}

impl EventKind {
    /// The `event_type` on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Stored => "stored",
            EventKind::Removed => "removed",
            EventKind::Cleared => "cleared",
        }
    }

    /// The legacy `type` on the wire.
    pub const fn legacy_name(self) -> &'static str {
        match self {
            EventKind::Stored => "BlockStored",
            EventKind::Removed => "BlockRemoved",
            EventKind::Cleared => "AllBlocksCleared",
        }
    }
}

/// One event as the encoder sees it, borrowing its bytes from the queued call.
/// `key` and `group` are empty on `cleared`, `medium` is `None` on `cleared` only.
#[cfg(feature = "publisher")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event<'a> {
    pub(crate) kind: EventKind,
    pub(crate) medium: Option<Medium>,
    pub(crate) tenant: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) group: &'a [u8],
}
