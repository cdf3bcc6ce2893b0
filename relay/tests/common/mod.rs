//! What the relay's tests share: a real `nats-server -js` on a port of its own, the real
//! `kv-events demo` publisher, the relay, and reading back what the relay wrote.
#![allow(dead_code)]

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;
use mooncake_kv_events::subscriber::Index;
use mooncake_kv_events::wire::{Checked, Event, Message};
use mooncake_kv_events::Medium;
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use kv_events_testing::TempDir;

/// A port nobody listens on now, and not handed out before in this process: the system
/// may give a port just closed again, and a cluster's six ports are taken before any
/// server binds one (two nodes once got the same route port).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("its address").port();
        if GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// Waits until `condition` holds, for up to `limit`.
pub fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    condition()
}

/// A child process stopped (SIGKILL) and reaped when dropped.
pub struct Process(pub Child);

impl Process {
    /// SIGTERM, then waits for the exit; its status code.
    pub fn terminate(mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let code = self.0.wait().ok().and_then(|s| s.code());
        std::mem::forget(self);
        code
    }

    /// SIGKILL: a crash.
    pub fn kill(self) {
        drop(self);
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, signal) };
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nats-server -js` for clients on loopback `port`, its store in `store`, stdout dropped.
fn nats_server(port: u16, store: &Path) -> Command {
    let mut command = Command::new("nats-server");
    command
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store)
        .stdout(Stdio::null());
    command
}

/// A `nats-server -js` on a free port, its store in `dir`.
pub struct Nats {
    pub port: u16,
    dir: PathBuf,
    process: Option<Process>,
}

impl Nats {
    pub fn start(dir: &Path) -> Nats {
        let mut nats = Nats {
            port: free_port(),
            dir: dir.join("jetstream"),
            process: None,
        };
        nats.up();
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn up(&mut self) {
        let child = nats_server(self.port, &self.dir)
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server runs: run scripts/install-deps.sh");
        self.process = Some(Process(child));
        let port = self.port;
        assert!(
            wait_for(Duration::from_secs(10), || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            }),
            "nats-server did not listen"
        );
    }

    /// Kills the server (SIGKILL: a crash), then starts it again on the same port and store
    /// after `down`.
    pub fn crash_restart(&mut self, down: Duration) {
        if let Some(process) = self.process.take() {
            process.kill();
        }
        std::thread::sleep(down);
        self.up();
    }

    /// Stops the server (SIGTERM: it flushes its store), then starts it again on the same
    /// port and store after `down`.
    pub fn restart(&mut self, down: Duration) {
        if let Some(process) = self.process.take() {
            process.terminate();
        }
        std::thread::sleep(down);
        self.up();
    }
}

/// Three `nats-server -js` clustered on loopback (JetStream replicas up to 3), their stores
/// in `dir`.
pub struct Cluster {
    pub ports: [u16; 3],
    routes: [u16; 3],
    dir: PathBuf,
    nodes: Vec<Option<Process>>,
}

impl Cluster {
    pub fn start(dir: &Path) -> Cluster {
        let mut cluster = Cluster {
            ports: [free_port(), free_port(), free_port()],
            routes: [free_port(), free_port(), free_port()],
            dir: dir.to_owned(),
            nodes: vec![None, None, None],
        };
        for node in 0..3 {
            cluster.up(node);
        }
        cluster.wait_ready();
        cluster
    }

    /// Starts node `node` on its port, routes and store.
    pub fn up(&mut self, node: usize) {
        let routes: Vec<String> = self
            .routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{node}.log")))
            .expect("a log");
        let child = nats_server(self.ports[node], &self.dir.join(format!("node-{node}")))
            .args([
                "--server_name",
                &format!("node-{node}"),
                "--cluster_name",
                "kv",
            ])
            .args(["--cluster", &routes[node], "--routes", &routes.join(",")])
            .stderr(log)
            .spawn()
            .expect("nats-server runs: run scripts/install-deps.sh");
        self.nodes[node] = Some(Process(child));
    }

    /// Waits until JetStream is up: a stream of 3 replicas can be made (the nodes found
    /// each other and elected a meta leader).
    pub fn wait_ready(&self) {
        let said = || {
            (0..3)
                .map(|i| std::fs::read_to_string(self.dir.join(format!("node-{i}.log"))))
                .map(Result::unwrap_or_default)
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(
            wait_for(Duration::from_secs(60), || self.ready()),
            "the cluster did not form:\n{}",
            said()
        );
    }

    fn ready(&self) -> bool {
        let url = self.url(0);
        block_on(async {
            let Ok(client) = async_nats::connect(&url).await else {
                return false;
            };
            let context = async_nats::jetstream::new(client);
            let made = context
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: "READY".into(),
                    subjects: vec!["ready".into()],
                    num_replicas: 3,
                    ..Default::default()
                })
                .await;
            made.is_ok() && context.delete_stream("READY").await.is_ok()
        })
    }

    pub fn url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.ports[node])
    }

    /// The node that leads `stream` (its `$JS.API.STREAM.INFO`), asked of node `via`;
    /// waits up to a minute for the stream and a leader.
    pub fn leader(&self, stream: &str, via: usize) -> usize {
        let url = self.url(via);
        let mut leader = None;
        wait_for(Duration::from_secs(60), || {
            leader = block_on(async {
                let client = async_nats::connect(&url).await.ok()?;
                let context = async_nats::jetstream::new(client);
                let mut stream = context.get_stream(stream).await.ok()?;
                let name = stream.info().await.ok()?.cluster.clone()?.leader?;
                name.strip_prefix("node-")?.parse().ok()
            });
            leader.is_some()
        });
        leader.unwrap_or_else(|| panic!("{stream} has no leader"))
    }

    /// SIGKILL of one node: a machine lost.
    pub fn kill(&mut self, node: usize) {
        self.nodes[node].take();
    }

    /// Sends `signal` to node `node` (SIGSTOP: a node that hangs; SIGCONT).
    pub fn signal(&self, node: usize, signal: libc::c_int) {
        if let Some(process) = &self.nodes[node] {
            process.signal(signal);
        }
    }
}

/// Runs `future` on a runtime of its own.
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(future)
}

/// A binary of the workspace: beside the relay's, built by `cargo test --workspace`; built
/// here when the relay's tests run alone.
pub fn binary(name: &str) -> PathBuf {
    let relay = PathBuf::from(env!("CARGO_BIN_EXE_kv-events-relay"));
    let path = relay.with_file_name(name);
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--locked", "-p", name, "--bin", name])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cannot build {name}");
    }
    path
}

/// Endpoints of one master: its PUB and replay sockets.
#[derive(Clone)]
pub struct Master {
    pub endpoint: String,
    pub replay: String,
}

impl Master {
    pub fn new() -> Master {
        Master {
            endpoint: format!("tcp://127.0.0.1:{}", free_port()),
            replay: format!("tcp://127.0.0.1:{}", free_port()),
        }
    }

    /// `kv-events demo` on these endpoints: `objects` objects at `rate` calls a second,
    /// up `linger` seconds after, writing its truth to `truth`.
    pub fn demo(&self, objects: u32, rate: u32, linger: f64, truth: &Path) -> Process {
        let child = Command::new(binary("kv-events"))
            .args([
                "demo",
                "--endpoint",
                &self.endpoint,
                "--replay-endpoint",
                &self.replay,
            ])
            .args([
                "--objects",
                &objects.to_string(),
                "--rate",
                &rate.to_string(),
            ])
            .args(["--linger", &linger.to_string(), "--heartbeat-ms", "200"])
            .args(["--wait", "0.5", "--show", "0", "--dump-index"])
            .arg(truth)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kv-events demo runs");
        Process(child)
    }

    /// The relay of this master into `nats`, its stderr in `log`, with the bucket
    /// `kv-events` and a snapshot every second.
    pub fn relay(&self, nats: &Nats, log: &Path) -> Process {
        self.relay_with(nats, log, &["--bucket", "kv-events"])
    }

    /// The relay of this master into `nats` with `extra` options and a snapshot every
    /// second, its stderr in `log`.
    pub fn relay_with(&self, nats: &Nats, log: &Path, extra: &[&str]) -> Process {
        self.relay_at(&nats.url(), log, extra)
    }

    /// The relay of this master into the NATS server at `url` with `extra` options and a
    /// snapshot every second, its stderr in `log`.
    pub fn relay_at(&self, url: &str, log: &Path, extra: &[&str]) -> Process {
        let stderr = std::fs::File::create(log).expect("a log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kv-events-relay"))
            .args([&self.endpoint, "--replay-endpoint", &self.replay])
            .args(["--nats", url, "--every", "1", "--snapshot-every", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("kv-events-relay runs");
        Process(child)
    }
}

/// One object as a set member: tenant, key, media names sorted.
pub type Object = (Vec<u8>, Vec<u8>, Vec<String>);

/// `kv-events demo --dump-index`'s objects (`bin` keys written `"hex:..."`).
pub fn truth(path: &Path) -> BTreeSet<Object> {
    let json: Value =
        serde_json::from_slice(&std::fs::read(path).expect("the demo's truth")).expect("JSON");
    let name = |v: &Value| {
        let text = v.as_str().expect("a string");
        match text.strip_prefix("hex:") {
            Some(hex) => decode_hex(hex),
            None => text.as_bytes().to_vec(),
        }
    };
    json["objects"]
        .as_array()
        .expect("objects")
        .iter()
        .map(|o| {
            let mut media: Vec<String> = o[3]
                .as_array()
                .expect("media")
                .iter()
                .map(|m| m.as_str().expect("a medium").to_owned())
                .collect();
            media.sort();
            (name(&o[1]), name(&o[2]), media)
        })
        .collect()
}

fn decode_hex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A line of `mirror --dump` (or a bucket value) as an [`Object`].
pub fn object_of(line: &Value) -> Object {
    let name = |v: &Value| match v.as_str() {
        Some(text) => text.as_bytes().to_vec(),
        None => decode_hex(v["hex"].as_str().expect("hex")),
    };
    let mut media: Vec<String> = line["media"]
        .as_array()
        .expect("media")
        .iter()
        .map(|m| m.as_str().expect("a medium").to_owned())
        .collect();
    media.sort();
    (name(&line["tenant"]), name(&line["key"]), media)
}

/// An index's objects.
pub fn objects_of(index: &Index) -> BTreeSet<Object> {
    index
        .iter()
        .map(|(t, k, media)| {
            let mut names: Vec<String> =
                media.iter().map(Medium::as_str).map(String::from).collect();
            names.sort();
            (t.to_vec(), k.to_vec(), names)
        })
        .collect()
}

/// What a reader of NATS sees of the relay's work.
pub struct Written {
    /// The bucket's objects, when there is a bucket.
    pub bucket: Option<BTreeSet<Object>>,
    /// Every event of the stream's subject applied in order from the first message.
    pub stream: BTreeSet<Object>,
    /// The snapshot object's state, then the subject's messages after its stream
    /// sequence, when there is a snapshot: what a new reader bootstraps from.
    pub from_snapshot: Option<BTreeSet<Object>>,
    /// The (incarnation, sequence) of the master's messages written more than once, message
    /// ids written more than once, and messages not written on top of the one before.
    pub duplicates: Vec<String>,
    /// Messages on the subject.
    pub messages: usize,
}

/// The batches of a log message or a snapshot, one after another, each checked by the
/// library's decoder (at most 64 events); the strict typed decoder must take every event
/// with the master's keys.
pub fn batches(payload: &[u8]) -> Result<Vec<rmpv::Value>, String> {
    let mut rest = payload;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let before = rest;
        let value = rmpv::decode::read_value(&mut rest).map_err(|e| e.to_string())?;
        let raw = &before[..before.len() - rest.len()];
        let checked = Checked::new(vec![&[][..], &[0u8; 8][..], raw]).map_err(|e| e.to_string())?;
        if checked.len() > 64 {
            return Err(format!("a batch of {} events", checked.len()));
        }
        out.push(value);
    }
    Ok(out)
}

/// Reads the stream `KV_EVENTS` (subject `kv-events.demo-store`), the snapshot
/// `demo-store` in `kv-events-snapshots`, and the bucket `kv-events` if there is one.
pub fn read_back(url: &str) -> Result<Written, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(read_back_async(url))
}

async fn all(
    stream: &async_nats::jetstream::stream::Stream,
    subject: &str,
    policy: DeliverPolicy,
) -> Result<Vec<async_nats::jetstream::Message>, String> {
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.into(),
            deliver_policy: policy,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut pending = consumer.cached_info().num_pending;
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    while pending > 0 {
        let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .map_err(|_| "timed out".to_string())?
            .ok_or("ended")?
            .map_err(|e| e.to_string())?;
        pending = message.info().map_err(|e| e.to_string())?.pending;
        out.push(message);
    }
    Ok(out)
}

async fn read_back_async(url: &str) -> Result<Written, String> {
    let client = async_nats::connect(url).await.map_err(|e| e.to_string())?;
    let context = async_nats::jetstream::new(client);
    let stream = context
        .get_stream("KV_EVENTS")
        .await
        .map_err(|e| e.to_string())?;
    let log = all(&stream, "kv-events.demo-store", DeliverPolicy::All).await?;
    let mut index = Index::new();
    let mut ids = HashSet::new();
    let mut covered = HashSet::new();
    let mut duplicates = Vec::new();
    let mut previous = 0;
    for message in &log {
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        // The standard name: a `&str` one does not find a header parsed as standard.
        let id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        if !ids.insert(id.clone()) {
            duplicates.push(format!("message id {id}"));
        }
        let sequence = message.info().map_err(|e| e.to_string())?.stream_sequence;
        if header("Kv-Events-Previous") != previous.to_string() {
            duplicates.push(format!("message {sequence} not on top of {previous}"));
        }
        previous = sequence;
        if header("Kv-Events-Kind") == "events" {
            let incarnation = header("Kv-Events-Incarnation");
            let range = id.rsplit('.').next().unwrap_or_default();
            let (first, last) = range
                .split_once('-')
                .ok_or(format!("an events id without a range: {id:?}"))?;
            let (first, last): (u64, u64) = (first.parse().unwrap(), last.parse().unwrap());
            for s in first..=last {
                if !covered.insert((incarnation.clone(), s)) {
                    duplicates.push(format!("master message {incarnation}/{s}"));
                }
            }
        }
        for batch in batches(&message.payload)? {
            for event in batch[1].as_array().ok_or("a batch")? {
                index.apply(event).map_err(|e| e.to_string())?;
            }
            // The master's events and a difference's: every key the contract lists.
            let mut raw = Vec::new();
            rmpv::encode::write_value(&mut raw, &batch).map_err(|e| e.to_string())?;
            Message::<Event>::decode(&[&[][..], &[0u8; 8][..], &raw[..]])
                .map_err(|e| format!("message {sequence}: {e}"))?;
        }
    }
    let from_snapshot = match snapshot(&context).await? {
        Some((stream_sequence, content)) => {
            let mut index = Index::new();
            for batch in batches(&content)? {
                for event in batch[1].as_array().ok_or("a batch")? {
                    index.apply(event).map_err(|e| e.to_string())?;
                }
            }
            for message in &log {
                let sequence = message.info().map_err(|e| e.to_string())?.stream_sequence;
                if sequence > stream_sequence {
                    for batch in batches(&message.payload)? {
                        for event in batch[1].as_array().ok_or("a batch")? {
                            index.apply(event).map_err(|e| e.to_string())?;
                        }
                    }
                }
            }
            Some(objects_of(&index))
        }
        None => None,
    };
    let bucket = match context.get_stream("KV_kv-events").await {
        Ok(kv) => {
            let entries = all(&kv, "$KV.kv-events.>", DeliverPolicy::LastPerSubject).await?;
            Some(
                entries
                    .iter()
                    .filter(|m| {
                        m.headers
                            .as_ref()
                            .and_then(|h| h.get("KV-Operation"))
                            .is_none()
                    })
                    .map(|m| object_of(&serde_json::from_slice(&m.payload).expect("JSON")))
                    .collect(),
            )
        }
        Err(_) => None,
    };
    Ok(Written {
        bucket,
        stream: objects_of(&index),
        from_snapshot,
        duplicates,
        messages: log.len(),
    })
}

/// The snapshot `demo-store`: the stream sequence its headers say it reflects, and its
/// content. Read as the Object Store's clients read it: its info on
/// `$O.<bucket>.M.<name in base64>`, its chunks on `$O.<bucket>.C.<nuid>`.
async fn snapshot(
    context: &async_nats::jetstream::Context,
) -> Result<Option<(u64, Vec<u8>)>, String> {
    use base64::Engine;
    let Ok(objects) = context.get_stream("OBJ_kv-events-snapshots").await else {
        return Ok(None);
    };
    let name = base64::engine::general_purpose::URL_SAFE.encode("demo-store");
    let info = match objects
        .get_last_raw_message_by_subject(&format!("$O.kv-events-snapshots.M.{name}"))
        .await
    {
        Ok(message) => message.payload,
        Err(_) => return Ok(None),
    };
    let info: Value = serde_json::from_slice(&info).map_err(|e| e.to_string())?;
    let header = |name: &str| info["headers"][name][0].as_str().map(str::to_owned);
    let stream_sequence: u64 = header("Kv-Events-Stream-Sequence")
        .ok_or("no Kv-Events-Stream-Sequence header")?
        .parse()
        .map_err(|_| "a stream sequence that is no number")?;
    header("Kv-Events-Incarnation").ok_or("no Kv-Events-Incarnation header")?;
    assert_eq!(
        info["metadata"]["Kv-Events-Stream-Sequence"].as_str(),
        Some(stream_sequence.to_string().as_str()),
        "the metadata says the same"
    );
    let nuid = info["nuid"].as_str().ok_or("no nuid")?;
    let chunks = all(
        &objects,
        &format!("$O.kv-events-snapshots.C.{nuid}"),
        DeliverPolicy::All,
    )
    .await?;
    let content: Vec<u8> = chunks
        .iter()
        .flat_map(|m| m.payload.iter().copied())
        .collect();
    if Some(content.len() as u64) != info["size"].as_u64() {
        return Err("a snapshot whose chunks do not add up to its size".into());
    }
    Ok(Some((stream_sequence, content)))
}

/// Waits (up to a minute) until the bucket and the stream's fold both equal `truth`; the
/// last reading, for the assertions.
pub fn converge(nats: &Nats, truth: &BTreeSet<Object>) -> Written {
    converge_at(&nats.url(), truth)
}

/// [`converge`] on the NATS server at `url`.
pub fn converge_at(url: &str, truth: &BTreeSet<Object>) -> Written {
    let mut last = None;
    wait_for(Duration::from_secs(60), || {
        let written = read_back(url);
        let done = written.as_ref().is_ok_and(|w| {
            w.bucket.as_ref().is_none_or(|b| b == truth)
                && &w.stream == truth
                && w.from_snapshot.as_ref().is_some_and(|s| s == truth)
        });
        last = Some(written);
        done
    });
    last.expect("read at least once")
        .unwrap_or_else(|e| panic!("cannot read NATS back: {e}"))
}

/// The relay's stderr, for a failed assertion.
pub fn said(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Asserts that NATS holds exactly `truth`, written once.
pub fn assert_exact(nats: &Nats, truth: &BTreeSet<Object>, logs: &[&Path]) {
    assert_exact_at(&nats.url(), truth, logs);
}

/// [`assert_exact`] on the NATS server at `url`.
pub fn assert_exact_at(url: &str, truth: &BTreeSet<Object>, logs: &[&Path]) {
    let written = converge_at(url, truth);
    let context: String = logs.iter().map(|l| said(l)).collect();
    if let Some(bucket) = &written.bucket {
        assert_eq!(bucket.len(), truth.len(), "bucket size\n{context}");
        assert!(bucket == truth, "the bucket is not the truth\n{context}");
    }
    assert!(
        written.from_snapshot.as_ref() == Some(truth),
        "the snapshot and the log after it are not the truth\n{context}"
    );
    assert!(
        &written.stream == truth,
        "the stream's fold is not the truth\n{context}"
    );
    assert!(
        written.duplicates.is_empty(),
        "{:?}\n{context}",
        written.duplicates
    );
}

/// `examples/relay/reader.py` (nats-py, Debian's `/usr/bin/python3`) following the relay's
/// log from NATS at `url` until stopped, its objects dumped to `dump` when it is.
pub struct Reader {
    process: Process,
    stderr: std::io::BufReader<std::process::ChildStderr>,
    said: String,
    dump: PathBuf,
}

impl Reader {
    /// Starts the reader on `url` and waits until it says it bootstrapped (from the snapshot,
    /// or the log from its start); panics, saying why, when Python lacks nats-py.
    pub fn start(url: &str, dump: PathBuf) -> Reader {
        const PYTHON: &str = "/usr/bin/python3";
        let check = Command::new(PYTHON).args(["-c", "import nats"]).output();
        assert!(
            check.is_ok_and(|o| o.status.success()),
            "{PYTHON} lacks nats-py: run scripts/install-deps.sh"
        );
        let mut child = Command::new(PYTHON)
            .arg("-B")
            .arg(kv_events_testing::repo_root().join("examples/relay/reader.py"))
            // A bound, should the test fail before it stops the reader.
            .args([
                "--nats",
                url,
                "--backend",
                "demo-store",
                "--duration",
                "300",
            ])
            .arg("--dump")
            .arg(&dump)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the reader runs");
        let stderr = std::io::BufReader::new(child.stderr.take().expect("piped"));
        let mut reader = Reader {
            process: Process(child),
            stderr,
            said: String::new(),
            dump,
        };
        while !reader.said.contains("bootstrapped") {
            use std::io::BufRead as _;
            let read = reader
                .stderr
                .read_line(&mut reader.said)
                .expect("its stderr");
            assert_ne!(read, 0, "the reader ended: {}", reader.said);
        }
        reader
    }

    /// What it said so far on stderr.
    pub fn said(&self) -> &str {
        &self.said
    }

    /// Stops it (SIGTERM) and returns the objects it held, after checking it exited well.
    pub fn stop(self) -> BTreeSet<Object> {
        self.stop_saying().0
    }

    /// As [`Reader::stop`], with everything it said on stderr.
    pub fn stop_saying(mut self) -> (BTreeSet<Object>, String) {
        use std::io::Read as _;
        self.process.signal(libc::SIGTERM);
        self.stderr
            .read_to_string(&mut self.said)
            .expect("its stderr");
        let status = self.process.0.wait().expect("the reader exits");
        assert!(status.success(), "{}", self.said);
        let objects = std::fs::read_to_string(&self.dump)
            .expect("its dump")
            .lines()
            .map(|line| object_of(&serde_json::from_str(line).expect("JSON")))
            .collect();
        (objects, std::mem::take(&mut self.said))
    }
}
