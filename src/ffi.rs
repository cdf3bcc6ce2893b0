//! The way the library's C++ layer (`cpp/kv_events.cc`, which implements the exported C API of
//! `include/mooncake/kv_events_c.h`) reaches the publisher: the `cxx` bridge declarations, then
//! thin adapters from its plain types to the crate's own. `Config` and `Stats` cross as they
//! are: each is the shared struct of a bridge in its own module (`config/mod.rs`, `stats.rs`),
//! which this bridge names. Nothing here does the work.
//!
//! Strings cross as bytes, never `rust::Str`, so keys that are not UTF-8 reach the wire
//! unchanged and nothing throws. The calls' strings cross as pointer and length rather than
//! `rust::Slice`, whose out-of-line constructor C++ reads back through a stalled
//! store-to-load forward, once per string per call. The calls the master makes under its
//! locks catch any panic here: a panic that reached C++ would abort the master.

use crate::logging::{self, Level};
use crate::{
    Config, CreateError, MediumSet, ObjectSource, Publisher, RemoveAllScan, Snapshot, SourceError,
    Stats,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

// cxx makes every name of the bridge `pub`, though nothing outside the crate uses them.
#[allow(unreachable_pub)]
#[cxx::bridge(namespace = "mooncake::kv_events::bridge")]
mod bridge {
    unsafe extern "C++" {
        include!("mooncake-kv-events/src/config/mod.rs.h");

        /// `crate::Config`, the shared struct of the bridge in `config/mod.rs`.
        type Config = crate::Config;

        include!("mooncake-kv-events/src/stats.rs.h");

        /// `crate::Stats`, the shared struct of the bridge in `stats.rs`.
        type Stats = crate::Stats;

        include!("cpp/log_sink.h");

        /// The master's log sink (`cpp/log_sink.h`); thread-safe by the C API's contract.
        /// Dropping it hands its context back to the master.
        type LogSink;
        /// `level`: 0 debug, 1 info, 2 warning, 3 error.
        fn write(self: &LogSink, level: u8, message: &[u8]);

        include!("cpp/object_source.h");

        /// The master's object source (`cpp/object_source.h`); dropping it hands its context
        /// back to the master.
        type ObjectSource;
        /// Adds the objects of `tenant` (of every tenant when `every_tenant`) to `snapshot`;
        /// 0 when it succeeded.
        fn objects(
            self: &ObjectSource,
            tenant: &[u8],
            every_tenant: bool,
            snapshot: &mut Snapshot,
        ) -> i32;
    }

    extern "Rust" {
        type RustPublisher;
        type Snapshot;

        /// Sends every publisher's log lines to `sink`; a null sink restores the default.
        fn set_log_sink(sink: UniquePtr<LogSink>);

        /// Validates `config` (reading its key files, once) and starts a publisher from it.
        /// The error names what failed; `invalid_config` says whether it was the config
        /// (a flag, a key file) rather than the start (an endpoint, a socket, a thread).
        fn create_publisher(
            config: &Config,
            invalid_config: &mut bool,
        ) -> Result<Box<RustPublisher>>;
        /// A publisher whose calls do nothing, for a disabled config.
        fn disabled_publisher() -> Box<RustPublisher>;

        // Media sets cross as the caller's bits: 1 is cpu, 2 is disk, any other is counted
        // in invalid_media_calls and ignored.

        /// # Safety
        /// Each pointer and length is a string of the C API's caller: `len` readable bytes, or
        /// any pointer with `len` 0.
        #[allow(clippy::too_many_arguments)]
        unsafe fn on_put_commit(
            self: &RustPublisher,
            tenant: *const u8,
            tenant_len: usize,
            key: *const u8,
            key_len: usize,
            group: *const u8,
            group_len: usize,
            media: u8,
        );
        /// # Safety
        /// As `on_put_commit`.
        #[allow(clippy::too_many_arguments)]
        unsafe fn on_medium_delta(
            self: &RustPublisher,
            tenant: *const u8,
            tenant_len: usize,
            key: *const u8,
            key_len: usize,
            group: *const u8,
            group_len: usize,
            before: u8,
            after: u8,
        );
        fn begin_remove_all(self: &RustPublisher) -> u64;
        /// # Safety
        /// As `on_medium_delta`.
        unsafe fn on_remove_all(
            self: &RustPublisher,
            scan: u64,
            tenant: *const u8,
            tenant_len: usize,
            objects_removed: u64,
            objects_skipped: u64,
        );
        fn stats(self: &RustPublisher) -> Stats;
        fn status_json(self: &RustPublisher) -> String;
        fn metrics_text(self: &RustPublisher) -> String;
        fn flush(self: &RustPublisher, timeout_ms: u64) -> bool;
        fn shutdown(self: &RustPublisher);
        /// Registers the master's object source; a null one unregisters.
        fn set_object_source(self: &RustPublisher, source: UniquePtr<ObjectSource>);

        /// Adds one object to a snapshot under way; false once it was abandoned.
        ///
        /// # Safety
        /// As `on_medium_delta`.
        #[allow(clippy::too_many_arguments)]
        unsafe fn snapshot_add(
            snapshot: &mut Snapshot,
            tenant: *const u8,
            tenant_len: usize,
            key: *const u8,
            key_len: usize,
            group: *const u8,
            group_len: usize,
            media: u8,
        ) -> bool;
    }
}

use bridge::LogSink;
use cxx::UniquePtr;

/// The publisher as C++ holds it.
#[derive(Debug)]
pub(crate) struct RustPublisher(Publisher);

fn create_publisher(
    config: &Config,
    invalid_config: &mut bool,
) -> Result<Box<RustPublisher>, CreateError> {
    let settings = config.validate().inspect_err(|_| *invalid_config = true)?;
    Publisher::start(settings).map(|p| Box::new(RustPublisher(p)))
}

fn disabled_publisher() -> Box<RustPublisher> {
    Box::new(RustPublisher(Publisher::disabled()))
}

// SAFETY: the C API requires the master's sink to be callable from any thread at once, and
// `LogSink::write` is a const call of a function pointer with its context.
unsafe impl Send for LogSink {}
// SAFETY: as above.
unsafe impl Sync for LogSink {}

fn set_log_sink(sink: UniquePtr<LogSink>) {
    if sink.is_null() {
        return logging::remove_log_sink();
    }
    logging::set_log_sink(move |level, message| {
        let level = match level {
            Level::Debug => 0,
            Level::Info => 1,
            Level::Warn => 2,
            Level::Error => 3,
        };
        if let Some(sink) = sink.as_ref() {
            sink.write(level, message.as_bytes());
        }
    });
}

// SAFETY: the C API requires the master's source to be callable from a library thread, one
// snapshot at a time; `objects` is a const call of a function pointer with its context.
unsafe impl Send for bridge::ObjectSource {}
// SAFETY: as above.
unsafe impl Sync for bridge::ObjectSource {}

impl std::fmt::Debug for bridge::ObjectSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the master's object source")
    }
}

/// The master's object source as the publisher calls it.
impl ObjectSource for UniquePtr<bridge::ObjectSource> {
    fn objects(&self, tenant: Option<&[u8]>, snapshot: &mut Snapshot) -> Result<(), SourceError> {
        let Some(source) = self.as_ref() else {
            return Ok(());
        };
        match source.objects(tenant.unwrap_or_default(), tenant.is_none(), snapshot) {
            0 => Ok(()),
            rc => Err(format!("it returned {rc}").into()),
        }
    }
}

/// # Safety
/// As `RustPublisher::on_medium_delta`.
#[allow(clippy::too_many_arguments)]
unsafe fn snapshot_add(
    snapshot: &mut Snapshot,
    tenant: *const u8,
    tenant_len: usize,
    key: *const u8,
    key_len: usize,
    group: *const u8,
    group_len: usize,
    media: u8,
) -> bool {
    // SAFETY: the bridge's contract: strings of the caller, alive during the call.
    let (tenant, key, group) = unsafe {
        (
            view(tenant, tenant_len),
            view(key, key_len),
            view(group, group_len),
        )
    };
    let media = MediumSet::from_bits(media);
    catch_unwind(AssertUnwindSafe(|| {
        snapshot.add(tenant, key, group, media).is_ok()
    }))
    .unwrap_or(false)
}

/// Runs a call the master makes under its locks; a panic is swallowed rather than abort the
/// master (the call's events are then lost; nothing here is known to panic).
fn contained(call: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(call));
}

/// The bytes of a C API string passed as pointer and length.
///
/// # Safety
/// Unless `len` is 0 (when `data` may be null), `data` points to `len` bytes that stay
/// readable and unchanged for `'a`.
unsafe fn view<'a>(data: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: as the caller promised; u8 needs no alignment.
    unsafe { std::slice::from_raw_parts(data, len) }
}

impl RustPublisher {
    #[allow(clippy::too_many_arguments)]
    unsafe fn on_put_commit(
        &self,
        tenant: *const u8,
        tenant_len: usize,
        key: *const u8,
        key_len: usize,
        group: *const u8,
        group_len: usize,
        media: u8,
    ) {
        // SAFETY: the bridge's contract: strings of the caller, alive during the call.
        let (tenant, key, group) = unsafe {
            (
                view(tenant, tenant_len),
                view(key, key_len),
                view(group, group_len),
            )
        };
        contained(|| self.0.on_put_commit_bits(tenant, key, group, media));
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn on_medium_delta(
        &self,
        tenant: *const u8,
        tenant_len: usize,
        key: *const u8,
        key_len: usize,
        group: *const u8,
        group_len: usize,
        before: u8,
        after: u8,
    ) {
        // SAFETY: the bridge's contract: strings of the caller, alive during the call.
        let (tenant, key, group) = unsafe {
            (
                view(tenant, tenant_len),
                view(key, key_len),
                view(group, group_len),
            )
        };
        contained(|| {
            self.0
                .on_medium_delta_bits(tenant, key, group, before, after)
        });
    }

    fn begin_remove_all(&self) -> u64 {
        catch_unwind(AssertUnwindSafe(|| self.0.begin_remove_all().id())).unwrap_or(0)
    }

    unsafe fn on_remove_all(
        &self,
        scan: u64,
        tenant: *const u8,
        tenant_len: usize,
        objects_removed: u64,
        objects_skipped: u64,
    ) {
        // SAFETY: as in `on_medium_delta`.
        let tenant = unsafe { view(tenant, tenant_len) };
        let scan = RemoveAllScan::from_id(scan);
        contained(|| {
            self.0
                .on_remove_all(&scan, tenant, objects_removed, objects_skipped)
        });
    }

    fn stats(&self) -> Stats {
        self.0.stats()
    }

    fn status_json(&self) -> String {
        self.0.status_json()
    }

    fn metrics_text(&self) -> String {
        self.0.metrics_text()
    }

    fn flush(&self, timeout_ms: u64) -> bool {
        self.0.flush(Duration::from_millis(timeout_ms))
    }

    fn shutdown(&self) {
        self.0.shutdown();
    }

    fn set_object_source(&self, source: UniquePtr<bridge::ObjectSource>) {
        if source.is_null() {
            self.0.remove_object_source();
        } else {
            self.0.set_object_source(source);
        }
    }
}
