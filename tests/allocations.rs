//! A call whose tenant, key and group fit in 256 bytes allocates nothing on the caller's
//! thread, whatever the queue's depth: a global allocator counts the allocations of each thread.

use kv_events_testing::{config, endpoint};
use mooncake_kv_events::{Medium, MediumSet, Publisher};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Barrier;

/// The system allocator, counting the allocations each thread makes.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: defers to the system allocator; the count does not affect allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: a thread being torn down has no counter left, and is not counted.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const TENANT: &str = "acme-inference-prod";
const GROUP: &str = "tp8-node-0017";
/// The default queue's capacity: each of the two threads makes twice as many calls.
const CAPACITY: usize = 65_536;

/// Key `i` of `len` bytes: hex digits of `i`, repeated.
fn key(i: usize, len: usize) -> Vec<u8> {
    format!("{i:016x}").bytes().cycle().take(len).collect()
}

#[test]
fn calls_of_up_to_256_bytes_allocate_nothing_even_into_a_full_queue() {
    let publisher = Publisher::create(&config(&endpoint())).expect("the publisher binds");
    assert_eq!(publisher.stats().queue_capacity, CAPACITY as u64);
    // 256 bytes of tenant, key and group: the most a call carries without allocating.
    let key_len = 256 - TENANT.len() - GROUP.len();
    let cpu = MediumSet::from([Medium::Cpu]);
    let start = Barrier::new(2);
    let counted: Vec<u64> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|thread| {
                let (publisher, start) = (&publisher, &start);
                s.spawn(move || {
                    let keys: Vec<Vec<u8>> =
                        (0..1024).map(|i| key(thread << 20 | i, key_len)).collect();
                    start.wait();
                    let before = allocations();
                    for call in 0..2 * CAPACITY {
                        publisher.on_put_commit(TENANT, &keys[call % keys.len()], GROUP, cpu);
                    }
                    allocations() - before
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(publisher.flush(std::time::Duration::from_secs(30)));
    let stats = publisher.stats();
    // A call is dropped only when it is pushed out of a full queue.
    assert!(
        stats.dropped_events > 0,
        "the queue never filled: {stats:?}"
    );
    assert_eq!(
        stats.published_events + stats.dropped_events,
        4 * CAPACITY as u64
    );
    assert_eq!(counted, [0, 0], "allocations on each calling thread");

    // The count is no artefact: a call of 257 bytes allocates its strings' block.
    let before = allocations();
    publisher.on_put_commit(TENANT, key(0, key_len + 1), GROUP, cpu);
    assert!(allocations() > before + 1, "the key, then the call's block");
}
