//! `mooncake_kv_events._native`: the library's [`Follower`] for the Python package. The
//! package validates what it is given and shapes what comes back (python/src); this module
//! only moves values across: plain tuples, dicts and bytes, and the package's exceptions
//! (`mooncake_kv_events._errors`) for what goes wrong.
//!
//! The follower sits behind a mutex: `poll` holds it without the GIL (other Python threads
//! and an asyncio loop run meanwhile), and a reader on another thread waits for it without
//! the GIL too.

use mooncake_kv_events::subscriber::{
    CurveClient, FollowOptions, Follower, FollowerCounters, Index, Notice, NoticeKind, Status,
    Upstream,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Raises the package's exception `name` (a class of `mooncake_kv_events._errors`) with
/// `args`.
fn raise<'py, T>(py: Python<'py>, name: &str, args: impl IntoPyObject<'py>) -> PyResult<T> {
    let class = py.import("mooncake_kv_events._errors")?.getattr(name)?;
    let error = class.call1((args,))?;
    Err(PyErr::from_value(error))
}

/// Seconds as a [`Duration`]; the package passes only finite, non-negative ones.
fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value).unwrap_or(Duration::ZERO)
}

/// A notice as the package's `Notice` takes it: (upstream, kind, text, numbers, took).
type NoticeTuple = (
    usize,
    &'static str,
    String,
    Vec<(&'static str, u64)>,
    Option<f64>,
);

/// What `poll` hands back: its notices, and with `keep_applied` the messages applied, as
/// (upstream, incarnation, sequence, payload).
type Polled = (Vec<NoticeTuple>, Vec<(usize, u64, u64, Vec<u8>)>);

/// A notice's kind as the package's `NoticeKind` values name it, its one-line text, its
/// numbers by name, and how long it took, in seconds, when it says.
fn notice_of(notice: Notice) -> NoticeTuple {
    let text = notice.kind.to_string();
    let (kind, numbers, took) = match notice.kind {
        NoticeKind::Snapshot {
            objects,
            events,
            next_sequence,
            incarnation,
            took,
        } => (
            "snapshot",
            vec![
                ("objects", objects as u64),
                ("events", events),
                ("next_sequence", next_sequence),
                ("incarnation", incarnation),
            ],
            Some(took),
        ),
        NoticeKind::Replayed {
            from,
            through,
            took,
        } => (
            "replayed",
            vec![("from", from), ("through", through)],
            Some(took),
        ),
        NoticeKind::NotHeld {
            from,
            through,
            oldest,
        } => (
            "not_held",
            vec![("from", from), ("through", through), ("oldest", oldest)],
            None,
        ),
        NoticeKind::ReplayShort {
            from,
            through,
            next,
        } => (
            "replay_short",
            vec![("from", from), ("through", through), ("next", next)],
            None,
        ),
        NoticeKind::NewIncarnation { old, new } => {
            ("new_incarnation", vec![("old", old), ("new", new)], None)
        }
        NoticeKind::SequenceBack { last, sequence } => (
            "sequence_back",
            vec![("last", last), ("sequence", sequence)],
            None,
        ),
        NoticeKind::Unrecoverable { from, through } => (
            "unrecoverable",
            vec![("from", from), ("through", through)],
            None,
        ),
        NoticeKind::InSync { took } => ("in_sync", Vec::new(), Some(took)),
        NoticeKind::Disconnected => ("disconnected", Vec::new(), None),
        NoticeKind::Malformed(_) => ("malformed", Vec::new(), None),
        NoticeKind::Skipped(_) => ("skipped", Vec::new(), None),
        NoticeKind::Failed(_) => ("failed", Vec::new(), None),
        // The reason alone: the package words the refusal (its `Refused`).
        NoticeKind::Refused(why) => {
            return (notice.upstream, "refused", why, Vec::new(), None);
        }
    };
    let took = took.map(|d| d.as_secs_f64());
    (notice.upstream, kind, text, numbers, took)
}

/// One publisher's counters by name; durations in seconds.
fn counters_dict<'py>(py: Python<'py>, c: &FollowerCounters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, value) in [
        ("messages", c.messages),
        ("events", c.events),
        ("discarded", c.discarded),
        ("gaps", c.gaps),
        ("unrecoverable", c.unrecoverable),
        ("replays", c.replays),
        ("replayed_messages", c.replayed_messages),
        ("snapshots", c.snapshots),
        ("incarnations", c.incarnations),
        ("malformed", c.malformed),
        ("skipped_events", c.skipped_events),
        ("failed_requests", c.failed_requests),
        ("overflowed", c.overflowed),
        ("convergences", c.convergences),
    ] {
        d.set_item(name, value)?;
    }
    d.set_item(
        "last_convergence",
        c.last_convergence.map(|d| d.as_secs_f64()),
    )?;
    d.set_item("longest_convergence", c.longest_convergence.as_secs_f64())?;
    Ok(d)
}

/// (endpoint, incarnation, next_sequence, in_sync, seconds since last heard, failing).
type StatusTuple = (
    String,
    Option<u64>,
    Option<u64>,
    bool,
    Option<f64>,
    Option<String>,
);

fn status_tuple(status: Status, now: Instant) -> StatusTuple {
    (
        status.endpoint,
        status.incarnation,
        status.next_sequence,
        status.in_sync,
        status
            .last_heard
            .map(|t| now.saturating_duration_since(t).as_secs_f64()),
        status.failing,
    )
}

/// An object as the package's `Object` takes it: (tenant, key, media names).
type ObjectTuple = (Vec<u8>, Vec<u8>, Vec<&'static str>);

/// Every object of `index`, in byte order of tenant then key.
fn objects_of(index: &Index) -> Vec<ObjectTuple> {
    index
        .iter()
        .map(|(tenant, key, media)| {
            (
                tenant.to_vec(),
                key.to_vec(),
                media.iter().map(|m| m.as_str()).collect(),
            )
        })
        .collect()
}

/// The library's follower; see the module's documentation. Every argument is checked by
/// the package before it comes here.
#[pyclass(module = "mooncake_kv_events._native")]
struct NativeFollower {
    /// `None` once closed.
    follower: Mutex<Option<Follower>>,
    upstreams: usize,
}

impl NativeFollower {
    /// Runs `f` on the follower with its lock held and without the GIL (so that a reader
    /// waiting for a `poll` of another thread holds up no Python thread); KvEventsError once
    /// closed.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Follower) -> T + Send,
    ) -> PyResult<T> {
        let done = py.detach(|| {
            // A panic while it was held cannot have left the follower in a state worse than
            // losing it: go on with it.
            let mut guard = self.follower.lock().unwrap_or_else(|e| e.into_inner());
            guard.as_mut().map(f)
        });
        match done {
            Some(value) => Ok(value),
            None => raise(
                py,
                "KvEventsError",
                "this follower is closed: make a new one",
            ),
        }
    }

    fn check(&self, py: Python<'_>, upstream: usize) -> PyResult<()> {
        if upstream >= self.upstreams {
            return raise(
                py,
                "KvEventsError",
                format!("no upstream {upstream}: there are {}", self.upstreams),
            );
        }
        Ok(())
    }

    /// Runs `f` on the index of `upstream`, or on every upstream's merged when `None`.
    fn with_index<T: Send>(
        &self,
        py: Python<'_>,
        upstream: Option<usize>,
        f: impl FnOnce(&Index) -> T + Send,
    ) -> PyResult<T> {
        if let Some(i) = upstream {
            self.check(py, i)?;
        }
        self.with(py, |follower| match upstream {
            Some(i) => f(follower.index(i)),
            None => f(&follower.union()),
        })
    }
}

#[pymethods]
impl NativeFollower {
    /// `upstreams`: (endpoint, replay endpoint or None, topic) each; `curve`: (the publisher's
    /// .pub file, this subscriber's .key file) or None.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        upstreams: Vec<(String, Option<String>, Vec<u8>)>,
        curve: Option<(String, String)>,
        rcvhwm: i32,
        max_message_bytes: usize,
        request_timeout: f64,
        retry_after: f64,
        quiet_check: f64,
        max_held: usize,
        max_held_bytes: usize,
        keep_applied: bool,
    ) -> PyResult<NativeFollower> {
        let curve = match curve {
            None => None,
            Some((server, secret)) => {
                match CurveClient::from_files(Path::new(&server), Path::new(&secret)) {
                    Ok(curve) => Some(curve),
                    Err(why) => return raise(py, "KvEventsError", why.to_string()),
                }
            }
        };
        let count = upstreams.len();
        let upstreams = upstreams
            .into_iter()
            .map(|(endpoint, replay_endpoint, topic)| Upstream {
                endpoint,
                replay_endpoint,
                curve: curve.clone(),
                topic,
            })
            .collect();
        let options = FollowOptions {
            rcvhwm,
            max_message_bytes,
            request_timeout: seconds(request_timeout),
            retry_after: seconds(retry_after),
            quiet_check: seconds(quiet_check),
            max_held,
            max_held_bytes,
            track_changes: false,
            keep_applied,
        };
        match py.detach(|| Follower::new(upstreams, options)) {
            Ok(follower) => Ok(NativeFollower {
                follower: Mutex::new(Some(follower)),
                upstreams: count,
            }),
            Err(why) => raise(py, "KvEventsError", why.to_string()),
        }
    }

    /// Polls for up to `timeout` seconds without the GIL; the notices, and the messages
    /// applied when `keep_applied` is on.
    fn poll(&self, py: Python<'_>, timeout: f64) -> PyResult<Polled> {
        let timeout = seconds(timeout);
        self.with(py, |follower| {
            let notices = follower.poll(timeout);
            let applied = follower
                .take_applied()
                .into_iter()
                .map(|m| (m.upstream, m.incarnation, m.sequence, m.payload))
                .collect();
            (notices.into_iter().map(notice_of).collect(), applied)
        })
    }

    /// Closes the sockets; every call after raises KvEventsError.
    fn close(&self, py: Python<'_>) {
        // Dropping closes the sockets; after a poll of another thread, which holds the lock.
        py.detach(|| {
            let closed = self
                .follower
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            drop(closed);
        });
    }

    /// Where each upstream stands, in the order given.
    fn statuses(&self, py: Python<'_>) -> PyResult<Vec<StatusTuple>> {
        let count = self.upstreams;
        self.with(py, |follower| {
            let now = Instant::now();
            (0..count)
                .map(|i| status_tuple(follower.status(i), now))
                .collect()
        })
    }

    /// The counters of `upstream`, or of every one added up when None.
    #[pyo3(signature = (upstream=None))]
    fn counters<'py>(
        &self,
        py: Python<'py>,
        upstream: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if let Some(i) = upstream {
            self.check(py, i)?;
        }
        let counters = self.with(py, |follower| match upstream {
            Some(i) => follower.upstream_counters(i).clone(),
            None => follower.counters(),
        })?;
        counters_dict(py, &counters)
    }

    /// Whether every upstream's index is in sync.
    fn in_sync(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |follower| follower.in_sync())
    }

    /// The upstream in sync heard from last; None when none is in sync.
    fn freshest(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        self.with(py, |follower| follower.freshest())
    }

    /// Every object of `upstream`'s index (None: every index merged), in byte order of
    /// tenant then key.
    #[pyo3(signature = (upstream=None))]
    fn objects(&self, py: Python<'_>, upstream: Option<usize>) -> PyResult<Vec<ObjectTuple>> {
        self.with_index(py, upstream, objects_of)
    }

    /// How many objects `upstream`'s index holds (None: every index merged).
    #[pyo3(signature = (upstream=None))]
    fn count(&self, py: Python<'_>, upstream: Option<usize>) -> PyResult<usize> {
        self.with_index(py, upstream, Index::objects)
    }

    /// The media `key` of `tenant` is readable on in `upstream`'s index.
    fn get(
        &self,
        py: Python<'_>,
        upstream: usize,
        tenant: &[u8],
        key: &[u8],
    ) -> PyResult<Vec<&'static str>> {
        self.with_index(py, Some(upstream), |index| {
            index.get(tenant, key).iter().map(|m| m.as_str()).collect()
        })
    }

    /// `upstream`'s index (None: every index merged) as JSON lines, byte for byte what
    /// `kv-events mirror --dump` writes.
    #[pyo3(signature = (upstream=None))]
    fn json_lines<'py>(
        &self,
        py: Python<'py>,
        upstream: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        // Writing to a Vec cannot fail.
        self.with_index(py, upstream, |index| index.write_json_lines(&mut out))?
            .expect("writing to memory");
        Ok(PyBytes::new(py, &out))
    }
}

/// The module: `NativeFollower`.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<NativeFollower>()
}
