//! Hostile peers against a running publisher, each a bounded attack on loopback: the
//! `kv-events demo` process publishes, `scripts/attack.py` attacks it while the demo's workload
//! runs and measures its descriptors, memory and CPU time from /proc, and the tests assert what
//! a master relies on: descriptors given back, memory bounded, the admitted subscriber's stream
//! complete, and the publisher's own counters showing that the attack took place. Also the loss
//! a subscriber cannot see in the stream (the end of a burst), found and filled through the
//! replay socket.

use kv_events_testing as common;

use common::{eventually, tcp_endpoint, TempDir};
use mooncake_kv_events::subscriber::{Catchup, ReplayClient};
use mooncake_kv_events::subscriber::{Continuity, Subscriber};
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";
const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
/// What the demo says as its workload starts, and the start of what it says once it is done.
const WORKLOAD_STARTS: &str = "The workload starts.";
const WORKLOAD_DONE: &str = "The workload is done";

/// The attacks measure a process's descriptors, memory and CPU time, and its watcher must
/// keep up: one at a time, so that they do not measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A `kv-events demo` that keeps its publisher up `wait` seconds, for its watcher to join,
/// before its workload of `objects`, on a fresh loopback port; its stdout read as it comes,
/// each line with the instant it arrived.
struct Demo {
    child: Child,
    endpoint: String,
    lines: Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
}

impl Demo {
    fn start(objects: usize, wait: u32, extra: &[&str]) -> Demo {
        let endpoint = tcp_endpoint();
        let mut child = Command::new(env!("CARGO_BIN_EXE_kv-events"))
            .args(["demo", "--endpoint", &endpoint, "--show", "0"])
            .args([
                "--objects",
                &objects.to_string(),
                "--wait",
                &wait.to_string(),
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kv-events demo runs");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (to_test, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if to_test.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        let address = endpoint.trim_start_matches("tcp://").to_owned();
        assert!(
            eventually(|| TcpStream::connect(&address).is_ok()),
            "the demo listens on {endpoint}"
        );
        Demo {
            child,
            endpoint,
            lines,
            seen: Vec::new(),
        }
    }

    /// The instant the demo said a line that starts with `start`, waiting for it up to a
    /// minute; `None` if its stdout ended or the minute passed first.
    fn said(&mut self, start: &str) -> Option<Instant> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((at, _)) = self.seen.iter().find(|(_, l)| l.starts_with(start)) {
                return Some(*at);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.seen.push(self.lines.recv_timeout(left).ok()?);
        }
    }

    /// Runs one attack against the demo; its JSON report.
    fn attack(&self, mode: &str, args: &[&str]) -> Value {
        let pid = self.child.id().to_string();
        let output = Command::new(PYTHON)
            .arg("-B")
            .arg(common::repo_root().join("scripts/attack.py"))
            .args([mode, "--endpoint", &self.endpoint, "--pid", &pid])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{PYTHON} does not run ({e}): run scripts/install-deps.sh"));
        assert!(
            output.status.success(),
            "attack.py {mode}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("attack.py prints JSON")
    }

    /// Runs one attack once the demo's workload has started, and checks that the workload was
    /// still running when the attack ended; the attack's report.
    fn attack_during_the_workload(&mut self, mode: &str, args: &[&str]) -> Value {
        assert!(
            self.said(WORKLOAD_STARTS).is_some(),
            "the demo's workload never started"
        );
        let report = self.attack(mode, args);
        let ended = Instant::now();
        let done = self.said(WORKLOAD_DONE).expect("the demo's workload ends");
        assert!(
            ended < done,
            "the {mode} attack outlasted the workload ({:.1}s): pace the workload slower \
             (--rate) or give it more objects; {report}",
            (ended - done).as_secs_f64()
        );
        report
    }

    /// Waits for the demo to end: its exit status, stdout and stderr.
    fn finish(mut self) -> (bool, String, String) {
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = self.child.wait().unwrap();
        // The reader thread sends every line, then ends with the demo's stdout.
        self.seen.extend(self.lines.iter());
        let out = self
            .seen
            .iter()
            .map(|(_, line)| format!("{line}\n"))
            .collect();
        (status.success(), out, err)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `label` in the demo's "Publisher stats" table.
fn stat(out: &str, label: &str) -> u64 {
    out.lines()
        .find_map(|line| line.trim().strip_prefix(label)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {label} in the demo's output:\n{out}"))
}

fn measured(report: &Value, at: &str, what: &str) -> i64 {
    report[at][what]
        .as_i64()
        .unwrap_or_else(|| panic!("{at}.{what} in {report}"))
}

/// The attack left the publisher's descriptors where they were.
fn assert_descriptors_given_back(report: &Value) {
    assert!(
        measured(report, "after", "fds") <= measured(report, "before", "fds") + 2,
        "descriptors given back: {report}"
    );
}

/// The attack grew the publisher's resident memory by less than `peak_kib` at any time, and
/// left it within `kept_kib` of where it was.
fn assert_memory_bounded(report: &Value, peak_kib: i64, kept_kib: i64) {
    let before = measured(report, "before", "rss_kib");
    let grew = measured(report, "peak", "rss_kib") - before;
    assert!(grew < peak_kib, "RSS grew {grew} KiB: {report}");
    let kept = measured(report, "after", "rss_kib") - before;
    assert!(
        kept < kept_kib,
        "RSS kept {kept} KiB after the attack: {report}"
    );
}

/// The demo ended with its watcher's verdict that it saw every published event, in order,
/// with no gap; its stdout.
fn assert_the_watcher_saw_everything(demo: Demo) -> String {
    let (ok, out, err) = demo.finish();
    assert!(ok, "the admitted watcher saw everything:\n{out}\n{err}");
    assert!(out.contains("OK: the watcher saw all"), "{out}");
    out
}

// The demo's workloads are paced (--rate, in calls a second; an object takes about 2.4 calls)
// to outlast the attack beside them, which starts with them.

#[test]
fn idle_connections_are_refused_past_the_bounds_and_closed_at_the_handshake_timeout() {
    let _serial = one_at_a_time();
    let mut demo = Demo::start(5000, 1, &["--rate", "1000"]);
    // 150 connections from one address that send nothing: the 63 that address may still hold
    // (the demo's watcher holds one) wait for the 3 s handshake timeout, the others are
    // closed at once.
    let report = demo.attack_during_the_workload("idle", &["--count", "150", "--hold", "4.5"]);
    assert_eq!(report["connected"], 150, "{report}");
    let at_once = report["closed_within_0_5_s"].as_i64().unwrap();
    assert!(at_once >= 150 - 64, "refused at once: {report}");
    assert_eq!(
        report["closed_within_4.5_s"], 150,
        "all closed by the timeout: {report}"
    );
    assert!(
        report["fds_after_0_5_s"].as_i64().unwrap() <= measured(&report, "before", "fds") + 64 + 2,
        "the publisher held at most the per-address bound: {report}"
    );
    assert_descriptors_given_back(&report);
    let out = assert_the_watcher_saw_everything(demo);
    // Each connection was closed by the publisher, and counted once.
    assert_eq!(
        stat(&out, "connections_refused") + stat(&out, "handshake_timeouts"),
        150,
        "{out}"
    );
    assert_eq!(stat(&out, "connections_refused") as i64, at_once, "{out}");
}

#[test]
fn a_flood_of_random_bytes_leaves_descriptors_and_memory_where_they_were() {
    let _serial = one_at_a_time();
    let mut demo = Demo::start(5000, 1, &["--rate", "1000"]);
    let report = demo.attack_during_the_workload("garbage", &["--count", "2000", "--hold", "3"]);
    assert_eq!(report["connections_sent_1_kib"], 2000, "{report}");
    // The publisher read each connection's bytes and closed it.
    assert_eq!(report["closed_by_publisher"], 2000, "{report}");
    assert_memory_bounded(&report, 16 * 1024, 4 * 1024);
    assert_descriptors_given_back(&report);
    assert_the_watcher_saw_everything(demo);
}

#[test]
fn a_subscription_flood_is_refused_and_leaves_memory_where_it_was() {
    let _serial = one_at_a_time();
    let mut demo = Demo::start(5000, 1, &["--rate", "1000"]);
    let report = demo.attack_during_the_workload(
        "subscribe",
        &[
            "--count",
            "20",
            "--prefixes",
            "500",
            "--rounds",
            "3",
            "--hold",
            "3",
        ],
    );
    // 60 peers, 30000 subscriptions: each peer was cut off. Nearly all joined first, and were
    // cut at their first subscription; the publishing thread cuts a peer by the descriptor
    // its subscription came through, which a peer cut before may have left to a new one
    // still in its handshake.
    assert_eq!(report["subscriptions_sent"], 30000, "{report}");
    assert_eq!(report["cut_off"], 60, "{report}");
    let joined = report["joined"].as_u64().unwrap();
    assert!(joined >= 50, "{report}");
    // Once the flood is over the heap is given back.
    assert_memory_bounded(&report, 16 * 1024, 4 * 1024);
    assert_descriptors_given_back(&report);
    let out = assert_the_watcher_saw_everything(demo);
    assert!(stat(&out, "subscriptions_refused") >= joined, "{out}");
    // The watcher, and each peer that joined, once. Under load a peer may be cut before it
    // sees its own handshake complete (not `joined` for the script, yet counted by the
    // publisher): between the joined and all 60, never more.
    let connects = stat(&out, "subscriber_connects");
    assert!((1 + joined..=1 + 60).contains(&connects), "{out}");
}

#[test]
fn a_curve_handshake_flood_leaves_the_admitted_subscriber_its_whole_stream() {
    let _serial = one_at_a_time();
    let dir = TempDir::new("hostile-curve");
    let keygen = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .current_dir(&dir.0)
        .args(["keygen", "server"])
        .output()
        .unwrap();
    assert!(keygen.status.success());
    let secret = dir.0.join("server.key");
    let allow = dir.0.join("nobody.pub");
    let other = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .current_dir(&dir.0)
        .args(["keygen", "nobody"])
        .output()
        .unwrap();
    assert!(other.status.success());
    let mut demo = Demo::start(
        20_000,
        3,
        &[
            "--rate",
            "6000",
            "--curve-secret-key",
            secret.to_str().unwrap(),
            "--curve-allow",
            allow.to_str().unwrap(),
        ],
    );
    let server_pub = dir.0.join("server.pub");
    let report = demo.attack_during_the_workload(
        "curve-flood",
        &[
            "--count",
            "300",
            "--server-key",
            server_pub.to_str().unwrap(),
            "--hold",
            "0.5",
        ],
    );
    // Each handshake went as far as the publisher's refusal, as the peer saw it.
    assert_eq!(report["handshakes"], 300, "{report}");
    assert_eq!(report["refused"], 300, "{report}");
    let out = assert_the_watcher_saw_everything(demo);
    // And as the publisher counted it.
    assert!(stat(&out, "refused_handshakes") >= 300, "{out}");
}

#[test]
fn subscribers_that_never_read_cost_the_reader_nothing() {
    let _serial = one_at_a_time();
    let mut demo = Demo::start(20_000, 3, &["--rate", "2400"]);
    let report = demo.attack_during_the_workload("nonreaders", &["--count", "40", "--hold", "12"]);
    assert_eq!(report["subscribers"], 40, "{report}");
    assert_eq!(report["joined"], 40, "{report}");
    let out = assert_the_watcher_saw_everything(demo);
    // The watcher and the 40, each once.
    assert_eq!(stat(&out, "subscriber_connects"), 41, "{out}");
}

/// A publisher with a replay socket and a send limit of `send_hwm` messages, on loopback.
fn replaying(send_hwm: u32, replay_buffer_bytes: u64) -> (Publisher, String, String) {
    let (endpoint, replay) = (tcp_endpoint(), tcp_endpoint());
    let publisher = Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: endpoint.clone(),
        replay_endpoint: replay.clone(),
        replay_buffer_bytes,
        backend_id: "store-a".into(),
        send_hwm,
        // Room for the whole burst: events dropped before encoding were never sent, and no
        // replay has them.
        queue_capacity: 1 << 18,
        ..Config::default()
    })
    .expect("the publisher binds");
    (publisher, endpoint, replay)
}

/// Reads `subscriber` through `catchup` until the stream has been quiet and the end was
/// checked; every sequence number taken, and the numbers lost at the end.
fn read_to_the_end(subscriber: &mut Subscriber, catchup: &mut Catchup) -> (Vec<u64>, u64) {
    let mut sequences = Vec::new();
    let mut record = |batches: Vec<mooncake_kv_events::subscriber::Batch>| {
        for batch in batches {
            sequences.push((batch.sequence, batch.continuity));
        }
    };
    while let Some(batch) = subscriber
        .recv(Duration::from_millis(500))
        .expect("a message")
    {
        let (batches, failure) = catchup.fill(batch);
        assert!(failure.is_none(), "{failure:?}");
        record(batches);
    }
    let (batches, lost) = catchup.check_end().expect("the replay socket answers");
    record(batches);
    let gaps: u64 = sequences
        .iter()
        .map(|(_, c)| match c {
            Continuity::Gap { missed } => *missed,
            _ => 0,
        })
        .sum();
    assert_eq!(gaps, 0, "every gap filled: {sequences:?}");
    (sequences.into_iter().map(|(s, _)| s).collect(), lost)
}

/// A subscriber whose buffers hold one message, so that a burst overflows the publisher's
/// send limit for it; connected and subscribed.
fn small_subscriber(endpoint: &str) -> Subscriber {
    let subscriber = Subscriber::connect(endpoint, 1).expect("the subscriber connects");
    std::thread::sleep(Duration::from_millis(300));
    subscriber
}

/// Publishes `calls` calls; the publisher's next sequence after them: every message of the
/// burst is numbered below it, from 0.
fn burst(publisher: &Publisher, calls: usize) -> u64 {
    for i in 0..calls {
        publisher.on_put_commit("t", format!("key-{i}"), "", CPU);
    }
    assert!(publisher.flush(Duration::from_secs(20)));
    publisher.stats().next_sequence
}

#[test]
fn a_burst_lost_at_the_socket_is_filled_by_replay_up_to_its_last_message() {
    let _serial = one_at_a_time();
    let (publisher, endpoint, replay) = replaying(4, 64 << 20);
    let mut subscriber = small_subscriber(&endpoint);
    let mut catchup = Catchup::new(ReplayClient::connect(&replay, None).unwrap());
    // Far more messages than the subscriber's buffers and the send limit hold: the socket
    // drops some for it, the last ones among them.
    let next = burst(&publisher, 64 * 2000);
    let (sequences, lost) = read_to_the_end(&mut subscriber, &mut catchup);
    assert_eq!(lost, 0);
    assert_eq!(
        sequences,
        (0..next).collect::<Vec<_>>(),
        "every message, once, in order"
    );
    assert!(
        publisher.stats().replayed_messages > 0,
        "the socket did drop some"
    );
}

#[test]
fn a_loss_at_the_end_of_a_burst_that_replay_cannot_fill_is_reported() {
    let _serial = one_at_a_time();
    let (publisher, endpoint, replay) = replaying(4, 0);
    let mut subscriber = small_subscriber(&endpoint);
    let mut catchup = Catchup::new(ReplayClient::connect(&replay, None).unwrap());
    let next = burst(&publisher, 64 * 2000);
    let mut seen = None;
    while let Some(batch) = subscriber.recv(Duration::from_millis(500)).unwrap() {
        let (batches, _) = catchup.fill(batch);
        seen = batches.last().map(|b| b.sequence).or(seen);
    }
    let seen = seen.expect("some messages arrived");
    let (replayed, lost) = catchup.check_end().unwrap();
    assert!(replayed.is_empty(), "a buffer of 0 bytes holds nothing");
    // Nothing held: the oldest a replay could send is the next message.
    let stats = publisher.stats();
    assert_eq!(
        (stats.replay_buffer_bytes, stats.replay_oldest_sequence),
        (0, next),
        "{stats:?}"
    );
    // Lost: the numbers after the last seen, up to the last taken (next - 1).
    assert_eq!(
        lost,
        next - 1 - seen,
        "the loss at the end is told, exactly"
    );
}

/// The child side of the next test: a publisher in a process whose descriptors are all
/// taken, as a master's would be when it runs out. Does nothing unless the parent asks.
#[test]
fn out_of_descriptors_child() {
    let Ok(endpoint) = std::env::var("KV_EVENTS_OUT_OF_DESCRIPTORS") else {
        return;
    };
    let limit = libc_limit(256);
    assert!(limit, "cannot lower the descriptor limit");
    let publisher = Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: endpoint,
        backend_id: "store-a".into(),
        ..Config::default()
    })
    .expect("the publisher binds");
    let mut hoard = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        hoard.push(file);
    }
    println!("ready {}", hoard.len());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    println!("stats {}", publisher.status_json());
    std::io::stdout().flush().unwrap();
}

fn libc_limit(n: u64) -> bool {
    let status = Command::new("sh")
        .args([
            "-c",
            &format!("prlimit --pid {} --nofile={n}:{n}", std::process::id()),
        ])
        .status();
    status.is_ok_and(|s| s.success())
}

/// CPU seconds the process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 =
        (fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()) as f64;
    ticks / 100.0
}

#[test]
fn out_of_descriptors_the_publisher_refuses_connections_and_does_not_spin() {
    let _serial = one_at_a_time();
    let endpoint = tcp_endpoint();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "out_of_descriptors_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KV_EVENTS_OUT_OF_DESCRIPTORS", &endpoint)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The test harness starts the line with the test's name: the report is what follows.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let hoarded: usize = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.split_once("ready ")?.1.parse().ok())
        .expect("the child is ready");
    assert!(hoarded > 0, "the child took every descriptor left");
    let address = endpoint.trim_start_matches("tcp://");
    let clients: Vec<TcpStream> = (0..50)
        .filter_map(|_| TcpStream::connect(address).ok())
        .collect();
    assert!(!clients.is_empty());
    // Settled: whatever the publisher does about the queued connections is done.
    std::thread::sleep(Duration::from_millis(500));
    let before = (Instant::now(), cpu_seconds(child.id()));
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_seconds(child.id()) - before.1;
    let wall = before.0.elapsed().as_secs_f64();
    drop(child.stdin.take());
    let stats = lines
        .map_while(Result::ok)
        .find_map(|l| l.split_once("stats ").map(|(_, json)| json.to_owned()))
        .expect("the child reports its stats");
    let _ = child.wait();
    let stats: Value = serde_json::from_str(&stats).unwrap();
    // A spinning I/O thread burns a whole core: about `wall` CPU seconds.
    assert!(
        spent < wall / 4.0,
        "{spent} CPU s in {wall} s: spinning; {stats}"
    );
    assert!(
        stats["connections_refused"].as_u64().unwrap() > 0,
        "{stats}"
    );
    drop(clients);
}
