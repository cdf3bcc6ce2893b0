//! Which objects of a followed index may have changed since they were last asked for: for a
//! reader that keeps a copy of the index (the relay's log) and brings it in line by the
//! objects that moved, not by a walk of millions.

use crate::subscriber::index::{tenant_name, Applied};
use crate::wire::{Change, Field};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// The keys named in one tenant. Hashed as [`Objects`](crate::subscriber::Objects) is.
pub type Keys = HashSet<Vec<u8>, foldhash::fast::RandomState>;

/// The objects of one publisher's index that may differ from what they were when
/// [`Follower::take_changes`](super::Follower::take_changes) was last called for it.
/// Every other object is as it was then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Any object may differ: the index was replaced by a snapshot, or changes are not
    /// tracked ([`FollowOptions::track_changes`](super::FollowOptions::track_changes)).
    /// The other fields are then empty.
    pub all: bool,
    /// Tenant → keys a `stored` or `removed` named (tenants as the index names them: an
    /// empty one is `default`). A tenant in `cleared` has none here.
    pub objects: BTreeMap<Vec<u8>, Keys>,
    /// Tenants a `cleared` emptied: any object they held or hold may differ.
    pub cleared: BTreeSet<Vec<u8>>,
}

impl Changes {
    /// Any object may differ.
    pub fn everything() -> Changes {
        Changes {
            all: true,
            ..Changes::default()
        }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.all && self.objects.is_empty() && self.cleared.is_empty()
    }

    /// The objects named in `objects`, all tenants together.
    pub fn objects_len(&self) -> usize {
        self.objects.values().map(HashSet::len).sum()
    }

    /// Adds what changed afterwards.
    pub fn merge(&mut self, later: Changes) {
        if self.all || later.all {
            *self = Changes::everything();
            return;
        }
        for tenant in later.cleared {
            self.objects.remove(&tenant);
            self.cleared.insert(tenant);
        }
        for (tenant, keys) in later.objects {
            if !self.cleared.contains(&tenant) {
                self.objects.entry(tenant).or_default().extend(keys);
            }
        }
    }

    /// Notes what an event the index took did. Names are copied only when new.
    pub(super) fn note(&mut self, change: &Change<'_>, applied: Applied) {
        let &Field::Bytes(tenant) = &change.tenant_id else {
            return;
        };
        let tenant = tenant_name(tenant);
        if self.all || self.cleared.contains(tenant) {
            return;
        }
        match (applied, &change.object_key) {
            (Applied::Cleared(_), _) => {
                self.objects.remove(tenant);
                self.cleared.insert(tenant.to_vec());
            }
            (Applied::Stored | Applied::Removed, Field::Bytes(key)) => {
                let keys = match self.objects.get_mut(tenant) {
                    Some(keys) => keys,
                    None => self.objects.entry(tenant.to_vec()).or_default(),
                };
                if !keys.contains(*key) {
                    keys.insert(key.to_vec());
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change<'a>(kind: &'a str, tenant: &'a str, key: &'a str) -> Change<'a> {
        Change {
            event_type: Field::Bytes(kind.as_bytes()),
            tenant_id: Field::Bytes(tenant.as_bytes()),
            object_key: if key.is_empty() {
                Field::Absent
            } else {
                Field::Bytes(key.as_bytes())
            },
            medium: Field::Bytes(b"cpu"),
        }
    }

    fn keys(changes: &Changes, tenant: &str) -> Vec<String> {
        let mut keys: Vec<String> = changes.objects[tenant.as_bytes()]
            .iter()
            .map(|k| String::from_utf8(k.clone()).unwrap())
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn notes_each_object_once_under_the_tenant_the_index_names() {
        let mut changes = Changes::default();
        changes.note(&change("stored", "", "a"), Applied::Stored);
        changes.note(&change("removed", "default", "a"), Applied::Removed);
        changes.note(&change("stored", "t", "b"), Applied::Stored);
        assert_eq!(keys(&changes, "default"), ["a"]);
        assert_eq!(keys(&changes, "t"), ["b"]);
        assert_eq!(changes.objects_len(), 2);
        assert!(!changes.is_empty());
    }

    #[test]
    fn a_cleared_tenant_stands_for_all_its_objects() {
        let mut changes = Changes::default();
        changes.note(&change("stored", "t", "a"), Applied::Stored);
        changes.note(&change("cleared", "t", ""), Applied::Cleared(1));
        changes.note(&change("stored", "t", "b"), Applied::Stored);
        assert!(changes.objects.is_empty());
        assert_eq!(changes.cleared, BTreeSet::from([b"t".to_vec()]));

        let mut earlier = Changes::default();
        earlier.note(&change("stored", "t", "x"), Applied::Stored);
        earlier.note(&change("stored", "u", "y"), Applied::Stored);
        earlier.merge(changes);
        assert_eq!(earlier.cleared, BTreeSet::from([b"t".to_vec()]));
        assert_eq!(keys(&earlier, "u"), ["y"]);
        assert_eq!(earlier.objects_len(), 1);
    }

    #[test]
    fn everything_absorbs_what_it_is_merged_with() {
        let mut changes = Changes::default();
        changes.note(&change("stored", "t", "a"), Applied::Stored);
        changes.merge(Changes::everything());
        assert_eq!(changes, Changes::everything());
        changes.note(&change("stored", "t", "b"), Applied::Stored);
        assert_eq!(changes, Changes::everything());
        let mut empty = Changes::default();
        assert!(empty.is_empty());
        empty.merge(Changes::default());
        assert!(empty.is_empty());
    }
}
