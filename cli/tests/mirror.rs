//! `kv-events mirror` as a user runs it, against a real publisher served by a model master:
//! what it writes (JSON lines, on exit or to --dump) is the master's truth, and stderr says
//! each recovery and the summaries.

use kv_events_testing as common;
use kv_events_testing::model;

use common::{endpoint, TempDir};
use model::{config, Model};
use mooncake_kv_events::subscriber::Index;
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn mirror(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .arg("mirror")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kv-events runs")
}

/// Bytes as `mirror` writes them: a string, or `{"hex": "..."}`.
fn bytes(value: &serde_json::Value) -> Vec<u8> {
    match value {
        serde_json::Value::String(text) => text.as_bytes().to_vec(),
        other => {
            let hex = other["hex"].as_str().expect("a string or {\"hex\": ...}");
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect()
        }
    }
}

/// The index JSON lines hold.
fn parse(lines: &str) -> Index {
    let mut index = Index::new();
    for line in lines.lines() {
        let object: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let media = object["media"].as_array().expect("media");
        assert!(!media.is_empty(), "{line}");
        for medium in media {
            let medium = match medium.as_str() {
                Some("cpu") => Medium::Cpu,
                Some("disk") => Medium::Disk,
                other => panic!("medium {other:?}"),
            };
            index.store(&bytes(&object["tenant"]), &bytes(&object["key"]), medium);
        }
    }
    index
}

fn terminate(child: &Child) {
    // SAFETY: kill(2) on the child's own process id.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
}

/// Waits for `child` to end, and its stdout and stderr.
fn finish(mut child: Child) -> (bool, String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    (status.success(), out, err)
}

fn publisher(model: &Model) -> (Publisher, String, String) {
    publisher_with(model, "skip")
}

/// A publisher served by `model` whose strings that are not UTF-8 go out as `non_utf8` says.
fn publisher_with(model: &Model, non_utf8: &str) -> (Publisher, String, String) {
    let (pub_endpoint, replay_endpoint) = (endpoint(), endpoint());
    let publisher = Publisher::create(&Config {
        non_utf8: non_utf8.into(),
        ..config(&pub_endpoint, &replay_endpoint)
    })
    .expect("the publisher binds");
    model.serve(&publisher);
    (publisher, pub_endpoint, replay_endpoint)
}

#[test]
fn mirror_dumps_the_truth_and_says_its_recoveries_and_summaries() {
    let model = Model::new();
    // The key that is not UTF-8 goes out as `bin`, which mirror writes as hex.
    let (publisher, pub_endpoint, replay_endpoint) = publisher_with(&model, "bin");
    model.churn(&publisher, 1, 2000, 400);
    // A key that is not UTF-8.
    model.set(
        &publisher,
        b"tenant-0",
        b"k\xff\x00",
        MediumSet::from([Medium::Cpu]),
    );
    let dir = TempDir::new("mirror-dump");
    let dump = dir.path("index.jsonl");
    let child = mirror(&[
        &pub_endpoint,
        "--replay-endpoint",
        &replay_endpoint,
        "--every",
        "0.3",
        "--dump",
        dump.to_str().unwrap(),
    ]);
    // Changes while it runs, and a RemoveAll.
    std::thread::sleep(Duration::from_millis(500));
    model.churn(&publisher, 2, 2000, 400);
    model.remove_all(&publisher, b"tenant-1");
    assert!(publisher.flush(Duration::from_secs(10)));
    // The periodic dump reaches the truth.
    let truth = model.truth();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&dump).map(|d| parse(&d)).ok() != Some(truth.clone()) {
        assert!(
            Instant::now() < deadline,
            "the dump never reached the truth"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    terminate(&child);
    let (ok, out, err) = finish(child);
    assert!(ok, "{err}");
    assert_eq!(out, "", "the index goes to --dump");
    let written = std::fs::read_to_string(&dump).unwrap();
    assert_eq!(parse(&written), truth);
    assert!(written.contains(r#"{"hex":"6bff00"}"#), "{written}");
    assert!(err.contains("kv-events: snapshot: "), "{err}");
    assert!(err.contains(" objects, next sequence "), "{err}");
    assert!(err.contains("kv-events: in sync after "), "{err}");
    // The summary names the sequence the index takes next: one a message of the run took.
    let next: u64 = err
        .split_once("in sync before sequence ")
        .and_then(|(_, rest)| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no sequence in the summary: {err}"));
    assert!(
        (1..=publisher.stats().next_sequence).contains(&next),
        "{next}: {err}"
    );
    assert!(err.contains("objects        cpu       disk"), "{err}");
    assert!(
        err.contains(&format!(
            "kv-events: wrote the index of {pub_endpoint}, {} objects, in sync",
            truth.objects()
        )),
        "{err}"
    );
}

#[test]
fn mirror_of_two_candidates_writes_the_live_ones_index_to_stdout_after_its_duration() {
    let model = Model::new();
    let (publisher, pub_endpoint, replay_endpoint) = publisher(&model);
    model.churn(&publisher, 3, 1000, 300);
    // The other candidate master is down.
    let (down, down_replay) = (endpoint(), endpoint());
    let child = mirror(&[
        &down,
        "--replay-endpoint",
        &down_replay,
        &pub_endpoint,
        "--replay-endpoint",
        &replay_endpoint,
        "--duration",
        "3",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    model.churn(&publisher, 4, 1000, 300);
    assert!(publisher.flush(Duration::from_secs(10)));
    let (ok, out, err) = finish(child);
    assert!(ok, "{err}");
    assert_eq!(parse(&out), model.truth(), "{err}");
    assert!(
        err.contains(&format!("kv-events: {pub_endpoint}: snapshot: ")),
        "{err}"
    );
    // The one down says why, as `tail` would.
    let why = "nothing accepted a connection there";
    assert!(
        err.contains(&format!("kv-events: cannot reach {down} yet: {why}")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{down}: not reached ({why}")),
        "{err}"
    );
}

#[test]
fn mirror_writes_into_a_dump_path_that_is_not_a_regular_file_and_leaves_it_one() {
    use std::os::unix::fs::FileTypeExt as _;
    let model = Model::new();
    let (publisher, pub_endpoint, replay_endpoint) = publisher(&model);
    model.churn(&publisher, 5, 500, 200);
    assert!(publisher.flush(Duration::from_secs(10)));
    let dir = TempDir::new("mirror-fifo");
    let fifo = dir.path("dump");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).expect("the FIFO reads"))
    };
    let child = mirror(&[
        &pub_endpoint,
        "--replay-endpoint",
        &replay_endpoint,
        "--duration",
        "2",
        "--every",
        "100",
        "--dump",
        fifo.to_str().unwrap(),
    ]);
    let (ok, _, err) = finish(child);
    assert!(ok, "{err}");
    // Before the reader is joined: a FIFO replaced by a file would leave it blocked.
    let kind = std::fs::metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the dump path is still a FIFO");
    assert!(!dir.path("dump.tmp").exists());
    assert_eq!(parse(&reader.join().unwrap()), model.truth(), "{err}");
}

#[test]
fn mirror_without_a_publisher_writes_nothing_and_says_it_is_not_in_sync() {
    let child = mirror(&[
        &endpoint(),
        "--replay-endpoint",
        &endpoint(),
        "--duration",
        "0.5",
    ]);
    let (ok, out, err) = finish(child);
    assert!(!ok);
    assert_eq!(out, "");
    assert!(err.contains("NOT in sync"), "{err}");
}

#[test]
fn mirror_wants_a_replay_endpoint_per_endpoint() {
    let child = mirror(&["a", "b", "--replay-endpoint", "r"]);
    let mut child = child;
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("2 ENDPOINTs but 1 --replay-endpoint"), "{err}");
    assert!(err.contains("Usage: kv-events mirror"), "{err}");
}

#[test]
fn mirror_follows_a_publisher_without_a_replay_socket_from_the_stream_alone() {
    let pub_endpoint = endpoint();
    let dir = TempDir::new("mirror-stream-only");
    let expected = dir.path("expected.json");
    // The mirror first, so that it joins before the publisher's message 0.
    let child = mirror(&[&pub_endpoint, "--replay-endpoint", "none", "--every", "0.5"]);
    // The real demo, with no replay endpoint; it waits for its subscribers before it starts.
    let demo = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(["demo", "--endpoint", &pub_endpoint, "--objects", "200"])
        .args(["--show", "0", "--wait", "3", "--dump-index"])
        .arg(&expected)
        .output()
        .expect("kv-events demo runs");
    assert!(demo.status.success(), "{demo:?}");
    // What the demo's own subscriber ends with: objects [backend, tenant, key, media].
    let dump: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&expected).unwrap()).unwrap();
    let mut truth = Index::new();
    for object in dump["objects"].as_array().expect("objects") {
        let [_, tenant, key, media] = object.as_array().unwrap().as_slice() else {
            panic!("{object}");
        };
        for medium in media.as_array().unwrap() {
            let medium = if medium == "cpu" {
                Medium::Cpu
            } else {
                Medium::Disk
            };
            let (tenant, key) = (tenant.as_str().unwrap(), key.as_str().unwrap());
            truth.store(tenant.as_bytes(), key.as_bytes(), medium);
        }
    }
    assert!(truth.objects() > 0);
    // The demo's messages reach the mirror after it exits: give them time.
    std::thread::sleep(Duration::from_secs(1));
    terminate(&child);
    let (ok, out, err) = finish(child);
    assert!(ok, "{err}");
    assert!(err.contains("(no replay endpoint"), "{err}");
    assert!(err.contains("every message since 0 applied"), "{err}");
    assert!(err.contains("in sync"), "{err}");
    assert_eq!(parse(&out), truth, "{err}");
}

#[test]
fn mirror_without_a_replay_socket_that_joins_late_says_its_index_is_incomplete() {
    let model = Model::new();
    let (publisher, pub_endpoint, _) = publisher(&model);
    // Messages before the mirror joins: never seen.
    model.churn(&publisher, 1, 200, 50);
    assert!(publisher.flush(Duration::from_secs(10)));
    let dir = TempDir::new("mirror-late");
    let dump = dir.path("index.jsonl");
    let child = mirror(&[
        &pub_endpoint,
        "--replay-endpoint",
        "none",
        "--every",
        "0.3",
        "--dump",
        dump.to_str().unwrap(),
    ]);
    // Then changes, until the mirror has taken some (its periodic dump holds objects).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seed = 2;
    while std::fs::read_to_string(&dump).map_or(true, |d| parse(&d).objects() == 0) {
        assert!(Instant::now() < deadline, "the mirror never took a message");
        model.churn(&publisher, seed, 20, 50);
        assert!(publisher.flush(Duration::from_secs(10)));
        seed += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    terminate(&child);
    let (ok, _, err) = finish(child);
    assert!(
        !ok,
        "an index that misses what came before the join is not in sync: {err}"
    );
    assert!(
        err.contains("incomplete (the stream since the join only)"),
        "{err}"
    );
    assert!(err.contains("NOT in sync"), "{err}");
    assert!(
        parse(&std::fs::read_to_string(&dump).unwrap()).objects() > 0,
        "{err}"
    );
}
