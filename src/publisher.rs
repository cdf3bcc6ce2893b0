//! The handle the master holds: the three calls, stats, flush and shutdown.

use crate::config::{Config, CreateError};
use crate::connections::Listeners;
use crate::encode::Encoder;
use crate::event::{ClearedEvent, ObjectEvents};
use crate::log::{log, Level};
use crate::media::MediumSet;
use crate::pool::StringPool;
use crate::queue::{EventQueue, Record};
use crate::replay::{self, Identity, Ring, Server, Snapshots, SourceSlot};
use crate::security::{Guard, Settings, MAX_REQUEST_BYTES, MAX_SUBSCRIPTION_BYTES};
use crate::snapshot::{self, ObjectSource};
use crate::stats::{Counters, Stats};
use crate::worker::{Outlet, Worker};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Announces object availability per medium to the subscribers of one ZeroMQ PUB socket.
///
/// Created from a [`Config`]: a disabled config gives a publisher whose calls return at once
/// and do nothing; an enabled one binds the socket and starts one publishing thread. The
/// caller never needs to know which it holds.
///
/// The three calls may be made from any number of threads at once, typically under the
/// master's metadata locks. Each copies its strings into one record, or up to 256 bytes into
/// a block of a pool that the publishing thread refills (so without allocating), and pushes
/// it onto a bounded lock-free queue, so its events stay contiguous in the stream and keep the calling thread's order. They never
/// wait: when the queue is full the oldest call's events are dropped, counted, and show as a
/// sequence gap. They make no system call unless the publishing thread sleeps, or callers
/// collide on the queue's tail often enough that crossbeam's backoff yields (rare:
/// docs/performance.md).
///
/// Dropping the publisher sends what is queued within a bounded linger and joins the thread.
///
/// ```no_run
/// use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
/// let publisher = Publisher::create(&Config {
///     enable_kv_events: true,
///     bind_endpoint: "tcp://*:5557".into(),
///     backend_id: "store-a".into(),
///     ..Config::default()
/// })?;
/// publisher.on_put_commit("", "object-1", "group-1", MediumSet::from([Medium::Cpu]));
/// # Ok::<(), mooncake_kv_events::CreateError>(())
/// ```
pub struct Publisher {
    enabled: Option<Enabled>,
}

struct Enabled {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The thread that serves the replay socket, when there is one.
    replay: Mutex<Option<Server>>,
    /// The thread that answers ZAP and watches connections; stopped last, once the sockets
    /// are closed.
    guard: Mutex<Option<Guard>>,
    next_scan: AtomicU64,
    incarnation: u64,
    /// Where snapshots get their objects, once the master registers it.
    source: Arc<SourceSlot>,
}

/// What the callers and the publishing thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) queue: EventQueue,
    /// Blocks for strings too long for a record.
    pub(crate) strings: StringPool,
    pub(crate) counters: Counters,
    emit_object_key: bool,
    closing: AtomicBool,
    /// Set once the publishing thread is joined: nothing will take records off the queue.
    stopped: AtomicBool,
}

impl Shared {
    fn new(queue: EventQueue, emit_object_key: bool) -> Shared {
        Shared {
            strings: StringPool::for_queue(queue.capacity()),
            queue,
            counters: Counters::default(),
            emit_object_key,
            closing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(SeqCst)
    }

    /// The hot path: push one call's record, or count why it was not pushed.
    fn push(&self, record: Record) {
        if self.is_closing() {
            Counters::add(&self.counters.dropped_events, record.event_count());
            return;
        }
        if let Some(displaced) = self.queue.push(record) {
            Counters::add(&self.counters.dropped_events, displaced.event_count());
            displaced.recycle(&self.strings);
        }
        // A call that saw the publisher open but pushed after shutdown's last look would stay
        // queued, neither sent nor counted. `stopped` is stored before that look and read
        // after the push (both sequentially consistent, as the queue's claim), so either the
        // look finds the record or this call sees `stopped`.
        if self.stopped.load(SeqCst) {
            self.drop_queued();
        }
    }

    /// Counts every queued record's events as dropped and returns how many there were; only
    /// once the publishing thread is gone.
    fn drop_queued(&self) -> usize {
        let mut late = 0;
        while let Some(record) = self.queue.pop() {
            late += record.event_count();
        }
        if late > 0 {
            Counters::add(&self.counters.dropped_events, late);
        }
        late
    }
}

/// The token of one RemoveAll, taken by [`Publisher::begin_remove_all`] before the master's
/// loop starts and passed to every [`Publisher::on_remove_all`] of that loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoveAllScan(u64);

impl RemoveAllScan {
    /// The scan's number, for carrying the token across the C++ bridge.
    pub fn id(self) -> u64 {
        self.0
    }

    /// The token numbered `id` (see [`RemoveAllScan::id`]).
    pub fn from_id(id: u64) -> RemoveAllScan {
        RemoveAllScan(id)
    }
}

impl Publisher {
    /// A publisher whose calls do nothing.
    pub fn disabled() -> Publisher {
        Publisher { enabled: None }
    }

    /// Validates `config`; when enabled, binds the PUB socket (and the replay socket, when
    /// configured) and starts the publishing thread. Errors name the field or the endpoint
    /// and the reason.
    pub fn create(config: &Config) -> Result<Publisher, CreateError> {
        config.validate()?;
        if !config.enable_kv_events {
            log(
                Level::Info,
                "kv events are disabled (enable_kv_events=false)",
            );
            return Ok(Publisher::disabled());
        }
        let security = Settings::from_config(config)?;
        let described = security.describe();
        let shared = Arc::new(Shared::new(
            EventQueue::new(config.queue_capacity as usize),
            config.emit_object_key,
        ));
        let peers = Arc::clone(&shared.counters.peers);
        let setup = |what: &str| {
            let what = what.to_owned();
            move |reason: String| CreateError::Setup { what, reason }
        };
        let context = zmq::Context::new();
        let socket = context
            .socket(zmq::XPUB)
            .map_err(|e| setup("the PUB socket")(e.to_string()))?;
        // A failed create must not wait for anything: nothing was sent yet. Every
        // subscription reaches the publishing thread, which refuses all but the empty topic.
        let options = socket
            .set_linger(0)
            .and_then(|()| socket.set_xpub_verbose(true))
            .and_then(|()| socket.set_sndhwm(config.send_hwm as i32));
        options.map_err(|e| setup("the PUB socket")(e.to_string()))?;
        security
            .secure(&socket, MAX_SUBSCRIPTION_BYTES)
            .map_err(setup("the PUB socket"))?;
        let replay_socket = if config.replay_endpoint.is_empty() {
            None
        } else {
            let router = context
                .socket(zmq::ROUTER)
                .map_err(|e| setup("the replay socket")(e.to_string()))?;
            replay::prepare(&router).map_err(setup("the replay socket"))?;
            security
                .secure(&router, MAX_REQUEST_BYTES)
                .map_err(setup("the replay socket"))?;
            Some(router)
        };
        let listeners = Arc::new(Listeners::default());
        let watched: Vec<&zmq::Socket> = std::iter::once(&socket)
            .chain(replay_socket.as_ref())
            .collect();
        let guard = security
            .watch(
                &context,
                &watched,
                Arc::clone(&peers),
                Arc::clone(&listeners),
            )
            .map_err(setup("the connection watch"))?;
        let bind = |socket: &zmq::Socket, field: &'static str, endpoint: &str| {
            security
                .bind(socket, endpoint)
                .map_err(|reason| CreateError::Endpoint {
                    field,
                    endpoint: endpoint.to_owned(),
                    reason,
                })
        };
        bind(&socket, "kv_events_bind_endpoint", &config.bind_endpoint)?;
        let incarnation = incarnation();
        let source = Arc::new(SourceSlot::default());
        let (ring, replay) = match replay_socket {
            None => (None, None),
            Some(router) => {
                bind(
                    &router,
                    "kv_events_replay_endpoint",
                    &config.replay_endpoint,
                )?;
                let ring = Arc::new(Ring::new(config.replay_buffer_bytes, Arc::clone(&peers)));
                let identity = Identity {
                    incarnation,
                    backend_id: config.backend_id.clone(),
                    dp_rank: config.dp_rank,
                };
                let taken = Arc::clone(&ring);
                let snapshots = Snapshots {
                    source: Arc::clone(&source),
                    context: snapshot::Context {
                        config: Arc::new(config.clone()),
                        incarnation,
                        sequence_now: Arc::new(move || taken.last_taken()),
                    },
                };
                let server = Server::start(
                    router,
                    config.replay_endpoint.clone(),
                    Arc::clone(&ring),
                    identity,
                    snapshots,
                )
                .map_err(|e| setup("the thread kv-events-replay")(e.to_string()))?;
                (Some(ring), Some(server))
            }
        };
        let outlet = Outlet {
            socket,
            endpoint: config.bind_endpoint.clone(),
            listeners,
            ring,
        };
        let worker = Worker::spawn(Arc::clone(&shared), outlet, Encoder::new(config))
            .map_err(|e| setup("the publishing thread")(e.to_string()))?;
        shared.queue.set_consumer(worker.thread().clone());
        log(
            Level::Info,
            &format!(
                "kv events publisher started: {config}; incarnation {incarnation}; \
                 subscribers: {described}"
            ),
        );
        if let Some(configured) = security.limit_lowered_from {
            log(
                Level::Warn,
                &format!(
                    "kv_events_max_connections={configured} is more than half the process's \
                     descriptor limit (ulimit -n): the publisher holds at most {} connections",
                    security.limits.total
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
        Ok(Publisher {
            enabled: Some(Enabled {
                shared,
                worker: Mutex::new(Some(worker)),
                replay: Mutex::new(replay),
                guard: Mutex::new(Some(guard)),
                next_scan: AtomicU64::new(1),
                incarnation,
                source,
            }),
        })
    }

    /// Registers where snapshots get their objects, replacing the source registered before
    /// (which is dropped once no snapshot uses it). Snapshots are served on the replay socket
    /// (`kv_events_replay_endpoint`); without one, or when the publisher is disabled, the
    /// source is kept but never called. See [`ObjectSource`] for what it must do.
    pub fn set_object_source(&self, source: impl ObjectSource + 'static) {
        if let Some(enabled) = &self.enabled {
            let mut slot = enabled
                .source
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            *slot = Some(Arc::new(source));
        }
    }

    /// Unregisters the object source: snapshots are then refused, with a reply saying so.
    pub fn remove_object_source(&self) {
        if let Some(enabled) = &self.enabled {
            *enabled
                .source
                .write()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// Whether calls publish anything.
    pub fn is_enabled(&self) -> bool {
        self.enabled.is_some()
    }

    /// A Put, BatchPut or Upsert committed: `stored` for every medium in `media`, even one
    /// already announced. Empty `media`: nothing.
    pub fn on_put_commit(
        &self,
        tenant: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
        group: impl AsRef<[u8]>,
        media: MediumSet,
    ) {
        self.announce(
            tenant.as_ref(),
            key.as_ref(),
            group.as_ref(),
            MediumSet::EMPTY,
            media,
        );
    }

    /// Any other mutation: `removed` for each medium in `before − after`, then `stored` for
    /// each in `after − before`. Equal sets: nothing.
    pub fn on_medium_delta(
        &self,
        tenant: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
        group: impl AsRef<[u8]>,
        before: MediumSet,
        after: MediumSet,
    ) {
        let (removed, stored) = (before.minus(after), after.minus(before));
        self.announce(
            tenant.as_ref(),
            key.as_ref(),
            group.as_ref(),
            removed,
            stored,
        );
    }

    fn announce(
        &self,
        tenant: &[u8],
        key: &[u8],
        group: &[u8],
        removed: MediumSet,
        stored: MediumSet,
    ) {
        let Some(enabled) = &self.enabled else { return };
        let shared = &enabled.shared;
        let events = removed.len() + stored.len();
        if events == 0 {
            return;
        }
        if key.is_empty() || !shared.emit_object_key {
            Counters::add(&shared.counters.skipped_keyless_events, events);
            return;
        }
        match ObjectEvents::new(tenant, key, group, removed, stored, &shared.strings) {
            Some(object) => shared.push(Record::Object(object)),
            None => Counters::add(&shared.counters.dropped_events, events),
        }
    }

    /// Takes the token of a RemoveAll that is about to start its loop.
    pub fn begin_remove_all(&self) -> RemoveAllScan {
        let Some(enabled) = &self.enabled else {
            return RemoveAllScan(0);
        };
        let scan = enabled.next_scan.fetch_add(1, Relaxed);
        // A full queue loses the marker rather than an event; the scan is then unknown to
        // the publishing thread and its `cleared` is suppressed, which is always safe.
        let _ = enabled.shared.queue.push_if_room(Record::ScanBegin(scan));
        RemoveAllScan(scan)
    }

    /// The RemoveAll loop of `scan` finished for `tenant`. Emits one `cleared` only when
    /// `objects_removed > 0`, `objects_skipped == 0` and no call added a medium to the tenant
    /// since the scan began; otherwise counts it in `cleared_suppressed`.
    ///
    /// The last condition is decided by the publishing thread, which sees calls in stream
    /// order: a `stored` is never followed by a `cleared` that would wipe it.
    pub fn on_remove_all(
        &self,
        scan: &RemoveAllScan,
        tenant: impl AsRef<[u8]>,
        objects_removed: u64,
        objects_skipped: u64,
    ) {
        let Some(enabled) = &self.enabled else { return };
        let shared = &enabled.shared;
        if objects_removed == 0 || objects_skipped > 0 {
            Counters::add(&shared.counters.cleared_suppressed, 1);
            return;
        }
        shared.push(Record::Cleared(ClearedEvent {
            tenant: tenant.as_ref().into(),
            scan: scan.0,
        }));
    }

    /// The counters so far; all zero and `enabled: false` when disabled.
    pub fn stats(&self) -> Stats {
        match &self.enabled {
            None => Stats::default(),
            Some(e) => e.shared.counters.snapshot(
                e.shared.queue.len(),
                e.shared.queue.capacity(),
                e.incarnation,
            ),
        }
    }

    /// [`Publisher::stats`] as one JSON object.
    pub fn status_json(&self) -> String {
        self.stats().to_json()
    }

    /// [`Publisher::stats`] in the Prometheus text format, for the master's `/metrics`.
    pub fn metrics_text(&self) -> String {
        self.stats().to_prometheus()
    }

    /// Waits until everything queued before the call is handed to the socket: true if so
    /// within `timeout`, false if the time ran out, events queued before it were dropped, or
    /// the publisher is shut down. A disabled publisher has nothing to flush: true.
    pub fn flush(&self, timeout: Duration) -> bool {
        let Some(enabled) = &self.enabled else {
            return true;
        };
        let shared = &enabled.shared;
        let deadline = Instant::now() + timeout;
        let (done, sent) = mpsc::sync_channel(1);
        let mut marker = Record::Flush(done);
        loop {
            if shared.is_closing() {
                return false;
            }
            match shared.queue.push_if_room(marker) {
                Ok(()) => break,
                Err(_) if Instant::now() >= deadline => return false,
                Err(back) => {
                    marker = back;
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        // A marker pushed out by a full queue drops its sender: that ends the wait too.
        match sent.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Stops accepting calls, sends what is queued within the shutdown linger, and joins the
    /// publishing thread. Calls made from now on are counted as dropped. Idempotent; dropping
    /// the publisher does the same.
    pub fn shutdown(&self) {
        let Some(enabled) = &self.enabled else { return };
        let shared = &enabled.shared;
        shared.closing.store(true, SeqCst);
        shared.queue.wake();
        let worker = enabled
            .worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
        drop(
            enabled
                .replay
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        // The sockets are closed: no handshake is left to check.
        drop(
            enabled
                .guard
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        // A call that saw the publisher open may have pushed after the thread's last look.
        shared.stopped.store(true, SeqCst);
        let late = shared.drop_queued();
        if late > 0 {
            log(
                Level::Warn,
                &format!("{late} events arrived during shutdown and were dropped"),
            );
        }
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

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Enabled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enabled").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ObjectEvents;
    use crate::media::Medium;

    fn object(key: &str) -> Record {
        let both = MediumSet::EMPTY.with(Medium::Cpu).with(Medium::Disk);
        Record::Object(
            ObjectEvents::new(
                b"t",
                key.as_bytes(),
                b"",
                MediumSet::EMPTY,
                both,
                StringPool::for_tests(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn a_push_that_lands_after_shutdown_drained_the_queue_is_counted_as_dropped() {
        // The state a caller meets when it passed the closing check, then was descheduled
        // while shutdown joined the thread and drained: its push must not stay queued.
        let shared = Shared::new(EventQueue::new(4), true);
        shared.push(object("before"));
        shared.stopped.store(true, SeqCst);
        shared.push(object("late"));
        assert_eq!(shared.queue.len(), 0);
        assert_eq!(shared.counters.dropped_events.load(Relaxed), 4);
    }

    #[test]
    fn while_running_a_push_stays_queued() {
        let shared = Shared::new(EventQueue::new(4), true);
        shared.push(object("k"));
        assert_eq!(shared.queue.len(), 1);
        assert_eq!(shared.counters.dropped_events.load(Relaxed), 0);
    }
}
