//! `metrics_text()` read by the Prometheus client's own parser (Debian's python3 with
//! python3-prometheus-client, see `scripts/install-deps.sh`): every metric documented and
//! typed, and each value equal to the field of the same name in `status_json()`.

use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const PYTHON: &str = "/usr/bin/python3";
const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const BOTH: MediumSet = CPU.with(Medium::Disk);

/// A directory of its own for the files handed to Python, removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn metrics_text_parses_as_prometheus_and_matches_status_json() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("kv-events-metrics-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("a temporary directory");
    let publisher = Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: format!("ipc://{}", dir.0.join("kv.sock").display()),
        backend_id: "metrics-store".into(),
        queue_capacity: 4,
        ..Config::default()
    })
    .expect("the publisher binds");

    publisher.on_put_commit("", "key-1", "group-1", BOTH);
    // Keyless: two suppressed events.
    publisher.on_put_commit("tenant-a", "", "", CPU);
    publisher.on_medium_delta("tenant-a", "", "", CPU, MediumSet::EMPTY);
    // A commit with no medium: nothing, counted.
    publisher.on_put_commit("tenant-a", "key-2", "", MediumSet::EMPTY);
    // Three RemoveAll results that publish no cleared, and one that does. A scan's marker
    // needs room in the queue (a lost one suppresses its cleared): start each from empty.
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "tenant-a", 0, 0);
    publisher.on_remove_all(&scan, "tenant-b", 5, 1);
    publisher.on_put_commit("tenant-c", "late", "", CPU);
    publisher.on_remove_all(&scan, "tenant-c", 3, 0);
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "tenant-d", 2, 0);
    // Published before the flood: one that began would drop the scan's marker first.
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    // A flood into a queue of 4 drops the oldest events.
    for round in 0.. {
        std::thread::scope(|s| {
            for thread in 0..4 {
                let publisher = &publisher;
                s.spawn(move || {
                    for call in 0..10_000 {
                        publisher.on_put_commit(
                            "flood",
                            format!("{round}/{thread}/{call}"),
                            "",
                            BOTH,
                        );
                    }
                });
            }
        });
        if publisher.stats().dropped_events > 0 {
            break;
        }
        assert!(round < 100, "a queue of 4 never overflowed");
    }
    assert!(publisher.flush(Duration::from_secs(30)), "flush");

    let (metrics, status) = (publisher.metrics_text(), publisher.status_json());
    let stats = publisher.stats();
    assert!(stats.dropped_events > 0, "{status}");
    assert_eq!(stats.skipped_keyless_events, 2, "{status}");
    assert_eq!(stats.cleared_suppressed, 3, "{status}");
    assert_eq!(stats.invalid_media_calls, 1, "{status}");
    // The incarnation, a random 64-bit id, as a string of its digits: a JSON reader that holds
    // numbers as doubles (check_metrics.py reads it so) would round a number above 2^53.
    let json: serde_json::Value = serde_json::from_str(&status).expect("JSON status");
    assert_eq!(
        json["incarnation"],
        serde_json::Value::String(stats.incarnation.to_string()),
        "{status}"
    );
    assert_eq!(stats.queue_depth, 0, "{status}");
    let (metrics_file, status_file) = (dir.0.join("metrics.txt"), dir.0.join("status.json"));
    std::fs::write(&metrics_file, &metrics).expect("write metrics");
    std::fs::write(&status_file, &status).expect("write status");

    let output = Command::new(PYTHON)
        .arg("-B")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_metrics.py"))
        .args([&metrics_file, &status_file])
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON} does not run ({e}): run scripts/install-deps.sh"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "check_metrics.py: {}\n{stdout}\n{stderr}\nmetrics:\n{metrics}\nstatus: {status}\n\
         (python3-prometheus-client missing? run scripts/install-deps.sh)",
        output.status
    );
    // One metric per field of the stats, none left out.
    let fields = serde_json::to_value(stats)
        .unwrap()
        .as_object()
        .unwrap()
        .len();
    let expected = format!("{fields} metrics match status_json");
    assert!(stdout.contains(&expected), "{stdout}");
}
