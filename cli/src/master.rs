//! A tiny model of the metadata master for the demo: the replicas of each object, so that
//! every call gets the media sets the master would capture before and after its mutation,
//! and a workload that makes each call of the calls' table (docs/spec.md section 3) the way the master does.

use mooncake_kv_events::{Config, Medium, MediumSet, NonUtf8, Publisher, ReplicaKind, Snapshot};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// The tenants the workload spreads its objects over; empty is the default tenant.
pub(crate) const TENANTS: [&str; 3] = ["", "tenant-a", "tenant-b"];
/// The groups; empty goes on the wire as nil.
const GROUPS: [&str; 3] = ["group-0", "group-1", ""];

/// An object's identity in the master: tenant and key. Keys are bytes, not text.
type ObjectId = (&'static str, Vec<u8>);

#[derive(Debug)]
struct Object {
    group: &'static str,
    replicas: Vec<ReplicaKind>,
}

fn media(replicas: &[ReplicaKind]) -> MediumSet {
    replicas.iter().map(|kind| kind.medium()).collect()
}

/// Events of each type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) stored: u64,
    pub(crate) removed: u64,
    pub(crate) cleared: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.stored += other.stored;
        self.removed += other.removed;
        self.cleared += other.cleared;
    }
}

/// One kind of master operation in the workload: how many objects it touched and which
/// events the contract says its calls publish.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) operation: &'static str,
    pub(crate) objects: u64,
    pub(crate) expected: Counts,
}

/// What the publisher's config changes in what each call publishes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Policy {
    /// `reannounce_remaining`: a call that removes a medium stores every medium left.
    reannounce_remaining: bool,
    /// `non_utf8 = skip`: an object whose key is not UTF-8 publishes nothing.
    skip_non_utf8: bool,
}

impl Policy {
    pub(crate) fn of(config: &Config) -> Policy {
        Policy {
            reannounce_remaining: config.reannounce_remaining,
            skip_non_utf8: config.non_utf8.parse() == Ok(NonUtf8::Skip),
        }
    }

    /// Whether the publisher leaves `key`'s events out (the model's tenants and groups
    /// are UTF-8).
    fn skips(self, key: &[u8]) -> bool {
        self.skip_non_utf8 && std::str::from_utf8(key).is_err()
    }
}

/// The metadata, shared with the publisher's snapshot thread: each change and the call that
/// announces it happen under its lock, and the snapshot copies it under the same lock.
type Metadata = Arc<Mutex<BTreeMap<ObjectId, Object>>>;

/// The master's metadata, reduced to what the publisher's calls need.
#[derive(Debug)]
pub(crate) struct Master<'p> {
    publisher: &'p Publisher,
    policy: Policy,
    objects: Metadata,
    /// When the workload is paced: its start and calls per second.
    pace: Option<(Instant, f64)>,
    calls: u64,
    /// Per tenant, the calls so far that added a medium: a RemoveAll's `cleared` goes out
    /// only if none came since its scan began.
    additions: HashMap<&'static str, u64>,
    /// The operations, in the order the workload first made them.
    pub(crate) rows: Vec<Row>,
    /// RemoveAll results that should publish no `cleared`.
    pub(crate) cleared_suppressed: u64,
}

impl<'p> Master<'p> {
    /// A master whose objects are the publisher's object source, making at most
    /// `calls_per_second` calls when given.
    fn new(publisher: &'p Publisher, policy: Policy, calls_per_second: Option<f64>) -> Master<'p> {
        let objects = Metadata::default();
        let source = Arc::clone(&objects);
        publisher.set_object_source(move |_: Option<&[u8]>, out: &mut Snapshot| {
            // A real master copies one shard at a time; the demo's metadata is one shard.
            let copied: Vec<_> = lock(&source)
                .iter()
                .map(|((tenant, key), o)| (*tenant, key.clone(), o.group, media(&o.replicas)))
                .collect();
            for (tenant, key, group, media) in copied {
                out.add(tenant.as_bytes(), &key, group.as_bytes(), media)?;
            }
            Ok(())
        });
        Master {
            publisher,
            policy,
            objects,
            pace: calls_per_second.map(|rate| (Instant::now(), rate)),
            calls: 0,
            additions: HashMap::new(),
            rows: Vec::new(),
            cleared_suppressed: 0,
        }
    }

    /// The events the whole workload should have published.
    pub(crate) fn expected(&self) -> Counts {
        let mut total = Counts::default();
        for row in &self.rows {
            total.add(row.expected);
        }
        total
    }

    /// How many objects the master still holds.
    pub(crate) fn live_objects(&self) -> usize {
        lock(&self.objects).len()
    }

    /// The objects the master holds on some medium and publishes, in key order: tenant
    /// (empty for the default tenant), key and media. They are what a subscriber that saw
    /// every event should hold.
    pub(crate) fn holdings(&self) -> Vec<(&'static str, Vec<u8>, MediumSet)> {
        lock(&self.objects)
            .iter()
            .filter(|((_, key), _)| !self.policy.skips(key))
            .map(|((tenant, key), object)| (*tenant, key.clone(), media(&object.replicas)))
            .filter(|(_, _, media)| !media.is_empty())
            .collect()
    }

    /// Waits, when the workload is paced, until the next call is due.
    fn paced(&mut self) {
        self.calls += 1;
        if let Some((start, rate)) = self.pace {
            let due = start + Duration::from_secs_f64(self.calls as f64 / rate);
            thread::sleep(due.saturating_duration_since(Instant::now()));
        }
    }

    fn row(&mut self, operation: &'static str) -> &mut Row {
        let at = match self.rows.iter().position(|r| r.operation == operation) {
            Some(at) => at,
            None => {
                self.rows.push(Row {
                    operation,
                    objects: 0,
                    expected: Counts::default(),
                });
                self.rows.len() - 1
            }
        };
        &mut self.rows[at]
    }

    fn media_of(&self, id: &ObjectId) -> Option<MediumSet> {
        lock(&self.objects).get(id).map(|o| media(&o.replicas))
    }

    /// Notes the events of one call that turned `before` into `after` for `id`.
    fn expect(
        &mut self,
        operation: &'static str,
        id: &ObjectId,
        before: MediumSet,
        after: MediumSet,
    ) {
        if self.policy.skips(&id.1) {
            return;
        }
        let removed = before.minus(after);
        let stored = if self.policy.reannounce_remaining && !removed.is_empty() {
            after
        } else {
            after.minus(before)
        };
        // The publisher takes any `stored`, a reannounced one too, for an addition.
        if !stored.is_empty() {
            *self.additions.entry(id.0).or_default() += 1;
        }
        let expected = &mut self.row(operation).expected;
        expected.stored += stored.len() as u64;
        expected.removed += removed.len() as u64;
    }

    /// A Put, BatchPut or Upsert commits `replicas`: `on_put_commit`.
    fn commit(
        &mut self,
        operation: &'static str,
        id: ObjectId,
        group: &'static str,
        replicas: Vec<ReplicaKind>,
    ) {
        let after = media(&replicas);
        {
            let mut objects = lock(&self.objects);
            self.publisher.on_put_commit(id.0, &id.1, group, after);
            objects.insert(id.clone(), Object { group, replicas });
        }
        // A commit announces every medium, even one already announced.
        self.expect(operation, &id, MediumSet::EMPTY, after);
        self.paced();
    }

    fn put(
        &mut self,
        operation: &'static str,
        id: ObjectId,
        group: &'static str,
        replicas: Vec<ReplicaKind>,
    ) {
        self.row(operation).objects += 1;
        self.commit(operation, id, group, replicas);
    }

    /// Any other mutation of `id`'s replicas: `on_medium_delta(before, after)`. An object
    /// left without a replica is erased.
    fn mutate(
        &mut self,
        operation: &'static str,
        id: &ObjectId,
        change: impl FnOnce(&mut Vec<ReplicaKind>),
    ) {
        let (before, after) = {
            let mut objects = lock(&self.objects);
            let Some(object) = objects.get_mut(id) else {
                return;
            };
            let (group, before) = (object.group, media(&object.replicas));
            change(&mut object.replicas);
            let after = media(&object.replicas);
            if object.replicas.is_empty() {
                objects.remove(id);
            }
            self.publisher
                .on_medium_delta(id.0, &id.1, group, before, after);
            (before, after)
        };
        self.expect(operation, id, before, after);
        self.row(operation).objects += 1;
        self.paced();
    }

    /// The erase path: `on_medium_delta(before, {})`.
    fn erase(&mut self, operation: &'static str, id: &ObjectId) {
        self.mutate(operation, id, Vec::clear);
    }

    /// Upsert of an existing object: its old value becomes unreadable (`on_medium_delta(old,
    /// {})`), then the new value commits (`on_put_commit`).
    fn upsert(&mut self, id: &ObjectId, replicas: Vec<ReplicaKind>) {
        let Some(group) = lock(&self.objects).get(id).map(|o| o.group) else {
            return;
        };
        self.erase("Upsert", id);
        self.commit("Upsert", id.clone(), group, replicas);
    }

    /// A new Put whose transfer failed before it committed: the master makes no call.
    fn failed_put(&mut self) {
        self.row("Put that failed before commit").objects += 1;
    }

    /// RemoveAll over `tenant`: `begin_remove_all`, `on_medium_delta(before, {})` per
    /// object, `on_remove_all`. `put_during_loop`, if any, commits halfway through the loop,
    /// as another client's Put may; the loop does not see it, and it must not be cleared.
    fn remove_all(
        &mut self,
        operation: &'static str,
        tenant: &'static str,
        mut put_during_loop: Option<(ObjectId, &'static str, Vec<ReplicaKind>)>,
    ) {
        self.row(operation);
        let scan = self.publisher.begin_remove_all();
        let additions_at_scan = self.additions.get(tenant).copied();
        let ids: Vec<ObjectId> = lock(&self.objects)
            .keys()
            .filter(|(t, _)| *t == tenant)
            .cloned()
            .collect();
        for (n, id) in ids.iter().enumerate() {
            if n == ids.len() / 2 {
                if let Some((id, group, replicas)) = put_during_loop.take() {
                    self.put("Put committed during that RemoveAll", id, group, replicas);
                }
            }
            self.erase(operation, id);
        }
        let removed = ids.len() as u64;
        self.publisher.on_remove_all(&scan, tenant, removed, 0);
        let unchanged = self.additions.get(tenant).copied() == additions_at_scan;
        if removed > 0 && unchanged {
            self.row(operation).expected.cleared += 1;
        } else {
            self.cleared_suppressed += 1;
        }
    }
}

/// The id of the workload's object `i`: tenants and keys in turn. The keys of objects 1
/// and 3 are not UTF-8, as keys may be: they go on the wire as `bin`, and `tail` prints
/// them as hex. Object 1 is among the first the demo prints; object 3, of the default
/// tenant, is still there at the end, so the final index holds a `bin` key too.
fn object_id(i: usize) -> ObjectId {
    let mut key = format!("obj-{i:06}").into_bytes();
    if i == 1 || i == 3 {
        key.extend_from_slice(&[0xff, 0xfe]);
    }
    (TENANTS[i % TENANTS.len()], key)
}

fn group(i: usize) -> &'static str {
    GROUPS[(i / TENANTS.len()) % GROUPS.len()]
}

/// The replicas object `i` is first committed with.
fn first_replicas(i: usize) -> Vec<ReplicaKind> {
    use ReplicaKind::*;
    match (i / 10) % 5 {
        0 => vec![Memory],
        1 => vec![Memory, Memory],
        2 => vec![Memory, Disk],
        3 => vec![Memory, LocalDisk, Dfs],
        _ => vec![NofSsd],
    }
}

/// The metadata, whatever a thread that panicked holding it left.
fn lock(objects: &Metadata) -> MutexGuard<'_, BTreeMap<ObjectId, Object>> {
    objects.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the workload over `n` objects, making each kind of call the master makes, at most
/// `calls_per_second` when given; returns the model, whose rows say what each operation
/// should have published. The model is the publisher's object source meanwhile.
pub(crate) fn run(
    publisher: &Publisher,
    policy: Policy,
    n: usize,
    calls_per_second: Option<f64>,
) -> Master<'_> {
    use ReplicaKind::*;
    let mut master = Master::new(publisher, policy, calls_per_second);
    let ids: Vec<ObjectId> = (0..n).map(object_id).collect();
    // Each later step works on the tenth of the objects whose index ends in `digit`.
    let tenth =
        |digit: usize| -> Vec<ObjectId> { ids.iter().skip(digit).step_by(10).cloned().collect() };

    // Put and BatchPut commit with the media of their completed replicas.
    for (i, id) in ids.iter().enumerate() {
        let operation = if i < n / 2 { "Put" } else { "BatchPut" };
        master.put(operation, id.clone(), group(i), first_replicas(i));
    }
    for _ in 0..n.div_ceil(100) {
        master.failed_put();
    }
    for id in tenth(0) {
        master.upsert(&id, vec![Memory]);
    }
    // Copy completes: a replica on DFS too.
    for id in tenth(1) {
        master.mutate("Copy", &id, |r| r.push(Dfs));
    }
    // Move completes: the first replica now sits on another segment of the same kind, so
    // the media do not change and nothing is published.
    for id in tenth(2) {
        master.mutate("Move", &id, |r| r.rotate_left(1));
    }
    for id in tenth(3) {
        if master.media_of(&id) == Some(MediumSet::from([Medium::Cpu])) {
            master.mutate("Offload cpu -> disk", &id, |r| r.push(Disk));
        }
    }
    for id in tenth(4) {
        if master.media_of(&id) == Some(MediumSet::from([Medium::Disk])) {
            master.mutate("Promotion disk -> cpu", &id, |r| r.push(Memory));
        }
    }
    // Eviction, one memory replica at a time: only the last one on `cpu` is a `removed`.
    // An object's last replica stays here: evicting it would invalidate the object (below).
    for id in tenth(5) {
        loop {
            let replicas = lock(&master.objects).get(&id).map(|o| o.replicas.clone());
            let Some(replicas) = replicas else { break };
            if replicas.len() < 2 || !replicas.contains(&Memory) {
                break;
            }
            master.mutate("Eviction of a replica", &id, |r| {
                if let Some(at) = r.iter().position(|k| *k == Memory) {
                    r.remove(at);
                }
            });
        }
    }
    // Eviction of an object's only replicas invalidates it: the erase path announces it.
    for id in tenth(6) {
        if master.media_of(&id) == Some(MediumSet::from([Medium::Cpu])) {
            master.erase("Eviction that invalidates the object", &id);
        }
    }
    // A client died: the replica it held (the first) goes with its stale handle.
    for id in tenth(7) {
        master.mutate("Stale handle cleanup", &id, |r| {
            r.remove(0);
        });
    }
    for id in tenth(8) {
        master.erase("Remove", &id);
    }
    for id in tenth(9) {
        master.erase("BatchRemove", &id);
    }
    master.remove_all("RemoveAll of tenant-b", "tenant-b", None);
    let late = (("tenant-a", b"late-put".to_vec()), "group-0", vec![Memory]);
    master.remove_all(
        "RemoveAll of tenant-a, a Put during it",
        "tenant-a",
        Some(late),
    );
    master
}
