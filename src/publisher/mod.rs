//! The publisher: the handle the master holds (the three calls, stats, flush, shutdown) and
//! what stands behind it.
//!
//! A call turns into a [`record::Record`] (its strings in the record's slot, or in a block of
//! the `pool` when they are long) pushed onto the bounded lock-free `queue`, which the
//! callers and the publishing thread share with the counters and the shutdown protocol
//! (`shared`). The publishing thread (`worker`) takes records off in order, applies the
//! RemoveAll rule (`scan`), encodes batches and sends them. `start` wires an enabled
//! publisher: its sockets, the replay socket's thread, the publishing thread.

pub(crate) mod pool;
pub(crate) mod queue;
pub(crate) mod record;
mod scan;
mod shared;
mod start;
mod worker;

use crate::config::Config;
use crate::error::CreateError;
use crate::logging::{log, Level};
use crate::media::MediumSet;
use crate::recovery::replay::{Server, SourceSlot};
use crate::recovery::snapshot::ObjectSource;
use crate::stats::{BuildInfo, Counters, Stats};
use crate::transport::Guard;
use record::{ClearedEvent, ObjectEvents, Record};
use shared::Shared;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
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

    /// Validates `config` and starts a publisher from it ([`Config::validate`], then
    /// [`Publisher::start`]).
    pub fn create(config: &Config) -> Result<Publisher, CreateError> {
        Publisher::start(config.validate()?)
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
    /// already announced. Empty `media`: nothing, counted in `invalid_media_calls` (a
    /// committed object is readable somewhere).
    pub fn on_put_commit(
        &self,
        tenant: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
        group: impl AsRef<[u8]>,
        media: MediumSet,
    ) {
        self.put_commit(tenant.as_ref(), key.as_ref(), group.as_ref(), media, false);
    }

    /// [`Publisher::on_put_commit`] as the C API makes it: `media` is a bit mask (see
    /// [`MediumSet::from_bits`]) whose other bits are ignored, and a call that sets one is
    /// counted in `invalid_media_calls`.
    pub(crate) fn on_put_commit_bits(&self, tenant: &[u8], key: &[u8], group: &[u8], media: u8) {
        let set = MediumSet::from_bits(media);
        self.put_commit(tenant, key, group, set, set.bits() != media);
    }

    /// [`Publisher::on_medium_delta`] as the C API makes it, with bit masks as in
    /// [`Publisher::on_put_commit_bits`].
    pub(crate) fn on_medium_delta_bits(
        &self,
        tenant: &[u8],
        key: &[u8],
        group: &[u8],
        before: u8,
        after: u8,
    ) {
        let (known_before, known_after) =
            (MediumSet::from_bits(before), MediumSet::from_bits(after));
        if known_before.bits() != before || known_after.bits() != after {
            self.count_invalid_media();
        }
        self.on_medium_delta(tenant, key, group, known_before, known_after);
    }

    /// A commit of `media`; `unknown_bits` says that the caller's mask had bits beyond them.
    /// Either that or no medium at all makes the call one of `invalid_media_calls`.
    fn put_commit(
        &self,
        tenant: &[u8],
        key: &[u8],
        group: &[u8],
        media: MediumSet,
        unknown_bits: bool,
    ) {
        // A disabled publisher counts nothing and its calls cost a branch.
        if self.enabled.is_none() {
            return;
        }
        if unknown_bits || media.is_empty() {
            self.count_invalid_media();
        }
        self.announce(tenant, key, group, MediumSet::EMPTY, media);
    }

    fn count_invalid_media(&self) {
        if let Some(enabled) = &self.enabled {
            Counters::add(&enabled.shared.counters.invalid_media_calls, 1);
        }
    }

    /// Any other mutation: `removed` for each medium in `before − after`, then `stored` for
    /// each in `after − before`. Equal sets: nothing. With `kv_events_reannounce_remaining`,
    /// a call that removes a medium stores every medium of `after`, so the object's remaining
    /// media follow its `removed` in the same message.
    pub fn on_medium_delta(
        &self,
        tenant: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
        group: impl AsRef<[u8]>,
        before: MediumSet,
        after: MediumSet,
    ) {
        let Some(enabled) = &self.enabled else { return };
        let removed = before.minus(after);
        let stored = if enabled.shared.reannounce_remaining && !removed.is_empty() {
            after
        } else {
            after.minus(before)
        };
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
            Some(e) => e.shared.counters.stats(
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

    /// [`Publisher::stats`] in the Prometheus text format, for the master's `/metrics`, then
    /// [`BuildInfo::current`]'s metric.
    pub fn metrics_text(&self) -> String {
        self.stats().to_prometheus() + &BuildInfo::current().to_prometheus()
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
        shared.close();
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
        let late = shared.finish();
        if late > 0 {
            log(
                Level::Warn,
                &format!("{late} events arrived during shutdown and were dropped"),
            );
        }
    }
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
