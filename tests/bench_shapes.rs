//! The benchmarks' key shapes (`cpp_tests/bench/shapes.tsv`, read through
//! `kv_events_testing::bench`) have the lengths their names promise, and each one's `strings`
//! field says where the library's queue really holds its calls' strings. Needs `--features
//! bench` for the library's sizes.

use kv_events_testing::bench::{shape, shapes, KeyShape};
use mooncake_kv_events::bench::{BLOCK_BYTES, INLINE_BYTES};

#[test]
fn shapes_have_the_lengths_their_names_promise() {
    // key1m stands for keys far beyond a block: a key1k of a MiB, which no benchmark runs (a
    // full queue of them is 64 GiB).
    let key1m = KeyShape {
        name: "key1m",
        digits: 1 << 20,
        ..*shape("key1k")
    };
    let (pooled, longer): (Vec<KeyShape>, Vec<KeyShape>) = shapes()
        .iter()
        .copied()
        .chain([key1m])
        .partition(|s| !s.allocates());
    let lens: Vec<_> = pooled
        .iter()
        .chain(&longer)
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
    assert!(pooled.iter().all(|s| s.strings_len() <= BLOCK_BYTES));
    assert!(longer.iter().all(|s| s.strings_len() > BLOCK_BYTES));
    let vllm = String::from_utf8(shape("vllm").key(0xab)).unwrap();
    assert!(vllm.starts_with("meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@"));
    assert!(
        vllm.ends_with("@group:0@00000000000000ab00000000000000ab00000000000000ab00000000000000ab")
    );
    let sglang = shape("sglang");
    assert_ne!(sglang.key(1), sglang.key(2));
    assert!(sglang.key(1).ends_with(b"@tp3"));
}

#[test]
fn each_shape_says_where_the_queue_holds_its_strings() {
    for shape in shapes() {
        let held = match shape.strings_len() {
            n if n <= INLINE_BYTES => "inline",
            n if n <= BLOCK_BYTES => "pooled",
            _ => "heap",
        };
        assert_eq!(
            shape.strings,
            held,
            "{}: {} bytes",
            shape.name,
            shape.strings_len()
        );
    }
    assert_eq!(
        shapes()[0].name,
        "synthetic64",
        "the default shape comes first"
    );
}
