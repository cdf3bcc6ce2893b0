//! The C side's lists agree with the Rust side: `KV_EVENTS_CONFIG_FIELDS` of
//! include/mooncake/kv_events_c.h has the Rust `Config`'s fields, in order, with the same
//! defaults; `KV_EVENTS_STATS_FIELDS` has the Rust `Stats`' fields in order; and the OFF build's
//! stub (cpp/kv_events_stub.cc, which has no Rust behind it and expands its texts from that
//! list) reports exactly the status and metrics of a disabled Rust publisher, so that a
//! dashboard sees the same metric families, at zero, from a master built without events.
//!
//! The C side is read by compiling it: tests/c_side/lists.cc with the stub, by the C++ compiler
//! the crate's build already needs (`CXX`, else `c++`).

use mooncake_kv_events::{BuildInfo, Config, Publisher, Stats};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The program of tests/c_side/lists.cc, built once for every test of this file.
fn lists_program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let program = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_api_lists");
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
        let mut words = compiler.split_whitespace();
        let output = Command::new(words.next().expect("a compiler"))
            .args(words)
            .args([
                "-std=c++17",
                "-fno-exceptions",
                "-fno-rtti",
                "-Wall",
                "-Wextra",
            ])
            .arg("-I")
            .arg(root.join("include"))
            .arg("-I")
            .arg(root.join("cpp"))
            .arg(root.join("tests/c_side/lists.cc"))
            .arg(root.join("cpp/kv_events_stub.cc"))
            .arg(root.join("cpp/kv_events_common.cc"))
            .arg("-pthread")
            .arg("-o")
            .arg(&program)
            .output()
            .unwrap_or_else(|e| panic!("{compiler} does not run ({e}): set CXX"));
        assert!(
            output.status.success(),
            "{compiler} failed to build tests/c_side/lists.cc with the stub:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        program
    })
}

/// What the program prints for `what`.
fn c_side(what: &str) -> String {
    let output = Command::new(lists_program())
        .arg(what)
        .output()
        .expect("the lists program runs");
    assert!(output.status.success(), "lists {what}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The fields of a Rust struct as `{:#?}` prints them: `name: value`, one a line.
fn rust_fields(debug: &str) -> Vec<&str> {
    debug
        .lines()
        .filter_map(|line| line.strip_prefix("    ")?.strip_suffix(','))
        .collect()
}

fn names<'a>(fields: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    fields
        .into_iter()
        .map(|field| field.split_once(": ").map_or(field, |(name, _)| name))
        .collect()
}

#[test]
fn the_c_config_list_has_the_rust_fields_in_order_with_their_defaults() {
    let rust = format!("{:#?}", Config::default());
    let c = c_side("config");
    assert_eq!(c.lines().collect::<Vec<_>>(), rust_fields(&rust));
}

#[test]
fn the_c_stats_list_has_the_rust_fields_in_order() {
    let rust = format!("{:#?}", Stats::default());
    let c = c_side("stats");
    assert_eq!(c.lines().collect::<Vec<_>>(), names(rust_fields(&rust)));
}

/// The fields of the first release of the size-versioned structs: the C ABI. New fields go
/// after them; none may move or go. Add nothing here when adding a field.
const RELEASED_CONFIG: [&str; 21] = [
    "enable_kv_events",
    "bind_endpoint",
    "backend_id",
    "model_name",
    "block_size",
    "additional_salt",
    "lora_name",
    "dp_rank",
    "emit_object_key",
    "emit_legacy_compat",
    "queue_capacity",
    "curve_secret_key_file",
    "curve_allow",
    "null_allow_addresses",
    "ipc_mode",
    "handshake_timeout_ms",
    "max_connections",
    "max_connections_per_address",
    "send_hwm",
    "replay_endpoint",
    "replay_buffer_bytes",
];
const RELEASED_STATS: [&str; 25] = [
    "enabled",
    "published_batches",
    "published_events",
    "dropped_events",
    "skipped_keyless_events",
    "cleared_suppressed",
    "send_failures",
    "queue_depth",
    "queue_capacity",
    // In the place of the released `last_sequence`, one above it: the first message is 0.
    "next_sequence",
    "refused_handshakes",
    "incarnation",
    "connections",
    "connections_refused",
    "handshake_timeouts",
    "subscriptions_refused",
    "replay_requests",
    "replayed_messages",
    "bad_requests",
    "replays_abandoned",
    "replay_buffer_bytes",
    "replay_oldest_sequence",
    "snapshots_served",
    "snapshots_abandoned",
    "snapshot_objects",
];

#[test]
fn released_fields_keep_their_places_in_the_c_lists() {
    let config = c_side("config");
    let config = names(config.lines());
    assert_eq!(config[..RELEASED_CONFIG.len()], RELEASED_CONFIG);
    let stats = c_side("stats");
    let stats: Vec<&str> = stats.lines().collect();
    assert_eq!(stats[..RELEASED_STATS.len()], RELEASED_STATS);
}

#[test]
fn the_stub_reports_the_metrics_of_a_disabled_publisher() {
    // The same metrics, but a build without libzmq behind it.
    let build = BuildInfo {
        libzmq: String::new(),
        curve: false,
        ..BuildInfo::current()
    };
    let rust = Publisher::disabled().stats().to_prometheus() + &build.to_prometheus();
    assert_eq!(c_side("metrics"), rust);
}

#[test]
fn the_stub_reports_the_status_of_a_disabled_publisher_built_without_events() {
    let rust = Publisher::disabled().status_json();
    let (built, rest) = rust.split_at("{\"built_with_kv_events\":true".len());
    assert_eq!(built, "{\"built_with_kv_events\":true", "{rust}");
    assert_eq!(
        c_side("status"),
        format!("{{\"built_with_kv_events\":false{rest}")
    );
}
