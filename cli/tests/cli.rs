//! The `kv-events` command as a user runs it: `demo` end to end, `tail` against a publisher
//! made here, and the exit statuses of bad command lines.

use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const DISK: MediumSet = MediumSet::EMPTY.with(Medium::Disk);
const BOTH: MediumSet = CPU.with(Medium::Disk);

fn kv_events() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kv-events"))
}

/// An ipc endpoint no other test uses. ZeroMQ leaves the socket file behind when the
/// publisher closes; dropping this removes it.
struct Endpoint(String);

impl Endpoint {
    fn new() -> Endpoint {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Endpoint(format!(
            "ipc:///tmp/kv-events-cli-{}-{n}.sock",
            std::process::id()
        ))
    }
}

impl std::ops::Deref for Endpoint {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0.trim_start_matches("ipc://"));
    }
}

fn publisher(endpoint: &str) -> Publisher {
    publisher_with(endpoint, "skip")
}

/// A publisher on `endpoint` whose strings that are not UTF-8 go out as `non_utf8` says.
fn publisher_with(endpoint: &str, non_utf8: &str) -> Publisher {
    Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: endpoint.to_owned(),
        backend_id: "cli-store".into(),
        model_name: "cli-model".into(),
        block_size: 16,
        non_utf8: non_utf8.into(),
        ..Config::default()
    })
    .expect("the publisher binds")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

/// A running `kv-events tail`, its stderr's first line (said once it connected) read.
struct Tail {
    child: Child,
    stderr: BufReader<ChildStderr>,
}

impl Tail {
    fn start(endpoint: &str, options: &[&str]) -> Tail {
        let mut child = kv_events()
            .args(["tail", endpoint])
            .args(options)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kv-events starts");
        let mut stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
        let mut first = String::new();
        stderr.read_line(&mut first).expect("tail's stderr");
        assert!(first.contains("watching"), "{first}");
        // ZeroMQ's slow joiner: the subscription takes a moment to reach the PUB socket.
        // This is setup, not an assertion: a message sent before it would be missed.
        std::thread::sleep(Duration::from_millis(500));
        Tail { child, stderr }
    }

    /// Waits for the exit: status, stdout, and the rest of stderr.
    fn finish(mut self) -> (Output, String) {
        let mut rest = String::new();
        self.stderr
            .read_to_string(&mut rest)
            .expect("tail's stderr");
        let output = self.child.wait_with_output().expect("tail exits");
        (output, rest)
    }
}

#[test]
fn demo_sees_every_published_event_with_no_gap() {
    let output = kv_events()
        .args(["demo", "--endpoint", &Endpoint::new(), "--objects", "200"])
        .output()
        .expect("kv-events runs");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // The summary's lines read "  <label>  <count> ...".
    let count = |label: &str| -> u64 {
        stdout
            .lines()
            .find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some(label)).then(|| words.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {label} count in\n{stdout}"))
    };
    for label in ["stored", "removed", "cleared"] {
        assert!(count(label) > 0, "{label}: {stdout}");
    }
    assert_eq!(count("gaps"), 0, "{stdout}");
    assert_eq!(count("dropped_events"), 0, "{stdout}");
    assert_eq!(count("events"), count("published_events"), "{stdout}");
    assert!(
        stdout.contains(" tail ipc:///tmp/kv-events-cli-"),
        "{stdout}"
    );
    assert!(stdout.contains("\nOK: "), "{stdout}");
}

/// The names of `Stats`' fields, in order, as `{:#?}` prints the struct.
fn stats_field_names() -> Vec<String> {
    format!("{:#?}", mooncake_kv_events::Stats::default())
        .lines()
        .filter_map(|line| Some(line.strip_prefix("    ")?.split_once(": ")?.0.to_owned()))
        .collect()
}

#[test]
fn demo_prints_every_field_of_the_stats_in_their_order() {
    let output = kv_events()
        .args(["demo", "--endpoint", &Endpoint::new(), "--objects", "20"])
        .output()
        .expect("kv-events runs");
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    // The table after "Publisher stats:", up to the blank line: "  <name>  <number>".
    let table: Vec<(String, u64)> = stdout
        .split_once("\nPublisher stats:\n")
        .unwrap_or_else(|| panic!("no stats table in\n{stdout}"))
        .1
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let name = words.next().unwrap().to_owned();
            let value = words.next().and_then(|v| v.parse().ok());
            (
                name,
                value.unwrap_or_else(|| panic!("{line:?} has no number")),
            )
        })
        .collect();
    let names: Vec<String> = table.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(names, stats_field_names(), "{stdout}");
    let value = |name: &str| table.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(value("incarnation") > 0, "{stdout}");
    assert!(value("published_events") > 0, "{stdout}");
    assert_eq!(
        value("subscriber_connects"),
        1,
        "the demo's watcher: {stdout}"
    );
}

#[test]
fn demo_dumps_the_index_its_subscribers_should_end_with() {
    let dir = std::env::temp_dir().join(format!("kv-events-cli-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let file = dir.join("expected.json");
    // Keys that are not UTF-8 published as `bin`, so that the dump holds them.
    let output = kv_events()
        .args(["demo", "--endpoint", &Endpoint::new(), "--objects", "100"])
        .args(["--non-utf8", "bin", "--dump-index"])
        .arg(&file)
        .output()
        .expect("kv-events runs");
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let dump: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("the dump")).expect("JSON");
    let _ = std::fs::remove_dir_all(&dir);
    let objects = dump["objects"].as_array().expect("objects");
    assert!(!objects.is_empty(), "{dump}");
    let mut sorted = objects.clone();
    sorted.sort_by_key(|o| o.to_string());
    assert_eq!(&sorted, objects, "sorted");
    for object in objects {
        let [backend, tenant, key, media] = object.as_array().unwrap().as_slice() else {
            panic!("{object}");
        };
        assert_eq!(backend, "demo-store");
        assert!(["default", "tenant-a", "tenant-b"].contains(&tenant.as_str().unwrap()));
        assert!(key.as_str().is_some_and(|k| !k.is_empty()), "{object}");
        assert!(
            [json!(["cpu"]), json!(["disk"]), json!(["cpu", "disk"])].contains(media),
            "{object}"
        );
    }
    // A key that is not UTF-8 renders as the Python indexer renders it; the Put committed
    // during tenant-a's RemoveAll outlives it.
    assert!(
        objects.contains(&json!([
            "demo-store",
            "default",
            "hex:6f626a2d303030303033fffe",
            ["cpu", "disk"]
        ])),
        "{dump}"
    );
    assert!(
        objects.contains(&json!(["demo-store", "tenant-a", "late-put", ["cpu"]])),
        "{dump}"
    );
    assert_eq!(dump["resyncs"], 0);
    assert!(
        dump["next_sequence"].as_u64().is_some_and(|s| s > 0),
        "{dump}"
    );
}

/// The number after `label` on the first line of `stdout` that starts with it (the demo's
/// summary and stats table read "  <label>  <count> ...").
fn count_in(stdout: &str, label: &str) -> u64 {
    stdout
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(label)).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no {label} count in\n{stdout}"))
}

/// `kv-events demo` over 100 objects with `args`, checked to end with OK; its stdout and its
/// `--dump-index`. `name` keeps the dump apart from other tests'.
fn demo_and_dump(name: &str, args: &[&str]) -> (String, Value) {
    let dir = std::env::temp_dir().join(format!("kv-events-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let file = dir.join("expected.json");
    let output = kv_events()
        .args(["demo", "--endpoint", &Endpoint::new(), "--objects", "100"])
        .args(["--show", "0"])
        .args(args)
        .arg("--dump-index")
        .arg(&file)
        .output()
        .expect("kv-events runs");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{args:?}: {stdout}\n{stderr}");
    assert!(stdout.contains("\nOK: "), "{stdout}");
    let dump: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("the dump")).expect("JSON");
    let _ = std::fs::remove_dir_all(&dir);
    // The watcher saw every published event, with no gap.
    assert_eq!(
        count_in(&stdout, "events"),
        count_in(&stdout, "published_events"),
        "{stdout}"
    );
    assert_eq!(count_in(&stdout, "gaps"), 0, "{stdout}");
    assert_eq!(count_in(&stdout, "dropped_events"), 0, "{stdout}");
    (stdout, dump)
}

/// Whether a dumped object's tenant or key is one that is not UTF-8 (`"hex:..."`).
fn not_utf8(object: &Value) -> bool {
    object[1].as_str().is_some_and(|s| s.starts_with("hex:"))
        || object[2].as_str().is_some_and(|s| s.starts_with("hex:"))
}

#[test]
fn demo_skips_keys_that_are_not_utf8_by_default_and_its_dump_leaves_them_out() {
    let (skipped, skipped_dump) = demo_and_dump("skip", &[]);
    let (bin, bin_dump) = demo_and_dump("bin", &["--non-utf8", "bin"]);
    // Skipped by default: counted, not published, and numbered by no message.
    let skipped_events = count_in(&skipped, "skipped_non_utf8_events");
    assert!(skipped_events > 0, "{skipped}");
    assert_eq!(count_in(&bin, "skipped_non_utf8_events"), 0, "{bin}");
    assert_eq!(
        count_in(&skipped, "published_events") + skipped_events,
        count_in(&bin, "published_events"),
        "the same workload publishes the skipped events as bin"
    );
    assert_eq!(
        skipped_dump["next_sequence"].as_u64(),
        Some(count_in(&skipped, "batches")),
        "every number taken by a message the watcher saw: {skipped}"
    );
    // The index without them is the bin index less its objects that are not UTF-8.
    let objects = |dump: &Value| dump["objects"].as_array().expect("objects").clone();
    let without: Vec<Value> = objects(&bin_dump)
        .into_iter()
        .filter(|o| !not_utf8(o))
        .collect();
    assert!(
        without.len() < objects(&bin_dump).len(),
        "the bin index holds a key that is not UTF-8: {bin_dump}"
    );
    assert_eq!(objects(&skipped_dump), without, "{skipped_dump}");
    assert!(!objects(&skipped_dump).iter().any(not_utf8));
    assert_eq!(skipped_dump["resyncs"], 0);
}

#[test]
fn demo_with_reannounce_remaining_sees_the_extra_stored_events_its_model_expects() {
    let (plain, plain_dump) = demo_and_dump("plain", &[]);
    let (reannounced, reannounced_dump) = demo_and_dump("reannounce", &["--reannounce-remaining"]);
    // The same removals, and more `stored`: the media each object kept after a removal.
    assert_eq!(
        count_in(&reannounced, "removed"),
        count_in(&plain, "removed")
    );
    assert!(
        count_in(&reannounced, "stored") > count_in(&plain, "stored"),
        "{plain}\n{reannounced}"
    );
    // A stored of a medium already held changes no per-medium index.
    assert_eq!(reannounced_dump["objects"], plain_dump["objects"]);
}

#[test]
fn demo_whose_watcher_lost_events_ends_and_says_so_despite_heartbeats() {
    // A send queue of one message drops most of a flat-out workload; heartbeats every 50 ms
    // keep messages coming after it, which must not keep the watcher waiting for the rest.
    // coreutils' timeout ends a demo that waits for ever with status 124.
    let output = Command::new("timeout")
        .arg("180")
        .arg(env!("CARGO_BIN_EXE_kv-events"))
        .args(["demo", "--endpoint", &Endpoint::new(), "--show", "0"])
        .args(["--objects", "100000", "--send-hwm", "1"])
        .args(["--heartbeat-ms", "50"])
        .output()
        .expect("kv-events runs");
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stdout));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("the watcher saw "), "{stderr}");
    assert!(stderr.contains("published events"), "{stderr}");
}

#[test]
fn demo_exits_1_when_its_endpoint_cannot_be_bound() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("its address").port();
    let output = kv_events()
        .args(["demo", "--endpoint", &format!("tcp://127.0.0.1:{port}")])
        .output()
        .expect("kv-events runs");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot be bound"), "{stderr}");
}

#[test]
fn tail_prints_each_event_as_a_json_line_with_its_sequence() {
    let endpoint = Endpoint::new();
    // The key that is not UTF-8 goes out as `bin`, which tail prints as hex.
    let publisher = publisher_with(&endpoint, "bin");
    let tail = Tail::start(&endpoint, &["--count", "6", "--idle-timeout", "5"]);

    publisher.on_put_commit("", b"key-\xff", "group-1", BOTH);
    publisher.on_medium_delta("tenant-a", "key-2", "", CPU, DISK);
    let scan = publisher.begin_remove_all();
    publisher.on_medium_delta("tenant-b", "key-3", "group-1", CPU, MediumSet::EMPTY);
    publisher.on_remove_all(&scan, "tenant-b", 1, 0);
    // One more than --count: tail stops before it.
    publisher.on_put_commit("", "key-4", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)), "flush");

    let (output, stderr) = tail.finish();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let events: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let column = |key: &str| -> Vec<Value> { events.iter().map(|e| e[key].clone()).collect() };
    assert_eq!(
        column("event_type"),
        ["stored", "stored", "removed", "stored", "removed", "cleared"]
    );
    assert_eq!(
        column("medium"),
        [
            json!("cpu"),
            json!("disk"),
            json!("cpu"),
            json!("disk"),
            json!("cpu"),
            Value::Null
        ]
    );
    assert_eq!(column("event_id"), [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        column("tenant_id"),
        ["default", "default", "tenant-a", "tenant-a", "tenant-b", "tenant-b"]
    );
    let key_hex: String = b"key-\xff".iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(events[0]["object_key"], json!({ "hex": key_hex }));
    assert_eq!(events[2]["object_key"], "key-2");
    assert_eq!(events[0]["group_id"], "group-1");
    assert_eq!(events[2]["group_id"], Value::Null);
    for event in &events {
        assert_eq!(event["backend_id"], "cli-store");
        assert_eq!(event["model_name"], "cli-model");
        assert_eq!(event["block_size"], 16);
        assert!(event["sequence"].as_u64().is_some(), "{event}");
        assert!(event["timestamp"].as_u64().is_some(), "{event}");
    }
    let sequences = column("sequence");
    // The tail joined before the publisher's first message, which is 0.
    assert_eq!(sequences[0], 0, "{sequences:?}");
    assert!(
        sequences.windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()),
        "{sequences:?}"
    );
    assert!(!events[5].as_object().unwrap().contains_key("object_key"));
    assert!(!stderr.contains("gap"), "{stderr}");
}

/// A tail with `options` that watched one event of a publisher on `endpoint`, then one call
/// with `media` of a second publisher bound to the same endpoint.
fn tail_across_a_restart(endpoint: &str, options: &[&str], media: MediumSet) -> Tail {
    let first = publisher(endpoint);
    let tail = Tail::start(endpoint, options);
    first.on_put_commit("", "before-restart", "", CPU);
    assert!(first.flush(Duration::from_secs(10)), "flush");
    drop(first);

    let second = publisher(endpoint);
    // Setup: the subscriber reconnects to the new socket on its own (ZeroMQ retries every
    // 100 ms).
    std::thread::sleep(Duration::from_millis(2000));
    second.on_put_commit("", "after-restart", "", media);
    assert!(second.flush(Duration::from_secs(10)), "flush");
    tail
}

#[test]
fn tail_reports_a_publisher_restart_on_stderr() {
    let endpoint = Endpoint::new();
    let tail = tail_across_a_restart(&endpoint, &["--count", "2", "--idle-timeout", "5"], CPU);

    let (output, stderr) = tail.finish();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(
        stderr.contains("restart: the sequence went back to 0 after 0"),
        "{stderr}"
    );
}

#[test]
fn tail_prints_and_counts_only_the_events_its_filters_pass() {
    let endpoint = Endpoint::new();
    // The key that is not UTF-8 goes out as `bin`, which --key-prefix matches by its bytes.
    let publisher = publisher_with(&endpoint, "bin");
    let tail = Tail::start(
        &endpoint,
        &[
            "--tenant",
            "tenant-a",
            "--type",
            "stored,removed",
            "--key-prefix",
            "key-",
            "--count",
            "3",
            "--idle-timeout",
            "5",
        ],
    );
    publisher.on_put_commit("tenant-a", "key-1", "", CPU); // 1
    publisher.on_put_commit("tenant-b", "key-2", "", CPU); // another tenant
    publisher.on_put_commit("tenant-a", "other", "", CPU); // another prefix
    publisher.on_put_commit("", "key-0", "", CPU); // the default tenant
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "tenant-a", 1, 0); // cleared: another type
    publisher.on_put_commit("tenant-a", b"key-\xff", "", DISK); // 2: a bin key, by its bytes
    publisher.on_medium_delta("tenant-a", "key-1", "", CPU, MediumSet::EMPTY); // 3
    publisher.on_put_commit("tenant-a", "key-4", "", CPU); // past --count
    assert!(publisher.flush(Duration::from_secs(10)), "flush");

    let (output, stderr) = tail.finish();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let events: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let summary: Vec<Value> = events
        .iter()
        .map(|e| {
            json!([
                e["event_type"],
                e["tenant_id"],
                e["object_key"],
                e["medium"]
            ])
        })
        .collect();
    assert_eq!(
        summary,
        [
            json!(["stored", "tenant-a", "key-1", "cpu"]),
            json!(["stored", "tenant-a", {"hex": "6b65792dff"}, "disk"]),
            json!(["removed", "tenant-a", "key-1", "cpu"]),
        ]
    );
    // The 4 events left out took sequence numbers too: no gap was reported for them.
    assert!(!stderr.contains("gap"), "{stderr}");
}

#[test]
fn tail_filters_hide_no_restart() {
    let endpoint = Endpoint::new();
    let tail = tail_across_a_restart(
        &endpoint,
        &["--tenant", "nobody", "--idle-timeout", "5"],
        BOTH,
    );

    let (output, stderr) = tail.finish();
    assert!(output.status.success(), "{stderr}");
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    assert!(
        stderr.contains("restart: the sequence went back to 0 after 0"),
        "{stderr}"
    );
    assert!(
        stderr.contains("stopping after 0 events that passed the filters (3 others left out)"),
        "{stderr}"
    );
}

#[test]
fn tail_stats_prints_rate_lines_instead_of_events() {
    let endpoint = Endpoint::new();
    let publisher = publisher(&endpoint);
    let tail = Tail::start(
        &endpoint,
        &["--stats", "--type", "stored", "--idle-timeout", "2"],
    );
    publisher.on_put_commit("", "key-1", "", BOTH);
    publisher.on_medium_delta("", "key-1", "", BOTH, CPU);
    publisher.on_put_commit("tenant-a", "key-2", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    // The last message the tail saw: the one below the next.
    let last_sequence = publisher.stats().next_sequence - 1;

    let (output, stderr) = tail.finish();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "time",
            "events/s",
            "stored/s",
            "removed/s",
            "cleared/s",
            "gaps",
            "missed",
            "last_sequence"
        ]
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    // A line a second while it waits out its idle timeout, and a last one at exit.
    assert!(rows.len() >= 2, "{stdout}");
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{stdout}");
        assert!(row[0].ends_with('s'), "{stdout}");
        for (column, value) in row.iter().enumerate().skip(1).take(6) {
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("column {column}: {stdout}"));
            assert!(value >= 0.0, "{stdout}");
        }
        assert_eq!((row[5], row[6]), ("0", "0"), "no gap: {stdout}");
        // Only stored events pass: no removed per second.
        assert_eq!(row[3], "0", "{stdout}");
    }
    assert_eq!(
        rows.last().unwrap()[7],
        last_sequence.to_string(),
        "{stdout}"
    );
    assert!(
        stderr.contains("stopping after 3 events that passed the filters (1 other left out)"),
        "{stderr}"
    );
}

#[test]
fn tail_stats_json_prints_an_object_per_line_for_programs() {
    let endpoint = Endpoint::new();
    let publisher = publisher(&endpoint);
    let tail = Tail::start(
        &endpoint,
        &[
            "--stats",
            "--json",
            "--type",
            "stored",
            "--idle-timeout",
            "2",
        ],
    );
    publisher.on_put_commit("", "key-1", "", BOTH);
    publisher.on_medium_delta("", "key-1", "", BOTH, CPU);
    publisher.on_put_commit("tenant-a", "key-2", "", CPU);
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    // The last message the tail saw: the one below the next.
    let last_sequence = publisher.stats().next_sequence - 1;

    let (output, stderr) = tail.finish();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // No header: every line is one JSON object with the text line's columns.
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}\n{stdout}")))
        .collect();
    assert!(rows.len() >= 2, "{stdout}");
    let keys = [
        "cleared_per_s",
        "events_per_s",
        "gaps",
        "last_sequence",
        "missed",
        "removed_per_s",
        "stored_per_s",
        "time_s",
    ];
    for row in &rows {
        let mut names: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        names.sort_unstable();
        assert_eq!(names, keys, "{stdout}");
        assert_eq!(
            (row["gaps"].as_u64(), row["missed"].as_u64()),
            (Some(0), Some(0))
        );
        assert_eq!(row["removed_per_s"].as_f64(), Some(0.0), "{stdout}");
    }
    assert_eq!(
        rows.last().unwrap()["last_sequence"],
        last_sequence,
        "{stdout}"
    );
}

#[test]
fn tail_stats_with_the_replay_socket_shows_the_publishers_subscribers() {
    let (endpoint, replay) = (Endpoint::new(), Endpoint::new());
    let publisher = Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: endpoint.to_string(),
        replay_endpoint: replay.to_string(),
        backend_id: "cli-store".into(),
        ..Config::default()
    })
    .expect("the publisher binds");
    let tail = Tail::start(
        &endpoint,
        &[
            "--stats",
            "--replay-endpoint",
            &replay,
            "--idle-timeout",
            "2",
        ],
    );
    // The tail itself is the one subscriber, once its handshake is done.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while publisher.stats().subscribers == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    publisher.on_put_commit("", "key-1", "", BOTH);
    assert!(publisher.flush(Duration::from_secs(10)), "flush");

    let (output, stderr) = tail.finish();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    assert_eq!(
        header[header.len() - 3..],
        ["subscribers", "connects", "disconnects"],
        "{stdout}"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert!(!rows.is_empty(), "{stdout}");
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{stdout}");
        assert_eq!(row[row.len() - 1], "0", "nobody left: {stdout}");
    }
    // The tail is connected while it asks.
    assert_eq!(rows.last().unwrap()[header.len() - 3], "1", "{stdout}");
    // Its own connect, counted once over the lines.
    let connects: u64 = rows
        .iter()
        .map(|r| r[r.len() - 2].parse::<u64>().unwrap())
        .sum();
    assert_eq!(connects, 1, "{stdout}");
}

/// A tail of `endpoint` with `--idle-timeout 0.5`, run to its end: its status and stderr.
fn idle_tail(endpoint: &str) -> (Output, String) {
    let output = kv_events()
        .args(["tail", endpoint, "--idle-timeout", "0.5"])
        .output()
        .expect("kv-events runs");
    let stderr = text(&output.stderr);
    (output, stderr)
}

#[test]
fn tail_stops_after_its_idle_timeout_with_0_once_it_reached_its_publisher() {
    let endpoint = Endpoint::new();
    let _publisher = publisher(&endpoint);
    let (output, stderr) = idle_tail(&endpoint);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(output.stdout.is_empty());
    assert!(stderr.contains("no message for 0.5s"), "{stderr}");
    assert!(!stderr.contains("reach"), "{stderr}");
}

/// A TCP endpoint on loopback where nothing listens.
fn nobody_listens() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("tcp://127.0.0.1:{port}")
}

#[test]
fn tail_exits_1_when_it_never_reached_its_publisher_and_says_why() {
    let nowhere = Endpoint::new();
    for (endpoint, why) in [
        (nobody_listens(), "nothing accepted a connection there"),
        (nowhere.to_string(), "nothing accepted a connection there"),
        (
            "tcp://no-such-host.invalid:5557".to_owned(),
            "its host name does not resolve",
        ),
    ] {
        let started = std::time::Instant::now();
        let (output, stderr) = idle_tail(&endpoint);
        assert_eq!(output.status.code(), Some(1), "{endpoint}: {stderr}");
        assert!(output.stdout.is_empty(), "{endpoint}");
        // Said while it waits, then as the reason of its exit.
        assert!(
            stderr.contains(&format!("kv-events: cannot reach {endpoint} yet: {why}")),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "kv-events: never reached {endpoint} within --idle-timeout (0.5s): {why}"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains("no message for"), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(10), "{endpoint}");
    }
}

#[test]
fn tail_says_when_it_reaches_a_publisher_that_came_late() {
    let endpoint = Endpoint::new();
    let mut tail = Tail::start(&endpoint, &["--count", "1", "--idle-timeout", "20"]);
    let mut line = String::new();
    tail.stderr.read_line(&mut line).expect("tail's stderr");
    assert!(line.contains("cannot reach"), "{line}");
    let publisher = publisher(&endpoint);
    line.clear();
    tail.stderr.read_line(&mut line).expect("tail's stderr");
    assert_eq!(line, format!("kv-events: reached {}\n", &*endpoint));
    // ZeroMQ's slow joiner: the subscription takes a moment to reach the PUB socket. This is
    // setup, not an assertion: a message sent before it would be missed.
    std::thread::sleep(Duration::from_millis(500));
    publisher.on_put_commit("t", "k", "g", CPU);
    let (output, rest) = tail.finish();
    assert_eq!(output.status.code(), Some(0), "{rest}");
    assert_eq!(text(&output.stdout).lines().count(), 1);
}

#[test]
fn bad_command_lines_exit_2_with_the_usage_on_stderr() {
    for (args, usage) in [
        (&["tail"][..], "Usage: kv-events tail "),
        (
            &["tail", "ipc:///tmp/a", "ipc:///tmp/b"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--count"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--count", "many"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--idle-timeout", "soon"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--follow"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--type", "stored,bogus"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--stats=1"],
            "Usage: kv-events tail ",
        ),
        (
            &["tail", "ipc:///tmp/a", "--tenant"],
            "Usage: kv-events tail ",
        ),
        (&["demo", "--objects", "0"], "Usage: kv-events demo "),
        (&["demo", "--show=some"], "Usage: kv-events demo "),
        (&["completions", "tcsh"], "Usage: kv-events completions "),
        (&[], "Usage: kv-events <COMMAND>"),
        (&["watch"], "Usage: kv-events <COMMAND>"),
    ] {
        let output = kv_events().args(args).output().expect("kv-events runs");
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(usage), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn tail_exits_1_when_it_cannot_connect() {
    let output = kv_events()
        .args(["tail", "nope://nowhere", "--idle-timeout", "1"])
        .output()
        .expect("kv-events runs");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot connect to nope://nowhere"),
        "{stderr}"
    );
}

#[test]
fn help_lists_the_commands_exit_statuses_and_examples() {
    for flag in ["--help", "-h"] {
        let output = kv_events().arg(flag).output().expect("kv-events runs");
        let stdout = text(&output.stdout);
        assert!(output.status.success(), "{flag}");
        for part in [
            "Usage: kv-events <COMMAND>",
            "\n  tail ",
            "\n  demo ",
            "\n  completions ",
            "--version",
            "Exit status:\n  0  ",
            "\n  1  runtime error",
            "\n  2  usage error",
            "Examples:\n  kv-events demo\n",
            "kv-events tail tcp://master-0:5557 --tenant tenant-a --type stored,removed",
            "kv-events completions bash",
        ] {
            assert!(stdout.contains(part), "{flag}: {part}: {stdout}");
        }
    }
}

#[test]
fn each_command_has_its_options_and_examples_in_its_help() {
    for (command, parts) in [
        (
            "tail",
            &[
                "Usage: kv-events tail [OPTIONS] <ENDPOINT>",
                "--count <N>",
                "--idle-timeout <SECS>",
                "--tenant <T>",
                "--type <TYPES>",
                "--key-prefix <P>",
                "--stats",
                "Examples:",
                "--key-prefix llama/",
            ][..],
        ),
        (
            "demo",
            &[
                "Usage: kv-events demo [OPTIONS]",
                "--endpoint <ENDPOINT>",
                "--objects <N>",
                "--show <N|all>",
                "--wait <SECS>",
                "--dump-index <FILE>",
                "Examples:",
                "kv-events demo --wait 10",
            ],
        ),
    ] {
        for help in [
            &[command, "--help"][..],
            &[command, "-h"],
            &["help", command],
        ] {
            let output = kv_events().args(help).output().expect("kv-events runs");
            let stdout = text(&output.stdout);
            assert!(output.status.success(), "{help:?}");
            for part in parts {
                assert!(stdout.contains(part), "{help:?}: {part}: {stdout}");
            }
        }
    }
}

#[test]
fn version_prints_the_package_version_and_its_libzmq() {
    let output = kv_events()
        .arg("--version")
        .output()
        .expect("kv-events runs");
    assert!(output.status.success());
    let info = mooncake_kv_events::BuildInfo::current();
    assert_eq!(text(&output.stdout), format!("kv-events {info}\n"));
    assert!(
        text(&output.stdout).starts_with(concat!(
            "kv-events ",
            env!("CARGO_PKG_VERSION"),
            " (libzmq "
        )),
        "{}",
        text(&output.stdout)
    );
}

/// What bash's completion offers for the last of `words`, with the script that
/// `kv-events completions bash` prints loaded.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let output = kv_events()
        .args(["completions", "bash"])
        .output()
        .expect("kv-events runs");
    assert!(output.status.success());
    let script = std::env::temp_dir().join(format!(
        "kv-events-completion-{}-{}.bash",
        std::process::id(),
        words.join("_").replace('/', "")
    ));
    std::fs::write(&script, &output.stdout).expect("the script is written");
    // Bash calls a completion function with the command, the word being completed and the
    // word before it, and reads COMPREPLY.
    let call = format!(
        "source {script:?}; COMP_WORDS=({words}); COMP_CWORD={last}; \
         _kv__events kv-events \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words = words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        last = words.len() - 1,
    );
    let output = Command::new("bash")
        .args(["-c", &call])
        .output()
        .expect("bash runs");
    let _ = std::fs::remove_file(&script);
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout).lines().map(str::to_owned).collect()
}

#[test]
fn bash_completes_commands_options_and_values() {
    assert_eq!(bash_completes(&["kv-events", "de"]), ["demo"]);
    assert_eq!(
        bash_completes(&["kv-events", "tail", "ipc:///x", "--idle"]),
        ["--idle-timeout"]
    );
    assert_eq!(
        bash_completes(&["kv-events", "tail", "ipc:///x", "--type", ""]),
        ["stored", "removed", "cleared"]
    );
    assert_eq!(
        bash_completes(&["kv-events", "demo", "--dump"]),
        ["--dump-index"]
    );
}

#[test]
fn zsh_and_fish_completions_name_every_command_and_option() {
    for shell in ["zsh", "fish"] {
        let output = kv_events()
            .args(["completions", shell])
            .output()
            .expect("kv-events runs");
        let script = text(&output.stdout);
        assert!(output.status.success(), "{shell}");
        for word in ["tail", "demo", "idle-timeout", "key-prefix", "dump-index"] {
            assert!(script.contains(word), "{shell}: {word}");
        }
    }
}
