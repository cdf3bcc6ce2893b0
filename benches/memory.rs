//! What a queued call costs in memory, and whether a call allocates.
//!
//! `cargo bench --features bench --bench memory` prints two tables, a row per key shape of
//! `cpp_tests/bench/shapes.tsv`:
//! - a full default queue (65,536 calls, no publishing thread): the allocations made to fill
//!   it, the bytes requested, and the bytes per queued call besides its tenant, key and group.
//!   Strings of up to 104 bytes ride in the queue's slots, up to 256 in the blocks of the
//!   string pool (a quarter as many as slots, allocated when the queue is made); a full queue
//!   of longer calls allocates for the calls beyond the pool, and longer strings always do;
//! - steady state: 100,000 calls through a real publisher that keeps up (its publishing
//!   thread running, the queue never full), counting every allocation of the process's Rust
//!   code, callers and publishing thread alike (libzmq's own, in C, are not counted);
//! - a subscriber's index of 1,000,000 objects of one tenant, stored on `cpu`: the heap it
//!   takes per object (what glibc's malloc handed out for it, headers, rounding and capacity
//!   not yet written included: resident memory would depend on what earlier rows freed), against
//!   a `HashMap<Vec<u8>, MediumSet>` with the same hasher (the index's layout before),
//!   for each key shape and the demo's short keys (`obj-` and 6 digits); and the time to
//!   store them, then remove them all, each way (keys made beforehand).

use kv_events_testing::bench::{shapes, KeyShape};
use mooncake_kv_events::bench::FullQueue;
use mooncake_kv_events::subscriber::Index;
use mooncake_kv_events::{Medium, MediumSet};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

/// The system allocator, counting the bytes it hands out (as requested, before rounding).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; the counters do not affect allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Relaxed);
        ALLOCATIONS.fetch_add(1, Relaxed);
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const CAPACITY: usize = 65_536;
const STEADY_CALLS: usize = 100_000;
const INDEX_OBJECTS: u64 = 1_000_000;

fn main() {
    println!("full default queue ({CAPACITY} calls of on_put_commit), per key shape:");
    println!("| shape | strings B | allocations | requested MB | per call besides strings B |");
    println!("|---|---|---|---|---|");
    for shape in shapes() {
        full_queue(shape);
    }
    println!("\nsteady state ({STEADY_CALLS} calls through a publisher that keeps up):");
    println!("| shape | allocations | per call |");
    println!("|---|---|---|");
    for shape in shapes() {
        steady_state(shape);
    }
    println!("\nan index of {INDEX_OBJECTS} objects, bytes per object:");
    println!(
        "| keys | key B | Index B | HashMap<Vec<u8>, MediumSet> B | ratio | \
         store + remove ns: Index | HashMap | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let demo = |i: u64| format!("obj-{i:06}").into_bytes();
    index_memory("demo (obj-NNNNNN)", &demo);
    for shape in shapes() {
        index_memory(shape.name, &|i| shape.key(i));
    }
}

/// Bytes glibc's malloc has handed out: chunks from its heaps and blocks it mapped.
fn allocated() -> usize {
    // SAFETY: mallinfo2 reads the allocator's statistics; no argument, no precondition.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks + info.hblkhd
}

fn index_memory(name: &str, key: &dyn Fn(u64) -> Vec<u8>) {
    let keys: Vec<Vec<u8>> = (0..INDEX_OBJECTS).map(key).collect();
    let per_object = |n: f64| n / INDEX_OBJECTS as f64;

    let started = Instant::now();
    let before = allocated();
    let mut index = Index::new();
    for key in &keys {
        index.store(b"tenant", key, Medium::Cpu);
    }
    let compact = allocated() - before;
    assert_eq!(index.objects() as u64, INDEX_OBJECTS);
    for key in &keys {
        index.remove(b"tenant", key, Medium::Cpu);
    }
    assert!(index.is_empty());
    let compact_ns = started.elapsed().as_nanos() as f64;
    drop(index);

    let started = Instant::now();
    let before = allocated();
    let mut map: HashMap<Vec<u8>, MediumSet, foldhash::fast::RandomState> = HashMap::default();
    for key in &keys {
        // As the index did: looked up first, the key copied only when new.
        match map.get_mut(key.as_slice()) {
            Some(media) => *media = media.with(Medium::Cpu),
            None => {
                map.insert(key.clone(), MediumSet::from([Medium::Cpu]));
            }
        }
    }
    let hashed = allocated() - before;
    assert_eq!(map.len() as u64, INDEX_OBJECTS);
    for key in &keys {
        map.remove(key.as_slice());
    }
    assert!(map.is_empty());
    let hashed_ns = started.elapsed().as_nanos() as f64;
    println!(
        "| {name} | {} | {:.1} | {:.1} | {:.2} | {:.0} | {:.0} | {:.2} |",
        keys[0].len(),
        per_object(compact as f64),
        per_object(hashed as f64),
        compact as f64 / hashed as f64,
        per_object(compact_ns),
        per_object(hashed_ns),
        compact_ns / hashed_ns
    );
}

fn full_queue(shape: &KeyShape) {
    let key = shape.key(0);
    let strings = shape.strings_len();
    let (tenant, group) = (shape.tenant.as_bytes(), shape.group.as_bytes());

    let (live_before, count_before) = (LIVE.load(Relaxed), ALLOCATIONS.load(Relaxed));
    let queue = FullQueue::new(CAPACITY, tenant, &key, group);
    let requested = LIVE.load(Relaxed) - live_before;
    let allocations = ALLOCATIONS.load(Relaxed) - count_before;
    assert_eq!(queue.len(), CAPACITY);
    drop(queue);
    assert_eq!(LIVE.load(Relaxed), live_before, "everything is freed");
    println!(
        "| {} | {strings} | {allocations} | {:.1} | {} |",
        shape.name,
        requested as f64 / 1e6,
        requested / CAPACITY - strings
    );
}

fn steady_state(shape: &KeyShape) {
    let publisher = kv_events_testing::bench::publisher("memory");
    let keys: Vec<Vec<u8>> = (0..1024).map(|i| shape.key(i)).collect();
    let cpu = MediumSet::from([Medium::Cpu]);
    let mut sent = 0;
    // Runs of 1,024 calls, each waited out until published, so the queue never fills.
    let mut calls = |n: usize| {
        for i in 0..n {
            publisher.on_put_commit(shape.tenant, &keys[i % 1024], shape.group, cpu);
            sent += 1;
            if i % 1024 == 1023 || i == n - 1 {
                while publisher.stats().published_events < sent {
                    std::hint::spin_loop();
                }
            }
        }
    };
    calls(20_000); // warm: the publishing thread's buffers have grown
    let before = ALLOCATIONS.load(Relaxed);
    calls(STEADY_CALLS);
    let allocations = ALLOCATIONS.load(Relaxed) - before;
    assert_eq!(publisher.stats().dropped_events, 0);
    println!(
        "| {} | {allocations} | {:.3} |",
        shape.name,
        allocations as f64 / STEADY_CALLS as f64
    );
}
