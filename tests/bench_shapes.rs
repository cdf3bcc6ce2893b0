//! The benchmarks' key shapes (`kv_events_testing::bench`) have the lengths their names
//! promise, and only the longer ones outgrow a block of the library's string pool. Needs
//! `--features bench` for the library's block size.

use kv_events_testing::bench::{LONGER_SHAPES, SHAPES};
use mooncake_kv_events::bench::BLOCK_BYTES;

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
    assert!(
        vllm.ends_with("@group:0@00000000000000ab00000000000000ab00000000000000ab00000000000000ab")
    );
    assert_ne!(SHAPES[2].key(1), SHAPES[2].key(2));
    assert!(SHAPES[2].key(1).ends_with(b"@tp3"));
}
