//! The payloads the relay writes and reads: batches in the stream's own msgpack format,
//! `[timestamp_ms, [event, ...], dp_rank]`, at most 64 events each (what the library's
//! decoder takes), one after another. A log message carries the master's batches verbatim,
//! or the batches of a difference; a snapshot object is the batches of its `stored` events.
//! Everything is written with `rmp` directly and read with the library's `Checked`: no
//! value tree, no allocation per event.

use mooncake_kv_events::subscriber::Index;
use mooncake_kv_events::wire::{Checked, Event, Malformed, Message, MAX_BATCH_EVENTS};
use mooncake_kv_events::{Medium, MediumSet};
use rmp::encode as mp;
use rmp::Marker;

/// The most events a batch holds: the wire format's bound.
pub(crate) const MAX_EVENTS: usize = MAX_BATCH_EVENTS as usize;
/// The most bytes of batches one log message carries: under JetStream's default limit of
/// 1 MiB a message, headers included.
pub(crate) const MAX_PAYLOAD: usize = 768 * 1024;

/// What the master's events say of the master, which the events a relay makes up carry as
/// the master's do: learned from the master's own events, else nil (as a master that sets
/// none sends them) with the legacy keys (the default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Context {
    pub(crate) model_name: Option<String>,
    pub(crate) block_size: Option<u64>,
    pub(crate) additional_salt: Option<String>,
    pub(crate) lora_name: Option<String>,
    pub(crate) dp_rank: u64,
    /// Whether the master sends the legacy keys (`type`, `block_hashes`,
    /// `parent_block_hash`).
    pub(crate) legacy: bool,
}

impl Default for Context {
    fn default() -> Context {
        Context {
            model_name: None,
            block_size: None,
            additional_salt: None,
            lora_name: None,
            dp_rank: 0,
            legacy: true,
        }
    }
}

impl Context {
    /// The context of the first event of a master's payload, if it has one.
    pub(crate) fn of(payload: &[u8]) -> Option<Context> {
        let message = Message::<Event>::decode(&[&[][..], &[0u8; 8][..], payload]).ok()?;
        let event = message.events.into_iter().next()?;
        Some(Context {
            model_name: event.model_name,
            block_size: event.block_size,
            additional_salt: event.additional_salt,
            lora_name: event.lora_name,
            dp_rank: event.dp_rank,
            legacy: event.legacy_type.is_some(),
        })
    }
}

/// `stored`, `removed`, or `cleared` (every object of a tenant gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Stored,
    Removed,
    Cleared,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Stored => "stored",
            Kind::Removed => "removed",
            Kind::Cleared => "cleared",
        }
    }

    fn legacy(self) -> &'static str {
        match self {
            Kind::Stored => "BlockStored",
            Kind::Removed => "BlockRemoved",
            Kind::Cleared => "AllBlocksCleared",
        }
    }
}

// Writing into a Vec cannot fail: the results of `rmp`'s writers are dropped.
fn text(out: &mut Vec<u8>, s: &str) {
    let _ = mp::write_str(out, s);
}

/// Bytes as the wire sends them: `str` when they are UTF-8, `bin` when not.
fn wire_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => text(out, s),
        Err(_) => {
            let _ = mp::write_bin(out, bytes);
        }
    }
}

fn uint(out: &mut Vec<u8>, v: u64) {
    let _ = mp::write_uint(out, v);
}

fn nil(out: &mut Vec<u8>) {
    let _ = mp::write_nil(out);
}

fn optional(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(s) => text(out, s),
        None => nil(out),
    }
}

/// One event of a difference, with every key a master's event of that kind has, in the
/// master's order (spec section 5): `event_id` 0 (not the master's count), `timestamp` the
/// batch's, `group_id` nil (the relay keeps no groups), the context's values. `object` is
/// the key and medium of a `stored` or `removed`, `None` for a `cleared` (medium nil).
pub(crate) fn full_event(
    out: &mut Vec<u8>,
    context: &Context,
    backend: &str,
    kind: Kind,
    tenant: &[u8],
    object: Option<(&[u8], Medium)>,
    now: u64,
) {
    let keys = match kind {
        Kind::Stored => 17 + u32::from(context.legacy) * 3,
        Kind::Removed => 15 + u32::from(context.legacy) * 2,
        Kind::Cleared => 11 + u32::from(context.legacy),
    };
    let _ = mp::write_map_len(out, keys);
    text(out, "event_id");
    uint(out, 0);
    text(out, "timestamp");
    uint(out, now);
    text(out, "event_type");
    text(out, kind.as_str());
    if context.legacy {
        text(out, "type");
        text(out, kind.legacy());
    }
    text(out, "model_name");
    optional(out, context.model_name.as_deref());
    text(out, "block_size");
    match context.block_size {
        Some(v) => uint(out, v),
        None => nil(out),
    }
    text(out, "additional_salt");
    optional(out, context.additional_salt.as_deref());
    text(out, "lora_name");
    optional(out, context.lora_name.as_deref());
    text(out, "backend_id");
    text(out, backend);
    text(out, "dp_rank");
    uint(out, context.dp_rank);
    text(out, "tenant_id");
    wire_bytes(out, tenant);
    text(out, "medium");
    let Some((key, medium)) = object.filter(|_| kind != Kind::Cleared) else {
        nil(out);
        return;
    };
    text(out, medium.as_str());
    text(out, "group_id");
    nil(out);
    text(out, "object_key");
    wire_bytes(out, key);
    text(out, "seq_hashes");
    let _ = mp::write_array_len(out, 0);
    if context.legacy {
        text(out, "block_hashes");
        let _ = mp::write_array_len(out, 0);
    }
    text(out, "base_block_idx");
    nil(out);
    if kind == Kind::Stored {
        text(out, "token_ids");
        nil(out);
        text(out, "parent_hash");
        nil(out);
        if context.legacy {
            text(out, "parent_block_hash");
            nil(out);
        }
    }
}

/// One `stored` event of a snapshot: the keys a reader's index needs, `event_type`,
/// `timestamp`, `tenant_id`, `backend_id`, `medium`, `object_key`. A snapshot is a state,
/// not the master's events: four times fewer bytes than the full form, for readers that
/// load millions of them.
fn compact_stored(
    out: &mut Vec<u8>,
    backend: &str,
    tenant: &[u8],
    key: &[u8],
    medium: Medium,
    now: u64,
) {
    let _ = mp::write_map_len(out, 6);
    text(out, "event_type");
    text(out, "stored");
    text(out, "timestamp");
    uint(out, now);
    text(out, "tenant_id");
    wire_bytes(out, tenant);
    text(out, "backend_id");
    text(out, backend);
    text(out, "medium");
    text(out, medium.as_str());
    text(out, "object_key");
    wire_bytes(out, key);
}

/// Events gathered into batches of at most [`MAX_EVENTS`], one after another.
#[derive(Debug)]
pub(crate) struct Batches {
    timestamp_ms: u64,
    dp_rank: u64,
    /// The batches closed so far.
    out: Vec<u8>,
    /// The events of the batch being filled.
    batch: Vec<u8>,
    in_batch: usize,
    events: u64,
}

/// The most bytes a batch takes beside its events: its array, timestamp, events' array and
/// `dp_rank` headers.
pub(crate) const BATCH_OVERHEAD: usize = 22;

impl Batches {
    /// Batches stamped `timestamp_ms` and `dp_rank`.
    pub(crate) fn new(timestamp_ms: u64, dp_rank: u64) -> Batches {
        Batches {
            timestamp_ms,
            dp_rank,
            out: Vec::new(),
            batch: Vec::new(),
            in_batch: 0,
            events: 0,
        }
    }

    /// Adds one event, which `write` encodes.
    pub(crate) fn push(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.batch);
        self.in_batch += 1;
        self.events += 1;
        if self.in_batch == MAX_EVENTS {
            self.close_batch();
        }
    }

    fn close_batch(&mut self) {
        if self.in_batch == 0 {
            return;
        }
        let _ = mp::write_array_len(&mut self.out, 3);
        uint(&mut self.out, self.timestamp_ms);
        let _ = mp::write_array_len(&mut self.out, self.in_batch as u32);
        self.out.append(&mut self.batch);
        uint(&mut self.out, self.dp_rank);
        self.in_batch = 0;
    }

    /// The first `bytes` bytes of what is encoded so far, once there are as many (batches
    /// may be cut anywhere, as a snapshot's chunks are).
    fn drain(&mut self, bytes: usize) -> Option<Vec<u8>> {
        if self.out.len() < bytes {
            return None;
        }
        let rest = self.out.split_off(bytes);
        Some(std::mem::replace(&mut self.out, rest))
    }

    /// Everything encoded and not drained yet.
    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Events pushed so far.
    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    /// The batches; empty when no event was pushed.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.close_batch();
        self.out
    }
}

/// An empty batch, `[timestamp_ms, [], dp_rank]`: a message that changes nothing (an empty
/// difference, which records a new position).
pub(crate) fn empty(timestamp_ms: u64, dp_rank: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    let _ = mp::write_array_len(&mut out, 3);
    uint(&mut out, timestamp_ms);
    let _ = mp::write_array_len(&mut out, 0);
    uint(&mut out, dp_rank);
    out
}

/// A snapshot to write: `index`, which its owner leaves unchanged while it is shared (see
/// [`crate::held::Held::share`]), as one compact `stored` per medium of each object, in
/// batches one after another, encoded a chunk at a time as it is written ([`Snapshot::chunks`]):
/// never whole in memory.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) index: std::sync::Arc<Index>,
    pub(crate) backend: String,
    pub(crate) timestamp_ms: u64,
}

impl Snapshot {
    /// Its content in chunks of `bytes` bytes (the last one fewer, none when empty).
    pub(crate) fn chunks(&self, bytes: usize) -> Chunks<'_> {
        Chunks {
            objects: Box::new(self.index.iter()),
            batches: Batches::new(self.timestamp_ms, 0),
            snapshot: self,
            bytes,
            done: false,
        }
    }
}

/// The chunks of a [`Snapshot`], encoded as they are asked for.
pub(crate) struct Chunks<'a> {
    objects: Box<dyn Iterator<Item = (&'a [u8], &'a [u8], MediumSet)> + Send + 'a>,
    batches: Batches,
    snapshot: &'a Snapshot,
    bytes: usize,
    done: bool,
}

impl Chunks<'_> {
    /// The events encoded so far: all of them, once the last chunk is taken.
    pub(crate) fn events(&self) -> u64 {
        self.batches.events()
    }
}

impl Iterator for Chunks<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(chunk) = self.batches.drain(self.bytes) {
                return Some(chunk);
            }
            if self.done {
                let rest = self.batches.rest();
                return (!rest.is_empty()).then_some(rest);
            }
            let Some((tenant, key, media)) = self.objects.next() else {
                self.done = true;
                self.batches.close_batch();
                continue;
            };
            let (backend, now) = (&self.snapshot.backend, self.snapshot.timestamp_ms);
            for medium in media.iter() {
                self.batches
                    .push(|out| compact_stored(out, backend, tenant, key, medium, now));
            }
        }
    }
}

/// The timestamp of a payload's first batch, if it reads as one.
pub(crate) fn timestamp(payload: &[u8]) -> Option<u64> {
    let mut rest = payload;
    rmp::decode::read_array_len(&mut rest).ok()?;
    rmp::decode::read_int(&mut rest).ok()
}

/// The batches of a payload of batches one after another, or why it is not one.
pub(crate) fn split(payload: &[u8]) -> Result<Vec<&[u8]>, Malformed> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let end = skip(payload, at, 0).map_err(Malformed::Payload)?;
        out.push(&payload[at..end]);
        at = end;
    }
    Ok(out)
}

/// Each batch of `payload`, checked by the library's decoder, in order.
pub(crate) fn checked(payload: &[u8]) -> Result<Vec<Checked<&[u8]>>, Malformed> {
    split(payload)?
        .into_iter()
        .map(|batch| Checked::new(vec![&[][..], &[0u8; 8][..], batch]))
        .collect()
}

/// The offset after the msgpack value at `at`.
fn skip(bytes: &[u8], at: usize, depth: u32) -> Result<usize, String> {
    if depth > 8 {
        return Err(format!("values nested too deep at byte {at}"));
    }
    let marker = Marker::from_u8(*bytes.get(at).ok_or("a value cut short")?);
    let be = |n: usize| -> Result<usize, String> {
        let b = bytes.get(at + 1..at + 1 + n).ok_or("a length cut short")?;
        Ok(b.iter().fold(0usize, |v, &x| (v << 8) | usize::from(x)))
    };
    let data = |header: usize, len: usize| -> Result<usize, String> {
        let end = at + header + len;
        if end > bytes.len() {
            return Err("a value cut short".into());
        }
        Ok(end)
    };
    let items = |header: usize, n: usize| -> Result<usize, String> {
        let mut end = at + header;
        for _ in 0..n {
            end = skip(bytes, end, depth + 1)?;
        }
        Ok(end)
    };
    match marker {
        Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
            data(1, 0)
        }
        Marker::U8 | Marker::I8 => data(1, 1),
        Marker::U16 | Marker::I16 => data(1, 2),
        Marker::U32 | Marker::I32 | Marker::F32 => data(1, 4),
        Marker::U64 | Marker::I64 | Marker::F64 => data(1, 8),
        Marker::FixStr(n) => data(1, usize::from(n)),
        Marker::Str8 | Marker::Bin8 => data(2, be(1)?),
        Marker::Str16 | Marker::Bin16 => data(3, be(2)?),
        Marker::Str32 | Marker::Bin32 => data(5, be(4)?),
        Marker::FixArray(n) => items(1, usize::from(n)),
        Marker::Array16 => items(3, be(2)?),
        Marker::Array32 => items(5, be(4)?),
        Marker::FixMap(n) => items(1, 2 * usize::from(n)),
        Marker::Map16 => items(3, 2 * be(2)?),
        Marker::Map32 => items(5, 2 * be(4)?),
        Marker::FixExt1 => data(2, 1),
        Marker::FixExt2 => data(2, 2),
        Marker::FixExt4 => data(2, 4),
        Marker::FixExt8 => data(2, 8),
        Marker::FixExt16 => data(2, 16),
        Marker::Ext8 => data(3, be(1)?),
        Marker::Ext16 => data(4, be(2)?),
        Marker::Ext32 => data(6, be(4)?),
        Marker::Reserved => Err(format!("byte {at} is no msgpack value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_kv_events::wire::{Event, Message};

    fn decode_all(payload: &[u8]) -> Vec<Message<Event>> {
        split(payload)
            .unwrap()
            .into_iter()
            .map(|b| Message::<Event>::decode(&[&[][..], &[0u8; 8][..], b]).expect("strict"))
            .collect()
    }

    #[test]
    fn a_difference_has_the_keys_of_the_masters_events_and_the_strict_decoder_takes_it() {
        for legacy in [true, false] {
            let context = Context {
                model_name: Some("m".into()),
                block_size: Some(16),
                legacy,
                dp_rank: 3,
                ..Context::default()
            };
            let mut batches = Batches::new(7, 3);
            for i in 0..130u32 {
                let kind = if i % 2 == 0 {
                    Kind::Stored
                } else {
                    Kind::Removed
                };
                let key = if i == 5 {
                    vec![0xff, 0xfe]
                } else {
                    format!("k{i}").into_bytes()
                };
                batches.push(|out| {
                    full_event(
                        out,
                        &context,
                        "s",
                        kind,
                        b"t",
                        Some((&key, Medium::Disk)),
                        7,
                    );
                });
            }
            batches.push(|out| full_event(out, &context, "s", Kind::Cleared, b"t", None, 7));
            let payload = batches.finish();
            let messages = decode_all(&payload);
            assert_eq!(
                messages.iter().map(|m| m.events.len()).collect::<Vec<_>>(),
                [64, 64, 3]
            );
            let first = &messages[0].events[0];
            assert_eq!(first.model_name.as_deref(), Some("m"));
            assert_eq!(first.block_size, Some(16));
            assert_eq!(first.dp_rank, 3);
            assert_eq!(first.legacy_type.is_some(), legacy);
            assert_eq!(
                messages[0].events[5].object_key.as_ref().unwrap().0,
                [0xff, 0xfe]
            );
            let cleared = &messages[2].events[2];
            assert_eq!(cleared.object_key, None);
            assert_eq!(cleared.medium, None);
            // The key counts of spec section 5: 17 for stored (20 legacy), 15 removed (17),
            // 11 cleared (12).
            let raws = split(&payload).unwrap();
            let value = rmpv::decode::read_value(&mut &raws[0][..]).unwrap();
            let events = value[1].as_array().unwrap();
            let keys = |e: &rmpv::Value| e.as_map().unwrap().len();
            assert_eq!(keys(&events[0]), if legacy { 20 } else { 17 });
            assert_eq!(keys(&events[1]), if legacy { 17 } else { 15 });
            let last = rmpv::decode::read_value(&mut &raws[2][..]).unwrap();
            assert_eq!(keys(&last[1][2]), if legacy { 12 } else { 11 });
        }
    }

    #[test]
    fn a_snapshot_in_chunks_applies_to_the_index_it_was_made_of() {
        let mut index = Index::new();
        for i in 0..1000 {
            index.store(b"t", format!("key-{i}").as_bytes(), Medium::Cpu);
            if i % 3 == 0 {
                index.store(b"u", format!("key-{i}").as_bytes(), Medium::Disk);
            }
        }
        let snapshot = Snapshot {
            index: std::sync::Arc::new(index.clone()),
            backend: "s".into(),
            timestamp_ms: 1,
        };
        let mut chunks = snapshot.chunks(1000);
        let pieces: Vec<Vec<u8>> = chunks.by_ref().collect();
        assert_eq!(chunks.events(), 1334);
        assert!(pieces[..pieces.len() - 1].iter().all(|c| c.len() == 1000));
        assert!(!pieces[pieces.len() - 1].is_empty() && pieces[pieces.len() - 1].len() <= 1000);
        let mut back = Index::new();
        for batch in checked(&pieces.concat()).unwrap() {
            assert!(batch.len() <= MAX_EVENTS);
            for change in batch.changes() {
                back.apply_change(&change).unwrap();
            }
        }
        assert_eq!(back, index);

        assert!(checked(b"\x93\x01").is_err(), "cut short");
        assert!(checked(&empty(5, 0)).unwrap()[0].is_empty());
    }
}
