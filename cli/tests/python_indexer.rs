//! The example indexer of `examples/python/indexer.py`, run by Debian's Python
//! (`/usr/bin/python3` with python3-zmq and python3-msgpack, see `scripts/install-deps.sh`) on
//! this checkout's package, its native module (the Rust follower) built and linked in by
//! `python/develop.py`: against the real publisher driven by `kv-events demo`, it must end
//! with the index the demo's model of the master expects: with the replay socket, with
//! CURVE keys, joining after the workload, and beside a stray PUB socket sending malformed
//! messages, which it counts and skips. Against a real publisher whose object source is a
//! master in miniature, it joins late by a snapshot, and converges again after a burst whose
//! events the publisher's queue dropped before encoding. Across a restart of a real publisher
//! it ends with the new life's objects, and SIGTERM stops it with its dump. Refused, it exits
//! 1 with the reason. The whole program against a fake publisher is tested by
//! `tests/python/test_indexer.py`; the `Follower` and `AsyncFollower` of the
//! `mooncake_kv_events` package it is a program over (`python/`), with sockets, and the
//! package itself, by `tests/python/test_follower.py`, `test_async.py` and `test_package.py`:
//! pytest runs them all (Debian's python3-pytest).

use kv_events_testing as common;

use common::TempDir;
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher, Snapshot};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Debian's interpreter, whose packages the example needs: not whatever `python3` is first
/// in PATH.
const PYTHON: &str = "/usr/bin/python3";

fn repo(path: &str) -> PathBuf {
    common::repo_root().join(path)
}

/// `/usr/bin/python3 -B`, after checking it has the modules the example imports, and with
/// the package's native module built and linked into `python/src` (once per test process).
fn python() -> Command {
    static NATIVE: OnceLock<()> = OnceLock::new();
    NATIVE.get_or_init(|| {
        let built = Command::new(PYTHON)
            .arg(repo("python/develop.py"))
            .output()
            .expect("python/develop.py runs");
        assert!(
            built.status.success(),
            "{}",
            explain("python/develop.py", &built)
        );
    });
    let check = Command::new(PYTHON)
        .args(["-c", "import zmq, msgpack"])
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON} does not run ({e}): run scripts/install-deps.sh"));
    assert!(
        check.status.success(),
        "{PYTHON} lacks python3-zmq or python3-msgpack: run scripts/install-deps.sh\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let mut command = Command::new(PYTHON);
    // No __pycache__ next to the example.
    command.arg("-B");
    command
}

/// Runs the pytest files `files` of `tests/python` with Debian's interpreter and pytest, on
/// this checkout's `python/src`; fails the test with pytest's report unless every test
/// passed.
fn pytest(files: &[&str]) {
    let check = Command::new(PYTHON)
        .args(["-c", "import pytest"])
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON} does not run ({e}): run scripts/install-deps.sh"));
    assert!(
        check.status.success(),
        "{PYTHON} lacks python3-pytest: run scripts/install-deps.sh\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let mut command = python();
    command.args(["-m", "pytest", "-q"]);
    for file in files {
        command.arg(repo(&format!("tests/python/{file}")));
    }
    command.env_remove("MOONCAKE_KV_EVENTS_INSTALLED");
    let output = command.output().expect("pytest runs");
    let report = format!("pytest {}", files.join(" "));
    assert!(output.status.success(), "{}", explain(&report, &output));
    // pytest's last line: "N passed in S s", no failure, no error.
    let stdout = text(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.contains(" passed") && !last.contains("failed") && !last.contains("error"),
        "{}",
        explain(&report, &output)
    );
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn read_json(path: &Path) -> Value {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the indexer's `--dump`.
fn read_dump(path: &Path) -> Vec<Value> {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text(&bytes)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

/// The objects of `kv-events demo --dump-index` as the indexer's dump lines: `bin` keys,
/// which the demo writes `"hex:..."`, as `{"hex": "..."}`.
fn expected_lines(expected: &Value) -> Vec<Value> {
    let objects = expected["objects"].as_array().expect("expected objects");
    objects
        .iter()
        .map(|object| {
            let rendered = |value: &Value| match value.as_str() {
                Some(s) if s.starts_with("hex:") => json!({ "hex": &s[4..] }),
                _ => value.clone(),
            };
            json!({
                "tenant": rendered(&object[1]),
                "key": rendered(&object[2]),
                "media": object[3],
            })
        })
        .collect()
}

/// The counters of the upstream `name` in the indexer's `--stats`.
fn stats_of<'s>(stats: &'s Value, name: &str) -> &'s Value {
    stats["upstreams"]
        .as_array()
        .expect("upstreams")
        .iter()
        .find(|p| p["upstream"] == name)
        .unwrap_or_else(|| panic!("no upstream {name} in {stats}"))
}

fn explain(what: &str, output: &Output) -> String {
    format!(
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// The indexer, started with `args` and known to have connected its sockets; its stderr is
/// read line by line as it comes.
struct Indexer {
    child: Option<Child>,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

/// A test that fails midway leaves no indexer running.
impl Drop for Indexer {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Indexer {
    fn start(args: &[&str]) -> Indexer {
        let mut child = python()
            .arg(repo("examples/python/indexer.py"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the indexer starts");
        let stderr: BufReader<ChildStderr> =
            BufReader::new(child.stderr.take().expect("stderr is piped"));
        let (to_test, lines) = mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in stderr.lines().map_while(Result::ok) {
                all.push_str(&line);
                all.push('\n');
                let _ = to_test.send(line);
            }
            all
        });
        let mut indexer = Indexer {
            child: Some(child),
            lines,
            stderr: Some(stderr),
        };
        // Setup, not an assertion: the indexer's first line says it has connected.
        indexer.wait_for_line("subscribed to");
        indexer
    }

    /// Waits, up to a generous bound, for a line of stderr that holds `text`.
    fn wait_for_line(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(line) => seen.push(line),
                Err(_) => panic!("the indexer never said {text:?}; it said {seen:#?}"),
            }
        }
    }

    /// Stops it as Ctrl-C or a service manager would.
    fn terminate(&self) {
        let child = self.child.as_ref().expect("running");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        // SAFETY: kill(2) on the pid of our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill");
    }

    /// Waits for it to exit; one still running after a minute is stopped with SIGTERM, and
    /// the test fails with what it said.
    fn wait(mut self) -> Output {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut stuck = false;
        while self
            .child
            .as_mut()
            .expect("running")
            .try_wait()
            .ok()
            .flatten()
            .is_none()
        {
            if Instant::now() >= deadline {
                stuck = true;
                self.terminate();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let child = self.child.take().expect("running");
        let mut output = child.wait_with_output().expect("the indexer exits");
        let stderr = self.stderr.take().expect("read");
        output.stderr = stderr.join().unwrap().into_bytes();
        assert!(
            !stuck,
            "{}",
            explain("the indexer did not stop by itself", &output)
        );
        output
    }
}

/// The paths of one run: the demo's endpoints and files, the indexer's files.
struct Run {
    dir: TempDir,
    endpoint: String,
    replay: String,
    actual: PathBuf,
    expected: PathBuf,
    stats: PathBuf,
}

impl Run {
    fn new(name: &str) -> Run {
        let dir = TempDir::new(name);
        Run {
            endpoint: format!("ipc://{}", dir.path("kv.sock").display()),
            replay: format!("ipc://{}", dir.path("replay.sock").display()),
            actual: dir.path("actual.jsonl"),
            expected: dir.path("expected.json"),
            stats: dir.path("stats.json"),
            dir,
        }
    }

    fn publisher(&self) -> String {
        format!("{},{}", self.endpoint, self.replay)
    }

    /// `kv-events demo` on this run's endpoints, writing the index it expects. Its keys that
    /// are not UTF-8 go out as `bin`, which the indexer must take.
    fn demo(&self, args: &[&str]) -> Command {
        let mut demo = Command::new(env!("CARGO_BIN_EXE_kv-events"));
        demo.args(["demo", "--endpoint", &self.endpoint, "--objects", "300"])
            .args(["--non-utf8", "bin"])
            .args(["--replay-endpoint", &self.replay, "--dump-index"])
            .arg(&self.expected)
            .args(args);
        demo
    }

    /// `--dump` and `--stats` into this run's files, then `args`.
    fn indexer_args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec![
            "--dump",
            self.actual.to_str().unwrap(),
            "--stats",
            self.stats.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        all
    }

    /// Checks that the indexer ended with the index the demo expects, complete, and returns
    /// its counters for `publisher`.
    fn check(&self, indexer: &Output, publisher: &str) -> Value {
        assert!(indexer.status.success(), "{}", explain("indexer", indexer));
        let expected = read_json(&self.expected);
        let lines = expected_lines(&expected);
        assert!(lines.len() > 10, "{expected}");
        assert!(
            lines.iter().any(|line| line["key"].is_object()),
            "the demo's index holds a bin key: {expected}"
        );
        // The dump sorts by the bytes of tenants and keys, the demo by their rendering.
        let actual = read_dump(&self.actual);
        let missing: Vec<_> = lines.iter().filter(|l| !actual.contains(l)).collect();
        let extra: Vec<_> = actual.iter().filter(|l| !lines.contains(l)).collect();
        assert!(
            missing.is_empty() && extra.is_empty() && actual.len() == lines.len(),
            "missing {missing:?}, extra {extra:?}\n{}",
            explain("indexer", indexer)
        );
        let stats = read_json(&self.stats);
        let counters = stats_of(&stats, publisher).clone();
        assert_eq!(counters["in_sync"], true, "{counters}");
        assert_eq!(counters["next_sequence"], expected["next_sequence"]);
        assert_eq!(counters["malformed"], 0, "{counters}");
        assert!(
            text(&indexer.stdout).contains(&format!("{} objects indexed", lines.len())),
            "{}",
            explain("indexer", indexer)
        );
        counters
    }
}

/// Runs the indexer with `indexer_args` from before the demo (with `demo_args`) binds: it
/// reads every message, and stops after 5 silent seconds, once the demo is done. Returns
/// its counters for `publisher`.
fn indexer_from_the_start(
    run: &Run,
    demo_args: &[&str],
    indexer_args: &[&str],
    publisher: &str,
) -> Value {
    let indexer =
        Indexer::start(&run.indexer_args(&[&["--idle-timeout", "5"], indexer_args].concat()));
    // The demo's --wait lets the subscription reach its PUB socket before the workload; its
    // --linger keeps it up after, so that the indexer, whose first snapshot the demo refuses
    // until its workload starts, takes it at the next try.
    let demo = run
        .demo(&["--wait", "1", "--linger", "3"])
        .args(demo_args)
        .output()
        .expect("kv-events runs");
    let indexer = indexer.wait();
    assert!(demo.status.success(), "{}", explain("demo", &demo));
    let counters = run.check(&indexer, publisher);
    for counter in ["gaps", "replays", "incarnations"] {
        assert_eq!(counters[counter], 0, "{counter}: {counters}");
    }
    // The demo serves snapshots once its workload starts: the indexer, earlier, needs none.
    assert!(counters["snapshots"].as_u64() <= Some(1), "{counters}");
    counters
}

#[test]
fn python_indexer_ends_with_the_index_the_demo_expects_with_the_replay_socket() {
    let run = Run::new("python-indexer-replay");
    let publisher = run.publisher();
    indexer_from_the_start(&run, &[], &["--publisher", &publisher], &run.endpoint);
}

#[test]
fn python_indexer_follows_a_topic_with_heartbeats_in_either_replay_form() {
    for (name, form) in [
        ("python-indexer-topic", None),
        (
            "python-indexer-topic-plain",
            Some("--replay-without-topic-frame"),
        ),
    ] {
        let run = Run::new(name);
        let publisher = run.publisher();
        let demo: Vec<&str> = ["--topic", "kv@pod-1@model-a", "--heartbeat-ms", "100"]
            .into_iter()
            .chain(form)
            .collect();
        let indexer = Indexer::start(&run.indexer_args(&[
            "--publisher",
            &publisher,
            "--topic",
            "kv@pod-1",
            "--idle-timeout",
            "5",
        ]));
        let demo = run
            .demo(&["--wait", "1", "--linger", "3"])
            .args(demo)
            .output()
            .expect("kv-events runs");
        let indexer = indexer.wait();
        assert!(demo.status.success(), "{}", explain("demo", &demo));
        // Heartbeats may go out before the subscription reaches the demo: the indexer then
        // joins mid-stream and replays what it missed, like any late joiner.
        let counters = run.check(&indexer, &run.endpoint);
        for counter in ["malformed", "incarnations"] {
            assert_eq!(counters[counter], 0, "{counter}: {counters}");
        }
        assert!(counters["snapshots"].as_u64() <= Some(1), "{counters}");
        assert_eq!(counters["in_sync"], true, "{counters}");
    }
}

#[test]
fn python_indexer_reads_a_curve_stream_and_replay_socket_with_its_keys() {
    let run = Run::new("python-indexer-curve");
    common::curve_keys(&run.dir.0, "indexer");
    let path = |name: &str| run.dir.path(name).display().to_string();
    let publisher = run.publisher();
    indexer_from_the_start(
        &run,
        &[
            "--curve-secret-key",
            &path("server.key"),
            "--curve-allow",
            &path("allowed"),
        ],
        &[
            "--publisher",
            &publisher,
            "--curve-server-key",
            &path("server.pub"),
            "--curve-secret-key",
            &path("allowed/indexer.key"),
        ],
        &run.endpoint,
    );
}

#[test]
fn python_indexer_joining_after_the_workload_converges() {
    let run = Run::new("python-indexer-late");
    // The demo stays up 4 s after its workload: the indexer joins then.
    let mut demo = run
        .demo(&["--linger", "4"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kv-events runs");
    let mut stdout = BufReader::new(demo.stdout.take().expect("stdout is piped"));
    let mut line = String::new();
    while !line.contains("The workload is done") {
        line.clear();
        let read = stdout.read_line(&mut line).expect("the demo's stdout");
        assert!(read > 0, "the demo ended before its workload was done");
    }
    // The rest of its stdout, so that the demo never waits on a full pipe.
    let rest_of_stdout = std::thread::spawn(move || {
        let mut rest = Vec::new();
        stdout.read_to_end(&mut rest).map(|_| rest)
    });
    // kv-events mirror, the Rust follower, joins at the same time.
    let mirrored = run.dir.path("mirror.jsonl");
    let mirror = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(["mirror", &run.endpoint, "--replay-endpoint", &run.replay])
        .args(["--duration", "3", "--dump"])
        .arg(&mirrored)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kv-events runs");
    let publisher = run.publisher();
    let indexer =
        Indexer::start(&run.indexer_args(&["--publisher", &publisher, "--idle-timeout", "2"]));
    let indexer = indexer.wait();
    let mirror = mirror.wait_with_output().expect("the mirror exits");
    let mut demo = demo.wait_with_output().expect("the demo exits");
    demo.stdout = rest_of_stdout.join().unwrap().expect("the demo's stdout");
    assert!(demo.status.success(), "{}", explain("demo", &demo));
    let counters = run.check(&indexer, &run.endpoint);
    // The demo's model of the master is its object source: one snapshot is the whole index.
    assert_eq!(counters["snapshots"], 1, "{counters}");
    assert_eq!(counters["gaps"], 0, "{counters}");
    assert_ne!(counters["last_convergence"], Value::Null, "{counters}");
    // Both followers write the same file, byte for byte.
    assert!(mirror.status.success(), "{}", explain("mirror", &mirror));
    assert_eq!(
        text(&std::fs::read(&run.actual).unwrap()),
        text(&std::fs::read(&mirrored).unwrap()),
        "the Python indexer's dump and kv-events mirror's"
    );
}

#[test]
fn python_indexer_counts_and_skips_what_a_stray_pub_socket_sends() {
    let run = Run::new("python-indexer-stray");
    let stray_endpoint = format!("ipc://{}", run.dir.path("stray.sock").display());
    // Nothing answers there: the stray's requests fail, which changes nothing for the other.
    let stray_upstream = format!(
        "{stray_endpoint},ipc://{}",
        run.dir.path("stray-replay.sock").display()
    );
    let context = zmq::Context::new();
    let stray = context.socket(zmq::XPUB).expect("an XPUB socket");
    stray.set_linger(0).unwrap();
    stray.bind(&stray_endpoint).expect("the stray binds");
    let publisher = run.publisher();
    let indexer = Indexer::start(&run.indexer_args(&[
        "--idle-timeout",
        "5",
        "--publisher",
        &publisher,
        "--publisher",
        &stray_upstream,
    ]));
    // The indexer's subscription has reached the stray socket: what it sends now arrives.
    assert!(
        stray.poll(zmq::POLLIN, 20_000).unwrap() > 0,
        "no subscription"
    );
    stray.recv_bytes(0).unwrap();
    let sequence = 1u64.to_be_bytes();
    let garbage: [&[&[u8]]; 5] = [
        &[b"", &sequence],
        &[b"\xde\xad\xbe\xef"],
        &[b"", &sequence, b"\xc1 not msgpack"],
        &[b"", &sequence[..7], b"\x93\x00\x90\x00"],
        &[b"", &sequence, b"\x92\x00\x90"],
    ];
    for frames in garbage {
        stray.send_multipart(frames, 0).unwrap();
    }
    let demo = run
        .demo(&["--wait", "1", "--linger", "3"])
        .output()
        .expect("kv-events runs");
    let indexer = indexer.wait();
    assert!(demo.status.success(), "{}", explain("demo", &demo));
    run.check(&indexer, &run.endpoint);
    let stats = read_json(&run.stats);
    let strayed = stats_of(&stats, &stray_endpoint);
    assert_eq!(strayed["malformed"], garbage.len(), "{strayed}");
    assert_eq!(strayed["objects"], 0, "{strayed}");
    assert!(
        text(&indexer.stderr).contains(&format!("{stray_endpoint}: refused a message: ")),
        "{}",
        explain("indexer", &indexer)
    );
}

/// `n` objects `<prefix>-<i>` of tenant "t" on cpu in `master`, flushed.
fn commit(master: &Master, prefix: &str, n: usize) {
    for i in 0..n {
        master.set(
            "t",
            format!("{prefix}-{i}").as_bytes(),
            MediumSet::from([Medium::Cpu]),
        );
    }
    assert!(master.publisher.flush(Duration::from_secs(10)), "flush");
}

#[test]
fn python_indexer_follows_a_publisher_restart_to_the_new_life() {
    let run = Run::new("python-indexer-restart");
    let config = mooncake_kv_events::Config {
        replay_endpoint: run.replay.clone(),
        ..common::config(&run.endpoint)
    };
    // Each life a master in miniature: the follower joins each by a snapshot.
    let first = Master::start(&config);
    let publisher = run.publisher();
    let mut indexer = Indexer::start(&run.indexer_args(&["--publisher", &publisher]));
    indexer.wait_for_line("in sync after");
    commit(&first, "old", 10);
    // The first life is gone; the second one's objects are all there is.
    drop(first);
    let second = Master::start(&config);
    commit(&second, "new", 5);
    // In sync again: after the new life's snapshot.
    indexer.wait_for_line("in sync after");
    commit(&second, "later", 2);
    std::thread::sleep(Duration::from_millis(500));
    indexer.terminate();
    let output = indexer.wait();
    assert!(output.status.success(), "{}", explain("indexer", &output));
    let keys: Vec<Value> = read_dump(&run.actual)
        .iter()
        .map(|line| line["key"].clone())
        .collect();
    let mut expected: Vec<Value> = (0..5)
        .map(|i| json!(format!("new-{i}")))
        .chain((0..2).map(|i| json!(format!("later-{i}"))))
        .collect();
    expected.sort_by_key(|k| k.to_string());
    assert_eq!(keys, expected, "{}", explain("indexer", &output));
    let stats = read_json(&run.stats);
    let counters = stats_of(&stats, &run.endpoint);
    assert_eq!(counters["in_sync"], true, "{counters}");
    assert_eq!(
        counters["next_sequence"],
        second.publisher.stats().next_sequence,
        "{counters}"
    );
    // One restart: one new incarnation and one snapshot of the new life, after the join's,
    // whichever of the new connection's info and the new life's first message comes first.
    assert_eq!(counters["incarnations"], 1, "{counters}");
    assert_eq!(counters["snapshots"], 2, "{counters}");
    assert!(
        text(&output.stderr).contains("stopped by signal 15"),
        "{}",
        explain("indexer", &output)
    );
}

type Held = Arc<Mutex<BTreeMap<(String, Vec<u8>), MediumSet>>>;

/// A master in miniature: the media of each object, each change announced under the lock
/// its object source copies under, as the real master's shards do.
struct Master {
    publisher: Publisher,
    held: Held,
}

impl Master {
    fn start(config: &Config) -> Master {
        let publisher = Publisher::create(config).expect("the publisher binds");
        let held = Held::default();
        let source = Arc::clone(&held);
        publisher.set_object_source(move |_: Option<&[u8]>, objects: &mut Snapshot| {
            let copied: Vec<_> = source
                .lock()
                .unwrap()
                .iter()
                .map(|(id, media)| (id.clone(), *media))
                .collect();
            for ((tenant, key), media) in copied {
                objects
                    .add(tenant.as_bytes(), &key, b"", media)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
        Master { publisher, held }
    }

    /// Sets the media of an object; the empty set removes it.
    fn set(&self, tenant: &str, key: &[u8], media: MediumSet) {
        let mut held = self.held.lock().unwrap();
        let id = (tenant.to_owned(), key.to_vec());
        let before = held.get(&id).copied().unwrap_or(MediumSet::EMPTY);
        self.publisher
            .on_medium_delta(tenant, key, "", before, media);
        if media.is_empty() {
            held.remove(&id);
        } else {
            held.insert(id, media);
        }
    }

    /// `changes` changes over 400 objects of three tenants, some with keys that are not
    /// UTF-8, each to one of four media sets, the empty one included.
    fn churn(&self, changes: usize, seed: usize) {
        let sets = [
            MediumSet::from([Medium::Cpu]),
            MediumSet::from([Medium::Disk]),
            MediumSet::from([Medium::Cpu, Medium::Disk]),
            MediumSet::EMPTY,
        ];
        for i in 0..changes {
            let n = (i * 7919 + seed * 104_729) % 400;
            let mut key = format!("obj-{n:04}").into_bytes();
            if n % 50 == 7 {
                key.extend_from_slice(b"\xff\x00");
            }
            let tenant = ["", "tenant-a", "tenant-b"][n % 3];
            // Each pass over the 400 objects gives each a set other than the pass before.
            self.set(tenant, &key, sets[(i / 400 + n + seed) % 4]);
        }
        assert!(self.publisher.flush(Duration::from_secs(10)), "flush");
    }

    /// What the indexer's dump should hold.
    fn lines(&self) -> Vec<Value> {
        let rendered = |bytes: &[u8]| match std::str::from_utf8(bytes) {
            Ok(text) => json!(text),
            Err(_) => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                json!({ "hex": hex })
            }
        };
        self.held
            .lock()
            .unwrap()
            .iter()
            .map(|((tenant, key), media)| {
                json!({
                    "tenant": if tenant.is_empty() { "default" } else { tenant },
                    "key": rendered(key),
                    "media": media.iter().map(Medium::as_str).collect::<Vec<_>>(),
                })
            })
            .collect()
    }
}

/// Checks that the dump holds exactly `expected`, in any order; returns the counters of
/// `publisher`, checked complete.
fn check_dump(run: &Run, indexer: &Output, expected: &[Value], publisher: &str) -> Value {
    assert!(indexer.status.success(), "{}", explain("indexer", indexer));
    let actual = read_dump(&run.actual);
    let missing: Vec<_> = expected.iter().filter(|l| !actual.contains(l)).collect();
    let extra: Vec<_> = actual.iter().filter(|l| !expected.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty() && actual.len() == expected.len(),
        "missing {missing:?}, extra {extra:?}\n{}",
        explain("indexer", indexer)
    );
    let stats = read_json(&run.stats);
    let counters = stats_of(&stats, publisher).clone();
    assert_eq!(counters["in_sync"], true, "{counters}");
    assert_eq!(counters["malformed"], 0, "{counters}");
    counters
}

#[test]
fn python_indexer_joining_late_installs_a_snapshot() {
    let run = Run::new("python-indexer-snapshot");
    let master = Master::start(&Config {
        replay_endpoint: run.replay.clone(),
        // Too small to hold the stream from 0: only a snapshot can rebuild it.
        replay_buffer_bytes: 4096,
        // The keys that are not UTF-8 go out as `bin`, on the stream and in the snapshot.
        non_utf8: "bin".into(),
        ..common::config(&run.endpoint)
    });
    master.churn(3000, 1);
    let publisher = run.publisher();
    let mut indexer =
        Indexer::start(&run.indexer_args(&["--publisher", &publisher, "--idle-timeout", "2"]));
    indexer.wait_for_line("in sync after");
    master.churn(500, 2);
    let indexer = indexer.wait();
    let counters = check_dump(&run, &indexer, &master.lines(), &run.endpoint);
    // One snapshot, the join's. A quiet check during the burst may take messages still on
    // their way for a gap: the replay that fills it is no second snapshot.
    assert_eq!(counters["snapshots"], 1, "{counters}");
    assert_eq!(counters["gaps"], counters["replays"], "{counters}");
    assert_eq!(
        counters["next_sequence"],
        master.publisher.stats().next_sequence,
        "{counters}"
    );
    assert!(counters["objects"].as_u64() > Some(100), "{counters}");
}

#[test]
fn python_indexer_converges_after_events_dropped_before_encoding() {
    let run = Run::new("python-indexer-dropped");
    let master = Master::start(&Config {
        replay_endpoint: run.replay.clone(),
        // A queue this short overflows under a burst: dropped events have numbers, no message.
        queue_capacity: 4,
        // The keys that are not UTF-8 go out as `bin`, on the stream and in snapshots.
        non_utf8: "bin".into(),
        ..common::config(&run.endpoint)
    });
    master.churn(300, 1);
    let publisher = run.publisher();
    let mut indexer =
        Indexer::start(&run.indexer_args(&["--publisher", &publisher, "--idle-timeout", "3"]));
    indexer.wait_for_line("in sync after");
    master.churn(20_000, 2);
    let dropped = master.publisher.stats().dropped_events;
    assert!(dropped > 0, "setup: the burst dropped nothing");
    // Events dropped after the last message of the burst take their numbers with the next
    // message, which shows them as a gap: until then no subscriber can know of them.
    master.set("", b"after-the-burst", MediumSet::from([Medium::Cpu]));
    assert!(master.publisher.flush(Duration::from_secs(10)), "flush");
    let indexer = indexer.wait();
    let counters = check_dump(&run, &indexer, &master.lines(), &run.endpoint);
    assert!(counters["gaps"].as_u64() >= Some(1), "{counters}");
    assert!(counters["snapshots"].as_u64() >= Some(2), "{counters}");
    assert_eq!(
        counters["next_sequence"],
        master.publisher.stats().next_sequence,
        "{counters}"
    );
    eprintln!(
        "{dropped} events dropped, {:?}; the indexer's counters: {counters}",
        master.publisher.stats()
    );
}

#[test]
fn python_indexer_exits_1_with_the_reason_when_refused() {
    let dir = TempDir::new("python-indexer-refused");
    common::curve_keys(&dir.0, "someone");
    common::keygen(&dir.0, "stranger");
    let endpoint = common::tcp_endpoint();
    let _publisher =
        mooncake_kv_events::Publisher::create(&common::curve_config(&endpoint, &dir.0))
            .expect("binds");
    let output = python()
        .arg(repo("examples/python/indexer.py"))
        .arg(format!("{endpoint},{}", common::tcp_endpoint()))
        .arg("--curve-server-key")
        .arg(dir.path("server.pub"))
        .arg("--curve-secret-key")
        .arg(dir.path("stranger.key"))
        .args(["--idle-timeout", "30"])
        .output()
        .expect("the indexer runs");
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        explain("indexer", &output)
    );
    assert!(
        text(&output.stderr).contains("the publisher refused this indexer"),
        "{}",
        explain("indexer", &output)
    );
}

#[test]
fn python_indexer_recovers_step_by_step_and_against_a_fake_publisher() {
    pytest(&["test_indexer.py"]);
}

#[test]
fn python_package_follower_calls_back_and_counts_with_real_sockets() {
    pytest(&["test_follower.py", "test_async.py", "test_package.py"]);
}
