//! The reader example of `examples/relay/reader.py` (nats-py, run by Debian's
//! `/usr/bin/python3`): joining after the relay wrote a demo's objects, it bootstraps from
//! the relay's snapshot and the log after it (the relay writes no bucket here), then follows
//! the log across a restart of the demo, and ends with the demo's `--dump-index` truth.

mod common;

use common::{assert_exact, object_of, truth, Master, Nats, TempDir};
use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Command, Stdio};

const PYTHON: &str = "/usr/bin/python3";

#[test]
fn the_python_reader_bootstraps_from_the_snapshot_and_follows_the_log() {
    let check = Command::new(PYTHON).args(["-c", "import nats"]).output();
    assert!(
        check.is_ok_and(|o| o.status.success()),
        "{PYTHON} lacks nats-py: run scripts/install-deps.sh"
    );
    let dir = TempDir::new("relay-python");
    let nats = Nats::start(&dir.0);
    let master = Master::new();
    let log = dir.path("relay.log");
    let _relay = master.relay_with(&nats, &log, &[]);
    let first = dir.path("first.json");
    assert_eq!(
        master
            .demo(2000, 4000, 1.0, &first)
            .0
            .wait()
            .unwrap()
            .code(),
        Some(0)
    );
    assert_exact(&nats, &truth(&first), &[&log]);

    // The reader joins late, then the master restarts under it.
    let dump = dir.path("reader.jsonl");
    let mut reader = Command::new(PYTHON)
        .arg("-B")
        .arg(kv_events_testing::repo_root().join("examples/relay/reader.py"))
        // A bound, should the test fail before it stops the reader.
        .args([
            "--nats",
            &nats.url(),
            "--backend",
            "demo-store",
            "--duration",
            "120",
        ])
        .arg("--dump")
        .arg(&dump)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the reader runs");
    // The reader says how many objects it bootstrapped before the second life starts: all of
    // the first life's, from the snapshot and the log after it.
    let mut stderr = BufReader::new(reader.stderr.take().expect("piped"));
    let mut said = String::new();
    while !said.contains("bootstrapped") {
        assert_ne!(
            stderr.read_line(&mut said).expect("its stderr"),
            0,
            "the reader ended: {said}"
        );
    }
    let objects = truth(&first).len();
    assert!(
        said.contains(&format!("bootstrapped {objects} objects")),
        "it bootstrapped the first life's {objects} objects: {said}"
    );
    let second = dir.path("second.json");
    assert_eq!(
        master
            .demo(1500, 4000, 2.0, &second)
            .0
            .wait()
            .unwrap()
            .code(),
        Some(0)
    );
    let expected = truth(&second);
    assert_exact(&nats, &expected, &[&log]);
    std::thread::sleep(std::time::Duration::from_secs(1));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(reader.id() as libc::pid_t, libc::SIGTERM) };
    stderr.read_to_string(&mut said).expect("its stderr");
    let status = reader.wait().expect("the reader exits");
    assert!(status.success(), "{said}");
    let read: BTreeSet<_> = std::fs::read_to_string(&dump)
        .expect("its dump")
        .lines()
        .map(|line| object_of(&serde_json::from_str(line).expect("JSON")))
        .collect();
    assert!(
        read == expected,
        "the reader's objects are not the truth: {said}"
    );
}
