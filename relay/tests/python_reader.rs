//! The reader example of `examples/relay/reader.py` (nats-py, run by Debian's
//! `/usr/bin/python3`): joining after the relay wrote a demo's objects, it bootstraps from
//! the relay's snapshot and the log after it (the relay writes no bucket here), then follows
//! the log across a restart of the demo, and ends with the demo's `--dump-index` truth.

mod common;

use common::{assert_exact, truth, Master, Nats, Reader, TempDir};

#[test]
fn the_python_reader_bootstraps_from_the_snapshot_and_follows_the_log() {
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

    // The reader joins late, then the master restarts under it. It bootstraps all of the
    // first life's objects, from the snapshot and the log after it.
    let reader = Reader::start(&nats.url(), dir.path("reader.jsonl"));
    let objects = truth(&first).len();
    assert!(
        reader
            .said()
            .contains(&format!("bootstrapped {objects} objects")),
        "it bootstrapped the first life's {objects} objects: {}",
        reader.said()
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
    assert!(
        reader.stop() == expected,
        "the reader's objects are not the truth"
    );
}
