//! The current state in the key-value bucket: one entry per object present, written from
//! what the log holds, and the position of the log it reflects, noted in the positions'
//! bucket so that a relay that starts again knows where to read the log from.

use crate::held::{parse_entry, Held};
use crate::log::Position;
use crate::names::{object_key, token};
use crate::nats::Nats;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Entries written together, their acknowledgements awaited together.
const CHUNK: usize = 4096;
/// How long one flush goes on writing chunks: the follower reads again between two
/// flushes, however many objects a difference touched. Behind a master faster than the
/// bucket, objects stay dirty meanwhile (each is written once, as it is when written).
const BUDGET: Duration = Duration::from_millis(100);

/// What the positions' bucket says of a backend: the log message the objects' bucket
/// reflects, and where that message left the log.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Reflected {
    /// The stream sequence of the last log message whose effects are in the bucket.
    pub(crate) stream_sequence: u64,
    /// The master's incarnation there, 16 hex digits.
    pub(crate) incarnation: String,
    /// The master's sequence there.
    pub(crate) sequence: u64,
    /// Whether the log was the master's state there (not in the middle of a difference).
    pub(crate) complete: bool,
}

impl Reflected {
    /// The log's position it names, if any.
    pub(crate) fn position(&self) -> Option<Position> {
        let incarnation = u64::from_str_radix(&self.incarnation, 16).ok()?;
        Some(Position {
            incarnation,
            sequence: self.sequence,
            complete: self.complete,
        })
    }
}

/// Loads what the bucket holds of `backend` into `held`, and says which log message that
/// is (the default, stream sequence 0, when the bucket never heard of it).
pub(crate) fn load(nats: &Nats, backend: &str, held: &mut Held) -> Result<Reflected, String> {
    let reflected = reflected(nats, backend)?;
    for value in nats.load(&format!("{}.", token(backend.as_bytes())))? {
        if let Some((tenant, key, media)) = parse_entry(&value) {
            held.load(&tenant, &key, media);
        }
    }
    Ok(reflected)
}

/// What the positions' bucket says of `backend`.
pub(crate) fn reflected(nats: &Nats, backend: &str) -> Result<Reflected, String> {
    match nats.position(&token(backend.as_bytes()))? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("the positions' bucket holds no position for {backend}: {e}")),
        None => Ok(Reflected::default()),
    }
}

/// Writes dirty objects' entries as `held` has them, [`CHUNK`] at a time, for up to
/// [`BUDGET`]; when none is left dirty, notes that the bucket reflects log message `last`
/// (at `position`). Returns how many entries were written.
pub(crate) fn flush(
    nats: &Nats,
    backend: &str,
    held: &mut Held,
    last: u64,
    position: Option<Position>,
) -> Result<usize, String> {
    let started = Instant::now();
    let mut written = 0;
    while held.dirty_len() > 0 {
        if started.elapsed() >= BUDGET {
            return Ok(written);
        }
        let dirty = held.dirty(CHUNK);
        let entries: Vec<(String, Option<String>)> = dirty
            .iter()
            .map(|(tenant, key)| (object_key(backend, tenant, key), held.entry(tenant, key)))
            .collect();
        written += entries.len();
        nats.write(&nats.names().bucket, entries)?;
        held.clean(&dirty);
    }
    let note = Reflected {
        stream_sequence: last,
        incarnation: position.map_or_else(String::new, |p| format!("{:016x}", p.incarnation)),
        sequence: position.map_or(0, |p| p.sequence),
        complete: position.is_some_and(|p| p.complete),
    };
    let value = serde_json::to_string(&note).map_err(|e| e.to_string())?;
    nats.write(
        &nats.names().positions(),
        vec![(token(backend.as_bytes()), Some(value))],
    )?;
    Ok(written)
}
