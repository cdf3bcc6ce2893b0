//! The dialect of the field's consumers, on real sockets: the topic frame, which
//! subscriptions are admitted, the two forms of replay replies, heartbeats. Frames are read
//! raw and payloads decoded with `rmpv`, not with the library's decoders.

use kv_events_testing as common;

use common::{config, dealer, eventually, publish};
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use rmpv::Value;
use std::time::Duration;

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const TOPIC: &[u8] = b"kv@pod-1@model-a";

/// A raw SUB socket subscribed to `subscription`, connected to `endpoint`.
fn sub(endpoint: &str, subscription: &[u8]) -> zmq::Socket {
    let socket = zmq::Context::new().socket(zmq::SUB).unwrap();
    socket.set_linger(0).unwrap();
    socket.set_subscribe(subscription).unwrap();
    socket.connect(endpoint).unwrap();
    socket
}

/// The next message on `socket` within 10 s, frame by frame.
fn next(socket: &zmq::Socket) -> Option<Vec<Vec<u8>>> {
    (socket.poll(zmq::POLLIN, 10_000).unwrap() > 0).then(|| socket.recv_multipart(0).unwrap())
}

/// A payload as msgpack values: `[timestamp_ms, events, dp_rank]`.
fn batch(payload: &[u8]) -> Vec<Value> {
    match rmpv::decode::read_value(&mut &payload[..]).unwrap() {
        Value::Array(items) if items.len() == 3 => items,
        other => panic!("not a batch: {other}"),
    }
}

/// Publishes one call after another until `socket` receives one (the slow joiner), then
/// returns that message.
fn first_message(publisher: &Publisher, socket: &zmq::Socket) -> Vec<Vec<u8>> {
    for call in 0..100 {
        publisher.on_put_commit("t", format!("join-{call}"), "", CPU);
        if socket.poll(zmq::POLLIN, 100).unwrap() > 0 {
            return socket.recv_multipart(0).unwrap();
        }
    }
    panic!("nothing arrived");
}

#[test]
fn every_message_carries_the_topic_and_each_prefix_of_it_is_a_subscription() {
    let (publisher, endpoint) = publish(Config {
        topic: String::from_utf8(TOPIC.to_vec()).unwrap(),
        ..config("")
    });
    let exact = sub(&endpoint, TOPIC);
    let prefix = sub(&endpoint, b"kv@");
    let everything = sub(&endpoint, b"");
    let wrong = sub(&endpoint, b"kv@pod-2");
    assert!(eventually(|| publisher.stats().subscribers == 4));
    let frames = first_message(&publisher, &exact);
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0], TOPIC);
    assert_eq!(frames[1].len(), 8);
    assert_eq!(batch(&frames[2])[1].as_array().unwrap().len(), 1);
    publisher.on_put_commit("t", "after", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)));
    for socket in [&prefix, &everything] {
        let saw_after = std::iter::from_fn(|| next(socket)).any(|frames| {
            assert_eq!(frames[0], TOPIC);
            let events = batch(&frames[2]);
            let mut keys = events[1].as_array().unwrap().iter();
            keys.any(|e| e["object_key"].as_str() == Some("after"))
        });
        assert!(saw_after, "a subscriber of a prefix missed the stream");
    }
    // The wrong guess reads nothing, is counted once, and keeps its connection.
    assert_eq!(wrong.poll(zmq::POLLIN, 300).unwrap(), 0);
    let stats = publisher.stats();
    assert_eq!(stats.subscriptions_refused, 1, "{stats:?}");
    assert_eq!(stats.subscriber_disconnects, 0, "{stats:?}");
    assert_eq!(stats.subscribers, 4, "{stats:?}");
}

#[test]
fn a_peer_that_floods_refused_subscriptions_is_cut_off() {
    let (publisher, endpoint) = publish(Config {
        topic: "kv@pod-1@model-a".into(),
        ..config("")
    });
    let flood = sub(&endpoint, b"x0");
    assert!(eventually(|| publisher.stats().subscribers == 1));
    for n in 1..20 {
        flood.set_subscribe(format!("x{n}").as_bytes()).unwrap();
    }
    assert!(
        eventually(|| publisher.stats().subscriber_disconnects >= 1),
        "{:?}",
        publisher.stats()
    );
    assert!(publisher.stats().subscriptions_refused > 8);
}

/// A publisher with a replay socket and `topic`, replies in the form `topic_frame` says,
/// after `messages` messages of one event each; its replay endpoint.
fn replaying(topic_frame: bool, messages: usize) -> (Publisher, String) {
    let replay = common::endpoint();
    let (publisher, _) = publish(Config {
        topic: "kv@pod-1@model-a".into(),
        replay_topic_frame: topic_frame,
        replay_endpoint: replay.clone(),
        ..config("")
    });
    for call in 0..messages {
        publisher.on_put_commit("t", format!("k{call}"), "", CPU);
        assert!(publisher.flush(Duration::from_secs(10)));
    }
    (publisher, replay)
}

/// Asks `replay` for a replay from sequence 0, the first message's, and reads every reply up
/// to and including the end, raw.
fn replay_from_0(replay: &str) -> Vec<Vec<Vec<u8>>> {
    let dealer = dealer(replay);
    dealer
        .send_multipart([&b""[..], &0u64.to_be_bytes()], 0)
        .unwrap();
    let mut replies = Vec::new();
    loop {
        let frames = dealer.recv_multipart(0).expect("a reply within 20 s");
        let end = frames.last().is_some_and(|f| f.is_empty());
        replies.push(frames);
        if end {
            return replies;
        }
    }
}

#[test]
fn replayed_messages_have_the_live_frames_and_end_as_vllm_ends_them() {
    let (_publisher, replay) = replaying(true, 3);
    let replies = replay_from_0(&replay);
    assert_eq!(replies.len(), 4);
    for (i, frames) in replies[..3].iter().enumerate() {
        assert_eq!(frames.len(), 4, "{frames:?}");
        assert_eq!(frames[0], b"");
        assert_eq!(frames[1], TOPIC);
        assert_eq!(frames[2], (i as u64).to_be_bytes());
        let key = format!("k{i}");
        assert_eq!(
            batch(&frames[3])[1][0]["object_key"].as_str(),
            Some(&key[..])
        );
    }
    // vLLM's end marker: an empty topic frame, -1, an empty payload.
    let end: [&[u8]; 4] = [b"", b"", &(-1i64).to_be_bytes(), b""];
    assert_eq!(replies[3], end);
}

#[test]
fn without_the_topic_frame_replies_are_the_older_form() {
    let (_publisher, replay) = replaying(false, 2);
    let replies = replay_from_0(&replay);
    assert_eq!(replies.len(), 3);
    for (i, frames) in replies[..2].iter().enumerate() {
        assert_eq!(frames.len(), 3, "{frames:?}");
        assert_eq!(frames[0], b"");
        assert_eq!(frames[1], (i as u64).to_be_bytes());
        batch(&frames[2]);
    }
    let end: [&[u8]; 3] = [b"", &(-1i64).to_be_bytes(), b""];
    assert_eq!(replies[2], end);
}

#[test]
fn a_heartbeat_after_a_silence_shows_a_lost_tail_as_a_gap() {
    let (publisher, endpoint) = publish(Config {
        heartbeat_ms: 100,
        ..config("")
    });
    // Sent before anyone subscribed, as sequence 0: lost for the subscriber that comes next.
    publisher.on_put_commit("t", "lost", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)));
    let socket = sub(&endpoint, b"");
    let frames = next(&socket).expect("a heartbeat within 10 s");
    assert_eq!(frames[0], b"");
    let sequence = u64::from_be_bytes(frames[1].clone().try_into().unwrap());
    assert!(
        sequence >= 1,
        "the heartbeat took the next sequence: {sequence}"
    );
    let heartbeat = batch(&frames[2]);
    assert!(heartbeat[0].is_u64(), "{heartbeat:?}");
    assert_eq!(heartbeat[1], Value::Array(vec![]));
    assert_eq!(heartbeat[2], Value::from(0u8));
    // They go on while nothing happens, one sequence each.
    let frames = next(&socket).expect("another heartbeat");
    assert_eq!(
        u64::from_be_bytes(frames[1].clone().try_into().unwrap()),
        sequence + 1
    );
    // The counter moves once the socket took the message, maybe after it arrived here.
    assert!(eventually(|| publisher.stats().heartbeats >= 2));
    assert_eq!(publisher.stats().published_batches, 1);
}

#[test]
fn no_heartbeat_unless_asked_for() {
    let (publisher, endpoint) = publish(config(""));
    let socket = sub(&endpoint, b"");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(socket.poll(zmq::POLLIN, 500).unwrap(), 0);
    assert_eq!(publisher.stats().heartbeats, 0);
}

/// The replay consumer of llm-d's router (its `zmqSubscriber`, pkg/kvevents, as of its
/// replay PR): a SUB of a topic prefix, a DEALER per replay request, two watermarks (the
/// last live sequence seen, the last sequence handed on), a replay from 0 on joining
/// mid-stream and after the sequence goes back. Written here after its source, to check
/// that what it expects of the frames is what the publisher sends.
struct LlmdConsumer {
    sub: zmq::Socket,
    replay_endpoint: String,
    last_seq: Option<u64>,
    last_live_seq: Option<u64>,
    /// Sequences handed on (to its indexer), in order.
    handed: Vec<u64>,
    replays: u32,
    resets: u32,
}

impl LlmdConsumer {
    fn new(endpoint: &str, replay_endpoint: &str, topic_filter: &[u8]) -> LlmdConsumer {
        let sub = sub(endpoint, topic_filter);
        sub.set_rcvhwm(1).unwrap();
        sub.set_rcvbuf(4096).unwrap();
        LlmdConsumer {
            sub,
            replay_endpoint: replay_endpoint.into(),
            last_seq: None,
            last_live_seq: None,
            handed: Vec::new(),
            replays: 0,
            resets: 0,
        }
    }

    /// `parseEventFrame`: exactly three frames, a sequence of at least 8 bytes.
    fn parse(frames: &[Vec<u8>]) -> Option<u64> {
        match frames {
            [_topic, seq, _payload] if seq.len() >= 8 => {
                Some(u64::from_be_bytes(seq[..8].try_into().unwrap()))
            }
            _ => None,
        }
    }

    /// `requestReplay`: false when a reply is malformed.
    fn request_replay(&mut self, start: u64) -> bool {
        self.replays += 1;
        let dealer = dealer(&self.replay_endpoint);
        dealer
            .send_multipart([&b""[..], &start.to_be_bytes()], 0)
            .unwrap();
        loop {
            let mut frames = dealer.recv_multipart(0).expect("a reply within 20 s");
            if frames.first().is_some_and(Vec::is_empty) {
                frames.remove(0);
            }
            if frames.len() == 3 && frames[2].is_empty() {
                return true;
            }
            let Some(seq) = Self::parse(&frames) else {
                return false;
            };
            assert_eq!(frames[0], TOPIC, "a replayed message carries the topic");
            if self.last_seq.is_some_and(|last| seq <= last) {
                continue;
            }
            self.handed.push(seq);
            self.last_seq = Some(seq);
        }
    }

    /// One live message, as `runSubscriber` takes it.
    fn on_live(&mut self, frames: &[Vec<u8>]) {
        let seq = Self::parse(frames).expect("a well-formed live message");
        if self.last_live_seq.is_some_and(|live| seq < live) {
            // The sequence went back: a restart. Reset the source and rebuild.
            self.resets += 1;
            self.last_seq = None;
            self.handed.clear();
            assert!(self.request_replay(0));
        }
        if self.last_live_seq == Some(seq) {
            return;
        }
        self.last_live_seq = Some(seq);
        if self.last_seq.is_some_and(|last| seq <= last) {
            return;
        }
        if let Some(last) = self.last_seq.filter(|last| seq > last + 1) {
            assert!(self.request_replay(last + 1), "a gap replay");
        }
        if self.last_seq.is_none() && seq > 0 {
            assert!(self.request_replay(0), "a replay on joining mid-stream");
        }
        if self.last_seq.is_some_and(|last| seq != last + 1) {
            return;
        }
        self.handed.push(seq);
        self.last_seq = Some(seq);
    }

    /// Takes what arrived until the stream is quiet for `quiet`.
    fn read(&mut self, quiet: Duration) {
        while self
            .sub
            .poll(zmq::POLLIN, quiet.as_millis() as i64)
            .unwrap()
            > 0
        {
            let frames = self.sub.recv_multipart(0).unwrap();
            self.on_live(&frames);
        }
    }
}

/// A publisher on `endpoint` and `replay` with the llm-d topic, every message replayable.
fn llmd_publisher(endpoint: &str, replay: &str) -> Publisher {
    Publisher::create(&Config {
        topic: String::from_utf8(TOPIC.to_vec()).unwrap(),
        replay_endpoint: replay.into(),
        send_hwm: 2,
        ..config(endpoint)
    })
    .unwrap()
}

#[test]
fn llm_d_routers_replay_consumer_joins_fills_gaps_and_follows_a_restart() {
    let (endpoint, replay) = (common::tcp_endpoint(), common::tcp_endpoint());
    let publisher = llmd_publisher(&endpoint, &replay);
    for call in 0..50 {
        publisher.on_put_commit("t", format!("before-{call}"), "", CPU);
    }
    assert!(publisher.flush(Duration::from_secs(10)));
    // Joins mid-stream: the first live message calls for a replay from 0.
    let mut consumer = LlmdConsumer::new(&endpoint, &replay, b"kv@");
    let frames = first_message(&publisher, &consumer.sub);
    consumer.on_live(&frames);
    assert_eq!(consumer.handed.first(), Some(&0), "{:?}", consumer.handed);
    // A burst the SUB socket cannot hold (a receive buffer of one message): gaps, each
    // filled by a replay from the last sequence handed on.
    for call in 0..3000 {
        publisher.on_put_commit("t", format!("burst-{call}"), "", CPU);
    }
    assert!(publisher.flush(Duration::from_secs(10)));
    consumer.read(Duration::from_millis(500));
    let next = publisher.stats().next_sequence;
    assert_eq!(consumer.handed, (0..next).collect::<Vec<_>>());
    assert!(consumer.replays >= 2, "the burst left no gap to replay");
    // The master restarts on the same endpoints: the sequence goes back to 0.
    drop(publisher);
    let publisher = llmd_publisher(&endpoint, &replay);
    let frames = first_message(&publisher, &consumer.sub);
    consumer.on_live(&frames);
    consumer.read(Duration::from_millis(500));
    assert_eq!(consumer.resets, 1);
    let next = publisher.stats().next_sequence;
    assert_eq!(consumer.handed, (0..next).collect::<Vec<_>>());
}
