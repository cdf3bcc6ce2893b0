//! Who may read the stream (docs/spec.md section 10): CURVE on the PUB socket, a ZAP handler (ZeroMQ
//! RFC 27) that admits the allow-listed public keys and addresses, the count and the log of
//! refused handshakes, and the mode of an `ipc://` socket file.
//!
//! All of it runs on libzmq's I/O thread and on one thread of its own, `kv-events-zap`: the
//! master's calls and the publishing thread never see a handshake, and the producers do no
//! cryptography (libzmq encrypts on its I/O thread).

use crate::config::{Config, CreateError};
use crate::connections::{canonical, Connections, Ended, Limits, Listeners};
use crate::keys::{self, Key, KeyPair};
use crate::log::{Level, RateLimited};
use crate::stats::PeerCounters;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The ZAP domain the PUB socket asks the handler about; libzmq consults ZAP for the NULL
/// mechanism only when the socket has a domain.
const ZAP_DOMAIN: &str = "kv-events";
/// Where a ZAP handler binds, by RFC 27, in the socket's own context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
/// How long the thread waits between looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);
/// At most one line about refused peers per this long, with the count of the others.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// The largest message a subscriber may send, the handshake's commands included (a CURVE
/// INITIATE is about 300 bytes). A subscription to the stream's one topic is 1 byte; a larger
/// message ends its connection (libzmq's ZMQ_MAXMSGSIZE) before any of it is kept.
pub(crate) const MAX_SUBSCRIPTION_BYTES: i64 = 512;
/// The largest frame a peer of the replay socket may send: requests are a few bytes and a
/// tenant id.
pub(crate) const MAX_REQUEST_BYTES: i64 = 1024;
/// Messages one peer may have waiting for the publisher to read them.
const INBOUND_HWM: i32 = 4;
/// The kernel's receive buffer of each connection, in bytes: what a peer can have in flight
/// towards the publisher. Subscribers send one subscription; a peer that floods
/// subscriptions is cut off at the first wrong one, and this bounds what it sent before.
const INBOUND_BUFFER: i32 = 1024;

// The monitor events and protocol error codes of libzmq's zmq.h (4.3), which the `zmq` crate
// does not re-export as numbers; `watch` reads the same events on the subscriber's side.
const EVENT_LISTENING: u32 = 0x0008;
const EVENT_ACCEPTED: u32 = 0x0020;
const EVENT_ACCEPT_FAILED: u32 = 0x0040;
const EVENT_DISCONNECTED: u32 = 0x0200;
const EVENT_MONITOR_STOPPED: u32 = 0x0400;
pub(crate) const EVENT_HANDSHAKE_FAILED_NO_DETAIL: u32 = 0x0800;
pub(crate) const EVENT_HANDSHAKE_SUCCEEDED: u32 = 0x1000;
pub(crate) const EVENT_HANDSHAKE_FAILED_PROTOCOL: u32 = 0x2000;
pub(crate) const EVENT_HANDSHAKE_FAILED_AUTH: u32 = 0x4000;
pub(crate) const PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: u32 = 0x1100_0001;
pub(crate) const PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: u32 = 0x1100_0002;

/// A monitor event as libzmq sends it: frame 1 holds a 16-bit event and a 32-bit value
/// (frame 2, the endpoint, is not needed here).
pub(crate) fn monitor_event(frames: &[Vec<u8>]) -> Option<(u32, u32)> {
    let head = frames.first().filter(|f| f.len() >= 6)?;
    let event = u32::from(u16::from_ne_bytes([head[0], head[1]]));
    Some((
        event,
        u32::from_ne_bytes([head[2], head[3], head[4], head[5]]),
    ))
}
const MONITORED: i32 = (EVENT_LISTENING
    | EVENT_ACCEPTED
    | EVENT_ACCEPT_FAILED
    | EVENT_DISCONNECTED
    | EVENT_MONITOR_STOPPED
    | EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | EVENT_HANDSHAKE_FAILED_PROTOCOL
    | EVENT_HANDSHAKE_FAILED_AUTH) as i32;

/// The security settings of one publisher, read and checked from its config.
pub(crate) struct Settings {
    curve: Option<KeyPair>,
    allowed_keys: Option<Vec<Key>>,
    allowed_addresses: Option<Vec<IpAddr>>,
    ipc_mode: u32,
    /// The bounds on connections, and the configured total when the descriptor limit
    /// lowered it.
    pub(crate) limits: Limits,
    pub(crate) limit_lowered_from: Option<u32>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys: only what is switched on.
        f.debug_struct("Settings")
            .field("curve", &self.curve.is_some())
            .field("allowed_keys", &self.allowed_keys.as_ref().map(Vec::len))
            .field("allowed_addresses", &self.allowed_addresses)
            .field("ipc_mode", &format_args!("{:04o}", self.ipc_mode))
            .field("limits", &self.limits)
            .finish()
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> CreateError {
    CreateError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

/// `kv_events_ipc_mode`: up to four octal digits, at most 0777.
pub(crate) fn parse_ipc_mode(text: &str) -> Result<u32, CreateError> {
    let field = "kv_events_ipc_mode";
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(invalid(
            field,
            format!("\"{text}\" is not an octal file mode such as 0660"),
        ));
    }
    let mode = u32::from_str_radix(digits, 8).unwrap_or(u32::MAX);
    if mode > 0o777 {
        return Err(invalid(
            field,
            format!(
                "\"{text}\" has bits beyond 0777 (no setuid, setgid or sticky bit on a socket)"
            ),
        ));
    }
    Ok(mode)
}

impl Settings {
    /// Reads the key files and parses the lists of `config`; errors name the flag and the
    /// reason, never a key.
    pub(crate) fn from_config(config: &Config) -> Result<Settings, CreateError> {
        let ipc_mode = parse_ipc_mode(&config.ipc_mode)?;
        let curve = if config.curve_secret_key_file.is_empty() {
            None
        } else {
            let field = "kv_events_curve_secret_key_file";
            keys::curve_available().map_err(|why| invalid(field, format!("is set, but {why}")))?;
            let path = Path::new(&config.curve_secret_key_file);
            Some(keys::read_key_pair(path).map_err(|why| invalid(field, why))?)
        };
        let allowed_keys = if config.curve_allow.is_empty() {
            None
        } else {
            let field = "kv_events_curve_allow";
            if curve.is_none() {
                return Err(invalid(
                    field,
                    "needs kv_events_curve_secret_key_file: an allow-list of public keys \
                     admits CURVE clients, and without a server key the socket speaks no CURVE",
                ));
            }
            let list = keys::read_allow_list(Path::new(&config.curve_allow))
                .map_err(|why| invalid(field, why))?;
            Some(list.into_iter().map(|(_, key)| key).collect())
        };
        let allowed_addresses = if config.null_allow_addresses.trim().is_empty() {
            None
        } else {
            let field = "kv_events_null_allow_addresses";
            if !config.bind_endpoint.starts_with("tcp://") {
                return Err(invalid(
                    field,
                    "applies to tcp:// endpoints only (a peer on ipc:// has no address; \
                     use kv_events_ipc_mode)",
                ));
            }
            let mut addresses = Vec::new();
            for entry in config.null_allow_addresses.split(',').map(str::trim) {
                let address = entry.parse::<IpAddr>().map_err(|_| {
                    invalid(
                        field,
                        format!("\"{entry}\" is not an IP address (a comma-separated list, e.g. 10.0.0.5,10.0.0.6)"),
                    )
                })?;
                addresses.push(canonical(address));
            }
            Some(addresses)
        };
        let (limits, lowered) = Limits::new(
            config.max_connections,
            config.max_connections_per_address,
            config.handshake_timeout_ms,
        );
        Ok(Settings {
            curve,
            allowed_keys,
            allowed_addresses,
            ipc_mode,
            limits,
            limit_lowered_from: lowered.then_some(config.max_connections),
        })
    }

    /// What is switched on, for the log at start: never a key.
    pub(crate) fn describe(&self) -> String {
        let mut parts = vec![match (&self.curve, &self.allowed_keys) {
            (None, _) => "no encryption (NULL mechanism)".to_owned(),
            (Some(_), None) => {
                "CURVE: encrypted, any subscriber with the server's public key".to_owned()
            }
            (Some(_), Some(keys)) => format!(
                "CURVE: encrypted, {} allow-listed subscriber key{}",
                keys.len(),
                if keys.len() == 1 { "" } else { "s" }
            ),
        }];
        if let Some(addresses) = &self.allowed_addresses {
            let list: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
            parts.push(format!("peers from {} only", list.join(", ")));
        }
        parts.join("; ")
    }

    /// Sets up `socket`, not yet bound, for these rules: a CURVE server when a key is set,
    /// every handshake put to the ZAP handler (which also turns away pre-ZMTP-3 peers), the
    /// handshake timeout, and the bounds on what a peer may send: messages of at most
    /// `max_inbound_bytes`, a few at a time.
    pub(crate) fn secure(
        &self,
        socket: &zmq::Socket,
        max_inbound_bytes: i64,
    ) -> Result<(), String> {
        let failed = |what: &str, e: zmq::Error| format!("cannot set {what}: {e}");
        if let Some(pair) = &self.curve {
            socket
                .set_curve_server(true)
                .map_err(|e| failed("CURVE", e))?;
            socket
                .set_curve_secretkey(&pair.secret.0)
                .map_err(|e| failed("CURVE", e))?;
        }
        socket
            .set_zap_domain(ZAP_DOMAIN)
            .map_err(|e| failed("the ZAP domain", e))?;
        let timeout = self.limits.handshake_timeout.as_millis() as i32;
        socket
            .set_handshake_ivl(timeout)
            .map_err(|e| failed("the handshake timeout", e))?;
        socket
            .set_maxmsgsize(max_inbound_bytes)
            .map_err(|e| failed("the largest inbound message", e))?;
        socket
            .set_rcvhwm(INBOUND_HWM)
            .map_err(|e| failed("the inbound high-water mark", e))?;
        socket
            .set_rcvbuf(INBOUND_BUFFER)
            .map_err(|e| failed("the receive buffer", e))
    }

    /// Binds `socket` to `endpoint`; an `ipc://` socket file gets the configured mode.
    pub(crate) fn bind(&self, socket: &zmq::Socket, endpoint: &str) -> Result<(), String> {
        match endpoint.strip_prefix("ipc://") {
            Some(path) => bind_ipc(socket, Path::new(path), self.ipc_mode),
            None => socket.bind(endpoint).map_err(|e| e.to_string()),
        }
    }

    /// Starts the thread `kv-events-zap`, which answers ZAP for every socket of `context`
    /// and watches the connections of `sockets` through their monitors. Called before the
    /// sockets are bound, so that no connection goes unseen and no handshake unchecked.
    pub(crate) fn watch(
        &self,
        context: &zmq::Context,
        sockets: &[&zmq::Socket],
        counters: Arc<PeerCounters>,
        listeners: Arc<Listeners>,
    ) -> Result<Guard, String> {
        let zap = context.socket(zmq::REP).map_err(|e| e.to_string())?;
        zap.set_linger(0).map_err(|e| e.to_string())?;
        zap.bind(ZAP_ENDPOINT)
            .map_err(|e| format!("cannot start the ZAP handler: {e}"))?;
        let mut monitors = Vec::with_capacity(sockets.len());
        for (i, socket) in sockets.iter().enumerate() {
            let endpoint = format!("inproc://kv-events-monitor-{i}");
            let failed = |e: zmq::Error| format!("cannot monitor connections: {e}");
            socket.monitor(&endpoint, MONITORED).map_err(failed)?;
            let monitor = context.socket(zmq::PAIR).map_err(failed)?;
            monitor.set_linger(0).map_err(failed)?;
            monitor.connect(&endpoint).map_err(failed)?;
            monitors.push((monitor, None));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            zap,
            monitors,
            allowed_keys: self.allowed_keys.clone(),
            allowed_addresses: self.allowed_addresses.clone(),
            counters,
            stop: Arc::clone(&stop),
            connections: Connections::new(self.limits),
            listeners,
            refusals: RateLimited::new(LOG_EVERY),
            after_attacks: Aftermath::default(),
        };
        let thread = thread::Builder::new()
            .name("kv-events-zap".into())
            .spawn(move || handler.run())
            .map_err(|e| format!("cannot start the thread kv-events-zap: {e}"))?;
        Ok(Guard {
            stop,
            thread: Some(thread),
        })
    }
}

/// Binds an ipc socket whose file has `mode` from the first moment anyone can reach it.
///
/// The mode of a socket file comes from the umask at bind, which is process-wide: changing
/// it in a multithreaded master would race every other thread that creates files. A chmod
/// after binding at the final path would leave a moment with the umask's mode. So the socket
/// is bound in a fresh directory of mode 0700 beside the final path (nobody else can reach
/// it there), given its mode, then renamed into place, atomically, replacing what was there
/// as ZeroMQ's own bind would.
fn bind_ipc(socket: &zmq::Socket, path: &Path, mode: u32) -> Result<(), String> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    // A name of its own per bind: publishers of one process may bind at the same time, and a
    // directory left by a process that crashed is never reused.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let private = loop {
        let n = NEXT.fetch_add(1, Relaxed);
        let candidate = parent.join(format!(".kv-events-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => break candidate,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", candidate.display())),
        }
    };
    let staged = private.join("s");
    let result = (|| {
        socket
            .bind(&format!("ipc://{}", staged.display()))
            .map_err(|e| e.to_string())?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("cannot set the mode of the socket file: {e}"))?;
        std::fs::rename(&staged, path)
            .map_err(|e| format!("cannot move the socket file into place: {e}"))
    })();
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    if result.is_err() {
        // The socket may be bound at the staged name: unbinding it is best effort.
        let _ = socket.unbind(&format!("ipc://{}", staged.display()));
    }
    result
}

/// The running thread `kv-events-zap`; dropping it stops and joins the thread.
#[derive(Debug)]
pub(crate) struct Guard {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A handshake failure a monitor reported, waiting for the disconnection that says which
/// connection it was (the event of a failure carries no descriptor).
#[derive(Debug)]
enum Failure {
    /// ZAP said no; the ZAP handler logged why.
    NotAdmitted,
    /// A security mechanism or CURVE failure, in words for the operator.
    Refused(String),
    /// The connection ended, or timed out, before the handshake finished.
    Unfinished,
}

/// The thread's state: the ZAP socket, the sockets' monitors (each with the failure it last
/// reported), and the table of connections.
struct Handler {
    zap: zmq::Socket,
    monitors: Vec<(zmq::Socket, Option<Failure>)>,
    allowed_keys: Option<Vec<Key>>,
    allowed_addresses: Option<Vec<IpAddr>>,
    counters: Arc<PeerCounters>,
    stop: Arc<AtomicBool>,
    connections: Connections,
    listeners: Arc<Listeners>,
    refusals: RateLimited,
    after_attacks: Aftermath,
}

/// Gives back to the OS the memory that hostile peers made the process's heap hold.
///
/// What libzmq allocates for a peer the publisher refuses (its connection, its subscriptions
/// until it is cut off) is freed when the peer is gone, but glibc keeps freed memory in the
/// heap: after a flood, the master's resident size would stay where the flood took it. So
/// once the refusals have stopped for [`Aftermath::SETTLE`], the heap is trimmed, once.
#[derive(Debug, Default)]
struct Aftermath {
    refusals_seen: u64,
    last_refusal: Option<Instant>,
}

impl Aftermath {
    const SETTLE: Duration = Duration::from_secs(2);

    fn look(&mut self, counters: &PeerCounters) {
        let refusals = [
            &counters.refused_handshakes,
            &counters.connections_refused,
            &counters.handshake_timeouts,
            &counters.subscriptions_refused,
        ]
        .iter()
        .map(|c| c.load(Relaxed))
        .sum();
        if refusals != self.refusals_seen {
            self.refusals_seen = refusals;
            self.last_refusal = Some(Instant::now());
        } else if self
            .last_refusal
            .is_some_and(|at| at.elapsed() >= Self::SETTLE)
        {
            self.last_refusal = None;
            trim_heap();
        }
    }
}

#[cfg(target_env = "gnu")]
fn trim_heap() {
    // SAFETY: malloc_trim only returns free heap memory to the OS; it takes the allocator's
    // locks, as any allocation would.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(target_env = "gnu"))]
fn trim_heap() {}

impl Handler {
    fn run(mut self) {
        self.serve();
        let unsaid = self.refusals.suppressed();
        if unsaid > 0 {
            crate::log::log(
                Level::Warn,
                &format!(
                    "{unsaid} more refused peers since the last report (the publisher's \
                     counters have them all)"
                ),
            );
        }
    }

    fn serve(&mut self) {
        let mut running = self.monitors.len();
        while running > 0 && !self.stop.load(Relaxed) {
            self.connections.keep_reserve();
            self.after_attacks.look(&self.counters);
            let mut items = vec![self.zap.as_poll_item(zmq::POLLIN)];
            items.extend(
                self.monitors
                    .iter()
                    .map(|(m, _)| m.as_poll_item(zmq::POLLIN)),
            );
            if zmq::poll(&mut items, POLL.as_millis() as i64).is_err() {
                continue;
            }
            let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
            drop(items);
            if ready[0] {
                self.answer_zap();
            }
            for i in (0..self.monitors.len()).filter(|i| ready[i + 1]) {
                while let Some(more) = self.take_monitor_event(i) {
                    if !more {
                        // That socket is closed: nothing more will happen on it.
                        running -= 1;
                        break;
                    }
                }
            }
        }
    }

    /// Answers one ZAP request (RFC 27): 200 when the peer's address and key are allowed,
    /// 400 otherwise, logging why.
    fn answer_zap(&mut self) {
        let Ok(request) = self.zap.recv_multipart(zmq::DONTWAIT) else {
            return;
        };
        // version, request id, domain, address, identity, mechanism, credentials...
        let frame = |i: usize| request.get(i).map_or(&[][..], Vec::as_slice);
        let address = String::from_utf8_lossy(frame(3)).into_owned();
        let mechanism = frame(5);
        let refusal = self.refusal(&address, mechanism, request.get(6));
        let (status, text) = match &refusal {
            None => ("200", "OK"),
            Some(_) => ("400", "not admitted"),
        };
        let reply: [&[u8]; 6] = [
            b"1.0",
            frame(1),
            status.as_bytes(),
            text.as_bytes(),
            b"",
            b"",
        ];
        let _ = self.zap.send_multipart(reply, 0);
        if let Some(why) = refusal {
            // The monitor counts the refusal (HANDSHAKE_FAILED_AUTH); here is its reason.
            self.refusals.log(Level::Warn, || {
                format!("refused a subscriber from {address}: {why}")
            });
        }
    }

    /// Why a peer is not admitted, or `None` when it is.
    fn refusal(&self, address: &str, mechanism: &[u8], key: Option<&Vec<u8>>) -> Option<String> {
        if let Some(allowed) = &self.allowed_addresses {
            let ok = address
                .parse::<IpAddr>()
                .is_ok_and(|ip| allowed.contains(&canonical(ip)));
            if !ok {
                return Some("its address is not in kv_events_null_allow_addresses".into());
            }
        }
        if let Some(allowed) = &self.allowed_keys {
            if mechanism != b"CURVE" {
                return Some("it does not use CURVE".into());
            }
            let key = key.and_then(|k| <[u8; 32]>::try_from(k.as_slice()).ok());
            match key {
                Some(k) if allowed.contains(&Key(k)) => {}
                Some(k) => {
                    return Some(format!(
                        "its public key {} is not in kv_events_curve_allow",
                        Key(k).to_z85()
                    ))
                }
                None => return Some("it sent no CURVE public key".into()),
            }
        }
        None
    }

    /// Takes one event of monitor `i`: `None` when none is waiting, `Some(false)` once the
    /// monitor stopped.
    fn take_monitor_event(&mut self, i: usize) -> Option<bool> {
        let frames = self.monitors[i].0.recv_multipart(zmq::DONTWAIT).ok()?;
        let Some((event, value)) = monitor_event(&frames) else {
            return Some(true);
        };
        let counters = Arc::clone(&self.counters);
        let fd = value as i32;
        match event {
            EVENT_MONITOR_STOPPED => return Some(false),
            EVENT_LISTENING => self.connections.listening(&self.listeners, fd),
            EVENT_ACCEPTED => {
                if let Some(why) = self.connections.accepted(&self.listeners, fd) {
                    counters.connections_refused.fetch_add(1, Relaxed);
                    self.refusals
                        .log(Level::Warn, || format!("refused a connection: {why}"));
                }
            }
            EVENT_ACCEPT_FAILED if matches!(value as i32, libc::EMFILE | libc::ENFILE) => {
                let refused = self.connections.out_of_descriptors(&self.listeners);
                counters
                    .connections_refused
                    .fetch_add(refused as u64, Relaxed);
                self.refusals.log(Level::Error, || {
                    format!(
                        "the process has no file descriptor left: refused {refused} waiting \
                         connections (raise ulimit -n, or lower kv_events_max_connections)"
                    )
                });
            }
            EVENT_DISCONNECTED => {
                let (ended, from) = self.connections.disconnected(fd);
                match (self.monitors[i].1.take(), ended) {
                    (Some(Failure::Unfinished), Ended::AfterTimeout) => {
                        counters.handshake_timeouts.fetch_add(1, Relaxed);
                        self.refusals.log(Level::Warn, || {
                            format!("closed a connection from {from}: no handshake in time")
                        });
                    }
                    (Some(Failure::Refused(why)), _) => {
                        self.refusals.log(Level::Warn, || {
                            format!("refused a handshake from {from}: {why}")
                        });
                    }
                    _ => {}
                }
            }
            EVENT_HANDSHAKE_FAILED_AUTH => {
                // Counted here, once per handshake; the ZAP handler logged the reason.
                counters.refused_handshakes.fetch_add(1, Relaxed);
                self.monitors[i].1 = Some(Failure::NotAdmitted);
            }
            EVENT_HANDSHAKE_FAILED_PROTOCOL => {
                counters.refused_handshakes.fetch_add(1, Relaxed);
                self.monitors[i].1 = Some(Failure::Refused(protocol_failure(value)));
            }
            EVENT_HANDSHAKE_FAILED_NO_DETAIL => self.monitors[i].1 = Some(Failure::Unfinished),
            _ => {}
        }
        counters
            .connections
            .store(self.connections.len() as u64, Relaxed);
        Some(true)
    }
}

/// What a failed handshake that ZAP never saw means, in words for the operator.
fn protocol_failure(value: u32) -> String {
    match value {
        PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH => {
            "the subscriber's security mechanism is not the publisher's (a subscriber without \
             CURVE keys, or CURVE against a plain publisher)"
                .into()
        }
        PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC => {
            "its CURVE handshake does not decrypt (the subscriber has the wrong server key)".into()
        }
        other => format!("ZMTP protocol error 0x{other:08x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_modes_are_octal_and_at_most_0777() {
        assert_eq!(parse_ipc_mode("0660").unwrap(), 0o660);
        assert_eq!(parse_ipc_mode("600").unwrap(), 0o600);
        assert_eq!(parse_ipc_mode("0o777").unwrap(), 0o777);
        for bad in ["", "0869", "rw-rw----", "4770", "07777", "1e3"] {
            let err = parse_ipc_mode(bad).unwrap_err().to_string();
            assert!(err.starts_with("kv_events_ipc_mode"), "{err}");
        }
    }

    #[test]
    fn mapped_ipv4_compares_as_ipv4() {
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(canonical(mapped), "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
