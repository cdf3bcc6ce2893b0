//! A difference: the events that turn what the log holds into a publisher's state, written
//! at a discontinuity. They are gathered first in a compact form (a kind, a medium, a
//! tenant and a key each), counted into log messages, then encoded a message at a time as
//! the messages are written, over as many turns of the relay as it takes: a difference of
//! millions of events is never held encoded, and the master is read between its messages.

use crate::batch::{self, Batches, Context, Kind, BATCH_OVERHEAD, MAX_EVENTS};
use mooncake_kv_events::subscriber::{Changes, Index};
use mooncake_kv_events::{Medium, MediumSet};
use std::collections::{BTreeSet, HashMap};

/// The events of a difference, in the order they are written: every `removed` and
/// `cleared` before every `stored`.
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// The `removed` and `cleared` events, as [`Events::push`] writes them; once gathered,
    /// every event.
    removed: Vec<u8>,
    /// The `stored` events while they are gathered.
    stored: Vec<u8>,
    /// The tenants the events name, by place.
    tenants: Vec<Vec<u8>>,
    count: u64,
}

/// One event: its kind, its tenant, its key and medium (empty and `None` for a `cleared`).
pub(crate) type Event<'a> = (Kind, &'a [u8], &'a [u8], Option<Medium>);

impl Events {
    /// The events that turn `held` into `truth`, which differ only where `changes` says.
    /// Where the master `restarted` (its subscribers replace their index too), a tenant
    /// whose difference takes more events than a `cleared` and a `stored` per medium it
    /// holds is written that way ([`cheaper_cleared`]); at a gap of the same master an
    /// object both hold is never gone a moment in the log.
    pub(crate) fn between(
        held: &Index,
        truth: &Index,
        changes: &Changes,
        restarted: bool,
    ) -> Events {
        let mut events = Events::default();
        let cleared = if restarted {
            cheaper_cleared(held, truth, changes)
        } else {
            BTreeSet::new()
        };
        for tenant in &cleared {
            events.push(Kind::Cleared, tenant, b"", None);
            for (key, media) in truth.tenant(tenant).into_iter().flatten() {
                for medium in media.iter() {
                    events.push(Kind::Stored, tenant, key, Some(medium));
                }
            }
        }
        walk(held, truth, changes, |kind, tenant, key, medium| {
            if !cleared.contains(tenant) {
                events.push(kind, tenant, key, Some(medium));
            }
        });
        let stored = std::mem::take(&mut events.stored);
        events.removed.extend_from_slice(&stored);
        events
    }

    /// Records `[kind, medium][tenant's place: u32][key's length: u32][key]`, little-endian.
    fn push(&mut self, kind: Kind, tenant: &[u8], key: &[u8], medium: Option<Medium>) {
        let place = match self.tenants.iter().rposition(|t| t == tenant) {
            Some(place) => place,
            None => {
                self.tenants.push(tenant.to_vec());
                self.tenants.len() - 1
            }
        };
        let out = if kind == Kind::Stored {
            &mut self.stored
        } else {
            &mut self.removed
        };
        let kind_code = match kind {
            Kind::Stored => 0,
            Kind::Removed => 1,
            Kind::Cleared => 2,
        };
        let medium_code = match medium {
            None => 0,
            Some(Medium::Cpu) => 1,
            Some(Medium::Disk) => 2,
        };
        out.push(kind_code << 2 | medium_code);
        out.extend_from_slice(&(place as u32).to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        self.count += 1;
    }

    /// The events from byte `at` of the records on, in the order they are written.
    fn from(&self, at: usize) -> Records<'_> {
        Records {
            bytes: &self.removed[at..],
            tenants: &self.tenants,
        }
    }

    /// Every event, in the order they are written.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> Records<'_> {
        self.from(0)
    }
}

/// Events, read from their records.
pub(crate) struct Records<'a> {
    bytes: &'a [u8],
    tenants: &'a [Vec<u8>],
}

impl<'a> Iterator for Records<'a> {
    type Item = Event<'a>;

    fn next(&mut self) -> Option<Event<'a>> {
        let (&tag, rest) = self.bytes.split_first()?;
        let word = |at: usize| -> usize {
            let mut le = [0u8; 4];
            le.copy_from_slice(&rest[at..at + 4]);
            u32::from_le_bytes(le) as usize
        };
        let (place, len) = (word(0), word(4));
        let key = &rest[8..8 + len];
        self.bytes = &rest[8 + len..];
        let kind = match tag >> 2 {
            0 => Kind::Stored,
            1 => Kind::Removed,
            _ => Kind::Cleared,
        };
        let medium = match tag & 3 {
            1 => Some(Medium::Cpu),
            2 => Some(Medium::Disk),
            _ => None,
        };
        Some((kind, &self.tenants[place], key, medium))
    }
}

/// One log message of a difference: its place from 0, how many there are, its batches and
/// the events they hold.
pub(crate) struct Message<'a> {
    pub(crate) part: usize,
    pub(crate) parts: usize,
    pub(crate) payload: Vec<u8>,
    pub(crate) events: Vec<Event<'a>>,
}

/// A difference to write: its events, with every key a master's event has
/// ([`batch::full_event`]), in log messages of at most a given number of bytes of batches
/// (one empty batch when there is no event: the log still notes the new position).
#[derive(Debug)]
pub(crate) struct Difference {
    events: Events,
    context: Context,
    backend: String,
    now: u64,
    /// How many events each message takes, counted before the first is written.
    sizes: Vec<usize>,
    /// Messages handed on so far.
    part: usize,
    /// Where the events of the next message start in the records.
    at: usize,
}

impl Difference {
    /// `events` in messages of at most `max` bytes of batches, stamped `now`.
    pub(crate) fn new(
        events: Events,
        context: Context,
        backend: String,
        now: u64,
        max: usize,
    ) -> Difference {
        let mut difference = Difference {
            events,
            context,
            backend,
            now,
            sizes: Vec::new(),
            part: 0,
            at: 0,
        };
        difference.sizes = difference.count(max);
        difference
    }

    /// How many events each message takes, from a bound of each event's bytes (the same
    /// event with an empty tenant and key, plus their bytes and a header of at most 5 bytes
    /// each).
    fn count(&self, max: usize) -> Vec<usize> {
        let mut empty = HashMap::new();
        let mut sizes = Vec::new();
        let (mut bytes, mut in_part) = (0, 0);
        for (kind, tenant, key, medium) in self.events.from(0) {
            let base = *empty.entry((kind, medium)).or_insert_with(|| {
                let mut out = Vec::new();
                self.encode(&(kind, &[][..], &[][..], medium), &mut out);
                out.len()
            });
            let size = |in_part: usize| {
                let head = if in_part % MAX_EVENTS == 0 {
                    BATCH_OVERHEAD
                } else {
                    0
                };
                head + base + tenant.len() + key.len() + 10
            };
            if in_part > 0 && bytes + size(in_part) > max {
                sizes.push(in_part);
                (bytes, in_part) = (0, 0);
            }
            bytes += size(in_part);
            in_part += 1;
        }
        sizes.push(in_part);
        sizes
    }

    fn encode(&self, event: &Event<'_>, out: &mut Vec<u8>) {
        let (kind, tenant, key, medium) = *event;
        let object = medium.map(|m| (key, m));
        let (context, backend) = (&self.context, &self.backend);
        batch::full_event(out, context, backend, kind, tenant, object, self.now);
    }

    /// How many events.
    pub(crate) fn events(&self) -> u64 {
        self.events.count
    }

    /// Whether every message was handed on.
    pub(crate) fn done(&self) -> bool {
        self.part == self.sizes.len()
    }

    /// The next message, encoded; `None` once every one was handed on.
    pub(crate) fn next_message(&mut self) -> Option<Message<'_>> {
        let size = *self.sizes.get(self.part)?;
        let mut records = self.events.from(self.at);
        let events: Vec<Event<'_>> = records.by_ref().take(size).collect();
        let mut batches = Batches::new(self.now, self.context.dp_rank);
        for event in &events {
            batches.push(|out| self.encode(event, out));
        }
        let mut payload = batches.finish();
        if payload.is_empty() {
            payload = batch::empty(self.now, self.context.dp_rank);
        }
        self.at = self.events.removed.len() - records.bytes.len();
        self.part += 1;
        Some(Message {
            part: self.part - 1,
            parts: self.sizes.len(),
            payload,
            events,
        })
    }
}

/// Calls `event` for each change that turns `held` into `truth`, given that they can
/// differ only where `changes` says (everywhere when it says `all`): a `removed` for a
/// medium `held` has and `truth` has not, a `stored` for the reverse. Its cost is that of
/// the objects compared, not of the index.
fn walk(
    held: &Index,
    truth: &Index,
    changes: &Changes,
    mut event: impl FnMut(Kind, &[u8], &[u8], Medium),
) {
    let mut compare = |tenant: &[u8], key: &[u8], before: MediumSet, after: MediumSet| {
        for medium in before.minus(after).iter() {
            event(Kind::Removed, tenant, key, medium);
        }
        for medium in after.minus(before).iter() {
            event(Kind::Stored, tenant, key, medium);
        }
    };
    // Tenants compared whole: each object of either side, once.
    let whole: BTreeSet<&[u8]> = if changes.all {
        held.tenants().chain(truth.tenants()).collect()
    } else {
        changes.cleared.iter().map(Vec::as_slice).collect()
    };
    for &tenant in &whole {
        let (before, after) = (held.tenant(tenant), truth.tenant(tenant));
        for (key, media) in before.into_iter().flat_map(|o| o.iter()) {
            let now = after.and_then(|o| o.get(key)).unwrap_or(MediumSet::EMPTY);
            compare(tenant, key, media, now);
        }
        for (key, media) in after.into_iter().flat_map(|o| o.iter()) {
            if before
                .and_then(|o| o.get(key))
                .unwrap_or(MediumSet::EMPTY)
                .is_empty()
            {
                compare(tenant, key, MediumSet::EMPTY, media);
            }
        }
    }
    for (tenant, keys) in &changes.objects {
        if !whole.contains(tenant.as_slice()) {
            for key in keys {
                compare(tenant, key, held.get(tenant, key), truth.get(tenant, key));
            }
        }
    }
}

/// The tenants for which a `cleared` then a `stored` per medium of `truth` takes fewer
/// events than the [`walk`] from `held`: a master that restarted with little of its old
/// state costs an event per tenant, not a removal per object the log held.
fn cheaper_cleared(held: &Index, truth: &Index, changes: &Changes) -> BTreeSet<Vec<u8>> {
    let mut events: HashMap<Vec<u8>, u64> = HashMap::new();
    walk(held, truth, changes, |_, tenant, _, _| {
        match events.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                events.insert(tenant.to_vec(), 1);
            }
        }
    });
    events
        .into_iter()
        .filter(|(tenant, n)| {
            let stored: usize = truth
                .tenant(tenant)
                .map_or(0, |objects| objects.values().map(|m| m.len()).sum());
            held.tenant(tenant).is_some() && (1 + stored as u64) < *n
        })
        .map(|(tenant, _)| tenant)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{checked, MAX_EVENTS};

    #[test]
    fn events_come_back_removed_first_and_messages_stay_under_their_bound() {
        let (mut held, mut truth) = (Index::new(), Index::new());
        for i in 0..3000 {
            let key = format!("key-{i}");
            if i % 2 == 0 {
                held.store(b"t", key.as_bytes(), Medium::Cpu);
            }
            if i % 3 == 0 {
                truth.store(b"t", key.as_bytes(), Medium::Disk);
            }
        }
        truth.store(b"u", &[0xff, 0x00], Medium::Cpu);
        let events = Events::between(&held, &truth, &Changes::everything(), false);
        let kinds: Vec<Kind> = events.iter().map(|e| e.0).collect();
        let first_stored = kinds.iter().position(|k| *k == Kind::Stored).unwrap();
        assert!(kinds[first_stored..].iter().all(|k| *k == Kind::Stored));

        let mut sizes = Vec::new();
        let mut applied = held.clone();
        let mut direct = crate::held::Held::new(false);
        for (tenant, key, media) in held.iter() {
            for medium in media.iter() {
                direct.apply_events(&[(Kind::Stored, tenant, key, Some(medium))], 0);
            }
        }
        let total = kinds.len() as u64;
        let mut difference = Difference::new(events, Context::default(), "s".into(), 1, 40_000);
        assert_eq!(difference.events(), total);
        while let Some(message) = difference.next_message() {
            assert_eq!(message.part, sizes.len());
            assert!(message.parts > 3);
            sizes.push(message.payload.len());
            let mut said = 0;
            for batch in checked(&message.payload).expect("batches") {
                assert!(batch.len() <= MAX_EVENTS);
                for change in batch.changes() {
                    applied
                        .apply_change(&change)
                        .expect("an event the index takes");
                    said += 1;
                }
            }
            assert_eq!(said, message.events.len());
            direct.apply_events(&message.events, 1);
        }
        assert!(difference.done());
        assert!(sizes.iter().all(|&n| n <= 40_000), "{sizes:?}");
        assert!(sizes[0] > 30_000, "messages are filled: {sizes:?}");
        assert_eq!(applied, truth, "the messages turn held into the truth");
        assert_eq!(direct.index(), &truth, "as the events they carry do");

        // No event: one empty batch.
        let none = Events::between(&truth, &truth, &Changes::everything(), false);
        let mut none = Difference::new(none, Context::default(), "s".into(), 1, 40_000);
        let message = none.next_message().expect("one message");
        assert_eq!((message.part, message.parts), (0, 1));
        assert_eq!(message.payload, batch::empty(1, 0));
        assert!(none.next_message().is_none());
    }
}
