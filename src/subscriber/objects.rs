//! The objects of one tenant: key → media, in little memory. An index of millions of
//! objects is mostly keys; a `HashMap<Vec<u8>, _>` pays, per object, a 24-byte `Vec` in a
//! table slot and a heap allocation of its own (32 bytes for a key of up to 24). Here the
//! keys and their media sit one after another in one buffer, and the hash table holds only
//! where each starts: about a third of the memory for short keys, and no allocation per
//! object.

use crate::media::MediumSet;
use hashbrown::HashTable;
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Range;

/// Garbage (the entries of removed objects) below this many bytes is left in place.
const MIN_GARBAGE: usize = 1 << 16;

/// Key → media of one tenant's objects. Hashed, not ordered: a follower applies millions
/// of events a second, and keys often share long prefixes, which an ordered map compares
/// again at every level; [`Index::iter`](super::Index::iter) sorts. Hashed with foldhash,
/// seeded per process: several times faster than the standard SipHash on 40-byte keys, and
/// the keys come from the master the reader chose to follow.
#[derive(Clone, Default)]
pub struct Objects {
    /// Each object written once: its media (one byte), its key's length (LEB128), its key.
    /// A removed object's entry stays, its media zero, until the garbage is worth
    /// compacting.
    entries: Vec<u8>,
    /// Where each object present starts in `entries`, hashed by its key.
    table: HashTable<usize>,
    hasher: foldhash::fast::RandomState,
    /// Bytes of `entries` that belong to removed objects.
    garbage: usize,
}

/// Where the key of the entry that starts at `at` lies in `entries`.
fn key_range(entries: &[u8], at: usize) -> Range<usize> {
    let (mut len, mut shift, mut i) = (0usize, 0, at + 1);
    loop {
        let byte = entries[i];
        len |= usize::from(byte & 0x7f) << shift;
        i += 1;
        if byte & 0x80 == 0 {
            return i..i + len;
        }
        shift += 7;
    }
}

/// The key of the entry that starts at `at`.
fn key_at(entries: &[u8], at: usize) -> &[u8] {
    &entries[key_range(entries, at)]
}

impl Objects {
    /// How many objects.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The media `key` is readable on, if it is held.
    pub fn get(&self, key: &[u8]) -> Option<MediumSet> {
        let hash = self.hasher.hash_one(key);
        let entries = &self.entries;
        self.table
            .find(hash, |&at| key_at(entries, at) == key)
            .map(|&at| MediumSet::from_bits(entries[at]))
    }

    /// Every object: key and media, in no order (the order they were first stored in,
    /// read from one buffer front to back).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], MediumSet)> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || loop {
            let media = *self.entries.get(at)?;
            let key = key_range(&self.entries, at);
            at = key.end;
            if media != 0 {
                return Some((&self.entries[key], MediumSet::from_bits(media)));
            }
        })
    }

    /// Every key, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.iter().map(|(key, _)| key)
    }

    /// Every object's media, in no order.
    pub fn values(&self) -> impl Iterator<Item = MediumSet> + '_ {
        self.iter().map(|(_, media)| media)
    }

    /// Sets `key`'s media to `change(its media now)` (empty when not held); an empty result
    /// removes it. Returns the media before.
    pub(crate) fn update(
        &mut self,
        key: &[u8],
        change: impl FnOnce(MediumSet) -> MediumSet,
    ) -> MediumSet {
        let hash = self.hasher.hash_one(key);
        let entries = &mut self.entries;
        match self
            .table
            .find_entry(hash, |&at| key_at(entries, at) == key)
        {
            Ok(found) => {
                let at = *found.get();
                let before = MediumSet::from_bits(entries[at]);
                let after = change(before);
                if after.is_empty() {
                    found.remove();
                    entries[at] = 0;
                    self.garbage += key_range(entries, at).end - at;
                    self.compact_if_worth();
                } else {
                    entries[at] = after.bits();
                }
                before
            }
            Err(_) => {
                let after = change(MediumSet::EMPTY);
                if !after.is_empty() {
                    let at = entries.len();
                    entries.push(after.bits());
                    let mut len = key.len();
                    while len >= 0x80 {
                        entries.push((len & 0x7f) as u8 | 0x80);
                        len >>= 7;
                    }
                    entries.push(len as u8);
                    entries.extend_from_slice(key);
                    let (hasher, entries) = (&self.hasher, &self.entries);
                    self.table
                        .insert_unique(hash, at, |&at| hasher.hash_one(key_at(entries, at)));
                }
                MediumSet::EMPTY
            }
        }
    }

    /// Once removed objects take more than the present ones (and [`MIN_GARBAGE`]), slides
    /// the present ones down over the gaps, in place (no second buffer at the peak), and
    /// gives the freed end back: amortized, each byte moves at most once per byte removed.
    fn compact_if_worth(&mut self) {
        if self.garbage < MIN_GARBAGE || self.garbage * 2 < self.entries.len() {
            return;
        }
        let mut starts: Vec<&mut usize> = self.table.iter_mut().collect();
        starts.sort_unstable_by_key(|at| **at);
        let mut kept = 0;
        for at in starts {
            let entry = *at..key_range(&self.entries, *at).end;
            let len = entry.len();
            self.entries.copy_within(entry, kept);
            *at = kept;
            kept += len;
        }
        self.entries.truncate(kept);
        self.entries.shrink_to(kept + kept / 2);
        self.garbage = 0;
    }
}

impl PartialEq for Objects {
    /// The same keys with the same media, however each was written.
    fn eq(&self, other: &Objects) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .all(|(key, media)| other.get(key) == Some(media))
    }
}

impl Eq for Objects {}

impl fmt::Debug for Objects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<'a> IntoIterator for &'a Objects {
    type Item = (&'a [u8], MediumSet);
    type IntoIter = Box<dyn Iterator<Item = (&'a [u8], MediumSet)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::Medium;
    use std::collections::HashMap;

    fn cpu(_: MediumSet) -> MediumSet {
        MediumSet::EMPTY.with(Medium::Cpu)
    }

    #[test]
    fn keys_of_every_length_are_found_again() {
        let mut objects = Objects::default();
        let keys: Vec<Vec<u8>> = [0, 1, 127, 128, 300, 20_000]
            .iter()
            .map(|&n| (0..n).map(|i| (i % 251) as u8).collect())
            .collect();
        for key in &keys {
            assert_eq!(objects.update(key, cpu), MediumSet::EMPTY);
        }
        for key in &keys {
            assert_eq!(
                objects.get(key),
                Some(cpu(MediumSet::EMPTY)),
                "{}",
                key.len()
            );
        }
        assert_eq!(objects.len(), keys.len());
        // Below the garbage worth compacting: removed, every byte written is garbage.
        for key in &keys {
            objects.update(key, |_| MediumSet::EMPTY);
        }
        assert!(objects.is_empty());
        assert_eq!(
            objects.garbage,
            objects.entries.len(),
            "every removed byte counted"
        );
    }

    #[test]
    fn removing_most_objects_compacts_and_keeps_the_rest() {
        // Against a HashMap: the same updates, the same objects after each round.
        let mut objects = Objects::default();
        let mut truth: HashMap<Vec<u8>, MediumSet> = HashMap::new();
        for round in 0..4u32 {
            for i in 0..50_000u32 {
                let key = format!("obj-{round}-{i:06}").into_bytes();
                let medium = if i % 3 == 0 {
                    Medium::Disk
                } else {
                    Medium::Cpu
                };
                objects.update(&key, |m| m.with(medium));
                let m = truth.entry(key).or_default();
                *m = m.with(medium);
            }
            // Removes nine objects in ten of every round so far.
            let gone: Vec<Vec<u8>> = truth
                .keys()
                .filter(|k| k[k.len() - 1] != b'7')
                .cloned()
                .collect();
            for key in gone {
                objects.update(&key, |_| MediumSet::EMPTY);
                truth.remove(&key);
            }
            assert_eq!(objects.len(), truth.len());
            for (key, media) in &truth {
                assert_eq!(objects.get(key), Some(*media));
            }
            assert!(
                objects.garbage * 2 < objects.entries.len() + 2 * MIN_GARBAGE,
                "compacted: {} bytes of garbage in {}",
                objects.garbage,
                objects.entries.len()
            );
        }
        let mut copy = Objects::default();
        for (key, media) in &truth {
            copy.update(key, |_| *media);
        }
        assert_eq!(objects, copy, "equal whatever the order of writing");
        copy.update(b"obj-0-000007", |_| MediumSet::EMPTY);
        assert_ne!(objects, copy);
    }
}
