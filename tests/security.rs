//! Who may read the stream (docs/spec.md section 10), with real sockets on loopback: an admitted
//! CURVE subscriber gets the plain stream byte for byte; subscribers without a key, with a
//! key not on the allow-list or with the wrong server key get nothing, and each refusal is
//! counted once; the address allow-list; the mode of an ipc socket file; every config error;
//! no secret in a log line, the status or the metrics. (`kv-events keygen` and `tail` with keys
//! are the command's: cli/tests/security.rs.)

use kv_events_testing as common;

use common::{
    curve_config, curve_keys, eventually, raw_messages, raw_subscriber, tcp_endpoint, TempDir,
};
use mooncake_kv_events::keys::KeyPair;
use mooncake_kv_events::subscriber::{CurveClient, Subscriber, WatchError};
use mooncake_kv_events::{set_log_sink, Config, Medium, MediumSet, Publisher};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn keys(dir: &Path) -> (KeyPair, KeyPair) {
    curve_keys(dir, "indexer-a")
}

/// The same calls whatever the publisher: every kind of event, in more than one batch.
/// With `one_call_per_message`, each call is flushed before the next, so that where one
/// message ends does not depend on timing and two runs give the same messages.
fn calls(publisher: &Publisher, one_call_per_message: bool) -> usize {
    let both = MediumSet::from([Medium::Cpu, Medium::Disk]);
    let flush = || {
        if one_call_per_message {
            assert!(publisher.flush(Duration::from_secs(10)));
        }
    };
    for i in 0..150 {
        publisher.on_put_commit("tenant-a", format!("key-{i}"), "group", both);
        flush();
    }
    for i in 0..50 {
        publisher.on_medium_delta("tenant-a", format!("key-{i}"), "", both, MediumSet::EMPTY);
        flush();
    }
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, "tenant-b", 5, 0);
    assert!(publisher.flush(Duration::from_secs(10)));
    300 + 100 + 1
}

fn workload(publisher: &Publisher) -> usize {
    calls(publisher, false)
}

/// `frames` with the batch timestamp, which differs between two runs, zeroed wherever it
/// is encoded (the trailer's first element and each event's `timestamp`).
fn without_timestamps(mut frames: Vec<Vec<Vec<u8>>>) -> Vec<Vec<Vec<u8>>> {
    for message in &mut frames {
        let payload = &mut message[2];
        let timestamp =
            mooncake_kv_events::wire::decode_message(&[vec![], vec![0; 8], payload.clone()])
                .unwrap()
                .timestamp_ms;
        let mut encoded = Vec::new();
        rmp::encode::write_uint(&mut encoded, timestamp).unwrap();
        let mut at = 0;
        while let Some(found) = payload[at..]
            .windows(encoded.len())
            .position(|w| w == encoded.as_slice())
        {
            let start = at + found;
            payload[start..start + encoded.len()].fill(0);
            at = start + encoded.len();
        }
    }
    frames
}

/// Every message a joined subscriber gets for `workload` on a publisher from `config`.
fn stream(config: &Config, curve: Option<(&KeyPair, &KeyPair)>) -> Vec<Vec<Vec<u8>>> {
    let publisher = Publisher::create(config).expect("the publisher binds");
    let subscriber = raw_subscriber(
        &config.bind_endpoint,
        curve.map(|(server, own)| (&server.public, own)),
    );
    // ZeroMQ's slow joiner, as in common::subscribe: setup, not an assertion.
    std::thread::sleep(Duration::from_millis(300));
    let events = calls(&publisher, true);
    let messages = raw_messages(&subscriber, Duration::from_millis(500));
    assert_eq!(publisher.stats().published_events, events as u64);
    messages
}

#[test]
fn an_admitted_subscriber_receives_the_plain_stream_byte_for_byte() {
    let dir = TempDir::new("security-bytes");
    let (server, admitted) = keys(&dir.0);
    let plain = stream(&common::config(&common::endpoint()), None);
    let curve = stream(
        &curve_config(&common::endpoint(), &dir.0),
        Some((&server, &admitted)),
    );
    assert_eq!(plain.len(), 201, "one message per call");
    let sequences: Vec<&[u8]> = curve.iter().map(|m| m[1].as_slice()).collect();
    assert_eq!(sequences[0], 0u64.to_be_bytes(), "the first sequence is 0");
    assert_eq!(without_timestamps(curve), without_timestamps(plain));
}

/// Validating reads the key files; starting uses what was read. A key rotated (or a file
/// removed) between the two must not give a publisher whose keys were never checked.
#[test]
fn the_keys_validated_are_the_keys_the_publisher_uses() {
    let dir = TempDir::new("security-read-once");
    let (server, admitted) = keys(&dir.0);
    let config = curve_config(&common::endpoint(), &dir.0);
    let settings = config.validate().expect("valid key files");
    // Between validation and start: the server's key file replaced by another key, and the
    // allow-list emptied.
    std::fs::remove_file(dir.0.join("server.key")).unwrap();
    std::fs::remove_file(dir.0.join("server.pub")).unwrap();
    common::keygen(&dir.0, "server");
    std::fs::remove_dir_all(dir.0.join("allowed")).unwrap();
    let publisher = Publisher::start(settings).expect("starts from what was validated");
    let subscriber = raw_subscriber(&config.bind_endpoint, Some((&server.public, &admitted)));
    let (sent, received) = delivered(&publisher, &subscriber);
    assert!(sent > 0);
    assert_eq!(
        received, sent,
        "the validated server key and allow-list are in use"
    );
}

/// Runs the workload once `subscriber`'s subscription has had time to reach the publisher
/// (setup, not an assertion): the events sent, and those `subscriber` received.
fn delivered(publisher: &Publisher, subscriber: &zmq::Socket) -> (usize, usize) {
    std::thread::sleep(Duration::from_millis(300));
    let sent = workload(publisher);
    let received = raw_messages(subscriber, Duration::from_millis(500))
        .iter()
        .map(|m| {
            mooncake_kv_events::wire::decode_message(m)
                .unwrap()
                .events
                .len()
        })
        .sum();
    (sent, received)
}

/// Every log line of this process from now on.
fn capture_log() -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&lines);
    set_log_sink(move |level, line| seen.lock().unwrap().push(format!("{level}: {line}")));
    lines
}

/// A peer without CURVE keys that sends its whole ZMTP 3.0 greeting (NULL mechanism) at
/// once, so that the publisher reads it all and refuses the mechanism. libzmq's own SUB sends
/// the greeting in two parts and, having read the publisher's CURVE greeting in between,
/// often hangs up before sending the second: the publisher then sees only a connection that
/// closed during its handshake, which it does not count (a TCP health check looks the same).
fn null_greeting(endpoint: &str) -> std::net::TcpStream {
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    let mut peer = std::net::TcpStream::connect(endpoint.trim_start_matches("tcp://")).unwrap();
    peer.write_all(&greeting).unwrap();
    peer
}

/// Everything `peer` receives until the publisher closes the connection.
fn until_closed(mut peer: std::net::TcpStream) -> Vec<u8> {
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut received = Vec::new();
    peer.read_to_end(&mut received)
        .expect("the publisher closes the connection");
    received
}

#[test]
fn refused_subscribers_get_nothing_and_each_refusal_is_counted_once() {
    let log = capture_log();
    let dir = TempDir::new("security-refused");
    let (server, admitted) = keys(&dir.0);
    let endpoint = tcp_endpoint();
    let publisher = Publisher::create(&curve_config(&endpoint, &dir.0)).expect("binds");
    let refused = || publisher.stats().refused_handshakes;

    // One after the other, so that the first refusal, the one the log's rate limit lets
    // through, is the key not on the allow-list.
    let stranger = KeyPair::generate().unwrap();
    let not_listed = raw_subscriber(&endpoint, Some((&server.public, &stranger)));
    assert!(eventually(|| refused() >= 1), "refused: {}", refused());
    // Admitted key, but the public key of some other server.
    let impostor = KeyPair::generate().unwrap();
    let wrong_server = raw_subscriber(&endpoint, Some((&impostor.public, &admitted)));
    assert!(eventually(|| refused() >= 2), "refused: {}", refused());
    let no_key = null_greeting(&endpoint);
    assert!(eventually(|| refused() >= 3), "refused: {}", refused());

    let good = raw_subscriber(&endpoint, Some((&server.public, &admitted)));
    let (sent, received) = delivered(&publisher, &good);
    assert_eq!(received, sent, "the admitted subscriber gets everything");
    for (name, socket) in [
        ("not listed", &not_listed),
        ("wrong server key", &wrong_server),
    ] {
        let got = raw_messages(socket, Duration::from_millis(200));
        assert!(got.is_empty(), "{name} received {} messages", got.len());
    }
    let greeting_at_most = until_closed(no_key).len();
    assert!(
        greeting_at_most <= 64,
        "the peer without keys got {greeting_at_most} bytes: more than a greeting"
    );
    // One handshake each, and none of them retries: exactly three.
    assert_eq!(refused(), 3);

    let status = publisher.status_json();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["refused_handshakes"], 3);
    assert!(publisher
        .metrics_text()
        .contains("\nmooncake_kv_events_refused_handshakes_total 3\n"));

    // The log sink is the process's, shared with the other tests of this file, which refuse
    // peers of their own: the line of this refusal is the one naming the stranger's key.
    let expected = format!(
        "refused a subscriber from 127.0.0.1: its public key {} is not in kv_events_curve_allow",
        stranger.public.to_z85()
    );
    let lines = log.lock().unwrap().clone();
    assert!(lines.iter().any(|l| l.contains(&expected)), "{lines:#?}");
    // No secret anywhere an operator looks.
    let secret = server.secret.to_z85();
    let everything = format!(
        "{}{}{}",
        log.lock().unwrap().join("\n"),
        publisher.status_json(),
        publisher.metrics_text()
    );
    assert!(!everything.contains(&secret));
    assert!(!everything.contains(&admitted.secret.to_z85()));
}

#[test]
fn the_address_allow_list_admits_127_0_0_1_and_refuses_127_0_0_2() {
    let endpoint = tcp_endpoint();
    let publisher = Publisher::create(&Config {
        null_allow_addresses: "127.0.0.1, ::1".into(),
        ..common::config(&endpoint)
    })
    .expect("binds");
    let port = endpoint.rsplit(':').next().unwrap();
    // ZeroMQ's source-address form: connect from 127.0.0.2.
    let outsider = raw_subscriber(&format!("tcp://127.0.0.2:0;127.0.0.1:{port}"), None);
    let insider = raw_subscriber(&endpoint, None);
    assert!(eventually(|| publisher.stats().refused_handshakes >= 1));
    let (sent, received) = delivered(&publisher, &insider);
    assert_eq!(received, sent);
    assert!(raw_messages(&outsider, Duration::from_millis(200)).is_empty());
    assert_eq!(publisher.stats().refused_handshakes, 1);
}

#[test]
fn an_ipc_socket_file_has_the_configured_mode() {
    for (mode, expected) in [("0600", 0o600), ("", 0o660)] {
        let dir = TempDir::new(&format!("security-ipc-{expected:o}"));
        let path = dir.path("kv.sock");
        let endpoint = format!("ipc://{}", path.display());
        let mut config = common::config(&endpoint);
        if !mode.is_empty() {
            config.ipc_mode = mode.into();
        }
        let publisher = Publisher::create(&config).expect("binds");
        let meta = std::fs::metadata(&path).expect("the socket file");
        assert_eq!(meta.permissions().mode() & 0o7777, expected, "{mode:?}");
        // Nothing is left of the private directory it was bound in.
        let names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kv.sock"]);
        // And the renamed file is the live socket.
        let mut subscriber = common::subscribe(&endpoint);
        publisher.on_put_commit("", "k", "", MediumSet::from([Medium::Cpu]));
        let batches = common::read_events(&publisher, &mut subscriber, 1);
        assert_eq!(batches.len(), 1);
    }
}

#[test]
fn every_config_error_names_its_flag_and_never_a_key() {
    let dir = TempDir::new("security-errors");
    let (server, _) = keys(&dir.0);
    let secret = server.secret.to_z85();
    let write = |name: &str, text: &str| {
        let path = dir.path(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    // The secret of the server with one character that is not Z85.
    let bad_z85 = write(
        "bad-z85.key",
        &format!(
            "curve\n    public-key = \"{}\"\n    secret-key = \"{}~\"\n",
            server.public.to_z85(),
            &secret[..39]
        ),
    );
    let short = write(
        "short.key",
        &format!(
            "    public-key = \"{}\"\n    secret-key = \"{}\"\n",
            server.public.to_z85(),
            &secret[..30]
        ),
    );
    let public_only = dir.path("server.pub").display().to_string();
    let empty_dir = dir.path("empty");
    std::fs::create_dir(&empty_dir).unwrap();
    let bad_pub = write("bad.pub", "public-key = \"tooshort\"\n");
    let key_file = dir.path("server.key").display().to_string();
    let ep = common::endpoint();
    let tcp = "tcp://127.0.0.1:5999".to_owned();
    let with = |change: &dyn Fn(&mut Config), endpoint: &str| {
        let mut config = common::config(endpoint);
        change(&mut config);
        config
    };
    // A good server key with `allow` as the allow-list.
    let allowing = |allow: &str| {
        let mut config = common::config(&ep);
        config.curve_secret_key_file = key_file.clone();
        config.curve_allow = allow.to_owned();
        config
    };
    let dir_path = dir.0.display().to_string();
    let empty = empty_dir.display().to_string();
    let mut cases: Vec<(Config, &str, &str)> = Vec::new();
    for (path, reason) in [
        ("/nonexistent/kv.key", "cannot read"),
        (dir_path.as_str(), "cannot read"),
        (bad_z85.as_str(), "not Z85"),
        (short.as_str(), "40 characters"),
        (public_only.as_str(), "no secret-key line"),
    ] {
        let config = with(&|c| c.curve_secret_key_file = path.to_owned(), &ep);
        cases.push((config, "kv_events_curve_secret_key_file", reason));
    }
    for (allow, reason) in [
        (empty.as_str(), "no .pub file"),
        (bad_pub.as_str(), "40 characters"),
        ("/nonexistent/allowed", "cannot read"),
    ] {
        cases.push((allowing(allow), "kv_events_curve_allow", reason));
    }
    let without_server_key = with(&|c| c.curve_allow = public_only.clone(), &ep);
    cases.extend([
        (
            without_server_key,
            "kv_events_curve_allow",
            "needs kv_events_curve_secret_key_file",
        ),
        (
            with(
                &|c| c.null_allow_addresses = "10.0.0.1,master-0".into(),
                &tcp,
            ),
            "kv_events_null_allow_addresses",
            "\"master-0\" is not an IP address",
        ),
        (
            with(&|c| c.null_allow_addresses = "127.0.0.1".into(), &ep),
            "kv_events_null_allow_addresses",
            "tcp:// endpoints only",
        ),
        (
            with(&|c| c.ipc_mode = "rw-rw----".into(), &ep),
            "kv_events_ipc_mode",
            "octal",
        ),
    ]);
    for (config, flag, reason) in cases {
        let err = Publisher::create(&config).unwrap_err().to_string();
        assert!(err.starts_with(flag), "{err}");
        assert!(err.contains(reason), "{err}");
        assert!(!err.contains(&secret[..20]), "{err}");
        assert_eq!(config.validate().unwrap_err().to_string(), err);
    }
}

/// The error a watch::Subscriber gets from `endpoint`, within a generous bound.
fn refusal(endpoint: &str, curve: Option<&CurveClient>) -> String {
    let mut subscriber = Subscriber::connect_with(endpoint, 1000, curve).expect("connects");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        match subscriber.recv(Duration::from_millis(100)) {
            Err(e @ WatchError::Refused(_)) => return e.to_string(),
            Err(e) => panic!("{e}"),
            Ok(batch) => assert!(batch.is_none(), "a refused subscriber got {batch:?}"),
        }
    }
    panic!("no refusal within 30 s");
}

#[test]
fn a_refused_subscriber_is_told_why_instead_of_waiting() {
    let dir = TempDir::new("security-told");
    let (server, _) = keys(&dir.0);
    let endpoint = tcp_endpoint();
    let _publisher = Publisher::create(&curve_config(&endpoint, &dir.0)).expect("binds");
    let stranger = CurveClient {
        server_key: server.public.clone(),
        keys: KeyPair::generate().unwrap(),
    };
    let wrong_server = CurveClient {
        server_key: KeyPair::generate().unwrap().public,
        keys: stranger.keys.clone(),
    };
    for (curve, why) in [
        (Some(&stranger), "status 400"),
        // A mechanism mismatch, or the publisher closing twice: either way, CURVE is named.
        (None, "CURVE"),
        (Some(&wrong_server), "the server key is not the publisher's"),
    ] {
        let err = refusal(&endpoint, curve);
        assert!(err.contains(why), "{err}");
    }

    let plain = tcp_endpoint();
    let _fenced = Publisher::create(&Config {
        null_allow_addresses: "127.0.0.1".into(),
        ..common::config(&plain)
    })
    .expect("binds");
    let port = plain.rsplit(':').next().unwrap();
    let err = refusal(&format!("tcp://127.0.0.2:0;127.0.0.1:{port}"), None);
    assert!(err.contains("status 400"), "{err}");
}

#[test]
fn publishers_of_one_process_bind_ipc_endpoints_at_the_same_time() {
    let dir = TempDir::new("security-ipc-parallel");
    let publishers: Vec<Publisher> = std::thread::scope(|s| {
        let binds: Vec<_> = (0..8)
            .map(|i| {
                let endpoint = format!("ipc://{}", dir.path(&format!("kv-{i}.sock")).display());
                s.spawn(move || Publisher::create(&common::config(&endpoint)).expect("binds"))
            })
            .collect();
        binds.into_iter().map(|b| b.join().unwrap()).collect()
    });
    assert_eq!(publishers.len(), 8);
    let mut names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 8, "{names:?}: no staging directory left");
}
