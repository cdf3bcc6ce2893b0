//! The command's side of who may read the stream (docs/security.md): the key files `kv-events
//! keygen` writes, and `tail` reading a CURVE stream with its keys or refused without them.
//! The publisher's side is the library's tests/security.rs.

use kv_events_testing as common;

use common::{curve_config, curve_keys, keygen, tcp_endpoint, TempDir};
use mooncake_kv_events::{Medium, MediumSet, Publisher};
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

fn kv_events(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(args)
        .output()
        .expect("kv-events runs")
}

#[test]
fn keygen_writes_a_secret_file_of_mode_0600_and_never_replaces_one() {
    let dir = TempDir::new("security-keygen");
    let name = dir.path("master-0").display().to_string();
    let output = kv_events(&["keygen", &name]);
    assert!(output.status.success(), "{output:?}");
    let pair = mooncake_kv_events::keys::read_key_pair(&dir.path("master-0.key")).unwrap();
    let public = mooncake_kv_events::keys::read_public_key(&dir.path("master-0.pub")).unwrap();
    assert_eq!(pair.public, public);
    let mode = |f: &str| std::fs::metadata(dir.path(f)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("master-0.key"), 0o600);
    assert!(!std::fs::read_to_string(dir.path("master-0.pub"))
        .unwrap()
        .contains("secret-key"));
    // Nothing of the secret on the terminal.
    assert!(!String::from_utf8_lossy(&output.stdout).contains(&pair.secret.to_z85()));

    let before = std::fs::read(dir.path("master-0.key")).unwrap();
    let again = kv_events(&["keygen", &name]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    assert_eq!(std::fs::read(dir.path("master-0.key")).unwrap(), before);
}

#[test]
fn tail_reads_a_curve_stream_with_its_keys_and_exits_1_when_refused() {
    let dir = TempDir::new("security-tail");
    curve_keys(&dir.0, "indexer-a");
    let endpoint = tcp_endpoint();
    let publisher = Publisher::create(&curve_config(&endpoint, &dir.0)).expect("binds");
    let server_pub = dir.path("server.pub").display().to_string();
    let admitted = dir.path("allowed/indexer-a.key").display().to_string();
    keygen(&dir.0, "stranger");
    let stranger = dir.path("stranger.key").display().to_string();

    let refused = kv_events(&[
        "tail",
        &endpoint,
        "--curve-server-key",
        &server_pub,
        "--curve-secret-key",
        &stranger,
    ]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("refused this subscriber"), "{stderr}");

    let mut tail = std::process::Command::new(env!("CARGO_BIN_EXE_kv-events"))
        .args(["tail", &endpoint, "--count", "2", "--curve-server-key"])
        .args([&server_pub, "--curve-secret-key", &admitted])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tail starts");
    // Publish until the tail has joined and printed its two events.
    let mut i = 0;
    let status = loop {
        if let Some(status) = tail.try_wait().unwrap() {
            break status;
        }
        publisher.on_put_commit("", format!("k{i}"), "", MediumSet::from([Medium::Cpu]));
        i += 1;
        assert!(i < 3000, "the tail never printed two events");
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = tail.wait_with_output().unwrap();
    assert!(status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 2);
}
