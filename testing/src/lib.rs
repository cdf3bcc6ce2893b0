//! What the tests and the benchmarks of both packages share (a dev-dependency only, never
//! published): a publisher and a subscriber on a private endpoint, for tests that read the real
//! stream; CURVE key files; raw sockets; a temporary directory; in [`model`], a master in
//! miniature for the follower's tests; in [`mod@bench`], the benchmarks' key shapes and a
//! publisher nobody reads. The tests bring it in as `use kv_events_testing as common;`.

pub mod bench;
pub mod model;

use mooncake_kv_events::subscriber::{Batch, Continuity, Reach, Subscriber};
use mooncake_kv_events::{Config, Publisher};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The repository's root, where README.md, docs/, scripts/ and examples/ are.
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testing/ is a folder of the repository")
}

/// A ZeroMQ endpoint no other test uses.
pub fn endpoint() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ipc:///tmp/kv-events-test-{}-{n}.sock", std::process::id())
}

/// An enabled config publishing on `endpoint` as backend `store-a`.
pub fn config(endpoint: &str) -> Config {
    Config {
        enable_kv_events: true,
        bind_endpoint: endpoint.to_owned(),
        backend_id: "store-a".into(),
        ..Config::default()
    }
}

/// A publisher created from `config`, its endpoint replaced by a fresh one, and that endpoint.
pub fn publish(mut config: Config) -> (Publisher, String) {
    config.bind_endpoint = endpoint();
    let publisher = Publisher::create(&config).expect("the publisher binds");
    (publisher, config.bind_endpoint)
}

/// A subscriber that has joined the publisher on `endpoint`, so the next message reaches it.
pub fn subscribe(endpoint: &str) -> Subscriber {
    let mut subscriber = Subscriber::connect(endpoint, 1_000_000).expect("the subscriber connects");
    // ZeroMQ's slow joiner: a subscription crosses to the PUB socket after the handshake, and
    // a message sent before it arrives is not delivered. So wait for the handshake, however
    // long a loaded machine takes, then give the subscription a moment. This is setup, not an
    // assertion; messages sent too early would be missed and the test fail.
    let reached = eventually(|| matches!(subscriber.reach(), Ok(Reach::Reached)));
    assert!(reached, "no handshake with {endpoint}");
    std::thread::sleep(Duration::from_millis(300));
    subscriber
}

/// A publisher from `config` on a fresh endpoint, and a subscriber that has joined it.
pub fn connected(config: Config) -> (Publisher, Subscriber) {
    let (publisher, endpoint) = publish(config);
    (publisher, subscribe(&endpoint))
}

/// The sum of the sequence gaps in `batches`, counting numbers missed before the first.
pub fn gaps(batches: &[Batch]) -> u64 {
    batches
        .iter()
        .map(|b| match b.continuity {
            Continuity::First { missed } | Continuity::Gap { missed } => missed,
            Continuity::Next => 0,
            Continuity::Restart => panic!("the sequence went back at {}", b.sequence),
        })
        .sum()
}

/// Flushes the publisher, then reads until `events` events arrived.
pub fn read_events(
    publisher: &Publisher,
    subscriber: &mut Subscriber,
    events: usize,
) -> Vec<Batch> {
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    let mut batches = Vec::new();
    let mut seen = 0;
    while seen < events {
        let batch = subscriber
            .recv(Duration::from_secs(10))
            .expect("a well-formed message")
            .unwrap_or_else(|| panic!("only {seen} of {events} events arrived"));
        seen += batch.events.len();
        batches.push(batch);
    }
    assert_eq!(seen, events, "more events than expected");
    batches
}

/// Asserts that nothing more arrives within a short while.
pub fn assert_silent(subscriber: &mut Subscriber) {
    let extra = subscriber
        .recv(Duration::from_millis(200))
        .expect("a well-formed message");
    assert!(extra.is_none(), "unexpected message: {extra:?}");
}

/// A directory of its own for one test's files, removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// `kv-events-NAME-PID` in the system's temporary directory, emptied if it was there.
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("kv-events-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }

    /// The path of the file `name` in the directory.
    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh key pair written as `kv-events keygen` writes it: `<dir>/<name>.key` and
/// `<dir>/<name>.pub`.
pub fn keygen(dir: &std::path::Path, name: &str) -> mooncake_kv_events::keys::KeyPair {
    let pair = mooncake_kv_events::keys::KeyPair::generate().expect("libzmq has CURVE");
    mooncake_kv_events::keys::write_key_files(&dir.join(name), &pair).expect("key files");
    pair
}

/// A server key pair (`<dir>/server.key`, `.pub`) and a subscriber's in the allow-list
/// directory `<dir>/allowed/` (`<subscriber>.key`, `.pub`).
pub fn curve_keys(
    dir: &std::path::Path,
    subscriber: &str,
) -> (
    mooncake_kv_events::keys::KeyPair,
    mooncake_kv_events::keys::KeyPair,
) {
    let server = keygen(dir, "server");
    std::fs::create_dir_all(dir.join("allowed")).unwrap();
    (server, keygen(&dir.join("allowed"), subscriber))
}

/// An enabled config on `endpoint` that publishes with the keys of [`curve_keys`] in `dir`.
pub fn curve_config(endpoint: &str, dir: &std::path::Path) -> Config {
    Config {
        curve_secret_key_file: dir.join("server.key").display().to_string(),
        curve_allow: dir.join("allowed").display().to_string(),
        ..config(endpoint)
    }
}

/// A raw SUB socket on `endpoint`, subscribed to everything, as a CURVE client of
/// `server_key` with `keys` when given. It makes one connection attempt only, so that each
/// client is exactly one handshake for the publisher's count.
pub fn raw_subscriber(
    endpoint: &str,
    curve: Option<(
        &mooncake_kv_events::keys::Key,
        &mooncake_kv_events::keys::KeyPair,
    )>,
) -> zmq::Socket {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::SUB).expect("a SUB socket");
    socket.set_rcvhwm(1_000_000).unwrap();
    socket.set_linger(0).unwrap();
    socket.set_reconnect_ivl(-1).unwrap();
    socket.set_subscribe(b"").unwrap();
    if let Some((server, keys)) = curve {
        socket.set_curve_serverkey(&server.0).unwrap();
        socket.set_curve_publickey(&keys.public.0).unwrap();
        socket.set_curve_secretkey(&keys.secret.0).unwrap();
    }
    socket.connect(endpoint).expect("connect");
    socket
}

/// A DEALER on a replay endpoint, as a requester uses one: replies within 20 s or an error.
pub fn dealer(endpoint: &str) -> zmq::Socket {
    let socket = zmq::Context::new().socket(zmq::DEALER).unwrap();
    socket.set_linger(0).unwrap();
    socket.set_rcvtimeo(20_000).unwrap();
    socket.connect(endpoint).unwrap();
    socket
}

/// Every message `socket` receives until none comes for `quiet`, frame by frame.
pub fn raw_messages(socket: &zmq::Socket, quiet: Duration) -> Vec<Vec<Vec<u8>>> {
    let mut messages = Vec::new();
    while socket.poll(zmq::POLLIN, quiet.as_millis() as i64).unwrap() > 0 {
        messages.push(socket.recv_multipart(0).unwrap());
    }
    messages
}

/// Waits, up to a generous bound, until `condition` holds; false if it never did.
pub fn eventually(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    condition()
}

/// A free TCP endpoint on loopback, for tests that need a peer address.
pub fn tcp_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    format!("tcp://127.0.0.1:{}", listener.local_addr().unwrap().port())
}
