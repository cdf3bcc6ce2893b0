//! The example indexer of `examples/python/indexer.py`, run by Debian's Python
//! (`/usr/bin/python3` with python3-zmq and python3-msgpack, see `scripts/install-deps.sh`):
//! against the real publisher driven by `kv-events demo`, it must end with the index the
//! demo's model of the master expects, plainly and with CURVE keys; refused, it exits 1 with
//! the reason; and its gap and restart handling, unit-tested by `tests/python/test_indexer.py`.

mod common;

use common::TempDir;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Debian's interpreter, whose packages the example needs: not whatever `python3` is first
/// in PATH.
const PYTHON: &str = "/usr/bin/python3";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `/usr/bin/python3 -B`, after checking it has the modules the example imports.
fn python() -> Command {
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn read_json(path: &Path) -> Value {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn explain(what: &str, output: &Output) -> String {
    format!(
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

#[test]
fn python_indexer_ends_with_the_index_the_demo_expects() {
    let dir = TempDir::new("python-indexer");
    indexer_against_the_demo(&dir, &[], &[]);
}

#[test]
fn python_indexer_reads_a_curve_stream_with_its_keys() {
    let dir = TempDir::new("python-indexer-curve");
    common::curve_keys(&dir.0, "indexer");
    let path = |name: &str| dir.path(name).display().to_string();
    indexer_against_the_demo(
        &dir,
        &[
            "--curve-secret-key",
            &path("server.key"),
            "--curve-allow",
            &path("allowed"),
        ],
        &[
            "--curve-server-key",
            &path("server.pub"),
            "--curve-secret-key",
            &path("allowed/indexer.key"),
        ],
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
        .arg(&endpoint)
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

/// Runs the indexer (with `indexer_args`) against `kv-events demo` (with `demo_args`) on an
/// ipc endpoint in `dir`, and checks that it ends with the index the demo expects.
fn indexer_against_the_demo(dir: &TempDir, demo_args: &[&str], indexer_args: &[&str]) {
    let socket = dir.0.join("kv.sock");
    let endpoint = format!("ipc://{}", socket.display());
    let (actual, expected) = (dir.0.join("actual.json"), dir.0.join("expected.json"));

    // The indexer connects first; ZeroMQ retries until the demo binds. It stops after
    // 5 silent seconds, once the demo is done.
    let mut indexer = python()
        .arg(repo("examples/python/indexer.py"))
        .arg(&endpoint)
        .args(["--idle-timeout", "5", "--dump"])
        .arg(&actual)
        .args(indexer_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the indexer starts");
    // Setup, not an assertion: the indexer's first line says it has connected. The demo's
    // --wait then lets the subscription reach its PUB socket before the workload.
    let mut stderr = BufReader::new(indexer.stderr.take().expect("stderr is piped"));
    let mut first_line = String::new();
    stderr
        .read_line(&mut first_line)
        .expect("the indexer's stderr");
    let rest_of_stderr = std::thread::spawn(move || {
        let mut rest = Vec::new();
        stderr.read_to_end(&mut rest).map(|_| rest)
    });
    let demo = Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(["demo", "--endpoint", &endpoint, "--objects", "300"])
        .args(["--wait", "1", "--dump-index"])
        .arg(&expected)
        .args(demo_args)
        .output()
        .expect("kv-events runs");
    let mut indexer = indexer.wait_with_output().expect("the indexer exits");
    indexer.stderr = first_line.into_bytes();
    indexer.stderr.extend(
        rest_of_stderr
            .join()
            .unwrap()
            .expect("the indexer's stderr"),
    );
    assert!(demo.status.success(), "{}", explain("demo", &demo));
    assert!(indexer.status.success(), "{}", explain("indexer", &indexer));

    let (actual, expected) = (read_json(&actual), read_json(&expected));
    let objects = expected["objects"].as_array().expect("expected objects");
    assert!(objects.len() > 10, "{expected}");
    assert_eq!(actual["objects"], expected["objects"]);
    assert_eq!(
        actual["resyncs"],
        0,
        "{}",
        explain("indexer resynced", &indexer)
    );
    assert_eq!(actual["last_sequence"], expected["last_sequence"]);
    assert!(
        text(&indexer.stdout).contains(&format!("{} objects indexed", objects.len())),
        "{}",
        explain("indexer", &indexer)
    );
}

#[test]
fn python_indexer_resyncs_a_backend_on_gaps_and_restarts() {
    let output = python()
        .arg(repo("tests/python/test_indexer.py"))
        .output()
        .expect("the Python tests run");
    assert!(
        output.status.success(),
        "{}",
        explain("tests/python/test_indexer.py", &output)
    );
    assert!(
        text(&output.stdout).contains("tests passed"),
        "{}",
        text(&output.stdout)
    );
}
