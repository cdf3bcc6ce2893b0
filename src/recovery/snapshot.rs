//! Snapshots: every object readable now, for a subscriber that joins late or lost its way.
//!
//! The publisher keeps no per-object state, so the master registers an [`ObjectSource`]
//! that enumerates what it holds. A snapshot runs on a thread of its own,
//! `kv-events-snapshot` (never a master thread, never the publishing thread), one at a time
//! per publisher, for every requester of its scope (`fanout`). The source adds objects to
//! [`Snapshot`], which writes them as the stream would (`stored` events, one per medium, an
//! object's events in one message of at most 64, alone when its strings are not UTF-8, the
//! configured context and legacy fields) and hands each message to the replay thread through
//! a bounded channel. No fixed pace: it goes as fast as its requesters read (the channel and
//! what the replay thread keeps are bounded, so a slow reader makes `add` wait, never a
//! master's caller), and it yields whenever the callers' queue holds more than
//! [`LIVE_FIRST`] calls, so that the live stream keeps its rate.
//!
//! Why applying a snapshot, then every stream message numbered from its `next_sequence` N on,
//! gives the master's state: N is the sequence the publishing thread would take next before
//! the source reads anything, every number below it taken by a message or for dropped events,
//! so everything numbered below N happened before the snapshot began; the publishing thread
//! numbers drops between batches, where they stand in the stream, never ahead of a batch it
//! holds (`worker.rs`). The master changes an object and makes the call that announces it
//! under the same lock that the source takes to copy the object out. A change the source saw
//! was announced by a message that is either below N (sent before the snapshot began, so
//! already in the state the snapshot shows) or at least N (applied again; events are
//! absolute, so applying one again changes nothing). A change the source did not see came
//! after it copied that object, so after the snapshot began: its message is at least N, and
//! applying it brings the object up to date. A message from N on that was lost is a gap the
//! subscriber sees.

use crate::config::Config;
use crate::error::CreateError;
use crate::event::{Event, EventKind};
use crate::media::{Medium, MediumSet};
use crate::threads;
use crate::wire::encode::{needs_own_message, Encoder, DEFAULT_TENANT, MAX_BATCH_EVENTS};
use crate::wire::SnapshotEnd;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Calls waiting in the publisher's queue past which a snapshot waits for the publishing
/// thread to catch up: the live stream goes first.
const LIVE_FIRST: usize = 1024;
/// How long a snapshot waits, each time, for the live stream.
const LIVE_FIRST_WAIT: Duration = Duration::from_micros(200);
/// Messages written ahead of what the requester's socket took: with 64 events of a few
/// hundred bytes each, a few MiB at most.
const AHEAD: usize = 256;

/// Where a snapshot's objects come from: the master's metadata.
///
/// [`objects`](ObjectSource::objects) is called on the library's thread
/// `kv-events-snapshot`, one snapshot at a time. It should copy the entries of one part of
/// the metadata (a shard) under that part's lock, release the lock, then add them: [`add`]
/// may wait for the requester to read, and a lock held meanwhile would stall the master.
/// The changes the master announces must be made under the locks the source copies under,
/// so that each object is seen either before or after a change, not in the middle.
///
/// [`add`]: Snapshot::add
pub trait ObjectSource: Send + Sync {
    /// Adds every object readable now, of `tenant` only when given (its `tenant_id` as on
    /// the wire; objects of other tenants are left out by the library anyway). Stops when
    /// [`Snapshot::add`] says the snapshot was abandoned. An error is sent to the requester,
    /// as its text.
    fn objects(&self, tenant: Option<&[u8]>, snapshot: &mut Snapshot) -> Result<(), SourceError>;
}

/// Why an [`ObjectSource`] could not list the objects: any error of the master's (a `String`,
/// [`Abandoned`] or its own type, through `?`). The library sends its text to the requester.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

impl<F> ObjectSource for F
where
    F: Fn(Option<&[u8]>, &mut Snapshot) -> Result<(), SourceError> + Send + Sync,
{
    fn objects(&self, tenant: Option<&[u8]>, snapshot: &mut Snapshot) -> Result<(), SourceError> {
        self(tenant, snapshot)
    }
}

/// The snapshot was given up (its requester stopped reading or left, or the publisher is
/// stopping): the source should return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned;

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the snapshot was abandoned")
    }
}

impl std::error::Error for Abandoned {}

/// What a snapshot thread hands the replay thread.
#[derive(Debug)]
pub(crate) enum Piece {
    /// A `snapshot` message's payload.
    Batch(Arc<[u8]>),
    /// The `snapshot-end` map, with the number of objects sent.
    End(Arc<[u8]>, u64),
    /// The text of an `error` reply: the source failed.
    Failed(Arc<[u8]>),
}

/// One `stored` event waiting for its message; its strings are in [`Snapshot::bytes`].
#[derive(Debug)]
struct Pending {
    medium: Medium,
    tenant: Range<usize>,
    key: Range<usize>,
    group: Range<usize>,
}

/// The objects of one snapshot under way, as the source adds them.
pub struct Snapshot {
    scope: Option<Vec<u8>>,
    emit_object_key: bool,
    encoder: Encoder,
    pending: Vec<Pending>,
    bytes: Vec<u8>,
    out: SyncSender<Piece>,
    live_backlog: Arc<dyn Fn() -> usize + Send + Sync>,
    objects: u64,
    events: u64,
    abandoned: bool,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("scope", &self.scope)
            .field("objects", &self.objects)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// Adds one readable object: a `stored` event for each medium of `media`. An empty key
    /// is left out, as on the stream, and so is an object the stream leaves out for a string
    /// that is not UTF-8 (`kv_events_non_utf8=skip`). `Err(Abandoned)` once the snapshot was
    /// given up.
    pub fn add(
        &mut self,
        tenant: &[u8],
        key: &[u8],
        group: &[u8],
        media: MediumSet,
    ) -> Result<(), Abandoned> {
        if self.abandoned {
            return Err(Abandoned);
        }
        let wire_tenant = if tenant.is_empty() {
            DEFAULT_TENANT
        } else {
            tenant
        };
        let in_scope = self.scope.as_deref().is_none_or(|s| s == wire_tenant);
        if !in_scope || key.is_empty() || media.is_empty() || !self.emit_object_key {
            return Ok(());
        }
        let event = Event {
            kind: EventKind::Stored,
            medium: None,
            tenant,
            key,
            group,
        };
        // An object's events travel together, as a call's do on the stream, and alone when
        // a string is not UTF-8, or not at all.
        let alone = needs_own_message(&event);
        if alone && self.encoder.skips_non_utf8() {
            return Ok(());
        }
        self.objects += 1;
        if alone || self.pending.len() + media.len() > MAX_BATCH_EVENTS {
            self.send_pending()?;
        }
        for medium in media.iter() {
            let mut keep = |s: &[u8]| {
                let start = self.bytes.len();
                self.bytes.extend_from_slice(s);
                start..self.bytes.len()
            };
            let (tenant, key, group) = (keep(tenant), keep(key), keep(group));
            self.pending.push(Pending {
                medium,
                tenant,
                key,
                group,
            });
        }
        if alone {
            self.send_pending()?;
        }
        Ok(())
    }

    fn send_pending(&mut self) -> Result<(), Abandoned> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let bytes = &self.bytes;
        let events = self.pending.iter().map(|p| Event {
            kind: EventKind::Stored,
            medium: Some(p.medium),
            tenant: &bytes[p.tenant.clone()],
            key: &bytes[p.key.clone()],
            group: &bytes[p.group.clone()],
        });
        let mut payload = Vec::with_capacity(self.bytes.len() + 64 * self.pending.len() + 16);
        self.encoder
            .encode_batch(now_ms(), self.pending.len(), events, &mut payload);
        self.events += self.pending.len() as u64;
        self.pending.clear();
        self.bytes.clear();
        while (self.live_backlog)() > LIVE_FIRST {
            thread::sleep(LIVE_FIRST_WAIT);
        }
        self.out.send(Piece::Batch(payload.into())).map_err(|_| {
            self.abandoned = true;
            Abandoned
        })
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What a snapshot needs besides its source and scope.
#[derive(Clone)]
pub(crate) struct Context {
    pub(crate) config: Arc<Config>,
    pub(crate) incarnation: u64,
    /// The N of a snapshot starting now: see the module's documentation.
    pub(crate) next_sequence: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// Calls waiting in the publisher's queue now.
    pub(crate) live_backlog: Arc<dyn Fn() -> usize + Send + Sync>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("incarnation", &self.incarnation)
            .finish_non_exhaustive()
    }
}

/// Starts a snapshot of `scope` (every tenant when `None`) from `source` on the thread
/// `kv-events-snapshot`; its messages come out of the returned receiver, the last one an
/// [`Piece::End`] or a [`Piece::Failed`]. Dropping the receiver abandons it.
pub(crate) fn start(
    source: Arc<dyn ObjectSource>,
    scope: Option<Vec<u8>>,
    context: &Context,
) -> Result<(Receiver<Piece>, JoinHandle<()>), CreateError> {
    let (out, pieces) = sync_channel(AHEAD);
    let context = context.clone();
    let thread = threads::spawn("kv-events-snapshot", move || {
        run(&*source, scope, &context, out)
    })?;
    Ok((pieces, thread))
}

fn run(
    source: &dyn ObjectSource,
    scope: Option<Vec<u8>>,
    context: &Context,
    out: SyncSender<Piece>,
) {
    let next_sequence = (context.next_sequence)();
    let mut snapshot = Snapshot {
        scope: scope.clone(),
        emit_object_key: context.config.emit_object_key,
        encoder: Encoder::new(&context.config),
        pending: Vec::with_capacity(MAX_BATCH_EVENTS),
        bytes: Vec::new(),
        out: out.clone(),
        live_backlog: Arc::clone(&context.live_backlog),
        objects: 0,
        events: 0,
        abandoned: false,
    };
    // The master's empty tenant goes on the wire as "default", so a snapshot of "default"
    // asks the source for everything and keeps what the wire would call "default".
    let hint = scope.as_deref().filter(|s| *s != DEFAULT_TENANT);
    let enumerated = catch_unwind(AssertUnwindSafe(|| source.objects(hint, &mut snapshot)));
    let last = match enumerated {
        Ok(Ok(())) => match snapshot.send_pending() {
            Ok(()) => Piece::End(
                SnapshotEnd {
                    next_sequence,
                    objects: snapshot.objects,
                    events: snapshot.events,
                    incarnation: context.incarnation,
                    tenant: scope,
                }
                .encode()
                .into(),
                snapshot.objects,
            ),
            Err(Abandoned) => return,
        },
        Ok(Err(_)) if snapshot.abandoned => return,
        Ok(Err(why)) => Piece::Failed(format!("the object source failed: {why}").as_bytes().into()),
        Err(_) => Piece::Failed(Arc::from(&b"the object source panicked"[..])),
    };
    let _ = out.send(last);
}
