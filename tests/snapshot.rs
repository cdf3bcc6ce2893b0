//! Snapshots on the replay socket: what a subscriber that applies one, then the stream from
//! its next sequence on, ends up holding, compared with the master's truth; and what the
//! socket does with requests it cannot serve.

use kv_events_testing as common;

use common::{dealer, eventually, raw_subscriber, tcp_endpoint};
use mooncake_kv_events::wire::{decode_message, field};
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher, Snapshot, SourceError};
use rmpv::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Object = (Vec<u8>, Vec<u8>);

/// A master in miniature: sharded metadata whose every change is announced under the lock of
/// its shard, and an object source that copies one shard at a time under that lock.
struct Master {
    publisher: Publisher,
    shards: Vec<Mutex<HashMap<Object, MediumSet>>>,
}

impl Master {
    fn new(publisher: Publisher) -> Arc<Master> {
        let master = Arc::new(Master {
            publisher,
            shards: (0..8).map(|_| Mutex::default()).collect(),
        });
        let source = Arc::clone(&master);
        master
            .publisher
            .set_object_source(move |tenant: Option<&[u8]>, objects: &mut Snapshot| {
                source.objects(tenant, objects)
            });
        master
    }

    fn shard(&self, object: &Object) -> &Mutex<HashMap<Object, MediumSet>> {
        let hash = object.1.iter().fold(0usize, |h, b| h * 31 + *b as usize);
        &self.shards[hash % self.shards.len()]
    }

    /// Sets the media of `object`; the empty set removes it.
    fn set(&self, object: Object, media: MediumSet) {
        let mut shard = self.shard(&object).lock().unwrap();
        let before = shard.get(&object).copied().unwrap_or(MediumSet::EMPTY);
        self.publisher
            .on_medium_delta(&object.0, &object.1, "", before, media);
        if media.is_empty() {
            shard.remove(&object);
        } else {
            shard.insert(object, media);
        }
    }

    fn objects(&self, tenant: Option<&[u8]>, objects: &mut Snapshot) -> Result<(), SourceError> {
        for shard in &self.shards {
            let copied: Vec<(Object, MediumSet)> = shard
                .lock()
                .unwrap()
                .iter()
                .filter(|((t, _), _)| tenant.is_none_or(|want| want == t.as_slice()))
                .map(|(o, m)| (o.clone(), *m))
                .collect();
            for ((tenant, key), media) in copied {
                objects.add(&tenant, &key, b"", media)?;
            }
        }
        Ok(())
    }

    /// What the master holds: object → media, in order.
    fn truth(&self) -> BTreeMap<Object, MediumSet> {
        let mut truth = BTreeMap::new();
        for shard in &self.shards {
            truth.extend(shard.lock().unwrap().iter().map(|(o, m)| (o.clone(), *m)));
        }
        truth
    }
}

/// A subscriber's index, built from events.
#[derive(Default)]
struct Index(BTreeMap<Object, MediumSet>);

fn bytes_of(value: Option<&Value>) -> Vec<u8> {
    match value {
        Some(Value::String(s)) => s.as_bytes().to_vec(),
        Some(Value::Binary(b)) => b.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

impl Index {
    fn apply(&mut self, events: &[Value]) {
        for event in events {
            let kind = field(event, "event_type").and_then(Value::as_str).unwrap();
            let tenant = bytes_of(field(event, "tenant_id"));
            if kind == "cleared" {
                self.0.retain(|(t, _), _| *t != tenant);
                continue;
            }
            let key = bytes_of(field(event, "object_key"));
            let medium = match field(event, "medium").and_then(Value::as_str) {
                Some("cpu") => Medium::Cpu,
                Some("disk") => Medium::Disk,
                other => panic!("medium {other:?}"),
            };
            let media = self.0.entry((tenant, key.clone())).or_default();
            if kind == "stored" {
                *media = media.with(medium);
            } else {
                *media = media.minus(MediumSet::from([medium]));
            }
        }
        self.0.retain(|_, media| !media.is_empty());
    }
}

/// Waits until `sub` receives `master`'s stream (ZeroMQ's slow joiner): setup, not an
/// assertion; each probe is a change and its undoing, so it leaves the objects as they were.
fn joined(master: &Master, sub: &zmq::Socket) {
    let probe = (b"probe".to_vec(), b"probe".to_vec());
    assert!(eventually(|| {
        master.set(probe.clone(), MediumSet::from([Medium::Cpu]));
        master.set(probe.clone(), MediumSet::EMPTY);
        master.publisher.flush(Duration::from_secs(5));
        sub.poll(zmq::POLLIN, 50).unwrap() > 0
    }));
}

/// The end of a snapshot: its map's fields by name.
type End = BTreeMap<String, Value>;

/// Asks for a snapshot (of `tenant`, or of all) and reads it whole: its batches' events, its
/// end map. An error reply is `Err` with its text.
fn snapshot(socket: &zmq::Socket, tenant: Option<&[u8]>) -> Result<(Vec<Value>, End), String> {
    let mut request: Vec<&[u8]> = vec![b"", b"snapshot"];
    request.extend(tenant);
    socket.send_multipart(request, 0).unwrap();
    read_snapshot(socket)
}

/// The replies to a snapshot request already sent, as [`snapshot`] returns them.
fn read_snapshot(socket: &zmq::Socket) -> Result<(Vec<Value>, End), String> {
    let mut events = Vec::new();
    loop {
        let frames = socket.recv_multipart(0).expect("a reply within 20 s");
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert!(frames[0].is_empty());
        match &frames[1][..] {
            b"snapshot" => {
                let batch = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
                let parts = batch.as_array().unwrap();
                assert_eq!(parts.len(), 3, "a batch is [timestamp, events, dp_rank]");
                let batch_events = parts[1].as_array().unwrap();
                assert!((1..=64).contains(&batch_events.len()));
                events.extend(batch_events.iter().cloned());
            }
            b"snapshot-end" => {
                let map = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
                let end = map
                    .as_map()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.clone()))
                    .collect();
                return Ok((events, end));
            }
            b"error" => return Err(String::from_utf8_lossy(&frames[2]).into_owned()),
            other => panic!("unexpected verb {other:?}"),
        }
    }
}

fn config(pub_endpoint: &str, replay_endpoint: &str) -> Config {
    Config {
        replay_endpoint: replay_endpoint.into(),
        ..common::config(pub_endpoint)
    }
}

/// A small seeded generator (xorshift64*), so that a failing seed can be run again.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn random_object(rng: &mut Rng) -> Object {
    let tenant = format!("tenant-{}", rng.below(3));
    (
        tenant.into_bytes(),
        format!("key-{}", rng.below(200)).into_bytes(),
    )
}

fn random_media(rng: &mut Rng) -> MediumSet {
    MediumSet::from_bits(rng.below(4) as u8)
}

/// What a subscriber that joined with a snapshot ended with.
#[derive(Debug, PartialEq, Eq)]
enum Joined {
    /// It applied every message from N on with no gap, and `info` says none came after: its
    /// index equals the master's objects.
    Exact,
    /// It saw a gap from N on (or `info` says the end was lost): it knows to take another.
    Gap,
}

/// A subscriber joins while three threads keep changing the master: it takes a snapshot,
/// then applies the stream from the snapshot's next sequence N on. Either it sees a gap, or
/// it ends with exactly the master's objects; nothing else is allowed. In a `flood`, the
/// threads change the master flat out and stop as the request leaves, so that events are
/// dropped around the moment the snapshot takes its next sequence.
fn join_while_changing(seed: u64, queue_capacity: u32, flood: bool) -> Joined {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let master = Master::new(
        Publisher::create(&Config {
            queue_capacity,
            ..config(&pub_endpoint, &replay_endpoint)
        })
        .expect("binds"),
    );
    let mut rng = Rng::new(seed);
    for _ in 0..300 {
        master.set(random_object(&mut rng), random_media(&mut rng));
    }
    // The stream first, so that nothing from the snapshot's next sequence on is missed.
    let sub = raw_subscriber(&pub_endpoint, None);
    joined(&master, &sub);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let (master, stop) = (Arc::clone(&master), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed * 10 + w + 1);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    master.set(random_object(&mut rng), random_media(&mut rng));
                    if !flood && rng.below(8) == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        })
        .collect();
    let replay = dealer(&replay_endpoint);
    let (events, end) = if flood {
        std::thread::sleep(Duration::from_millis(20));
        replay.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        read_snapshot(&replay)
    } else {
        snapshot(&replay, None)
    }
    .expect("a snapshot");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    master.publisher.flush(Duration::from_secs(10));

    let mut index = Index::default();
    index.apply(&events);
    let n = end["next_sequence"].as_u64().unwrap();
    assert_eq!(end["events"].as_u64().unwrap(), events.len() as u64);
    assert_eq!(
        end["incarnation"].as_u64().unwrap(),
        master.publisher.stats().incarnation
    );
    assert!(end["tenant"].is_nil());
    // The sequence the index needs next.
    let mut next = n;
    for message in common::raw_messages(&sub, Duration::from_millis(500)) {
        let message = decode_message(&message).unwrap();
        if message.sequence < n {
            continue;
        }
        if message.sequence != next {
            return Joined::Gap;
        }
        next = message.sequence + 1;
        index.apply(&message.events);
    }
    replay.send_multipart([&b""[..], b"info"], 0).unwrap();
    let info = rmpv::decode::read_value(&mut &replay.recv_multipart(0).unwrap()[2][..]).unwrap();
    if field(&info, "next_sequence").and_then(Value::as_u64) != Some(next) {
        return Joined::Gap;
    }
    let truth = master.truth();
    assert_eq!(
        index.0,
        truth,
        "seed {seed}: N={n}, {} snapshot events, no gap from it on",
        events.len()
    );
    // Counted once its last message is handed to the socket, maybe after it arrived.
    assert!(eventually(|| master.publisher.stats().snapshots_served == 1));
    Joined::Exact
}

/// With no event lost, the subscriber ends exact every time. Over many seeds, each with its
/// own interleaving.
#[test]
fn a_snapshot_taken_while_the_master_changes_then_the_stream_after_it_give_the_truth() {
    for seed in 0..12u64 {
        assert_eq!(
            join_while_changing(seed, 65536, false),
            Joined::Exact,
            "seed {seed}"
        );
    }
}

/// Flat out into a queue of 8, events are dropped around the moment N is taken: a subscriber
/// either sees the loss, or (when none fell from N on) ends exact. A snapshot never hides a
/// drop, whether the publishing thread held a batch when it happened or not.
#[test]
fn a_snapshot_during_a_flood_that_drops_events_never_hides_a_loss() {
    let outcomes: Vec<Joined> = (0..16u64)
        .map(|seed| join_while_changing(100 + seed, 8, true))
        .collect();
    eprintln!("{outcomes:?}");
}

#[test]
fn a_snapshot_of_one_tenant_holds_that_tenant_only_and_default_is_the_empty_tenant() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let master = Master::new(Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap());
    let both = MediumSet::from([Medium::Cpu, Medium::Disk]);
    master.set((b"a".to_vec(), b"k1".to_vec()), both);
    master.set((b"b".to_vec(), b"k2".to_vec()), both);
    master.set(
        (b"".to_vec(), b"k3".to_vec()),
        MediumSet::from([Medium::Disk]),
    );
    let socket = dealer(&replay_endpoint);

    let (events, end) = snapshot(&socket, Some(b"a")).unwrap();
    let keys: Vec<Vec<u8>> = events
        .iter()
        .map(|e| bytes_of(field(e, "object_key")))
        .collect();
    assert_eq!(
        keys,
        [b"k1".to_vec(), b"k1".to_vec()],
        "one stored per medium"
    );
    assert_eq!(end["objects"].as_u64(), Some(1));
    assert_eq!(end["tenant"].as_str(), Some("a"));
    for event in &events {
        assert_eq!(
            field(event, "event_type").and_then(Value::as_str),
            Some("stored")
        );
        assert_eq!(
            field(event, "backend_id").and_then(Value::as_str),
            Some("store-a")
        );
    }

    let (events, end) = snapshot(&socket, Some(b"default")).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(bytes_of(field(&events[0], "tenant_id")), b"default");
    assert_eq!(end["objects"].as_u64(), Some(1));

    let (events, end) = snapshot(&socket, None).unwrap();
    assert_eq!((events.len(), end["objects"].as_u64()), (5, Some(3)));
    assert!(eventually(|| master.publisher.stats().snapshot_objects == 5));
}

#[test]
fn a_snapshot_without_an_object_source_is_refused_saying_so_and_info_says_it() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let publisher = Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap();
    let socket = dealer(&replay_endpoint);
    let err = snapshot(&socket, None).unwrap_err();
    assert!(err.contains("no object source"), "{err}");
    let info = |socket: &zmq::Socket| {
        socket.send_multipart([&b""[..], b"info"], 0).unwrap();
        let frames = socket.recv_multipart(0).unwrap();
        let map = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
        field(&map, "snapshots").and_then(Value::as_bool)
    };
    assert_eq!(info(&socket), Some(false));
    publisher.set_object_source(|_: Option<&[u8]>, _: &mut Snapshot| Ok(()));
    assert_eq!(info(&socket), Some(true));
    let (events, end) = snapshot(&socket, None).unwrap();
    assert_eq!((events.len(), end["objects"].as_u64()), (0, Some(0)));
    publisher.remove_object_source();
    assert_eq!(info(&socket), Some(false));
}

#[test]
fn a_failing_source_gets_its_requester_an_error_and_one_scope_is_taken_at_a_time() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let publisher = Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap();
    let release = Arc::new(Mutex::new(false));
    let held = Arc::clone(&release);
    publisher.set_object_source(move |tenant: Option<&[u8]>, _: &mut Snapshot| {
        if tenant == Some(b"broken") {
            return Err("shard 3 is unreachable".into());
        }
        // Holds the snapshot open until the test lets it go.
        let started = Instant::now();
        while !*held.lock().unwrap() && started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    });
    let err = snapshot(&dealer(&replay_endpoint), Some(b"broken")).unwrap_err();
    assert_eq!(err, "the object source failed: shard 3 is unreachable");

    let first = dealer(&replay_endpoint);
    first.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Another scope waits for this one to end; the same scope shares it.
    let err = snapshot(&dealer(&replay_endpoint), Some(b"t")).unwrap_err();
    assert!(
        err.starts_with("busy: a snapshot of another scope"),
        "{err}"
    );
    let second = dealer(&replay_endpoint);
    second.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    *release.lock().unwrap() = true;
    let (end, shared) = (
        first.recv_multipart(0).unwrap(),
        second.recv_multipart(0).unwrap(),
    );
    assert_eq!(end[1], b"snapshot-end");
    assert_eq!(end, shared);
    assert!(eventually(|| publisher.stats().snapshots_served == 2));
}

#[test]
fn requesters_of_one_scope_share_one_snapshot_and_one_that_stops_reading_goes_alone() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let publisher = Publisher::create(&Config {
        snapshot_max_requesters: 4,
        ..config(&pub_endpoint, &replay_endpoint)
    })
    .unwrap();
    let gate = Arc::new(Mutex::new(false));
    let enumerations = Arc::new(Mutex::new(0));
    let (open, count) = (Arc::clone(&gate), Arc::clone(&enumerations));
    // 100,000 objects of long keys: more than what a snapshot keeps for its requesters (32
    // MiB) and what a requester's connection holds, so that one that stops reading holds
    // the others back until it is given up.
    const OBJECTS: u64 = 100_000;
    publisher.set_object_source(move |_: Option<&[u8]>, objects: &mut Snapshot| {
        *count.lock().unwrap() += 1;
        let started = Instant::now();
        while !*open.lock().unwrap() && started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        for i in 0..OBJECTS {
            let key = format!("{i:0>400}");
            objects
                .add(b"t", key.as_bytes(), b"g", MediumSet::from([Medium::Cpu]))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let readers: Vec<zmq::Socket> = (0..3).map(|_| dealer(&replay_endpoint)).collect();
    let stalled = zmq::Context::new().socket(zmq::DEALER).unwrap();
    stalled.set_rcvhwm(1).unwrap();
    stalled.set_rcvbuf(4096).unwrap();
    stalled.connect(&replay_endpoint).unwrap();
    for socket in readers.iter().chain([&stalled]) {
        socket.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    // A fifth requester is past the bound; another scope waits its turn.
    let err = snapshot(&dealer(&replay_endpoint), None).unwrap_err();
    assert!(
        err.starts_with("busy: the snapshot under way has as many"),
        "{err}"
    );
    let err = snapshot(&dealer(&replay_endpoint), Some(b"u")).unwrap_err();
    assert!(
        err.starts_with("busy: a snapshot of another scope"),
        "{err}"
    );
    *gate.lock().unwrap() = true;
    let reading: Vec<_> = readers
        .into_iter()
        .map(|socket| std::thread::spawn(move || read_snapshot(&socket).unwrap()))
        .collect();
    let ends: Vec<End> = reading
        .into_iter()
        .map(|r| {
            let (events, end) = r.join().unwrap();
            assert_eq!(events.len() as u64, OBJECTS);
            end
        })
        .collect();
    assert!(ends.iter().all(|end| *end == ends[0]), "{ends:?}");
    assert_eq!(ends[0]["objects"].as_u64(), Some(OBJECTS));
    assert_eq!(*enumerations.lock().unwrap(), 1, "one enumeration for all");
    let stats = publisher.stats();
    assert_eq!((stats.snapshots_served, stats.snapshots_abandoned), (3, 1));
}

/// A requester that never reads: its snapshot is given up, counted, and the source is told
/// to stop; the publisher's memory for it is bounded by the socket's and the channel's queues.
#[test]
fn a_requester_that_never_reads_is_abandoned_and_the_source_told_to_stop() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let publisher = Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap();
    let told = Arc::new(Mutex::new(None));
    let seen = Arc::clone(&told);
    publisher.set_object_source(move |_: Option<&[u8]>, objects: &mut Snapshot| {
        let both = MediumSet::from([Medium::Cpu, Medium::Disk]);
        for i in 0..10_000_000u64 {
            let key = format!("a-rather-long-object-key-to-fill-the-queues-{i:020}");
            if let Err(abandoned) = objects.add(b"t", key.as_bytes(), b"g", both) {
                *seen.lock().unwrap() = Some(i);
                return Err(abandoned.into());
            }
        }
        Ok(())
    });
    let socket = zmq::Context::new().socket(zmq::DEALER).unwrap();
    socket.set_rcvhwm(1).unwrap();
    socket.set_rcvbuf(4096).unwrap();
    socket.connect(&replay_endpoint).unwrap();
    socket.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    assert!(eventually(|| publisher.stats().snapshots_abandoned == 1));
    assert!(eventually(|| told.lock().unwrap().is_some()));
    let added = told.lock().unwrap().unwrap();
    assert!(added < 1_000_000, "stopped after {added} objects");
    assert_eq!(publisher.stats().snapshots_served, 0);
    // Another requester is served at once.
    publisher.set_object_source(|_: Option<&[u8]>, _: &mut Snapshot| Ok(()));
    assert!(snapshot(&dealer(&replay_endpoint), None).is_ok());
}

#[test]
fn bad_requests_are_answered_and_counted_and_a_storm_of_snapshots_gets_one_served() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let master = Master::new(Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap());
    let socket = dealer(&replay_endpoint);
    let bad: [&[&[u8]]; 6] = [
        &[b"info"],
        &[b"", b"infos"],
        &[b"", b"info", b"extra"],
        &[b"", &[1, 2, 3]],
        &[b"", b"snapshot", b""],
        &[b"x", b"snapshot"],
    ];
    for request in bad {
        socket.send_multipart(request, 0).unwrap();
        let reply = socket.recv_multipart(0).expect("an answer");
        assert_eq!(reply[1], b"error", "{request:?}");
        assert!(!reply[2].is_empty());
    }
    assert_eq!(master.publisher.stats().bad_requests, bad.len() as u64);

    // Many requesters at once, while the master keeps publishing: one snapshot is served,
    // the others are told to come back, and the live stream goes on.
    let sub = raw_subscriber(&pub_endpoint, None);
    for i in 0..2000u64 {
        master.set(
            (b"t".to_vec(), format!("k{i}").into_bytes()),
            MediumSet::from([Medium::Cpu]),
        );
    }
    let requesters: Vec<zmq::Socket> = (0..20).map(|_| dealer(&replay_endpoint)).collect();
    for r in &requesters {
        r.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    }
    let (mut served, mut busy) = (0, 0);
    for r in &requesters {
        loop {
            let reply = r.recv_multipart(0).expect("an answer");
            match &reply[1][..] {
                b"snapshot" => continue,
                b"snapshot-end" => served += 1,
                b"error" if reply[2].starts_with(b"busy") => busy += 1,
                other => panic!("{}", String::from_utf8_lossy(other)),
            }
            break;
        }
    }
    assert!(
        served >= 1 && served + busy == 20,
        "{served} served, {busy} busy"
    );
    master.set(
        (b"t".to_vec(), b"after".to_vec()),
        MediumSet::from([Medium::Disk]),
    );
    assert!(master.publisher.flush(Duration::from_secs(10)));
    assert!(eventually(|| sub.poll(zmq::POLLIN, 10).unwrap() > 0));
    assert!(eventually(
        || master.publisher.stats().snapshots_served == served
    ));
}

#[test]
fn with_curve_a_requester_not_admitted_gets_nothing_from_the_replay_socket() {
    let dir = common::TempDir::new("snapshot-curve");
    let (server, admitted) = common::curve_keys(&dir.0, "indexer");
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let master = Master::new(
        Publisher::create(&Config {
            replay_endpoint: replay_endpoint.clone(),
            ..common::curve_config(&pub_endpoint, &dir.0)
        })
        .unwrap(),
    );
    master.set(
        (b"t".to_vec(), b"k".to_vec()),
        MediumSet::from([Medium::Cpu]),
    );
    let requester = |keys: &mooncake_kv_events::keys::KeyPair| {
        let socket = zmq::Context::new().socket(zmq::DEALER).unwrap();
        socket.set_linger(0).unwrap();
        socket.set_curve_serverkey(&server.public.0).unwrap();
        socket.set_curve_publickey(&keys.public.0).unwrap();
        socket.set_curve_secretkey(&keys.secret.0).unwrap();
        socket.set_rcvtimeo(20_000).unwrap();
        socket.connect(&replay_endpoint).unwrap();
        socket
    };
    let stranger = mooncake_kv_events::keys::KeyPair::generate().unwrap();
    let refused = requester(&stranger);
    refused.send_multipart([&b""[..], b"snapshot"], 0).unwrap();
    assert!(eventually(
        || master.publisher.stats().refused_handshakes >= 1
    ));
    assert_eq!(
        refused.poll(zmq::POLLIN, 500).unwrap(),
        0,
        "the stranger got an answer"
    );

    let (events, end) = snapshot(&requester(&admitted), None).unwrap();
    assert_eq!((events.len(), end["objects"].as_u64()), (1, Some(1)));
    assert!(eventually(|| master.publisher.stats().snapshots_served == 1));
}

/// What a replay sends is what the PUB socket sent, frame for frame: a subscriber that
/// fills a gap from it gets the very messages it missed.
#[test]
fn replayed_messages_are_byte_identical_to_those_first_sent() {
    let (pub_endpoint, replay_endpoint) = (tcp_endpoint(), tcp_endpoint());
    let master = Master::new(Publisher::create(&config(&pub_endpoint, &replay_endpoint)).unwrap());
    let sub = raw_subscriber(&pub_endpoint, None);
    joined(&master, &sub);
    let mut rng = Rng::new(7);
    for i in 0..500 {
        master.set(random_object(&mut rng), random_media(&mut rng));
        if i % 7 == 0 {
            // Messages of every size, down to a single event.
            master.publisher.flush(Duration::from_secs(5));
        }
    }
    assert!(master.publisher.flush(Duration::from_secs(10)));
    let sent: Vec<Vec<Vec<u8>>> = common::raw_messages(&sub, Duration::from_millis(500));
    let first = u64::from_be_bytes(sent[0][1].as_slice().try_into().unwrap());

    let replay = dealer(&replay_endpoint);
    replay
        .send_multipart([&b""[..], &first.to_be_bytes()], 0)
        .unwrap();
    let mut replayed = Vec::new();
    loop {
        let frames = replay.recv_multipart(0).expect("the replay goes on");
        if frames[2] == (-1i64).to_be_bytes() {
            break;
        }
        replayed.push(frames);
    }
    assert_eq!(replayed.len(), sent.len());
    for (got, original) in replayed.iter().zip(&sent) {
        // ["", topic, seq, payload] from the ROUTER; [topic, seq, payload] from the PUB socket.
        assert_eq!(got[0], b"");
        assert_eq!(got[1..], original[..]);
    }
}
