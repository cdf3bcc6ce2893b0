//! The follower against a scripted publisher that speaks the replay socket's protocol frame
//! by frame: the cases a real publisher produces only by chance (the first held message
//! after a snapshot is not its next sequence N, a gap the buffer holds and one it does not, a
//! busy or inconsistent snapshot, a new incarnation while the stream is quiet, a lost end of
//! burst).

use kv_events_testing as common;

use common::endpoint;
use mooncake_kv_events::subscriber::Index;
use mooncake_kv_events::subscriber::{FollowOptions, Follower, Notice, NoticeKind, Upstream};
use rmpv::Value;
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

fn event(kind: &str, tenant: &str, key: Option<&str>, medium: Option<&str>) -> Value {
    let mut map = vec![
        (Value::from("event_type"), Value::from(kind)),
        (Value::from("tenant_id"), Value::from(tenant)),
    ];
    if let Some(key) = key {
        map.push((Value::from("object_key"), Value::from(key)));
    }
    map.push((
        Value::from("medium"),
        medium.map_or(Value::Nil, Value::from),
    ));
    Value::Map(map)
}

fn stored(tenant: &str, key: &str, medium: &str) -> Value {
    event("stored", tenant, Some(key), Some(medium))
}

fn removed(tenant: &str, key: &str, medium: &str) -> Value {
    event("removed", tenant, Some(key), Some(medium))
}

fn batch(events: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(
        &mut out,
        &Value::Array(vec![1u64.into(), events.to_vec().into(), 0u64.into()]),
    )
    .unwrap();
    out
}

fn map(entries: &[(&str, Value)]) -> Vec<u8> {
    let mut out = Vec::new();
    let entries = entries
        .iter()
        .map(|(k, v)| (Value::from(*k), v.clone()))
        .collect();
    rmpv::encode::write_value(&mut out, &Value::Map(entries)).unwrap();
    out
}

/// How the scripted publisher answers a snapshot request.
#[derive(Clone, Copy, PartialEq)]
enum Snapshots {
    Serve,
    Busy,
    /// An end that announces one object more than it sent.
    Inconsistent,
}

/// A publisher played by the test: a PUB socket, a ROUTER that answers info, replays and
/// snapshots from what the test set, and the truth.
struct Scripted {
    publisher: zmq::Socket,
    router: zmq::Socket,
    incarnation: u64,
    /// The sequence of the next message: the first is 0.
    next: u64,
    /// What a replay can send.
    held: BTreeMap<u64, Vec<u8>>,
    /// What a snapshot sends: its next sequence N and its objects' events.
    snapshot: (u64, Vec<Value>),
    snapshots: Snapshots,
    truth: Index,
    requests: Vec<String>,
    upstream: Upstream,
}

impl Scripted {
    fn new() -> Scripted {
        let context = zmq::Context::new();
        let publisher = context.socket(zmq::PUB).unwrap();
        let router = context.socket(zmq::ROUTER).unwrap();
        let (pub_endpoint, replay_endpoint) = (endpoint(), endpoint());
        publisher.bind(&pub_endpoint).unwrap();
        router.bind(&replay_endpoint).unwrap();
        Scripted {
            publisher,
            router,
            incarnation: 7,
            next: 0,
            held: BTreeMap::new(),
            snapshot: (0, Vec::new()),
            snapshots: Snapshots::Serve,
            truth: Index::new(),
            requests: Vec::new(),
            upstream: Upstream::new(pub_endpoint, replay_endpoint),
        }
    }

    /// Sends the next message with `events`, or (`deliver` false) numbers and keeps it for
    /// replays without sending it: a loss after the socket.
    fn publish(&mut self, events: &[Value], deliver: bool) {
        let sequence = self.next;
        self.next += 1;
        for event in events {
            self.truth.apply(event).unwrap();
        }
        let payload = batch(events);
        if deliver {
            let frames = [vec![], sequence.to_be_bytes().to_vec(), payload.clone()];
            self.publisher.send_multipart(frames, 0).unwrap();
        }
        self.held.insert(sequence, payload);
    }

    /// Sends held message `sequence` on the stream now: one the socket delivers late.
    fn deliver(&self, sequence: u64) {
        let frames = [
            vec![],
            sequence.to_be_bytes().to_vec(),
            self.held[&sequence].clone(),
        ];
        self.publisher.send_multipart(frames, 0).unwrap();
    }

    /// The snapshot a request now gets: the truth before the next sequence.
    fn snapshot_now(&mut self) {
        let events = self
            .truth
            .iter()
            .flat_map(|(t, k, media)| {
                let (t, k) = (
                    String::from_utf8(t.to_vec()).unwrap(),
                    String::from_utf8(k.to_vec()).unwrap(),
                );
                media
                    .iter()
                    .map(move |m| stored(&t, &k, m.as_str()))
                    .collect::<Vec<_>>()
            })
            .collect();
        self.snapshot = (self.next, events);
    }

    /// Answers every request that arrived.
    fn serve(&mut self) {
        while let Ok(frames) = self.router.recv_multipart(zmq::DONTWAIT) {
            let peer = frames[0].clone();
            let send = |frames: Vec<&[u8]>| {
                let mut all: Vec<&[u8]> = vec![&peer, b""];
                all.extend(frames);
                self.router.send_multipart(all, 0).unwrap();
            };
            match frames[2].as_slice() {
                b"info" => {
                    self.requests.push("info".into());
                    // As the library says it: the next sequence when nothing is held.
                    let oldest = self.held.keys().next().copied().unwrap_or(self.next);
                    let body = map(&[
                        ("incarnation", self.incarnation.into()),
                        ("next_sequence", self.next.into()),
                        ("oldest_sequence", oldest.into()),
                        ("snapshots", true.into()),
                    ]);
                    send(vec![b"info", &body]);
                }
                b"snapshot" => {
                    self.requests.push("snapshot".into());
                    match self.snapshots {
                        Snapshots::Busy => send(vec![b"error", b"busy: try again"]),
                        mode => {
                            let (next_sequence, events) = &self.snapshot;
                            for page in events.chunks(64) {
                                send(vec![b"snapshot", &batch(page)]);
                            }
                            let objects: Index = {
                                let mut index = Index::new();
                                for e in events {
                                    index.apply(e).unwrap();
                                }
                                index
                            };
                            let extra = u64::from(mode == Snapshots::Inconsistent);
                            let end = map(&[
                                ("next_sequence", (*next_sequence).into()),
                                ("objects", (objects.objects() as u64 + extra).into()),
                                ("events", (events.len() as u64).into()),
                                ("incarnation", self.incarnation.into()),
                                ("tenant", Value::Nil),
                            ]);
                            send(vec![b"snapshot-end", &end]);
                        }
                    }
                }
                start => {
                    let from = u64::from_be_bytes(start.try_into().unwrap());
                    self.requests.push(format!("replay {from}"));
                    for (sequence, payload) in self.held.range(from..) {
                        send(vec![&sequence.to_be_bytes(), payload]);
                    }
                    send(vec![&(-1i64).to_be_bytes(), b""]);
                }
            }
        }
    }
}

fn options() -> FollowOptions {
    FollowOptions {
        request_timeout: Duration::from_secs(2),
        retry_after: Duration::from_millis(100),
        quiet_check: Duration::from_millis(200),
        ..FollowOptions::default()
    }
}

/// A follower of `scripted`, whose SUB socket has joined.
fn follower(scripted: &Scripted) -> Follower {
    let follower = Follower::new(vec![scripted.upstream.clone()], options()).unwrap();
    // ZeroMQ's slow joiner: the subscription reaches the PUB socket a moment later.
    thread::sleep(Duration::from_millis(300));
    follower
}

/// Polls and serves until the follower is in sync with the truth; the notices.
fn settle(follower: &mut Follower, scripted: &mut Scripted) -> Vec<Notice> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut notices = Vec::new();
    loop {
        notices.extend(follower.poll(Duration::from_millis(10)));
        scripted.serve();
        if follower.in_sync() && *follower.index(0) == scripted.truth {
            return notices;
        }
        assert!(
            Instant::now() < deadline,
            "no convergence: {:?} against {:?}; {:?}; requests {:?}; {notices:#?}",
            follower.index(0).iter().collect::<Vec<_>>(),
            scripted.truth.iter().collect::<Vec<_>>(),
            follower.counters(),
            scripted.requests
        );
    }
}

fn happened(notices: &[Notice]) -> Vec<NoticeKind> {
    notices.iter().map(|n| n.kind.clone()).collect()
}

#[test]
fn messages_held_during_a_snapshot_apply_from_n_and_the_first_missing_one_is_replayed() {
    let mut scripted = Scripted::new();
    // Messages 0 to 4.
    for i in 0..5 {
        scripted.publish(&[stored("t", &format!("k{i}"), "cpu")], true);
    }
    let mut follower = follower(&scripted);
    // The snapshot is asked for; meanwhile 5 is lost and 6 and 7 arrive. The snapshot says
    // N = 5, so 5 must come from a replay.
    let deadline = Instant::now() + Duration::from_secs(5);
    while scripted.router.poll(zmq::POLLIN, 0).unwrap() == 0 {
        follower.poll(Duration::from_millis(10));
        assert!(Instant::now() < deadline, "no snapshot request");
    }
    scripted.snapshot_now();
    scripted.publish(&[removed("t", "k0", "cpu")], false);
    scripted.publish(&[stored("t", "k9", "disk")], true);
    scripted.publish(
        &[event("cleared", "u", None, None), stored("t", "k1", "disk")],
        true,
    );
    thread::sleep(Duration::from_millis(100));
    follower.poll(Duration::from_millis(10));
    let notices = happened(&settle(&mut follower, &mut scripted));
    assert!(
        matches!(
            notices.as_slice(),
            [
                NoticeKind::Snapshot {
                    objects: 5,
                    next_sequence: 5,
                    ..
                },
                NoticeKind::Replayed {
                    from: 5,
                    through: 5,
                    ..
                },
                NoticeKind::InSync { .. }
            ]
        ),
        "{notices:#?}"
    );
    assert_eq!(scripted.requests, ["snapshot", "replay 5"]);
    let counters = follower.counters();
    assert_eq!(
        (counters.messages, counters.replayed_messages, counters.gaps),
        (3, 1, 0),
        "{counters:?}"
    );
}

#[test]
fn a_gap_the_buffer_holds_is_replayed_and_one_it_does_not_hold_calls_for_a_snapshot() {
    let mut scripted = Scripted::new();
    let mut follower = follower(&scripted);
    settle(&mut follower, &mut scripted);
    // Messages 0 to 2; 1 is lost.
    scripted.publish(&[stored("t", "a", "cpu")], true);
    scripted.publish(&[stored("t", "b", "cpu")], false);
    scripted.publish(&[stored("t", "c", "cpu")], true);
    let notices = happened(&settle(&mut follower, &mut scripted));
    assert!(
        notices.iter().any(|n| matches!(
            n,
            NoticeKind::Replayed {
                from: 1,
                through: 1,
                ..
            }
        )),
        "{notices:#?}"
    );
    // The buffer now holds nothing before 5: messages 3 and 4 are gone for good.
    scripted.publish(&[stored("t", "d", "disk")], false);
    scripted.publish(&[removed("t", "a", "cpu")], false);
    scripted.publish(&[stored("t", "e", "cpu")], true);
    scripted.held.retain(|s, _| *s >= 5);
    scripted.snapshot_now();
    let notices = happened(&settle(&mut follower, &mut scripted));
    assert!(
        notices.contains(&NoticeKind::NotHeld {
            from: 3,
            through: 4,
            oldest: 5
        }),
        "{notices:#?}"
    );
    let counters = follower.counters();
    assert_eq!(
        (counters.gaps, counters.replays, counters.snapshots),
        (2, 1, 2),
        "{counters:?}"
    );
    assert_eq!(counters.convergences, 3, "{counters:?}");
}

#[test]
fn busy_and_inconsistent_snapshots_are_retried() {
    let mut scripted = Scripted::new();
    scripted.publish(&[stored("t", "a", "cpu")], true);
    scripted.snapshot_now();
    scripted.snapshots = Snapshots::Busy;
    let mut follower = follower(&scripted);
    let mut notices = Vec::new();
    while !scripted.requests.iter().any(|r| r == "snapshot") {
        notices.extend(follower.poll(Duration::from_millis(10)));
        scripted.serve();
    }
    scripted.snapshots = Snapshots::Inconsistent;
    while scripted
        .requests
        .iter()
        .filter(|r| *r == "snapshot")
        .count()
        < 3
    {
        notices.extend(follower.poll(Duration::from_millis(10)));
        scripted.serve();
    }
    scripted.snapshots = Snapshots::Serve;
    notices.extend(settle(&mut follower, &mut scripted));
    let text: Vec<String> = notices.iter().map(|n| n.kind.to_string()).collect();
    assert!(
        text.iter().any(|t| t.contains("busy: try again")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|t| t.contains("announced 1 events and 2 objects; 1 events and 1 objects")),
        "{text:#?}"
    );
    let counters = follower.counters();
    assert!(counters.failed_requests >= 2, "{counters:?}");
    assert!(counters.malformed >= 1, "{counters:?}");
    assert_eq!(counters.snapshots, 1, "{counters:?}");
}

#[test]
fn a_new_incarnation_found_while_the_stream_is_quiet_calls_for_a_snapshot() {
    let mut scripted = Scripted::new();
    scripted.publish(&[stored("t", "a", "cpu")], true);
    scripted.snapshot_now();
    let mut follower = follower(&scripted);
    settle(&mut follower, &mut scripted);
    // Another life: sequences from 0 again, other objects, nothing sent yet.
    scripted.incarnation = 8;
    scripted.next = 0;
    scripted.held.clear();
    scripted.truth = Index::new();
    scripted.publish(&[stored("t", "b", "disk")], false);
    scripted.snapshot_now();
    let notices = happened(&settle(&mut follower, &mut scripted));
    assert!(
        notices.contains(&NoticeKind::NewIncarnation { old: 7, new: 8 }),
        "{notices:#?}"
    );
    assert_eq!(follower.status(0).incarnation, Some(8));
    assert_eq!(follower.counters().incarnations, 1);
}

#[test]
fn a_loss_at_the_end_of_a_burst_is_found_by_info_and_replayed() {
    let mut scripted = Scripted::new();
    let mut follower = follower(&scripted);
    settle(&mut follower, &mut scripted);
    // Messages 0 to 2; 1 and 2, the end of the burst, are lost.
    scripted.publish(&[stored("t", "a", "cpu")], true);
    scripted.publish(&[stored("t", "b", "cpu")], false);
    scripted.publish(&[stored("t", "c", "cpu")], false);
    let notices = happened(&settle(&mut follower, &mut scripted));
    assert!(
        notices.iter().any(|n| matches!(
            n,
            NoticeKind::Replayed {
                from: 1,
                through: 2,
                ..
            }
        )),
        "{notices:#?}"
    );
    assert_eq!(follower.counters().gaps, 1);
}

#[test]
fn an_info_ahead_of_the_stream_once_is_no_loss_when_the_stream_then_brings_it() {
    let mut scripted = Scripted::new();
    let mut follower = follower(&scripted);
    settle(&mut follower, &mut scripted);
    // Messages 0 and 1 are sent but still on their way, as after the reader stalled: a
    // quiet check hears of them before the stream brings them.
    scripted.publish(&[stored("t", "a", "cpu")], false);
    scripted.publish(&[stored("t", "b", "cpu")], false);
    let asked = scripted.requests.len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scripted.requests[asked..].iter().any(|r| r == "info") {
        assert!(Instant::now() < deadline, "no quiet check");
        follower.poll(Duration::from_millis(10));
        scripted.serve();
    }
    // The reply is taken before the stream brings the messages.
    for _ in 0..5 {
        follower.poll(Duration::from_millis(10));
    }
    scripted.deliver(0);
    scripted.deliver(1);
    // Nothing more is answered until the stream brought them: under load, a check answered
    // before they reach the socket would be the second one short, a real loss to the follower.
    let deadline = Instant::now() + Duration::from_secs(10);
    while follower.status(0).next_sequence != Some(2) {
        assert!(Instant::now() < deadline, "the stream never brought them");
        follower.poll(Duration::from_millis(10));
    }
    let notices = happened(&settle(&mut follower, &mut scripted));
    assert_eq!(follower.counters().gaps, 0, "{notices:#?}");
    assert!(
        !scripted.requests[asked..].iter().any(|r| r != "info"),
        "a replay or snapshot it did not need: {:?}",
        scripted.requests
    );
}
