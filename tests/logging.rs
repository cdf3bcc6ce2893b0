//! The library's log lines reach the sink the host installed, and nothing else does.

use kv_events_testing as common;

use common::{config, endpoint};
use mooncake_kv_events::{set_log_sink, Config, Level, Publisher};
use std::sync::{Arc, Mutex};

#[test]
fn lifecycle_lines_land_in_the_installed_sink() {
    let lines = Arc::new(Mutex::new(Vec::<(Level, String)>::new()));
    let sink = Arc::clone(&lines);
    set_log_sink(move |level, line| sink.lock().unwrap().push((level, line.to_owned())));

    let endpoint = endpoint();
    let publisher = Publisher::create(&Config {
        emit_object_key: false,
        model_name: "llama".into(),
        ..config(&endpoint)
    })
    .unwrap();
    drop(publisher);
    let _ = Publisher::create(&Config::default()).unwrap();

    let lines = lines.lock().unwrap();
    let find = |level: Level, needle: &str| {
        lines
            .iter()
            .any(|(l, line)| *l == level && line.contains(needle))
    };
    assert!(find(Level::Info, "publisher started"), "{lines:?}");
    assert!(
        find(Level::Info, &format!("bind_endpoint={endpoint:?}")),
        "the effective config"
    );
    assert!(find(Level::Info, "model_name=\"llama\""));
    assert!(find(Level::Warn, "kv_events_emit_object_key=false"));
    assert!(find(Level::Info, "publisher stopped"));
    assert!(find(Level::Info, "disabled"));
}
