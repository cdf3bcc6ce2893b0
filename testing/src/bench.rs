//! What the benchmarks share that needs nothing of the library's internals: the key shapes of
//! `cpp_tests/bench/shapes.tsv` (the one definition, which kv_events_bench and the scripts read
//! too), and a publisher with nobody listening.

use mooncake_kv_events::{Config, Publisher};
use std::sync::LazyLock;

/// The tenant, key and group of one kind of call, as the benchmarks drive them: a line of
/// `cpp_tests/bench/shapes.tsv`, whose header says what each field means.
#[derive(Clone, Copy, Debug)]
pub struct KeyShape {
    /// What `--shape` and the benchmark ids call it.
    pub name: &'static str,
    /// The tenant id of every call.
    pub tenant: &'static str,
    /// The group id of every call.
    pub group: &'static str,
    /// The key's text before its hex digits.
    pub prefix: &'static str,
    /// How many hex digits the key has between its prefix and its suffix.
    pub digits: usize,
    /// The key's text after its hex digits.
    pub suffix: &'static str,
    /// Where the library's queue holds a call's strings: `inline`, `pooled` or `heap`.
    pub strings: &'static str,
    /// One line on what the shape stands for.
    pub about: &'static str,
}

const SHAPES_TSV: &str = include_str!("../../cpp_tests/bench/shapes.tsv");

static SHAPES: LazyLock<Vec<KeyShape>> = LazyLock::new(|| {
    SHAPES_TSV
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&'static str> = line.split('\t').collect();
            let [name, tenant, group, prefix, digits, suffix, strings, about] = fields[..] else {
                panic!("shapes.tsv: not 8 tab-separated fields: {line:?}");
            };
            let digits = digits
                .parse()
                .unwrap_or_else(|_| panic!("shapes.tsv: {name}: digits {digits:?}"));
            KeyShape {
                name,
                tenant,
                group,
                prefix,
                digits,
                suffix,
                strings,
                about,
            }
        })
        .collect()
});

/// Every shape of `shapes.tsv`, in its order (the first is the default of `--shape`).
pub fn shapes() -> &'static [KeyShape] {
    &SHAPES
}

/// The shape called `name`.
///
/// # Panics
///
/// If `shapes.tsv` has no such shape.
pub fn shape(name: &str) -> &'static KeyShape {
    shapes()
        .iter()
        .find(|shape| shape.name == name)
        .unwrap_or_else(|| panic!("shapes.tsv has no shape {name}"))
}

impl KeyShape {
    /// Key number `i`: the shape's prefix, the 16 hex digits of `i` repeated to the shape's
    /// number of digits, its suffix; so that every key of a run differs as a content hash
    /// would.
    pub fn key(&self, i: u64) -> Vec<u8> {
        let hex = format!("{i:016x}");
        let mut key = Vec::with_capacity(self.key_len());
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend(hex.bytes().cycle().take(self.digits));
        key.extend_from_slice(self.suffix.as_bytes());
        key
    }

    /// Bytes of each key.
    pub fn key_len(&self) -> usize {
        self.prefix.len() + self.digits + self.suffix.len()
    }

    /// Bytes of tenant, key and group of one call.
    pub fn strings_len(&self) -> usize {
        self.tenant.len() + self.key_len() + self.group.len()
    }

    /// Whether a call of this shape allocates, even in steady state (`strings` is `heap`).
    pub fn allocates(&self) -> bool {
        self.strings == "heap"
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
