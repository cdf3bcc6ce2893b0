//! Starting an enabled publisher: its sockets, the replay socket's thread when configured,
//! the publishing thread, and the log lines that say how it started.

use super::queue::EventQueue;
use super::shared::Shared;
use super::worker::{Outlet, Worker};
use super::{Enabled, Publisher};
use crate::config::access::Access;
use crate::config::{Config, Settings};
use crate::error::CreateError;
use crate::logging::{log, Level};
use crate::recovery::replay::{self, Server, SourceSlot};
use crate::transport::Sockets;
use crate::wire::encode::Encoder;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl Publisher {
    /// When enabled, binds the PUB socket (and the replay socket, when configured) and starts
    /// the publishing thread. Errors name what failed: the endpoint, the socket or the thread.
    pub fn start(settings: Settings) -> Result<Publisher, CreateError> {
        let config = settings.config();
        let Some(access) = &settings.access else {
            log(
                Level::Info,
                "kv events are disabled (enable_kv_events=false)",
            );
            return Ok(Publisher::disabled());
        };
        let shared = Arc::new(Shared::new(
            EventQueue::new(config.queue_capacity as usize),
            config.emit_object_key,
            config.reannounce_remaining,
        ));
        let peers = Arc::clone(&shared.counters.peers);
        let sockets = Sockets::open(config, access, Arc::clone(&peers), replay::prepare)?;
        let incarnation = incarnation();
        let source = Arc::new(SourceSlot::default());
        let (replay, ring) = match sockets.replay {
            None => (None, None),
            Some(router) => {
                let shared = Arc::clone(&shared);
                let (server, ring) = Server::start(
                    router,
                    config,
                    incarnation,
                    Arc::clone(&source),
                    Arc::new(move || shared.queue.len()),
                    peers,
                    Arc::clone(&sockets.listeners),
                )?;
                (Some(server), Some(ring))
            }
        };
        let outlet = Outlet {
            socket: sockets.publish,
            endpoint: config.bind_endpoint.clone(),
            listeners: sockets.listeners,
            ring,
            topic: config.topic.as_bytes().to_vec(),
            heartbeat: (config.heartbeat_ms > 0)
                .then(|| Duration::from_millis(u64::from(config.heartbeat_ms))),
        };
        let worker = Worker::spawn(Arc::clone(&shared), outlet, Encoder::new(config))?;
        shared.queue.set_consumer(worker.thread().clone());
        announce_start(config, access, incarnation);
        Ok(Publisher {
            enabled: Some(Enabled {
                shared,
                worker: Mutex::new(Some(worker)),
                replay: Mutex::new(replay),
                guard: Mutex::new(Some(sockets.guard)),
                next_scan: AtomicU64::new(1),
                incarnation,
                source,
            }),
        })
    }
}

/// The log lines of a start: the effective configuration, and what deserves a warning.
fn announce_start(config: &Config, access: &Access, incarnation: u64) {
    log(
        Level::Info,
        &format!(
            "kv events publisher started: {config}; incarnation {incarnation}; \
             subscribers: {}",
            access.describe()
        ),
    );
    if access.limits.total < config.max_connections {
        log(
            Level::Warn,
            &format!(
                "kv_events_max_connections={} is more than half the process's descriptor \
                 limit (ulimit -n): the publisher holds at most {} connections",
                config.max_connections, access.limits.total
            ),
        );
    }
    if !config.emit_object_key {
        log(
            Level::Warn,
            "kv_events_emit_object_key=false: every stored and removed event is suppressed; \
             subscribers will only see cleared",
        );
    }
}

/// A random 64-bit id for one publisher's life, never 0 (which says "disabled").
fn incarnation() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into `bytes`.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let random = if filled == bytes.len() as isize {
        u64::from_ne_bytes(bytes)
    } else {
        // No entropy to be had: the time and the process still tell two lives apart.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 32)
    };
    random.max(1)
}
