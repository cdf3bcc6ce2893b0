//! A publisher that breaks the wire format, by accident or on purpose: a raw XPUB socket
//! sends hand-made frames to a `Subscriber` and to `kv-events tail`, which must refuse what
//! is too large or malformed, say what was wrong, hold their memory to a bound, and go on
//! with the stream.

use kv_events_testing as common;

use mooncake_kv_events::subscriber::{Continuity, Subscriber, SubscriberOptions, WatchError};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: usize = 1 << 20;
const WAIT: Duration = Duration::from_secs(10);

/// A raw publisher on a fresh endpoint. XPUB rather than PUB so that a test waits for the
/// subscription instead of sleeping through ZeroMQ's slow joiner.
struct RawPublisher {
    _context: zmq::Context,
    socket: zmq::Socket,
    endpoint: String,
}

impl RawPublisher {
    fn bind() -> RawPublisher {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::XPUB).expect("an XPUB socket");
        socket.set_linger(0).unwrap();
        socket.set_sndhwm(0).unwrap();
        let endpoint = common::endpoint();
        socket.bind(&endpoint).expect("bind");
        RawPublisher {
            _context: context,
            socket,
            endpoint,
        }
    }

    /// Waits for a subscriber to subscribe (again, after a reconnection).
    fn subscribed(&self) {
        loop {
            assert!(
                self.socket.poll(zmq::POLLIN, 30_000).unwrap() > 0,
                "no subscription came"
            );
            if self.socket.recv_bytes(0).unwrap().first() == Some(&1) {
                return;
            }
        }
    }

    fn send(&self, frames: &[&[u8]]) {
        self.socket.send_multipart(frames, 0).expect("send");
    }

    /// A well-formed message: one `cleared` event.
    fn send_batch(&self, sequence: u64) {
        self.send(&[b"", &sequence.to_be_bytes(), &batch()]);
    }
}

impl Drop for RawPublisher {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.endpoint.trim_start_matches("ipc://"));
    }
}

fn batch() -> Vec<u8> {
    let event = rmpv::Value::Map(vec![(
        rmpv::Value::from("event_type"),
        rmpv::Value::from("cleared"),
    )]);
    let body = rmpv::Value::Array(vec![
        1u64.into(),
        rmpv::Value::Array(vec![event]),
        0u64.into(),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &body).unwrap();
    out
}

/// An array32 header claiming 4 294 967 295 elements, and nothing after it.
const HUGE_CLAIM: &[u8] = &[0xdd, 0xff, 0xff, 0xff, 0xff];

fn subscriber(publisher: &RawPublisher, max_message_bytes: usize) -> Subscriber {
    let options = SubscriberOptions {
        max_message_bytes,
        ..SubscriberOptions::default()
    };
    let subscriber = Subscriber::open(&publisher.endpoint, &options).expect("connects");
    publisher.subscribed();
    subscriber
}

#[test]
fn a_frame_over_the_bound_is_lost_as_a_gap_and_the_subscriber_reconnects() {
    let publisher = RawPublisher::bind();
    let mut subscriber = subscriber(&publisher, MIB);
    // Numbered as a publisher numbers them: the first message is 0.
    publisher.send_batch(0);
    publisher.send(&[b"", &1u64.to_be_bytes(), &vec![0xc0; 2 * MIB]]);
    let first = subscriber.recv(WAIT).expect("a message").expect("in time");
    assert_eq!(
        (first.sequence, first.continuity),
        (0, Continuity::First { missed: 0 })
    );
    // libzmq closed the connection at the oversized frame; the subscriber joins again
    // while it waits in `recv`.
    let resend = std::thread::spawn(move || {
        publisher.subscribed();
        publisher.send_batch(2);
        publisher
    });
    let next = subscriber.recv(WAIT).expect("a message").expect("in time");
    drop(resend.join().expect("the publisher's thread"));
    assert_eq!(
        (next.sequence, next.continuity),
        (2, Continuity::Gap { missed: 1 })
    );
    assert_eq!(subscriber.connections_lost(), 1);
}

#[test]
fn frames_under_the_bound_that_add_up_over_it_are_refused_with_their_size() {
    let publisher = RawPublisher::bind();
    let mut subscriber = subscriber(&publisher, MIB);
    let half = vec![0xc0; MIB / 2 + 1];
    publisher.send(&[b"", &7u64.to_be_bytes(), &half, &half]);
    publisher.send_batch(8);
    let err = subscriber.recv(WAIT).expect_err("refused").to_string();
    let bytes = 8 + 2 * (MIB / 2 + 1);
    assert_eq!(
        err,
        format!(
            "a message of {bytes} bytes (sequence 7) is {} bytes over the bound of {MIB}: \
             dropped",
            bytes - MIB
        )
    );
    let next = subscriber.recv(WAIT).expect("a message").expect("in time");
    assert_eq!(next.sequence, 8);
    assert_eq!(subscriber.connections_lost(), 0);
}

#[test]
fn malformed_messages_are_refused_with_what_was_wrong_and_the_stream_goes_on() {
    let publisher = RawPublisher::bind();
    let mut subscriber = subscriber(&publisher, MIB);
    let seq = 0u64.to_be_bytes();
    let cases: [(&[&[u8]], &str); 5] = [
        (
            &[b"", &seq, br#"{"event_type": "stored"}"#],
            "malformed message: the payload is not a msgpack batch: byte 0 (0x7b) is a \
             positive integer, expected an array of 3 [timestamp_ms, events, dp_rank]",
        ),
        (
            &[b"", &seq, HUGE_CLAIM],
            "malformed message: the payload is an array of 4294967295, expected an array \
             of 3 [timestamp_ms, events, dp_rank]",
        ),
        (
            &[b"", &seq],
            "malformed message: 2 frames, expected 3 (topic, sequence, payload)",
        ),
        (
            &[b"", &seq, &batch(), b"", b""],
            "malformed message: 5 frames, expected 3 (topic, sequence, payload)",
        ),
        (
            &[b"", &[0; 4], &batch()],
            "malformed message: a sequence of 4 bytes, expected 8",
        ),
    ];
    for (frames, _) in &cases {
        publisher.send(frames);
    }
    publisher.send_batch(1);
    for (_, why) in cases {
        match subscriber.recv(WAIT) {
            Err(e @ WatchError::Malformed(_)) => assert_eq!(e.to_string(), why),
            other => panic!("{why}: {other:?}"),
        }
    }
    let next = subscriber.recv(WAIT).expect("a message").expect("in time");
    assert_eq!(next.sequence, 1);
}

/// The peak resident memory of process `pid`, in bytes (VmHWM).
fn peak_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmHWM in kB");
    kib * 1024
}

/// Runs `kv-events tail --max-message-bytes <bound>` against `publisher`, lets `feed` send
/// to it, then stops it at its idle timeout: its stdout, stderr and peak RSS, read while
/// it still runs.
fn tail(
    publisher: &RawPublisher,
    bound: usize,
    feed: impl FnOnce(&RawPublisher),
) -> (String, String, usize) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(["tail", &publisher.endpoint, "--idle-timeout", "2"])
        .args(["--max-message-bytes", &bound.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kv-events starts");
    publisher.subscribed();
    feed(publisher);
    // Read while the tail waits out its idle timeout: a well-formed last message, once
    // printed, says every message before it was handled.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout
        .read_exact(&mut first)
        .expect("the last message's line");
    let peak = peak_rss(child.id());
    let mut out = String::from_utf8(first.to_vec()).unwrap();
    stdout.read_to_string(&mut out).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{err}");
    (out, err, peak)
}

/// What a tail may hold at most: a small multiple of its bound, plus the allowance of a
/// process that has loaded its libraries and threads.
fn within(peak: usize, bound: usize) -> bool {
    peak < 4 * bound + 64 * MIB
}

#[test]
fn tail_refuses_a_message_over_its_bound_in_bounded_memory_and_goes_on() {
    let publisher = RawPublisher::bind();
    let bound = 4 * MIB;
    let (out, err, peak) = tail(&publisher, bound, |p| {
        p.send_batch(0);
        p.send(&[b"", &1u64.to_be_bytes(), &vec![0xc0; 60 * MIB]]);
        p.subscribed();
        p.send_batch(2);
    });
    assert!(within(peak, bound), "peak RSS {peak} bytes\n{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        err.contains("closed: the publisher stopped, or sent a message over --max-message-bytes (4194304 bytes)"),
        "{err}"
    );
    assert!(err.contains("gap of 1 before sequence 2"), "{err}");
}

#[test]
fn tail_says_what_was_wrong_with_a_malformed_message_in_bounded_memory_and_goes_on() {
    let publisher = RawPublisher::bind();
    let bound = 4 * MIB;
    let (out, err, peak) = tail(&publisher, bound, |p| {
        p.send_batch(0);
        p.send(&[b"", &1u64.to_be_bytes(), HUGE_CLAIM]);
        p.send(&[b"", &2u64.to_be_bytes(), b"not msgpack"]);
        p.send_batch(3);
    });
    assert!(within(peak, bound), "peak RSS {peak} bytes\n{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        err.contains(
            "kv-events: refused a message: malformed message: the payload is an array of \
             4294967295, expected an array of 3 [timestamp_ms, events, dp_rank]; its events \
             are lost, the next message shows the gap"
        ),
        "{err}"
    );
    assert!(
        err.contains("byte 0 (0x6e) is a positive integer, expected an array of 3"),
        "{err}"
    );
    assert!(err.contains("gap of 2 before sequence 3"), "{err}");
}
