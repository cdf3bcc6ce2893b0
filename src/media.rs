//! Logical media, the replica kinds that collapse onto them, and media sets.

use std::fmt;

/// A logical storage tier as subscribers see it: the wire knows only these two.
/// Deserializes from its name on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    /// Memory replicas.
    Cpu,
    /// Every persistent replica: disk, local disk, NVMe-oF SSD, DFS.
    Disk,
}

impl Medium {
    /// Both media, in the order a call announces them: `cpu` before `disk`.
    pub const ALL: [Medium; 2] = [Medium::Cpu, Medium::Disk];

    /// The name on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Medium::Cpu => "cpu",
            Medium::Disk => "disk",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            Medium::Cpu => MediumSet::CPU_BIT,
            Medium::Disk => MediumSet::DISK_BIT,
        }
    }
}

impl fmt::Display for Medium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of a replica in the master's metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaKind {
    /// A memory replica.
    Memory,
    /// A disk replica.
    Disk,
    /// A replica on a client's local disk.
    LocalDisk,
    /// A replica on an NVMe-oF SSD.
    NofSsd,
    /// A replica on a distributed file system.
    Dfs,
}

impl ReplicaKind {
    /// The medium this kind of replica is announced on: memory is `cpu`, everything else `disk`.
    pub const fn medium(self) -> Medium {
        match self {
            ReplicaKind::Memory => Medium::Cpu,
            ReplicaKind::Disk | ReplicaKind::LocalDisk | ReplicaKind::NofSsd | ReplicaKind::Dfs => {
                Medium::Disk
            }
        }
    }
}

/// A set of media: a copyable value with at most two members, iterated `cpu` first.
///
/// ```
/// use mooncake_kv_events::{Medium, MediumSet, ReplicaKind};
/// let set = MediumSet::EMPTY.with(ReplicaKind::Dfs.medium()).with(Medium::Cpu);
/// assert_eq!(set.iter().collect::<Vec<_>>(), [Medium::Cpu, Medium::Disk]);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MediumSet(Bits);

/// The four possible sets as a byte whose other 252 values cannot be built, so no code has
/// to decide what they would mean.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
enum Bits {
    #[default]
    Empty = 0,
    Cpu = MediumSet::CPU_BIT,
    Disk = MediumSet::DISK_BIT,
    Both = MediumSet::CPU_BIT | MediumSet::DISK_BIT,
}

impl MediumSet {
    const CPU_BIT: u8 = 1;
    const DISK_BIT: u8 = 2;

    /// The empty set.
    pub const EMPTY: MediumSet = MediumSet(Bits::Empty);

    /// The set whose bit 0 is `cpu` and bit 1 is `disk`, the form the C++ bridge passes.
    /// Higher bits name no medium and are ignored.
    pub const fn from_bits(bits: u8) -> MediumSet {
        MediumSet(match bits & (Self::CPU_BIT | Self::DISK_BIT) {
            0 => Bits::Empty,
            Self::CPU_BIT => Bits::Cpu,
            Self::DISK_BIT => Bits::Disk,
            _ => Bits::Both,
        })
    }

    /// The bits of [`MediumSet::from_bits`].
    pub const fn bits(self) -> u8 {
        self.0 as u8
    }

    /// This set with `medium` added.
    #[must_use]
    pub const fn with(self, medium: Medium) -> MediumSet {
        MediumSet::from_bits(self.bits() | medium.bit())
    }

    /// Whether `medium` is a member.
    pub const fn contains(self, medium: Medium) -> bool {
        self.bits() & medium.bit() != 0
    }

    /// Whether the set has no member.
    pub const fn is_empty(self) -> bool {
        self.bits() == 0
    }

    /// The number of members, 0 to 2.
    pub const fn len(self) -> usize {
        self.bits().count_ones() as usize
    }

    /// The members of `self` that `other` lacks.
    #[must_use]
    pub const fn minus(self, other: MediumSet) -> MediumSet {
        MediumSet::from_bits(self.bits() & !other.bits())
    }

    /// The members, `cpu` before `disk`.
    pub fn iter(self) -> impl Iterator<Item = Medium> {
        Medium::ALL.into_iter().filter(move |m| self.contains(*m))
    }
}

impl FromIterator<Medium> for MediumSet {
    fn from_iter<I: IntoIterator<Item = Medium>>(media: I) -> Self {
        media.into_iter().fold(MediumSet::EMPTY, MediumSet::with)
    }
}

impl<const N: usize> From<[Medium; N]> for MediumSet {
    fn from(media: [Medium; N]) -> Self {
        media.into_iter().collect()
    }
}

impl fmt::Debug for MediumSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn replica_kinds_collapse_onto_two_media() {
        assert_eq!(ReplicaKind::Memory.medium(), Medium::Cpu);
        for kind in [
            ReplicaKind::Disk,
            ReplicaKind::LocalDisk,
            ReplicaKind::NofSsd,
            ReplicaKind::Dfs,
        ] {
            assert_eq!(kind.medium(), Medium::Disk, "{kind:?}");
        }
    }

    #[test]
    fn a_set_holds_each_medium_once_and_iterates_cpu_first() {
        let set = MediumSet::from([Medium::Disk, Medium::Cpu, Medium::Disk]);
        assert_eq!(set.len(), 2);
        assert_eq!(set.iter().collect::<Vec<_>>(), [Medium::Cpu, Medium::Disk]);
        assert_eq!(format!("{set:?}"), "{Cpu, Disk}");
        assert!(MediumSet::EMPTY.is_empty());
    }

    #[test]
    fn bits_round_trip_and_ignore_unknown_bits() {
        assert_eq!(
            MediumSet::from_bits(0b1111),
            MediumSet::from([Medium::Cpu, Medium::Disk])
        );
        assert_eq!(MediumSet::from_bits(0b10).bits(), 0b10);
        assert_eq!(MediumSet::from_bits(0b100), MediumSet::EMPTY);
    }

    fn any_set() -> impl Strategy<Value = MediumSet> {
        (0u8..4).prop_map(MediumSet::from_bits)
    }

    proptest! {
        #[test]
        fn minus_keeps_exactly_the_members_the_other_lacks(a in any_set(), b in any_set()) {
            let diff = a.minus(b);
            for m in Medium::ALL {
                prop_assert_eq!(diff.contains(m), a.contains(m) && !b.contains(m));
            }
            prop_assert!(diff.minus(a).is_empty());
        }
    }
}
