//! The publisher's sockets and who may use them: the PUB socket (an XPUB, so that the
//! publishing thread sees subscriptions) and the optional replay ROUTER, set up for the
//! access rules the config was validated into (CURVE, ZAP, handshake timeout, inbound bounds),
//! watched by the thread `kv-events-zap` from before they are bound, then bound.
//!
//! - `zap`: the thread that answers ZAP and reads the sockets' monitors;
//! - `connections`: the table of connections and the bounds it enforces;
//! - `monitor`: libzmq's monitor events, shared with the subscriber side;
//! - `ipc`: binding an `ipc://` endpoint with its file mode.

pub(crate) mod connections;
mod ipc;
pub(crate) mod monitor;
mod zap;

use crate::config::access::Access;
use crate::config::Config;
use crate::error::CreateError;
use crate::stats::PeerCounters;
use connections::Listeners;
use std::path::Path;
use std::sync::Arc;
pub(crate) use zap::Guard;

/// The largest message a subscriber may send, the handshake's commands included (a CURVE
/// INITIATE is about 300 bytes). A subscription to the stream's one topic is 1 byte; a larger
/// message ends its connection (libzmq's ZMQ_MAXMSGSIZE) before any of it is kept.
const MAX_SUBSCRIPTION_BYTES: i64 = 512;
/// The largest frame a peer of the replay socket may send: requests are a few bytes and a
/// tenant id.
const MAX_REQUEST_BYTES: i64 = 1024;
/// Messages one peer may have waiting for the publisher to read them.
const INBOUND_HWM: i32 = 4;
/// The kernel's receive buffer of each connection, in bytes: what a peer can have in flight
/// towards the publisher. Subscribers send one subscription; a peer that floods
/// subscriptions is cut off at the first wrong one, and this bounds what it sent before.
const INBOUND_BUFFER: i32 = 1024;

/// The publisher's sockets, set up and bound, and the thread that watches them.
pub(crate) struct Sockets {
    /// The PUB socket, for the publishing thread.
    pub(crate) publish: zmq::Socket,
    /// The replay socket, when `kv_events_replay_endpoint` is set.
    pub(crate) replay: Option<zmq::Socket>,
    /// The listeners of both, for cutting connections safely.
    pub(crate) listeners: Arc<Listeners>,
    /// The thread `kv-events-zap`; stopped last, once the sockets are closed.
    pub(crate) guard: Guard,
}

impl Sockets {
    /// Creates the sockets `config` names, sets them up for `access` (`prepare_replay` gives the replay
    /// socket the options its protocol needs), starts the watch, then binds them. Errors
    /// name the socket, the thread or the endpoint that failed.
    pub(crate) fn open(
        config: &Config,
        access: &Access,
        peers: Arc<PeerCounters>,
        prepare_replay: fn(&zmq::Socket) -> Result<(), zmq::Error>,
    ) -> Result<Sockets, CreateError> {
        let failed = |socket: &'static str| {
            move |e: zmq::Error| CreateError::Socket {
                socket,
                reason: e.to_string(),
            }
        };
        let context = zmq::Context::new();
        let publish = context
            .socket(zmq::XPUB)
            .map_err(failed("the PUB socket"))?;
        // A failed create must not wait for anything: nothing was sent yet. Every
        // subscription reaches the publishing thread, which refuses all but the empty topic.
        publish
            .set_linger(0)
            .and_then(|()| publish.set_xpub_verbose(true))
            .and_then(|()| publish.set_sndhwm(config.send_hwm as i32))
            .and_then(|()| secure(&publish, access, MAX_SUBSCRIPTION_BYTES))
            .map_err(failed("the PUB socket"))?;
        let replay = if config.replay_endpoint.is_empty() {
            None
        } else {
            let router = context
                .socket(zmq::ROUTER)
                .map_err(failed("the replay socket"))?;
            prepare_replay(&router)
                .and_then(|()| secure(&router, access, MAX_REQUEST_BYTES))
                .map_err(failed("the replay socket"))?;
            Some(router)
        };
        let listeners = Arc::new(Listeners::default());
        let watched: Vec<&zmq::Socket> = std::iter::once(&publish).chain(replay.as_ref()).collect();
        let guard = zap::start(access, &context, &watched, peers, Arc::clone(&listeners))?;
        bind(
            &publish,
            access,
            "kv_events_bind_endpoint",
            &config.bind_endpoint,
        )?;
        if let Some(router) = &replay {
            bind(
                router,
                access,
                "kv_events_replay_endpoint",
                &config.replay_endpoint,
            )?;
        }
        Ok(Sockets {
            publish,
            replay,
            listeners,
            guard,
        })
    }
}

/// Sets up `socket`, not yet bound, for `access`: a CURVE server when a key is set, every
/// handshake put to the ZAP handler (which also turns away pre-ZMTP-3 peers), the handshake
/// timeout, and the bounds on what a peer may send: messages of at most `max_inbound_bytes`,
/// a few at a time.
fn secure(socket: &zmq::Socket, access: &Access, max_inbound_bytes: i64) -> Result<(), zmq::Error> {
    if let Some(pair) = &access.curve {
        socket.set_curve_server(true)?;
        socket.set_curve_secretkey(&pair.secret.0)?;
    }
    socket.set_zap_domain(zap::ZAP_DOMAIN)?;
    socket.set_handshake_ivl(access.limits.handshake_timeout.as_millis() as i32)?;
    socket.set_maxmsgsize(max_inbound_bytes)?;
    socket.set_rcvhwm(INBOUND_HWM)?;
    socket.set_rcvbuf(INBOUND_BUFFER)
}

/// Binds `socket` to `endpoint` (the value of flag `field`); an `ipc://` socket file gets the
/// configured mode.
fn bind(
    socket: &zmq::Socket,
    access: &Access,
    field: &'static str,
    endpoint: &str,
) -> Result<(), CreateError> {
    match endpoint.strip_prefix("ipc://") {
        Some(path) => ipc::bind(socket, Path::new(path), access.ipc_mode),
        None => socket.bind(endpoint).map_err(|e| e.to_string()),
    }
    .map_err(|reason| CreateError::Bind {
        field,
        endpoint: endpoint.to_owned(),
        reason,
    })
}
