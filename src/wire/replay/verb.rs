//! The verbs of the replay protocol: the second frame of a request or a reply that is not a
//! replayed message.

/// Asks where the stream stands; the reply carries an [`Info`](super::Info) map.
pub const INFO: &[u8] = b"info";
/// Asks for a snapshot; each reply carries one batch of it.
pub const SNAPSHOT: &[u8] = b"snapshot";
/// The last reply of a snapshot, with a [`SnapshotEnd`](super::SnapshotEnd) map.
pub const SNAPSHOT_END: &[u8] = b"snapshot-end";
/// A request refused or failed; the reply carries why, as text.
pub const ERROR: &[u8] = b"error";
