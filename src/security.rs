//! Who may read the stream (SPEC section 10): CURVE on the PUB socket, a ZAP handler (ZeroMQ
//! RFC 27) that admits the allow-listed public keys and addresses, the count and the log of
//! refused handshakes, and the mode of an `ipc://` socket file.
//!
//! All of it runs on libzmq's I/O thread and on one thread of its own, `kv-events-zap`: the
//! master's calls and the publishing thread never see a handshake, and the producers do no
//! cryptography (libzmq encrypts on its I/O thread).

use crate::config::{Config, CreateError};
use crate::keys::{self, Key, KeyPair};
use crate::log::{Level, RateLimited};
use std::mem::ManuallyDrop;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::FromRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// The ZAP domain the PUB socket asks the handler about; libzmq consults ZAP for the NULL
/// mechanism only when the socket has a domain.
const ZAP_DOMAIN: &str = "kv-events";
/// Where a ZAP handler binds, by RFC 27, in the socket's own context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
/// Where the PUB socket's monitor publishes its events; one per context, as each publisher
/// has a context of its own.
const MONITOR_ENDPOINT: &str = "inproc://kv-events-monitor";
/// How long the thread waits between looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);
/// At most one line about refused handshakes per this long, with the count of the others.
const LOG_EVERY: Duration = Duration::from_secs(10);

// The monitor events and protocol error codes of libzmq's zmq.h (4.3), which the `zmq` crate
// does not re-export as numbers; `watch` reads the same events on the subscriber's side.
const EVENT_ACCEPTED: u32 = 0x0020;
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
const MONITORED: i32 = (EVENT_ACCEPTED
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
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys: only what is switched on.
        f.debug_struct("Settings")
            .field("curve", &self.curve.is_some())
            .field("allowed_keys", &self.allowed_keys.as_ref().map(Vec::len))
            .field("allowed_addresses", &self.allowed_addresses)
            .field("ipc_mode", &format_args!("{:04o}", self.ipc_mode))
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
        Ok(Settings {
            curve,
            allowed_keys,
            allowed_addresses,
            ipc_mode,
        })
    }

    /// Whether handshakes are checked at all: then the thread `kv-events-zap` runs.
    fn guarded(&self) -> bool {
        self.curve.is_some() || self.allowed_addresses.is_some()
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

    /// Sets up `socket` (not yet bound) for these settings, starts the thread that answers
    /// ZAP and watches handshakes when one is needed, then binds `endpoint`. The thread is
    /// started before the bind, so no handshake ever goes unchecked.
    pub(crate) fn bind(
        self,
        context: &zmq::Context,
        socket: &zmq::Socket,
        endpoint: &str,
        refused: Arc<AtomicU64>,
    ) -> Result<Option<Guard>, String> {
        let guard = if self.guarded() {
            if let Some(pair) = &self.curve {
                socket.set_curve_server(true).map_err(|e| e.to_string())?;
                socket
                    .set_curve_secretkey(&pair.secret.0)
                    .map_err(|e| e.to_string())?;
            }
            let zap = if self.allowed_keys.is_some() || self.allowed_addresses.is_some() {
                socket
                    .set_zap_domain(ZAP_DOMAIN)
                    .map_err(|e| e.to_string())?;
                let zap = context.socket(zmq::REP).map_err(|e| e.to_string())?;
                zap.set_linger(0).map_err(|e| e.to_string())?;
                zap.bind(ZAP_ENDPOINT)
                    .map_err(|e| format!("cannot start the ZAP handler: {e}"))?;
                Some(zap)
            } else {
                None
            };
            socket
                .monitor(MONITOR_ENDPOINT, MONITORED)
                .map_err(|e| format!("cannot monitor handshakes: {e}"))?;
            let monitor = context.socket(zmq::PAIR).map_err(|e| e.to_string())?;
            monitor.set_linger(0).map_err(|e| e.to_string())?;
            monitor
                .connect(MONITOR_ENDPOINT)
                .map_err(|e| format!("cannot monitor handshakes: {e}"))?;
            let stop = Arc::new(AtomicBool::new(false));
            let handler = Handler {
                zap,
                monitor,
                allowed_keys: self.allowed_keys,
                allowed_addresses: self.allowed_addresses,
                refused,
                stop: Arc::clone(&stop),
                peers: Vec::new(),
                failure: None,
                refusals: RateLimited::new(LOG_EVERY),
            };
            let thread = thread::Builder::new()
                .name("kv-events-zap".into())
                .spawn(move || handler.run())
                .map_err(|e| format!("cannot start the thread kv-events-zap: {e}"))?;
            Some(Guard {
                stop,
                thread: Some(thread),
            })
        } else {
            None
        };
        match endpoint.strip_prefix("ipc://") {
            Some(path) => bind_ipc(socket, Path::new(path), self.ipc_mode)?,
            None => socket.bind(endpoint).map_err(|e| e.to_string())?,
        }
        Ok(guard)
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

/// The thread's state: the ZAP socket, the PUB socket's monitor, and what it knows of the
/// connections it saw accepted.
struct Handler {
    zap: Option<zmq::Socket>,
    monitor: zmq::Socket,
    allowed_keys: Option<Vec<Key>>,
    allowed_addresses: Option<Vec<IpAddr>>,
    refused: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    /// The peer of each accepted connection's descriptor, until it disconnects.
    peers: Vec<(i32, Option<SocketAddr>)>,
    /// A handshake failure the monitor reported, waiting for the disconnection that says
    /// which peer it was (a monitor event of a failure carries no descriptor).
    failure: Option<String>,
    refusals: RateLimited,
}

impl Handler {
    fn run(mut self) {
        self.serve();
        let unsaid = self.refusals.suppressed();
        if unsaid > 0 {
            crate::log::log(
                Level::Warn,
                &format!(
                    "{unsaid} more refused handshakes since the last report \
                     (refused_handshakes counts them all)"
                ),
            );
        }
    }

    fn serve(&mut self) {
        loop {
            if self.stop.load(Relaxed) {
                return;
            }
            let mut items = vec![self.monitor.as_poll_item(zmq::POLLIN)];
            if let Some(zap) = &self.zap {
                items.push(zap.as_poll_item(zmq::POLLIN));
            }
            if zmq::poll(&mut items, POLL.as_millis() as i64).is_err() {
                continue;
            }
            let (monitor_ready, zap_ready) = (
                items[0].is_readable(),
                items.get(1).is_some_and(|i| i.is_readable()),
            );
            drop(items);
            if zap_ready {
                self.answer_zap();
            }
            if monitor_ready && !self.take_monitor_event() {
                // The PUB socket is closed: nothing more will happen.
                return;
            }
        }
    }

    /// Answers one ZAP request (RFC 27): 200 when the peer's address and key are allowed,
    /// 400 otherwise, logging why.
    fn answer_zap(&mut self) {
        let Some(zap) = &self.zap else { return };
        let Ok(request) = zap.recv_multipart(zmq::DONTWAIT) else {
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
        let _ = zap.send_multipart(reply, 0);
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

    /// Takes one monitor event; false once the monitor stopped.
    fn take_monitor_event(&mut self) -> bool {
        let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) else {
            return true;
        };
        let Some((event, value)) = monitor_event(&frames) else {
            return true;
        };
        match event {
            EVENT_MONITOR_STOPPED => return false,
            EVENT_ACCEPTED => {
                let fd = value as i32;
                self.peers.retain(|(known, _)| *known != fd);
                self.peers.push((fd, peer_of(fd)));
            }
            EVENT_DISCONNECTED => {
                let fd = value as i32;
                let peer = self
                    .peers
                    .iter()
                    .position(|(known, _)| *known == fd)
                    .and_then(|at| self.peers.swap_remove(at).1);
                if let Some(why) = self.failure.take() {
                    let from = peer.map_or_else(|| "an unknown address".into(), |p| p.to_string());
                    self.refusals.log(Level::Warn, || {
                        format!("refused a handshake from {from}: {why}")
                    });
                }
            }
            EVENT_HANDSHAKE_FAILED_AUTH => {
                // Counted here, once per handshake; the ZAP handler logged the reason.
                self.refused.fetch_add(1, Relaxed);
            }
            EVENT_HANDSHAKE_FAILED_PROTOCOL | EVENT_HANDSHAKE_FAILED_NO_DETAIL => {
                self.refused.fetch_add(1, Relaxed);
                self.failure = Some(protocol_failure(event, value));
            }
            _ => {}
        }
        true
    }
}

/// An IPv4 address in IPv6 form (`::ffff:10.0.0.5`), as ZAP reports it on a dual-stack
/// socket, compares as the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What a failed handshake that ZAP never saw means, in words for the operator.
fn protocol_failure(event: u32, value: u32) -> String {
    if event == EVENT_HANDSHAKE_FAILED_NO_DETAIL {
        return "the connection ended during the handshake".into();
    }
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

/// The remote address of the connection on descriptor `fd`, while libzmq holds it open.
fn peer_of(fd: i32) -> Option<SocketAddr> {
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is the descriptor of a connection libzmq accepted; ManuallyDrop keeps it
    // from being closed here, and getpeername only reads. Should libzmq have closed it (and
    // the number been reused) in between, the call fails or names another peer: a wrong
    // address in a log line, nothing worse.
    let stream = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
    stream.peer_addr().ok()
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
