//! A call as queued: a [`Record`], holding the `removed` and `stored` of one object or one
//! `cleared`, with its strings carried where the calling thread need not allocate, or a
//! marker the publishing thread acts on in stream order.

use super::pool::{Block, StringPool, BLOCK_BYTES};
use crate::event::{Event, EventKind};
use crate::media::MediumSet;
use std::sync::mpsc::SyncSender;

/// One queued call, or a marker the publishing thread acts on in stream order.
#[derive(Debug)]
pub(crate) enum Record {
    /// The events of one `on_put_commit` or `on_medium_delta`.
    Object(ObjectEvents),
    /// The `cleared` of one `on_remove_all`, to be confirmed against its scan.
    Cleared(ClearedEvent),
    /// `begin_remove_all` took scan number `n` here.
    ScanBegin(u64),
    /// `flush` waits until everything before this marker is sent.
    Flush(SyncSender<()>),
}

impl Record {
    /// The events this record carries; markers carry none.
    pub(crate) fn event_count(&self) -> usize {
        match self {
            Record::Object(o) => o.len(),
            Record::Cleared(_) => 1,
            Record::ScanBegin(_) | Record::Flush(_) => 0,
        }
    }

    /// Done with: gives a call's string block back to `pool`.
    pub(crate) fn recycle(self, pool: &StringPool) {
        if let Record::Object(object) = self {
            object.recycle(pool);
        }
    }
}

/// The `removed` and `stored` events of one call about one object, queued as one record so
/// that no other call's events can come between them.
///
/// The tenant, key and group travel inside the record when together they fit in
/// [`INLINE_BYTES`] (a 64-byte key with ids of up to 40 bytes), and in a block of the
/// publisher's [`StringPool`] up to [`BLOCK_BYTES`] (a vLLM connector key of 135 bytes with
/// ids of up to 120): either way the calling thread allocates nothing and the publishing
/// thread frees nothing, the queue full or not (a publisher's pool has a block for every slot,
/// see [`StringPool::for_queue`]). Longer strings share one heap allocation, as would long
/// ones should every block be in use. The record is 128 bytes whichever holds the strings: a bigger slot that
/// held 256 bytes itself was measured slower (docs/performance.md), since every call, short
/// or long, then writes and reads all of its cache lines.
#[derive(Debug)]
pub(crate) struct ObjectEvents {
    strings: Strings,
    tenant_len: u32,
    key_len: u32,
    removed: MediumSet,
    stored: MediumSet,
}

/// The most bytes of tenant, key and group that a record carries in itself.
pub(crate) const INLINE_BYTES: usize = 104;

/// Tenant, key and group, concatenated.
#[derive(Debug)]
enum Strings {
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    Pooled { len: u16, block: Block },
    Heap(Box<[u8]>),
}

impl Strings {
    fn new(parts: [&[u8]; 3], pool: &StringPool) -> Strings {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len <= INLINE_BYTES {
            let mut bytes = [0; INLINE_BYTES];
            concat_into(&mut bytes, parts);
            return Strings::Inline {
                len: len as u8,
                bytes,
            };
        }
        if len <= BLOCK_BYTES {
            if let Some(mut block) = pool.take() {
                concat_into(block.bytes_mut(), parts);
                return Strings::Pooled {
                    len: len as u16,
                    block,
                };
            }
        }
        Strings::Heap(parts.concat().into_boxed_slice())
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Strings::Inline { len, bytes } => &bytes[..*len as usize],
            Strings::Pooled { len, block } => &block.bytes()[..*len as usize],
            Strings::Heap(bytes) => bytes,
        }
    }
}

/// Copies `parts` one after the other to the start of `to`, which is long enough.
fn concat_into(to: &mut [u8], parts: [&[u8]; 3]) {
    let mut at = 0;
    for part in parts {
        to[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
}

impl ObjectEvents {
    /// `None` when a string is longer than 4 GiB, which no msgpack `str` or `bin` can carry.
    /// Strings too long for the record take a block of `pool`.
    pub(crate) fn new(
        tenant: &[u8],
        key: &[u8],
        group: &[u8],
        removed: MediumSet,
        stored: MediumSet,
        pool: &StringPool,
    ) -> Option<ObjectEvents> {
        let tenant_len = u32::try_from(tenant.len()).ok()?;
        let key_len = u32::try_from(key.len()).ok()?;
        u32::try_from(group.len()).ok()?;
        Some(ObjectEvents {
            strings: Strings::new([tenant, key, group], pool),
            tenant_len,
            key_len,
            removed,
            stored,
        })
    }

    /// Removed events before stored ones, `cpu` before `disk` in each.
    pub(crate) fn events(&self) -> impl Iterator<Item = Event<'_>> {
        let (tenant, rest) = self.strings.as_bytes().split_at(self.tenant_len as usize);
        let (key, group) = rest.split_at(self.key_len as usize);
        let removed = self.removed.iter().map(|m| (EventKind::Removed, m));
        let stored = self.stored.iter().map(|m| (EventKind::Stored, m));
        removed.chain(stored).map(move |(kind, medium)| Event {
            kind,
            medium: Some(medium),
            tenant,
            key,
            group,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.removed.len() + self.stored.len()
    }

    pub(crate) fn tenant(&self) -> &[u8] {
        &self.strings.as_bytes()[..self.tenant_len as usize]
    }

    /// Gives the strings' block, if they have one, back to `pool`: the call is done with.
    pub(crate) fn recycle(self, pool: &StringPool) {
        if let Strings::Pooled { block, .. } = self.strings {
            pool.give_back(block);
        }
    }

    /// Whether the call made the object readable on a medium it was not on: such a call
    /// must stop a RemoveAll that scanned before it from clearing the tenant. A `stored`
    /// that `kv_events_reannounce_remaining` adds for a medium the object kept counts too:
    /// it may suppress a `cleared`, which is always safe.
    pub(crate) fn adds_medium(&self) -> bool {
        !self.stored.is_empty()
    }
}

/// A `cleared` waiting for the publishing thread to confirm that no medium was added to its
/// tenant since the RemoveAll scan `scan` began.
#[derive(Debug)]
pub(crate) struct ClearedEvent {
    pub(crate) tenant: Box<[u8]>,
    pub(crate) scan: u64,
}

impl ClearedEvent {
    pub(crate) fn event(&self) -> Event<'_> {
        Event {
            kind: EventKind::Cleared,
            medium: None,
            tenant: &self.tenant,
            key: &[],
            group: &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::Medium;

    fn kinds(o: &ObjectEvents) -> Vec<(EventKind, Option<Medium>)> {
        o.events().map(|e| (e.kind, e.medium)).collect()
    }

    fn object(tenant: &[u8], key: &[u8], group: &[u8], pool: &StringPool) -> ObjectEvents {
        ObjectEvents::new(tenant, key, group, MediumSet::EMPTY, CPU, pool).unwrap()
    }

    const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);

    #[test]
    fn removed_come_before_stored_and_cpu_before_disk() {
        let pool = StringPool::new(1);
        let disk = MediumSet::from([Medium::Disk]);
        let o = ObjectEvents::new(b"t", b"k", b"g", disk, CPU, &pool).unwrap();
        assert_eq!(
            kinds(&o),
            [
                (EventKind::Removed, Some(Medium::Disk)),
                (EventKind::Stored, Some(Medium::Cpu))
            ]
        );
        assert_eq!(o.len(), 2);
        let both = MediumSet::from([Medium::Disk, Medium::Cpu]);
        let both = ObjectEvents::new(b"t", b"k", b"", MediumSet::EMPTY, both, &pool).unwrap();
        assert_eq!(
            kinds(&both),
            [
                (EventKind::Stored, Some(Medium::Cpu)),
                (EventKind::Stored, Some(Medium::Disk))
            ]
        );
    }

    #[test]
    fn strings_come_back_byte_for_byte() {
        let o = object(b"", b"k\0\xff", b"\xc3", &StringPool::new(1));
        let e = o.events().next().unwrap();
        assert_eq!(
            (e.tenant, e.key, e.group),
            (&b""[..], &b"k\0\xff"[..], &b"\xc3"[..])
        );
        assert_eq!(o.tenant(), b"");
        assert!(o.adds_medium());
    }

    #[test]
    fn strings_ride_inline_then_in_a_block_then_on_the_heap_and_come_back() {
        let pool = StringPool::new(4);
        let cases = [
            (INLINE_BYTES - 3, "inline"),
            (INLINE_BYTES - 2, "inline"),
            (INLINE_BYTES - 1, "pooled"),
            (BLOCK_BYTES - 2, "pooled"),
            (BLOCK_BYTES - 1, "heap"),
            (1 << 20, "heap"),
        ];
        for (len, expected) in cases {
            let key: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let o = object(b"t", &key, b"g", &pool);
            let held = match o.strings {
                Strings::Inline { .. } => "inline",
                Strings::Pooled { .. } => "pooled",
                Strings::Heap(_) => "heap",
            };
            assert_eq!(held, expected, "{len}");
            let e = o.events().next().unwrap();
            assert_eq!((e.tenant, e.key, e.group), (&b"t"[..], &key[..], &b"g"[..]));
            o.recycle(&pool);
            assert_eq!(pool.free(), 4, "{len}: the block came back");
        }
    }

    #[test]
    fn long_strings_go_to_the_heap_while_every_block_is_in_use() {
        let pool = StringPool::new(1);
        let key = [b'k'; 200];
        let first = object(b"t", &key, b"g", &pool);
        let second = object(b"t", &key, b"g", &pool);
        assert!(matches!(first.strings, Strings::Pooled { .. }));
        assert!(matches!(second.strings, Strings::Heap(_)));
        assert_eq!(second.events().next().unwrap().key, &key[..]);
        second.recycle(&pool);
        assert_eq!(pool.free(), 0);
        first.recycle(&pool);
        let third = object(b"t", &key, b"g", &pool);
        assert!(matches!(third.strings, Strings::Pooled { .. }));
        third.recycle(&pool);
    }

    #[test]
    fn a_queued_call_is_128_bytes_whichever_holds_its_strings() {
        // The memory figures of docs/performance.md count on it.
        assert_eq!(std::mem::size_of::<ObjectEvents>(), 128);
    }
}
