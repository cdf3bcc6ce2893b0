//! What the benchmarks share that needs nothing of the library's internals: the key shapes
//! and a publisher with nobody listening.

use mooncake_kv_events::{Config, Publisher};

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

/// An enabled publisher on an ipc endpoint of this process's own, with no subscriber.
pub fn publisher(name: &str) -> Publisher {
    Publisher::create(&Config {
        enable_kv_events: true,
        bind_endpoint: format!("ipc:///tmp/kv-events-{name}-{}.sock", std::process::id()),
        backend_id: "bench".into(),
        ..Config::default()
    })
    .expect("a publisher on a fresh ipc endpoint")
}
