//! Entry points for the criterion benchmarks into what the public API hides (`--features
//! bench`); not part of the library's interface. Only what needs the crate's internals is here:
//! what needs only its API (the key shapes, a publisher with nobody listening) is
//! `kv_events_testing::bench`.

use crate::config::Config;
use crate::event::{Event, EventKind};
use crate::media::Medium;
use crate::wire::encode::{Encoder, MAX_BATCH_EVENTS};

/// Encodes full batches of one kind of event with a 64-byte key, as the publishing thread does.
#[derive(Debug)]
pub struct EncodeBatches {
    encoder: Encoder,
    kind: EventKind,
    key: Vec<u8>,
    out: Vec<u8>,
}

impl EncodeBatches {
    /// A realistic context: model, block size and backend set, legacy fields as asked.
    pub fn new(kind: EventKind, legacy: bool) -> EncodeBatches {
        let config = Config {
            backend_id: "mooncake-store-0".into(),
            model_name: "meta-llama/Llama-3.1-8B-Instruct".into(),
            block_size: 16,
            emit_legacy_compat: legacy,
            ..Config::default()
        };
        EncodeBatches {
            encoder: Encoder::new(&config),
            kind,
            key: vec![b'k'; 64],
            out: Vec::new(),
        }
    }

    /// Events per call of [`EncodeBatches::encode`].
    pub const EVENTS: usize = MAX_BATCH_EVENTS;

    /// Encodes one batch of [`EncodeBatches::EVENTS`] events; returns its size in bytes.
    pub fn encode(&mut self) -> usize {
        let cleared = self.kind == EventKind::Cleared;
        let event = Event {
            kind: self.kind,
            medium: (!cleared).then_some(Medium::Cpu),
            tenant: b"tenant-a",
            key: if cleared { b"" } else { &self.key },
            group: if cleared { b"" } else { b"group-1" },
        };
        let events = std::iter::repeat_n(event, Self::EVENTS);
        self.encoder
            .encode_batch(1_764_000_000_000, Self::EVENTS, events, &mut self.out);
        self.out.len()
    }
}

/// A queue filled to capacity with one-medium calls, as a flood leaves it when the publishing
/// thread cannot keep up, with the string pool a publisher gives it. Dropping it frees
/// everything.
#[derive(Debug)]
pub struct FullQueue {
    queue: crate::publisher::queue::EventQueue,
    /// Held so that what a full queue costs includes its pool, as a publisher's does.
    _strings: crate::publisher::pool::StringPool,
}

impl Drop for FullQueue {
    /// Gives the queued calls' blocks back, as the publishing thread would: the pool frees its
    /// memory only once every block is back.
    fn drop(&mut self) {
        while let Some(record) = self.queue.pop() {
            record.recycle(&self._strings);
        }
    }
}

impl FullQueue {
    /// `capacity` calls of `on_put_commit(tenant, key, group, {cpu})`.
    pub fn new(capacity: usize, tenant: &[u8], key: &[u8], group: &[u8]) -> FullQueue {
        use crate::media::MediumSet;
        use crate::publisher::queue::EventQueue;
        use crate::publisher::record::ObjectEvents;
        use crate::publisher::record::Record;
        let queue = EventQueue::new(capacity);
        let strings = crate::publisher::pool::StringPool::for_queue(capacity);
        let cpu = MediumSet::from([Medium::Cpu]);
        for _ in 0..capacity {
            let object = ObjectEvents::new(tenant, key, group, MediumSet::EMPTY, cpu, &strings);
            queue.push(Record::Object(object.expect("small strings")));
        }
        FullQueue {
            queue,
            _strings: strings,
        }
    }

    /// Calls queued now.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.len() == 0
    }
}

/// The most bytes of tenant, key and group a queued call carries in its slot; more, up to
/// [`BLOCK_BYTES`], take a block of the string pool.
pub const INLINE_BYTES: usize = crate::publisher::record::INLINE_BYTES;

/// The most bytes of tenant, key and group a block of the string pool holds; more always take
/// an allocation of their own.
pub const BLOCK_BYTES: usize = crate::publisher::pool::BLOCK_BYTES;
