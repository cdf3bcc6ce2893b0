//! The C API's sources agree with the Rust side: the fields of `kv_events_config` in
//! include/mooncake/kv_events_c.h are the Rust `Config`'s, in order, and the OFF build's stub
//! (cpp/kv_events_stub.cc, which has no Rust behind it) reports exactly the status and metrics of
//! a disabled Rust publisher, so that a dashboard sees the same metric families, at zero, from a
//! master built without events.

use mooncake_kv_events::{Config, Publisher};
use std::path::Path;

fn source(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of the C++ raw string literal `R"<delimiter>(...)<delimiter>"` in `text`.
fn raw_string<'a>(text: &'a str, delimiter: &str) -> &'a str {
    let open = format!("R\"{delimiter}(");
    let close = format!("){delimiter}\"");
    let start = text.find(&open).expect("the raw string's start") + open.len();
    let len = text[start..].find(&close).expect("the raw string's end");
    &text[start..start + len]
}

#[test]
fn the_stub_reports_the_metrics_of_a_disabled_publisher() {
    let stub = source("cpp/kv_events_stub.cc");
    assert_eq!(
        raw_string(&stub, "metrics"),
        Publisher::disabled().metrics_text()
    );
}

#[test]
fn the_stub_reports_the_status_of_a_disabled_publisher_built_without_events() {
    let stub = source("cpp/kv_events_stub.cc");
    let rust = Publisher::disabled().status_json();
    let (built, rest) = rust.split_at("{\"built_with_kv_events\":true".len());
    assert_eq!(built, "{\"built_with_kv_events\":true", "{rust}");
    assert_eq!(
        raw_string(&stub, "status"),
        format!("{{\"built_with_kv_events\":false{rest}")
    );
}

#[test]
fn the_c_config_has_the_rust_fields_in_order() {
    let header = source("include/mooncake/kv_events_c.h");
    let body = header
        .split_once("typedef struct kv_events_config {")
        .expect("kv_events_config in the C header")
        .1
        .split_once("} kv_events_config;")
        .unwrap()
        .0;
    let c_fields: Vec<&str> = body
        .lines()
        .filter_map(|line| line.split_once(';'))
        .filter_map(|(declaration, _)| declaration.rsplit(' ').next())
        .map(|name| name.trim_start_matches('*'))
        .collect();
    let debug = format!("{:#?}", Config::default());
    let rust_fields: Vec<&str> = debug
        .lines()
        .filter_map(|line| line.trim().split_once(": "))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(c_fields, rust_fields);
}
