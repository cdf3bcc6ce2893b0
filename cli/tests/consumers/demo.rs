//! `kv-events demo` as the consumers' tests run it: on private `ipc://` endpoints, with the
//! replay socket on, writing the index a reader that saw everything ends with.

use kv_events_testing::TempDir;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// What `--dump-index` says a reader ends with: per tenant, per key, its media.
pub type Index = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<String>>>;

/// The endpoints and files of one scenario; demos started from it publish on the same
/// endpoints, so a second one is a publisher restart as the readers see it.
pub struct Scenario {
    dir: TempDir,
    /// The PUB endpoint.
    pub stream: String,
    /// The replay (ROUTER) endpoint.
    pub replay: String,
    runs: usize,
}

impl Scenario {
    pub fn new(name: &str) -> Scenario {
        let dir = TempDir::new(name);
        Scenario {
            stream: format!("ipc://{}", dir.path("kv.sock").display()),
            replay: format!("ipc://{}", dir.path("replay.sock").display()),
            dir,
            runs: 0,
        }
    }

    /// Starts `kv-events demo` on this scenario's endpoints with `args` added; its expected
    /// index goes to a file of its own, read by [`Demo::finish`].
    pub fn demo(&mut self, args: &[&str]) -> Demo {
        self.runs += 1;
        let expected = self.dir.path(&format!("expected-{}.json", self.runs));
        let child = Command::new(env!("CARGO_BIN_EXE_kv-events"))
            .args([
                "demo",
                "--endpoint",
                &self.stream,
                "--replay-endpoint",
                &self.replay,
            ])
            .args(["--show", "0", "--dump-index"])
            .arg(&expected)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kv-events demo starts");
        Demo {
            child: Some(child),
            expected,
        }
    }
}

/// A running demo.
pub struct Demo {
    child: Option<Child>,
    expected: PathBuf,
}

impl Demo {
    /// Waits for the demo to exit (a few minutes at most), asserts that it succeeded, and
    /// returns the index it expects.
    pub fn finish(mut self) -> Index {
        let output = self.wait();
        assert!(
            output.status.success(),
            "the demo failed: {}\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        expected_index(&self.expected)
    }

    fn wait(&mut self) -> Output {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(300);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("output")
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Reads a `--dump-index` file: keys and tenants are text, or `hex:` and their bytes.
fn expected_index(path: &PathBuf) -> Index {
    let text = std::fs::read_to_string(path).expect("the demo wrote its index");
    let dump: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let mut index = Index::new();
    for object in dump["objects"].as_array().expect("objects") {
        let tenant = bytes(object[1].as_str().expect("tenant"));
        let key = bytes(object[2].as_str().expect("key"));
        let media = object[3].as_array().expect("media");
        let media = media.iter().map(|m| m.as_str().expect("medium").to_owned());
        index
            .entry(tenant)
            .or_default()
            .insert(key, media.collect());
    }
    index
}

fn bytes(rendered: &str) -> Vec<u8> {
    match rendered.strip_prefix("hex:") {
        Some(hex) => (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect(),
        None => rendered.as_bytes().to_vec(),
    }
}

/// Waits until `condition` holds, up to `limit`.
pub fn within(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}
