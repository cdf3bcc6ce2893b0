//! The relay's decisions on a store in memory and a follower of the tests' making: what is
//! written when (the master's messages verbatim, a difference only at a discontinuity),
//! who writes (a writer, a standby that takes over), snapshots by the rule and a relay
//! started from one, NATS away and back, the bucket beside the log.

use super::*;
use crate::batch::{checked, full_event, Batches, Kind};
use crate::memory::Memory;
use crate::store::Logged;
use mooncake_kv_events::subscriber::{Index, Status};
use mooncake_kv_events::wire::{Event, Message};
use mooncake_kv_events::Medium;

const BACKEND: &str = "store-a";
const SUBJECT: &str = "kv-events.store-a";

/// A follower of the tests' making: per publisher an index, a status, the messages
/// "applied" and the changes since they were last taken.
struct Fake {
    indexes: Vec<Index>,
    statuses: Vec<Status>,
    applied: Vec<AppliedMessage>,
    changes: Vec<Changes>,
    events: u64,
}

type Change<'a> = (Kind, &'a str, &'a str, Medium);

impl Fake {
    fn new(upstreams: usize) -> Fake {
        Fake {
            indexes: vec![Index::new(); upstreams],
            statuses: (0..upstreams)
                .map(|i| Status {
                    endpoint: format!("tcp://m{i}:5557"),
                    incarnation: None,
                    next_sequence: None,
                    in_sync: false,
                    last_heard: None,
                    failing: None,
                })
                .collect(),
            applied: Vec::new(),
            changes: vec![Changes::everything(); upstreams],
            events: 0,
        }
    }

    /// A snapshot replaced publisher `i`'s index: `incarnation`, next sequence `next`.
    fn snapshot(&mut self, i: usize, incarnation: u64, next: u64, objects: &[(&str, &str)]) {
        let mut index = Index::new();
        for (tenant, key) in objects {
            index.store(tenant.as_bytes(), key.as_bytes(), Medium::Cpu);
        }
        self.indexes[i] = index;
        self.changes[i] = Changes::everything();
        let status = &mut self.statuses[i];
        status.incarnation = Some(incarnation);
        status.next_sequence = Some(next);
        status.in_sync = true;
        status.last_heard = Some(Instant::now());
    }

    /// Publisher `i`'s master sends one message of `changes`, which the follower applies.
    fn publish(&mut self, i: usize, changes: &[Change<'_>]) -> Vec<u8> {
        let payload = self.encode(changes);
        self.apply(i, &payload);
        let status = &mut self.statuses[i];
        let sequence = status.next_sequence.expect("after a snapshot");
        self.applied.push(AppliedMessage {
            upstream: i,
            incarnation: status.incarnation.unwrap(),
            sequence,
            payload: payload.clone(),
        });
        status.next_sequence = Some(sequence + 1);
        status.last_heard = Some(Instant::now());
        payload
    }

    /// `lost` messages of publisher `i` the relay never sees (a gap a snapshot filled):
    /// the index has their changes, the applied messages do not.
    fn behind_the_relays_back(&mut self, i: usize, lost: u64, changes: &[Change<'_>]) {
        let payload = self.encode(changes);
        self.apply(i, &payload);
        self.changes[i] = Changes::everything();
        let status = &mut self.statuses[i];
        status.next_sequence = status.next_sequence.map(|n| n + lost);
    }

    fn encode(&self, changes: &[Change<'_>]) -> Vec<u8> {
        let context = Context {
            model_name: Some("llama".into()),
            block_size: Some(16),
            ..Context::default()
        };
        let mut batches = Batches::new(now_ms(), 0);
        for &(kind, tenant, key, medium) in changes {
            batches.push(|out| {
                full_event(
                    out,
                    &context,
                    BACKEND,
                    kind,
                    tenant.as_bytes(),
                    Some((key.as_bytes(), medium)),
                    1,
                );
            });
        }
        Some(batches.finish())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| batch::empty(1, 0))
    }

    fn apply(&mut self, i: usize, payload: &[u8]) {
        for batch in checked(payload).unwrap() {
            for change in batch.changes() {
                let applied = self.indexes[i].apply_change(&change).unwrap();
                self.events += 1;
                if !self.changes[i].all {
                    let (tenant, key) = (change.tenant_id.bytes(), change.object_key.bytes());
                    if let (Some(t), Some(k), Applied::Stored | Applied::Removed) =
                        (tenant, key, applied)
                    {
                        let keys = self.changes[i].objects.entry(t.to_vec()).or_default();
                        keys.insert(k.to_vec());
                    }
                }
            }
        }
    }
}

use mooncake_kv_events::subscriber::Applied;

impl Source for Fake {
    fn poll(&mut self, _wait: Duration) -> Vec<Notice> {
        Vec::new()
    }
    fn take_applied(&mut self) -> Vec<AppliedMessage> {
        std::mem::take(&mut self.applied)
    }
    fn take_changes(&mut self, i: usize) -> Changes {
        std::mem::take(&mut self.changes[i])
    }
    fn index(&self, i: usize) -> &Index {
        &self.indexes[i]
    }
    fn status(&self, i: usize) -> Status {
        self.statuses[i].clone()
    }
    fn freshest(&self) -> Option<usize> {
        (0..self.statuses.len())
            .filter(|&i| self.statuses[i].in_sync)
            .max_by_key(|&i| self.statuses[i].last_heard)
    }
    fn upstreams(&self) -> usize {
        self.indexes.len()
    }
    fn events_in(&self) -> u64 {
        self.events
    }
}

fn options() -> Options {
    Options {
        backend: BACKEND.into(),
        subject_prefix: "kv-events".into(),
        snapshot_every: Duration::from_secs(3600),
        bucket: false,
    }
}

fn relay(fake: Fake, memory: &Memory, options: Options) -> Relay<Fake, Memory> {
    Relay::start(fake, memory.clone(), options).expect("starts")
}

/// A relay of a master whose state is `objects` (incarnation 4, next sequence 0) into
/// `memory`, with a snapshot due at every turn that may write one.
fn snapshotting(memory: &Memory, objects: &[(&str, &str)]) -> Relay<Fake, Memory> {
    let mut fake = Fake::new(1);
    fake.snapshot(0, 4, 0, objects);
    let every = Options {
        snapshot_every: Duration::ZERO,
        ..options()
    };
    relay(fake, memory, every)
}

/// `object-00000`, `object-00001`, ...: `n` keys.
fn object_keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("object-{i:05}")).collect()
}

/// A relay of a master holding `n` objects of tenant `t` (incarnation 1, next sequence 0):
/// from an empty log, a difference of as many `stored`.
fn relay_of_many(memory: &Memory, n: usize) -> Relay<Fake, Memory> {
    let keys = object_keys(n);
    let objects: Vec<(&str, &str)> = keys.iter().map(|k| ("t", k.as_str())).collect();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &objects);
    relay(fake, memory, options())
}

/// Turns until the log is up to date, 100 turns at most.
fn turn_until_up_to_date(relay: &mut Relay<Fake, Memory>) {
    for _ in 0..100 {
        if relay.up_to_date() {
            return;
        }
        turn(relay);
    }
    assert!(relay.up_to_date(), "not up to date after 100 turns");
}

fn turn(relay: &mut Relay<Fake, Memory>) {
    relay.turn(Duration::ZERO).1.expect("the store takes it");
}

/// What a reader of the subject holds: every batch of every message, applied in order.
fn fold(messages: &[Logged]) -> Index {
    let mut index = Index::new();
    for message in messages {
        for batch in checked(&message.payload).expect("batches") {
            for change in batch.changes() {
                index
                    .apply_change(&change)
                    .expect("an event the index takes");
            }
        }
    }
    index
}

fn kinds(messages: &[Logged]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m.header(crate::log::KIND).unwrap_or("?"))
        .collect()
}

fn stored(tenant: &'static str, key: &'static str) -> Change<'static> {
    (Kind::Stored, tenant, key, Medium::Cpu)
}

#[test]
fn a_fresh_log_starts_with_a_difference_then_carries_the_masters_messages_verbatim() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 0xaa, 5, &[("t", "a"), ("t", "b")]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(kinds(&log), ["diff"], "the state the relay joined at");
    assert_eq!(
        log[0].header("Nats-Msg-Id"),
        Some("store-a.00000000000000aa.5.diff-0.0")
    );

    let sent: Vec<Vec<u8>> = (0..3)
        .map(|k| {
            let key = ["c", "d", "e"][k];
            relay.source.publish(
                0,
                &[stored("t", key), (Kind::Removed, "t", "a", Medium::Cpu)],
            )
        })
        .collect();
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(
        kinds(&log),
        ["diff", "events"],
        "three master messages in one log message"
    );
    assert_eq!(&log[1].payload[..], sent.concat(), "verbatim");
    assert_eq!(
        log[1].header("Nats-Msg-Id"),
        Some("store-a.00000000000000aa.5-7")
    );
    assert_eq!(log[1].header(crate::log::NEXT_SEQUENCE), Some("8"));
    assert_eq!(log[1].header(crate::log::PREVIOUS), Some("1"));
    assert_eq!(fold(&log), relay.source.indexes[0]);
    assert_eq!(relay.counters.diffs, 1);
    assert_eq!(
        (
            relay.counters.events_written,
            relay.counters.master_messages
        ),
        (6, 3)
    );
    assert!(relay.up_to_date());
    // Nothing new: nothing written.
    turn(&mut relay);
    assert_eq!(memory.subject(SUBJECT).len(), 2);
}

#[test]
fn a_discontinuity_is_a_difference_with_the_keys_of_the_masters_events_and_only_then() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    relay
        .source
        .publish(0, &[stored("t", "a"), stored("t", "b")]);
    turn(&mut relay);
    // Two messages the relay never saw (a gap only a snapshot filled).
    relay.source.behind_the_relays_back(
        0,
        2,
        &[(Kind::Removed, "t", "a", Medium::Cpu), stored("u", "x")],
    );
    relay.source.publish(0, &[stored("t", "c")]);
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(kinds(&log), ["diff", "events", "diff"]);
    assert_eq!(fold(&log), relay.source.indexes[0]);
    // The difference: `removed` before `stored`, each with the master's keys and context
    // (learned from its events), `event_id` 0.
    let events: Vec<Event> = crate::batch::split(&log[2].payload)
        .unwrap()
        .into_iter()
        .flat_map(|b| {
            Message::<Event>::decode(&[&[][..], &[0u8; 8][..], b])
                .unwrap()
                .events
        })
        .collect();
    let described: Vec<(String, Vec<u8>)> = events
        .iter()
        .map(|e| {
            (
                format!("{:?}", e.event_type),
                e.object_key.clone().unwrap().0,
            )
        })
        .collect();
    assert_eq!(events.len(), 3, "{described:?}");
    assert_eq!(events[0].object_key.as_ref().unwrap().0, b"a");
    assert!(events
        .iter()
        .all(|e| e.model_name.as_deref() == Some("llama")
            && e.block_size == Some(16)
            && e.event_id == 0
            && e.legacy_type.is_some()));
    // Back to the master's own messages.
    relay.source.publish(0, &[stored("t", "d")]);
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(kinds(&log), ["diff", "events", "diff", "events"]);
    assert_eq!(fold(&log), relay.source.indexes[0]);

    // A new incarnation (a master restarted): a difference to its state.
    relay.source.snapshot(0, 2, 0, &[("t", "new")]);
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(kinds(&log).last(), Some(&"diff"));
    assert_eq!(fold(&log), relay.source.indexes[0]);
    assert_eq!(relay.counters.diffs, 3);
    assert!(relay.up_to_date());
}

#[test]
fn a_master_restarted_with_little_of_its_state_costs_a_cleared_not_a_removal_per_object() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    let keys: Vec<String> = (0..50).map(|k| format!("k{k}")).collect();
    let mut old: Vec<(&str, &str)> = keys.iter().map(|k| ("t", k.as_str())).collect();
    old.push(("u", "kept"));
    fake.snapshot(0, 1, 0, &old);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    // The new incarnation holds one of tenant t's 50 objects and another: a `cleared` and
    // two `stored` for t, where a difference takes 49 `removed` and one `stored`; tenant
    // u, where the difference is one `stored`, keeps it.
    relay.source.snapshot(
        0,
        2,
        0,
        &[("t", "k7"), ("t", "new"), ("u", "kept"), ("u", "x")],
    );
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(kinds(&log), ["diff", "diff"]);
    assert_eq!(fold(&log), relay.source.indexes[0]);
    let mut events: Vec<(String, String, Option<Vec<u8>>)> = crate::batch::split(&log[1].payload)
        .unwrap()
        .into_iter()
        .flat_map(|b| {
            Message::<Event>::decode(&[&[][..], &[0u8; 8][..], b])
                .expect("the strict decoder takes it")
                .events
        })
        .map(|e| {
            let tenant = String::from_utf8(e.tenant_id.0.clone()).unwrap();
            (
                format!("{:?}", e.event_type),
                tenant,
                e.object_key.map(|k| k.0),
            )
        })
        .collect();
    assert_eq!(events.remove(0), ("Cleared".into(), "t".into(), None));
    events.sort();
    assert_eq!(
        events,
        [
            ("Stored".into(), "t".into(), Some(b"k7".to_vec())),
            ("Stored".into(), "t".into(), Some(b"new".to_vec())),
            ("Stored".into(), "u".into(), Some(b"x".to_vec())),
        ]
    );
    assert!(relay.up_to_date());
}

#[test]
fn a_difference_of_many_messages_is_written_one_by_one_and_goes_on_after_a_failure() {
    let memory = Memory::default();
    let mut relay = relay_of_many(&memory, 20_000);
    // NATS fails at the third message of the difference (which a turn may not reach, on a
    // loaded machine, within its budget).
    memory.shared.borrow_mut().fail_append_in = Some(2);
    assert!((0..10).any(|_| relay.turn(Duration::ZERO).1.is_err()));
    let log = memory.subject(SUBJECT);
    let parts: Vec<&str> = log
        .iter()
        .map(|m| m.header(crate::log::PART).unwrap())
        .collect();
    let count = parts[0]
        .split_once('/')
        .unwrap()
        .1
        .parse::<usize>()
        .unwrap();
    assert!(count > 3, "{parts:?}");
    assert_eq!(parts, [format!("1/{count}"), format!("2/{count}")]);
    assert!(log
        .iter()
        .all(|m| m.payload.len() <= crate::batch::MAX_PAYLOAD));
    assert_eq!(
        relay.objects(),
        fold(&log).objects(),
        "each written part applied"
    );
    assert!(!relay.up_to_date());

    // The next difference is what the first two parts left, written a message a turn; what
    // the master sends meanwhile is read, and continues the log after it.
    relay.budget = Duration::ZERO;
    relay.not_before = Instant::now();
    turn(&mut relay);
    assert_eq!(memory.subject(SUBJECT).len(), 3, "one message a turn");
    relay.source.publish(0, &[stored("t", "late")]);
    turn_until_up_to_date(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(fold(&log), relay.source.indexes[0]);
    let kinds = kinds(&log);
    assert_eq!(
        kinds.last(),
        Some(&"events"),
        "the master's message, verbatim"
    );
    assert!(kinds[..kinds.len() - 1].iter().all(|k| *k == "diff"));
    let stored: usize = log
        .iter()
        .flat_map(|m| checked(&m.payload).unwrap())
        .map(|b| b.len())
        .sum();
    assert_eq!(stored, 20_001, "no object written twice");
    assert_eq!(relay.counters.diffs, 1);
}

#[test]
fn a_difference_is_given_up_when_its_publisher_falls_out_of_sync() {
    let memory = Memory::default();
    let mut relay = relay_of_many(&memory, 20_000);
    relay.budget = Duration::ZERO;
    turn(&mut relay);
    assert_eq!(memory.subject(SUBJECT).len(), 1);
    // A gap: the publisher is recovering, its index no longer the master's state.
    relay.source.statuses[0].in_sync = false;
    turn(&mut relay);
    assert_eq!(
        memory.subject(SUBJECT).len(),
        1,
        "nothing more of a stale state"
    );
    // Back, with a state of which the log's first message wrote a part.
    let keys = object_keys(5_000);
    let fewer: Vec<(&str, &str)> = keys.iter().map(|k| ("t", k.as_str())).collect();
    relay.source.snapshot(0, 1, 50, &fewer);
    turn_until_up_to_date(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(fold(&log), relay.source.indexes[0]);
    assert_eq!(relay.counters.diffs, 1, "the one written whole");
}

#[test]
fn nats_away_holds_the_masters_messages_and_writes_them_when_back() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    memory.shared.borrow_mut().down = true;
    for key in ["a", "b", "c"] {
        relay.source.publish(0, &[stored("t", key)]);
        assert!(relay.turn(Duration::ZERO).1.is_err() || relay.not_before > Instant::now());
    }
    assert_eq!(relay.pending_messages(), 3);
    memory.shared.borrow_mut().down = false;
    relay.not_before = Instant::now();
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    // The first write after the outage is the one that failed, the same message under the
    // same id (it may have landed), then the rest.
    assert_eq!(
        kinds(&log),
        ["diff", "events", "events"],
        "no difference: nothing was lost"
    );
    assert_eq!(fold(&log), relay.source.indexes[0]);
    assert!(relay.counters.nats_failures >= 1);
}

#[test]
fn a_long_lag_notes_everything_rather_than_a_copy_of_each_key_and_the_log_catches_up() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    memory.shared.borrow_mut().down = true;
    let keys: Vec<String> = (0..=MIN_NOTED).map(|n| format!("k{n}")).collect();
    let changes: Vec<Change<'_>> = keys
        .iter()
        .map(|k| (Kind::Stored, "t", k.as_str(), Medium::Cpu))
        .collect();
    for chunk in changes.chunks(1000) {
        relay.source.publish(0, chunk);
    }
    let _ = relay.turn(Duration::ZERO);
    assert!(
        relay.changes[0].all && relay.changes[0].objects.is_empty(),
        "past the share of the objects held, no key is noted"
    );
    memory.shared.borrow_mut().down = false;
    relay.not_before = Instant::now();
    // A turn writes for a budget of time: under load, this many messages take more.
    for _ in 0..1000 {
        turn(&mut relay);
        if relay.up_to_date() {
            break;
        }
    }
    assert!(relay.up_to_date());
    assert_eq!(fold(&memory.subject(SUBJECT)), relay.source.indexes[0]);
}

#[test]
fn a_second_relay_stands_by_and_takes_over_when_the_log_is_still() {
    let memory = Memory::default();
    let (mut one, mut two) = (Fake::new(1), Fake::new(1));
    one.snapshot(0, 9, 3, &[("t", "a")]);
    // The second joined the master later: its truth is two messages further.
    two.snapshot(0, 9, 5, &[("t", "a"), ("t", "b"), ("t", "c")]);
    let mut first = relay(one, &memory, options());
    let mut second = relay(two, &memory, options());
    turn(&mut first);
    // The second computed its difference from an empty log: refused, it reads the log and
    // stands by.
    turn(&mut second);
    assert!(matches!(second.role, Role::Standby { .. }));
    assert_eq!(second.counters.races_lost, 1);
    for key in ["b", "c"] {
        first.source.publish(0, &[stored("t", key)]);
    }
    turn(&mut first);
    // The standby reads what the writer wrote.
    let expired = Instant::now() - STANDBY_CHECK;
    second.role = Role::Standby {
        since: Instant::now(),
        checked: expired,
    };
    turn(&mut second);
    assert_eq!(second.log.last, 2);
    assert!(matches!(second.role, Role::Standby { .. }));

    // The writer dies; the log stays still past the takeover delay.
    drop(first);
    second.role = Role::Standby {
        since: Instant::now() - TAKEOVER - Duration::from_millis(1),
        checked: Instant::now() - STANDBY_CHECK,
    };
    second.source.publish(0, &[stored("t", "d")]);
    turn(&mut second);
    assert_eq!(second.role, Role::Writer);
    assert_eq!(second.counters.takeovers, 1);
    let log = memory.subject(SUBJECT);
    assert_eq!(
        kinds(&log),
        ["diff", "events", "events"],
        "no difference at the takeover"
    );
    assert_eq!(
        log[2].header("Nats-Msg-Id"),
        Some("store-a.0000000000000009.5-5")
    );
    assert_eq!(fold(&log), second.source.indexes[0]);
    // Every message on top of the one before it.
    for pair in log.windows(2) {
        assert_eq!(
            pair[1].header(crate::log::PREVIOUS),
            Some(pair[0].stream_sequence.to_string().as_str())
        );
    }
}

#[test]
fn a_standby_holds_only_what_the_writer_has_not_written() {
    let memory = Memory::default();
    let (mut one, mut two) = (Fake::new(1), Fake::new(1));
    one.snapshot(0, 9, 3, &[("t", "a")]);
    two.snapshot(0, 9, 3, &[("t", "a")]);
    let mut first = relay(one, &memory, options());
    let mut second = relay(two, &memory, options());
    turn(&mut first);
    // The same difference under the same id: a duplicate, not a race; then standby.
    turn(&mut second);
    second.role = Role::Standby {
        since: Instant::now(),
        checked: Instant::now(),
    };
    for k in 0..50 {
        let key: &'static str = Box::leak(format!("k{k}").into_boxed_str());
        first.source.publish(0, &[stored("t", key)]);
        second.source.publish(0, &[stored("t", key)]);
        turn(&mut first);
        second.role = Role::Standby {
            since: Instant::now(),
            checked: Instant::now() - STANDBY_CHECK,
        };
        turn(&mut second);
        assert_eq!(
            second.pending_messages(),
            0,
            "what the writer wrote is dropped"
        );
    }
    // The writer falls behind: the standby holds what the log lacks, no more.
    second.source.publish(0, &[stored("t", "late")]);
    second.role = Role::Standby {
        since: Instant::now(),
        checked: Instant::now() - STANDBY_CHECK,
    };
    turn(&mut second);
    assert_eq!(second.pending_messages(), 1);
    assert_eq!(second.pending_bytes, cost(&second.pending[0]));
    assert!(second.pending_bytes > second.pending[0].payload.len() + 64);
}

#[test]
fn a_write_whose_acknowledgement_was_lost_is_kept_once() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    let payload = relay.source.publish(0, &[stored("t", "a")]);
    // The same message written by someone with the same id before this relay learns of it.
    let mut other = memory.clone();
    let id = "store-a.0000000000000001.0-0".to_owned();
    let message = crate::store::LogMessage {
        id,
        headers: vec![],
        payload: payload.into(),
    };
    other.append(SUBJECT, message, 1).unwrap();
    turn(&mut relay);
    assert_eq!(
        memory.subject(SUBJECT).len(),
        2,
        "the duplicate was dropped"
    );
    assert_eq!(relay.counters.races_lost, 0);
}

#[test]
fn a_lost_acknowledgement_retried_regrouped_is_no_race() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    relay.source.publish(0, &[stored("t", "a")]);
    // Written, but the acknowledgement never comes (NATS restarted meanwhile).
    memory.shared.borrow_mut().lose_ack = true;
    assert!(relay.turn(Duration::ZERO).1.is_err());
    assert_eq!(relay.pending_messages(), 1, "held for the retry");
    // More comes before the retry: regrouped, under another id, on top of a stale last.
    relay.source.publish(0, &[stored("t", "b")]);
    relay.not_before = Instant::now();
    turn(&mut relay);
    turn(&mut relay);
    let log = memory.subject(SUBJECT);
    assert_eq!(relay.counters.races_lost, 0, "its own write, not another's");
    assert_eq!(relay.counters.takeovers, 0);
    assert_eq!(relay.role, Role::Writer);
    assert_eq!(
        kinds(&log),
        ["diff", "events", "events"],
        "each message once, no difference"
    );
    assert_eq!(fold(&log), relay.source.indexes[0]);
    assert!(relay.up_to_date());
}

#[test]
fn a_retry_after_a_lost_acknowledgement_is_the_same_write() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[]);
    let mut relay = relay(fake, &memory, options());
    turn(&mut relay);
    relay.source.publish(0, &[stored("t", "a")]);
    memory.shared.borrow_mut().lose_ack = true;
    assert!(relay.turn(Duration::ZERO).1.is_err());
    // More comes before the retry, and NATS would let a write in on top of the first one
    // still in flight (a leader change): the retry is the same message under the same id,
    // dropped as a duplicate, not a regrouped write landing beside the first.
    relay.source.publish(0, &[stored("t", "b")]);
    memory.shared.borrow_mut().stale_check = true;
    relay.not_before = Instant::now();
    turn(&mut relay);
    relay.source.publish(0, &[stored("t", "c")]);
    turn(&mut relay);
    turn(&mut relay);
    assert_eq!(relay.counters.races_lost, 0, "its own write, not another's");
    assert_eq!(relay.role, Role::Writer);
    let log = memory.subject(SUBJECT);
    assert_eq!(
        kinds(&log),
        ["diff", "events", "events"],
        "each master message once"
    );
    assert_eq!(fold(&log), relay.source.indexes[0]);
    assert!(relay.up_to_date());
}

#[test]
fn snapshots_follow_the_rule_and_a_relay_starts_from_one() {
    let memory = Memory::default();
    let mut first = snapshotting(&memory, &[("t", "a"), ("t", "b")]);
    turn(&mut first);
    first.source.publish(0, &[stored("u", "c")]);
    turn(&mut first);
    turn(&mut first);
    let (meta, content) = memory.shared.borrow().snapshots[BACKEND].clone();
    assert_eq!(meta.stream_sequence, 2);
    assert_eq!((meta.incarnation, meta.next_sequence), (4, 1));
    let mut from_snapshot = Index::new();
    for batch in checked(&content).unwrap() {
        assert!(batch.len() <= 64);
        for change in batch.changes() {
            from_snapshot.apply_change(&change).unwrap();
        }
    }
    assert_eq!(from_snapshot, first.source.indexes[0]);
    assert_eq!(first.counters.snapshots, 2);

    // By events alone: none before as many log events as objects (and 10,000).
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 4, 0, &[]);
    let mut rule = relay(fake, &memory, options());
    turn(&mut rule);
    rule.source.publish(0, &[stored("t", "a")]);
    turn(&mut rule);
    assert!(memory.shared.borrow().snapshots.is_empty());
    // Quiet: the events stopped.
    rule.snapshots.last_events = Instant::now() - QUIET;
    turn(&mut rule);
    let snapshot = || memory.shared.borrow().snapshots[BACKEND].0.stream_sequence;
    assert_eq!(snapshot(), 2);
    rule.source.publish(0, &[stored("t", "b")]);
    turn(&mut rule);
    assert_eq!(snapshot(), 2, "neither quiet nor as many events as objects");
    rule.snapshots.events_since = MIN_SNAPSHOT_EVENTS;
    rule.source.publish(0, &[stored("t", "c")]);
    turn(&mut rule);
    assert_eq!(snapshot(), 4);

    // A relay started anew loads the snapshot and the log after it, and has nothing to
    // write for a master where the log is.
    let mut again = Fake::new(1);
    again.snapshot(0, 4, 3, &[("t", "a"), ("t", "b"), ("t", "c")]);
    let mut second = relay(again, &memory, options());
    assert_eq!(second.log.last, 4);
    turn(&mut second);
    assert_eq!(memory.subject(SUBJECT).len(), 4, "nothing written");
    assert!(second.up_to_date());
}

#[test]
fn a_failed_snapshot_is_said_counted_and_written_again() {
    let memory = Memory::default();
    memory.shared.borrow_mut().fail_snapshot = true;
    let mut relay = snapshotting(&memory, &[("t", "a")]);
    turn(&mut relay);
    assert!(memory.shared.borrow().snapshots.is_empty());
    turn(&mut relay);
    let failures = relay.take_failures();
    assert!(
        matches!(&failures[..], [said] if said.starts_with("a snapshot failed (")
            && said.ends_with("); written again")),
        "{failures:?}"
    );
    assert!(relay.take_failures().is_empty(), "said once");
    assert_eq!(relay.counters.snapshot_failures, 1);
    assert!(
        crate::status::line(&relay, &["tcp://m:1".to_owned()], Duration::ZERO)
            .contains("snapshot failures 1")
    );
    turn(&mut relay);
    assert_eq!(
        memory.shared.borrow().snapshots[BACKEND].0.stream_sequence,
        relay.log.last,
        "written again"
    );
}

#[test]
fn a_snapshot_being_written_holds_the_log_state_it_started_at_and_the_log_goes_on() {
    let memory = Memory::default();
    memory.shared.borrow_mut().slow_snapshots = true;
    let mut relay = snapshotting(&memory, &[("t", "a"), ("t", "b")]);
    turn(&mut relay);
    assert!(relay.snapshot_writing(), "of the log's first message");
    // The log goes on while the snapshot is written, in several turns.
    relay
        .source
        .publish(0, &[(Kind::Removed, "t", "a", Medium::Cpu)]);
    turn(&mut relay);
    relay.source.publish(0, &[stored("u", "c")]);
    turn(&mut relay);
    assert_eq!(
        memory.subject(SUBJECT).len(),
        3,
        "the log was not held back"
    );
    assert!(relay.up_to_date());
    assert!(memory.finish_snapshot());
    let (meta, content) = memory.shared.borrow().snapshots[BACKEND].clone();
    assert_eq!(meta.stream_sequence, 1);
    assert_eq!(
        fold(&[Logged {
            stream_sequence: 1,
            headers: Default::default(),
            payload: content.into(),
        }]),
        fold(&memory.subject(SUBJECT)[..1]),
        "the state at its stream sequence, not after"
    );
    // Once written, the messages taken meanwhile are in what the relay holds, and the
    // next snapshot has them.
    turn(&mut relay);
    assert_eq!(relay.counters.snapshots, 1);
    assert_eq!(relay.held.index(), &relay.source.indexes[0]);
    assert!(memory.finish_snapshot());
    turn(&mut relay);
    let (meta, content) = memory.shared.borrow().snapshots[BACKEND].clone();
    assert_eq!(meta.stream_sequence, 3);
    let snapshot = Logged {
        stream_sequence: 3,
        headers: Default::default(),
        payload: content.into(),
    };
    assert_eq!(fold(&[snapshot]), relay.source.indexes[0]);
}

#[test]
fn a_difference_waits_for_the_snapshot_being_written_and_no_snapshot_starts_while_the_log_lags() {
    let memory = Memory::default();
    memory.shared.borrow_mut().slow_snapshots = true;
    let mut relay = snapshotting(&memory, &[("t", "a"), ("t", "b")]);
    turn(&mut relay);
    assert!(relay.snapshot_writing());
    // A gap the relay never saw: the log continues by a difference, which compares the
    // fold only once no snapshot shares it (else the whole fold would be copied).
    relay
        .source
        .behind_the_relays_back(0, 2, &[(Kind::Removed, "t", "a", Medium::Cpu)]);
    relay.source.publish(0, &[stored("t", "c")]);
    turn(&mut relay);
    assert_eq!(memory.subject(SUBJECT).len(), 1, "no difference yet");
    assert!(!relay.up_to_date());
    assert!(memory.finish_snapshot());
    turn(&mut relay);
    assert_eq!(kinds(&memory.subject(SUBJECT)), ["diff", "diff"]);
    assert_eq!(fold(&memory.subject(SUBJECT)), relay.source.indexes[0]);
    assert!(relay.up_to_date());
    assert!(
        memory.finish_snapshot(),
        "the next snapshot, of the log in sync"
    );
    turn(&mut relay);

    // A message applied and not written yet: no snapshot starts until it is written.
    relay.snapshots.last = None;
    relay.source.publish(0, &[stored("t", "d")]);
    relay.take_applied();
    relay.snapshot_if_due();
    assert!(!relay.snapshot_writing(), "the log lags what was applied");
    turn(&mut relay);
    assert!(relay.up_to_date());
    assert!(relay.snapshot_writing(), "once the log caught up");
}

#[test]
fn the_bucket_is_written_beside_the_log_and_a_relay_started_anew_marks_what_it_lacks() {
    let memory = Memory::default();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 0, &[("t", "a")]);
    let with_bucket = Options {
        bucket: true,
        ..options()
    };
    let mut relay = relay(fake, &memory, with_bucket.clone());
    turn(&mut relay);
    relay.source.publish(
        0,
        &[stored("t", "b"), (Kind::Removed, "t", "a", Medium::Cpu)],
    );
    turn(&mut relay);
    turn(&mut relay);
    let bucket = memory.shared.borrow().bucket.clone();
    assert_eq!(
        bucket.keys().collect::<Vec<_>>(),
        ["store-a.t.b"],
        "{bucket:?}"
    );
    let noted: bucket::Reflected =
        serde_json::from_str(&memory.shared.borrow().positions[BACKEND]).unwrap();
    assert_eq!(noted.stream_sequence, 2);
    assert!(relay.up_to_date());

    // The bucket away: the log goes on without it.
    drop(relay);
    memory.shared.borrow_mut().bucket.clear();
    let mut fake = Fake::new(1);
    fake.snapshot(0, 1, 1, &[("t", "b")]);
    let mut relay = crate::relay::tests::relay(fake, &memory, with_bucket);
    relay.source.publish(0, &[stored("t", "c")]);
    turn(&mut relay);
    assert_eq!(
        kinds(&memory.subject(SUBJECT)),
        ["diff", "events", "events"]
    );
    turn(&mut relay);
    // Only what the log wrote since the bucket's position is written again.
    assert_eq!(
        memory.shared.borrow().bucket.keys().collect::<Vec<_>>(),
        ["store-a.t.c"]
    );
}

#[test]
fn the_status_line_says_which_relay_writes_and_no_frozen_lag() {
    let memory = Memory::default();
    let (mut one, mut two) = (Fake::new(1), Fake::new(1));
    one.snapshot(0, 9, 3, &[("t", "a")]);
    two.snapshot(0, 9, 3, &[("t", "a")]);
    let mut first = relay(one, &memory, options());
    let mut second = relay(two, &memory, options());
    turn(&mut first);
    // The master idle: the second has nothing to write, so it is not the writer.
    turn(&mut second);
    let names = ["tcp://m:1".to_owned()];
    let line = |r: &Relay<Fake, Memory>| crate::status::line(r, &names, Duration::ZERO);
    assert!(line(&first).contains("; writer\n"), "{}", line(&first));
    assert!(
        line(&second).contains("; ready to write (nothing to write yet)\n"),
        "{}",
        line(&second)
    );
    // A message from long ago, written: up to date, the lag is 0, not the last write's.
    first.source.publish(0, &[stored("t", "b")]);
    turn(&mut first);
    first.counters.lag_ms = 5000;
    assert!(first.up_to_date());
    assert!(
        line(&first).contains("lag 0 messages / 0 ms"),
        "{}",
        line(&first)
    );
    // A restart: recovering in a new incarnation says no sequence of the old one.
    first.source.statuses[0].in_sync = false;
    first.source.statuses[0].incarnation = Some(0xb);
    assert!(
        line(&first).contains("tcp://m:1: recovering, incarnation 000000000000000b;"),
        "{}",
        line(&first)
    );
}
