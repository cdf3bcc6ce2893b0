//! What a queued event costs in memory: every allocation is counted while the default queue
//! (65,536 calls) is filled.
//!
//! `cargo bench --features bench --bench memory` prints the bytes per queued event besides the
//! key, tenant and group bytes themselves, and the total for a full default queue, for keys
//! that fit inside a queue slot and for keys that do not.

use mooncake_kv_events::bench::FullQueue;
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
    // 64-byte keys travel inside the queue's slots; 256-byte keys need a heap block each.
    for key_len in [64, 256] {
        measure(key_len);
    }
}

fn measure(key_len: usize) {
    const CAPACITY: usize = 65_536;
    let (tenant, group) = (&b"tenant-a"[..], &b"group-1"[..]);
    let key = vec![b'k'; key_len];
    let strings = tenant.len() + key_len + group.len();

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
    println!("full default queue, {key_len}-byte keys, tenant and group of 8 and 7 bytes:");
    println!("  allocations:                      {allocations}");
    println!(
        "  requested bytes:                  {requested} ({:.1} MiB)",
        mib(requested)
    );
    println!(
        "  with glibc chunk overhead:        {:.1} MiB",
        mib(requested + overhead)
    );
    println!(
        "  bytes per queued event besides its strings: {} (slot and record), {} with malloc's overhead",
        besides / CAPACITY,
        (besides + overhead) / CAPACITY
    );
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
