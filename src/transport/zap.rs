//! The thread `kv-events-zap`: it answers ZAP (ZeroMQ RFC 27) for the publisher's sockets,
//! admitting only the allow-listed public keys and addresses, and reads the sockets' monitors
//! to keep the table of connections, count and log refused peers, and trim the heap once an
//! attack has passed.
//!
//! All of it runs on libzmq's I/O thread and on this one thread: the master's calls and the
//! publishing thread never see a handshake, and the producers do no cryptography (libzmq
//! encrypts on its I/O thread).

use super::connections::{Connections, Ended, Listeners};
use super::monitor::*;
use crate::config::access::{canonical, Access};
use crate::error::CreateError;
use crate::keys::Key;
use crate::logging::{Level, RateLimited};
use crate::stats::PeerCounters;
use crate::threads;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The ZAP domain the PUB socket asks the handler about; libzmq consults ZAP for the NULL
/// mechanism only when the socket has a domain.
pub(super) const ZAP_DOMAIN: &str = "kv-events";
/// Where a ZAP handler binds, by RFC 27, in the socket's own context.
const ZAP_ENDPOINT: &str = "inproc://zeromq.zap.01";
/// The PUB socket's place among the watched sockets.
const PUB: usize = 0;
/// How long the thread waits between looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);
/// At most one line about refused peers per this long, with the count of the others.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// The monitor events the thread acts on.
const MONITORED: i32 = (EVENT_LISTENING
    | EVENT_ACCEPTED
    | EVENT_ACCEPT_FAILED
    | EVENT_DISCONNECTED
    | EVENT_MONITOR_STOPPED
    | EVENT_HANDSHAKE_SUCCEEDED
    | EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | EVENT_HANDSHAKE_FAILED_PROTOCOL
    | EVENT_HANDSHAKE_FAILED_AUTH) as i32;

/// Starts the thread `kv-events-zap`, which answers ZAP for every socket of `context`
/// and watches the connections of `sockets` through their monitors; the first is the PUB
/// socket, whose connections that finish their handshake are the subscribers. Called before
/// the sockets are bound, so that no connection goes unseen and no handshake unchecked.
pub(crate) fn start(
    access: &Access,
    context: &zmq::Context,
    sockets: &[&zmq::Socket],
    counters: Arc<PeerCounters>,
    listeners: Arc<Listeners>,
) -> Result<Guard, CreateError> {
    let failed = |e: zmq::Error| CreateError::Zap {
        reason: e.to_string(),
    };
    let zap = context.socket(zmq::REP).map_err(failed)?;
    zap.set_linger(0).map_err(failed)?;
    zap.bind(ZAP_ENDPOINT).map_err(failed)?;
    let mut monitors = Vec::with_capacity(sockets.len());
    for (i, socket) in sockets.iter().enumerate() {
        let endpoint = format!("inproc://kv-events-monitor-{i}");
        socket.monitor(&endpoint, MONITORED).map_err(failed)?;
        let monitor = context.socket(zmq::PAIR).map_err(failed)?;
        monitor.set_linger(0).map_err(failed)?;
        monitor.connect(&endpoint).map_err(failed)?;
        monitors.push(Monitor {
            socket: monitor,
            failure: None,
            quiet_since: Instant::now(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let handler = Handler {
        zap,
        monitors,
        allowed_keys: access.allowed_keys.clone(),
        allowed_addresses: access.allowed_addresses.clone(),
        counters,
        stop: Arc::clone(&stop),
        connections: Connections::new(access.limits),
        listeners,
        refusals: RateLimited::new(LOG_EVERY),
        after_attacks: Aftermath::default(),
    };
    let thread = threads::spawn("kv-events-zap", move || handler.run())?;
    Ok(Guard {
        stop,
        thread: Some(thread),
    })
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

/// The monitor of one watched socket, and what the thread knows of its events so far.
struct Monitor {
    socket: zmq::Socket,
    /// The handshake failure it last reported, until the disconnection that follows it.
    failure: Option<Failure>,
    /// An instant at which the monitor had no event waiting: every event read since was sent
    /// after it. The thread may read an event long after libzmq sent it (while it cuts
    /// hundreds of connections of a burst, or when the machine is busy), so the time it reads
    /// an accept at would make a connection look younger than it is, and one closed by
    /// libzmq's handshake timer look closed before its time.
    quiet_since: Instant,
}

/// The thread's state: the ZAP socket, the sockets' monitors, and the table of connections.
struct Handler {
    zap: zmq::Socket,
    monitors: Vec<Monitor>,
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
            crate::logging::log(
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
                    .map(|m| m.socket.as_poll_item(zmq::POLLIN)),
            );
            if zmq::poll(&mut items, POLL.as_millis() as i64).is_err() {
                continue;
            }
            let zap_ready = items[0].is_readable();
            drop(items);
            if zap_ready {
                self.answer_zap();
            }
            // Every monitor, ready or not, is read until it is empty, which renews its
            // `quiet_since` at each turn of the loop.
            for i in 0..self.monitors.len() {
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
        let asked = Instant::now();
        let Ok(frames) = self.monitors[i].socket.recv_multipart(zmq::DONTWAIT) else {
            // Nothing was waiting at `asked`: the next event is sent after it.
            self.monitors[i].quiet_since = asked;
            return None;
        };
        let Some((event, value)) = monitor_event(&frames) else {
            return Some(true);
        };
        let counters = Arc::clone(&self.counters);
        let fd = value as i32;
        match event {
            EVENT_MONITOR_STOPPED => return Some(false),
            EVENT_LISTENING => self.connections.listening(&self.listeners, fd),
            EVENT_ACCEPTED => {
                let since = self.monitors[i].quiet_since;
                if let Some(why) = self.connections.accepted(&self.listeners, i, fd, since) {
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
            EVENT_HANDSHAKE_SUCCEEDED if i == PUB => {
                counters.subscriber_connects.fetch_add(1, Relaxed);
                counters.subscribers.fetch_add(1, Relaxed);
            }
            EVENT_DISCONNECTED => {
                let (ended, from) = self.connections.disconnected(i, fd);
                match (self.monitors[i].failure.take(), ended) {
                    // libzmq reports a handshake that did not finish just before the
                    // disconnection, so one without a failure had succeeded. Only this
                    // thread changes the gauge.
                    (None, _)
                        if i == PUB
                            && counters
                                .subscribers
                                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                                .is_ok() =>
                    {
                        counters.subscriber_disconnects.fetch_add(1, Relaxed);
                    }
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
                self.monitors[i].failure = Some(Failure::NotAdmitted);
            }
            EVENT_HANDSHAKE_FAILED_PROTOCOL => {
                counters.refused_handshakes.fetch_add(1, Relaxed);
                self.monitors[i].failure = Some(Failure::Refused(protocol_failure(value)));
            }
            EVENT_HANDSHAKE_FAILED_NO_DETAIL => {
                self.monitors[i].failure = Some(Failure::Unfinished)
            }
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
