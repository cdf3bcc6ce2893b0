//! The events a call produces, as queued and as handed to the encoder.

use crate::media::{Medium, MediumSet};

/// What an event announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event<'a> {
    pub(crate) kind: EventKind,
    pub(crate) medium: Option<Medium>,
    pub(crate) tenant: &'a [u8],
    pub(crate) key: &'a [u8],
    pub(crate) group: &'a [u8],
}

/// The `removed` and `stored` events of one call about one object, queued as one record so
/// that no other call's events can come between them.
///
/// The tenant, key and group travel inside the record when together they fit in
/// [`INLINE_BYTES`] (a vLLM connector key of 135 bytes with ids of up to 120): the calling
/// thread then allocates nothing and the publishing thread frees nothing, and it reads the
/// strings from the queue's ring, which it walks in order, instead of from a heap block last
/// written on another core. Longer strings share one heap allocation. The record is 280 bytes
/// either way, so a full default queue of 65,536 calls holds 18.4 MB.
#[derive(Debug)]
pub(crate) struct ObjectEvents {
    strings: Strings,
    tenant_len: u32,
    key_len: u32,
    removed: MediumSet,
    stored: MediumSet,
}

/// The most bytes of tenant, key and group that a record carries without an allocation.
pub(crate) const INLINE_BYTES: usize = 256;

/// Tenant, key and group, concatenated.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "the inline variant is the point: boxing it would allocate on every call"
)]
enum Strings {
    Inline { len: u16, bytes: [u8; INLINE_BYTES] },
    Heap(Box<[u8]>),
}

impl Strings {
    fn new(parts: [&[u8]; 3]) -> Strings {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > INLINE_BYTES {
            return Strings::Heap(parts.concat().into_boxed_slice());
        }
        let mut bytes = [0; INLINE_BYTES];
        let mut at = 0;
        for part in parts {
            bytes[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Strings::Inline {
            len: len as u16,
            bytes,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Strings::Inline { len, bytes } => &bytes[..*len as usize],
            Strings::Heap(bytes) => bytes,
        }
    }
}

impl ObjectEvents {
    /// `None` when a string is longer than 4 GiB, which no msgpack `str` or `bin` can carry.
    pub(crate) fn new(
        tenant: &[u8],
        key: &[u8],
        group: &[u8],
        removed: MediumSet,
        stored: MediumSet,
    ) -> Option<ObjectEvents> {
        let tenant_len = u32::try_from(tenant.len()).ok()?;
        let key_len = u32::try_from(key.len()).ok()?;
        u32::try_from(group.len()).ok()?;
        Some(ObjectEvents {
            strings: Strings::new([tenant, key, group]),
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

    /// Whether the call made the object readable on a medium it was not on: such a call
    /// must stop a RemoveAll that scanned before it from clearing the tenant.
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

    fn kinds(o: &ObjectEvents) -> Vec<(EventKind, Option<Medium>)> {
        o.events().map(|e| (e.kind, e.medium)).collect()
    }

    #[test]
    fn removed_come_before_stored_and_cpu_before_disk() {
        let o = ObjectEvents::new(
            b"t",
            b"k",
            b"g",
            MediumSet::from([Medium::Disk]),
            MediumSet::from([Medium::Cpu]),
        )
        .unwrap();
        assert_eq!(
            kinds(&o),
            [
                (EventKind::Removed, Some(Medium::Disk)),
                (EventKind::Stored, Some(Medium::Cpu))
            ]
        );
        assert_eq!(o.len(), 2);
        let both = ObjectEvents::new(
            b"t",
            b"k",
            b"",
            MediumSet::EMPTY,
            MediumSet::from([Medium::Disk, Medium::Cpu]),
        )
        .unwrap();
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
        let o = ObjectEvents::new(
            b"",
            b"k\0\xff",
            b"\xc3",
            MediumSet::EMPTY,
            MediumSet::from([Medium::Cpu]),
        )
        .unwrap();
        let e = o.events().next().unwrap();
        assert_eq!(
            (e.tenant, e.key, e.group),
            (&b""[..], &b"k\0\xff"[..], &b"\xc3"[..])
        );
        assert_eq!(o.tenant(), b"");
        assert!(o.adds_medium());
    }

    #[test]
    fn strings_that_do_not_fit_inline_come_back_too() {
        for len in [INLINE_BYTES - 2, INLINE_BYTES - 1, INLINE_BYTES, 1 << 20] {
            let key: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let o = ObjectEvents::new(
                b"t",
                &key,
                b"g",
                MediumSet::EMPTY,
                MediumSet::from([Medium::Cpu]),
            )
            .unwrap();
            let inline = matches!(o.strings, Strings::Inline { .. });
            assert_eq!(inline, len + 2 <= INLINE_BYTES, "{len}");
            let e = o.events().next().unwrap();
            assert_eq!((e.tenant, e.key, e.group), (&b"t"[..], &key[..], &b"g"[..]));
        }
    }

    #[test]
    fn a_queued_call_with_256_bytes_of_strings_fits_in_its_record() {
        // The memory figures of docs/performance.md count on it.
        assert_eq!(std::mem::size_of::<ObjectEvents>(), 280);
        let o = ObjectEvents::new(
            &[b'x'; 19],
            &[b'k'; 224],
            &[b'g'; 13],
            MediumSet::EMPTY,
            MediumSet::EMPTY,
        );
        assert!(matches!(o.unwrap().strings, Strings::Inline { .. }));
    }
}
