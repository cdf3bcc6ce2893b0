//! What a queued event costs in memory: every allocation is counted while the default queue
//! (65,536 calls) is filled.
//!
//! `cargo bench --features bench --bench memory` prints, for each key shape, the allocations
//! a full default queue makes, the bytes per queued call besides its key, tenant and group,
//! and the total: shapes up to 256 bytes of strings ride in the queue's slots (one
//! allocation, the ring), longer ones need a heap block per call.

use mooncake_kv_events::bench::{FullQueue, KeyShape, LONGER_SHAPES, SHAPES};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

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

/// glibc's malloc adds 8 bytes to a request and rounds the chunk up to 16.
fn glibc_chunk(request: usize) -> usize {
    (request + 8).div_ceil(16).max(2) * 16
}

fn main() {
    println!("full default queue ({CAPACITY} calls of on_put_commit), per key shape:");
    println!(
        "| shape | strings B | allocations | per call besides strings B | with malloc overhead B | full queue MB |"
    );
    println!("|---|---|---|---|---|---|");
    // key1m is left out: a full queue of them is 64 GiB.
    for shape in SHAPES.iter().chain(&LONGER_SHAPES[..1]) {
        measure(shape);
    }
}

const CAPACITY: usize = 65_536;

fn measure(shape: &KeyShape) {
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

    // One allocation is the queue's ring of slots; any other holds one call's strings.
    let string_blocks = allocations - 1;
    let besides = requested - CAPACITY * strings;
    let overhead = (glibc_chunk(strings) - strings) * string_blocks;
    println!(
        "| {} | {strings} | {allocations} | {} | {} | {:.1} |",
        shape.name,
        besides / CAPACITY,
        (besides + overhead) / CAPACITY,
        (requested + overhead) as f64 / 1e6
    );
}
