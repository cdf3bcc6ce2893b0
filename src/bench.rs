//! Entry points for the criterion benchmarks into what the public API hides (`--features
//! bench`); not part of the library's interface.

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

impl FullQueue {
    /// `capacity` calls of `on_put_commit(tenant, key, group, {cpu})`.
    pub fn new(capacity: usize, tenant: &[u8], key: &[u8], group: &[u8]) -> FullQueue {
        use crate::media::MediumSet;
        use crate::publisher::queue::{EventQueue, Record};
        use crate::publisher::record::ObjectEvents;
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

/// An enabled publisher on an ipc endpoint of this process's own, with no subscriber.
pub fn publisher(name: &str) -> crate::Publisher {
    crate::Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: format!("ipc:///tmp/kv-events-{name}-{}.sock", std::process::id()),
        backend_id: "bench".into(),
        ..Config::default()
    })
    .expect("a publisher on a fresh ipc endpoint")
}

/// The tenant, key and group of one kind of call, as the benchmarks drive them.
#[derive(Clone, Copy, Debug)]
pub struct KeyShape {
    /// What `--shape` and the benchmark ids call it.
    pub name: &'static str,
    /// The tenant id of every call.
    pub tenant: &'static str,
    /// The group id of every call.
    pub group: &'static str,
    key_len: usize,
    prefix: &'static str,
    suffix: &'static str,
}

/// A realistic tenant and group: 32 bytes between them.
const TENANT: &str = "acme-inference-prod";
const GROUP: &str = "tp8-node-0017";

/// vLLM's Mooncake connector: `model@tp_rank:N@pcpN@dcpN@pp_rank:N@group:N@<64 hex>`.
const VLLM_PREFIX: &str = "meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@";

/// The shapes `scripts/bench.sh` runs, none of which allocates per call in steady state.
/// `kv_events_bench --shape` builds the same keys.
pub const SHAPES: [KeyShape; 4] = [
    KeyShape {
        name: "synthetic64",
        tenant: "tenant-a",
        group: "group-1",
        key_len: 64,
        prefix: "",
        suffix: "",
    },
    KeyShape {
        name: "vllm",
        tenant: TENANT,
        group: GROUP,
        key_len: VLLM_PREFIX.len() + 64,
        prefix: VLLM_PREFIX,
        suffix: "",
    },
    KeyShape {
        name: "sglang",
        tenant: TENANT,
        group: GROUP,
        key_len: 68,
        prefix: "",
        suffix: "@tp3",
    },
    KeyShape {
        name: "max256",
        tenant: TENANT,
        group: GROUP,
        key_len: 256 - TENANT.len() - GROUP.len(),
        prefix: "",
        suffix: "",
    },
];

/// Shapes beyond what a pooled block holds: they cost an allocation per call and must stay
/// lossless.
pub const LONGER_SHAPES: [KeyShape; 2] = [
    KeyShape {
        name: "key1k",
        tenant: TENANT,
        group: GROUP,
        key_len: 1024,
        prefix: "",
        suffix: "",
    },
    KeyShape {
        name: "key1m",
        tenant: TENANT,
        group: GROUP,
        key_len: 1 << 20,
        prefix: "",
        suffix: "",
    },
];

impl KeyShape {
    /// Key number `i`: the shape's prefix and suffix around hex digits of `i`, repeated to
    /// the shape's length, so that every key of a run differs as a content hash would.
    pub fn key(&self, i: u64) -> Vec<u8> {
        let digits = self.key_len - self.prefix.len() - self.suffix.len();
        let hex = format!("{i:016x}");
        let mut key = Vec::with_capacity(self.key_len);
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend(hex.bytes().cycle().take(digits));
        key.extend_from_slice(self.suffix.as_bytes());
        key
    }

    /// Bytes of tenant, key and group of one call.
    pub fn strings_len(&self) -> usize {
        self.tenant.len() + self.key_len + self.group.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::pool::BLOCK_BYTES;

    #[test]
    fn shapes_have_the_lengths_their_names_promise() {
        let lens: Vec<_> = SHAPES
            .iter()
            .chain(&LONGER_SHAPES)
            .map(|s| (s.name, s.key(7).len(), s.strings_len()))
            .collect();
        assert_eq!(
            lens,
            [
                ("synthetic64", 64, 79),
                ("vllm", 135, 167),
                ("sglang", 68, 100),
                ("max256", 224, 256),
                ("key1k", 1024, 1056),
                ("key1m", 1 << 20, (1 << 20) + 32),
            ]
        );
        assert!(SHAPES.iter().all(|s| s.strings_len() <= BLOCK_BYTES));
        assert!(LONGER_SHAPES.iter().all(|s| s.strings_len() > BLOCK_BYTES));
        let vllm = String::from_utf8(SHAPES[1].key(0xab)).unwrap();
        assert!(vllm.starts_with("meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@"));
        assert!(vllm.ends_with(
            "@group:0@00000000000000ab00000000000000ab00000000000000ab00000000000000ab"
        ));
        assert_ne!(SHAPES[2].key(1), SHAPES[2].key(2));
        assert!(SHAPES[2].key(1).ends_with(b"@tp3"));
    }
}
