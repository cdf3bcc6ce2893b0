//! Blocks for the strings of calls too long to ride in a queue slot.

use crate::wire::encode::MAX_BATCH_EVENTS;
use crossbeam_queue::ArrayQueue;
use std::cell::UnsafeCell;
use std::ptr::NonNull;

/// The most bytes of tenant, key and group that one pooled block holds.
pub(crate) const BLOCK_BYTES: usize = 256;

/// Calls in progress at one instant that a publisher's pool covers beyond its queue (each
/// holds one block outside it); calls beyond them, only while the queue is full of long
/// calls, take the heap.
pub(crate) const CALLERS: usize = 1024;

/// One block in the slab: four cache lines, aligned on one, so that a vLLM call's 167 bytes
/// take three.
#[repr(C, align(64))]
struct Slot(UnsafeCell<[u8; BLOCK_BYTES]>);

/// A block taken from a [`StringPool`]: its holder's alone until given back.
#[derive(Debug)]
pub(crate) struct Block(NonNull<[u8; BLOCK_BYTES]>);

// SAFETY: a block is the only handle on its bytes (the pool hands an index out once until it
// comes back), so moving it to another thread moves the exclusive access with it.
unsafe impl Send for Block {}

impl Block {
    pub(crate) fn bytes(&self) -> &[u8; BLOCK_BYTES] {
        // SAFETY: the slab outlives every block taken from it (`StringPool`'s drop keeps it
        // while one is out), and this block's bytes are its holder's alone.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8; BLOCK_BYTES] {
        // SAFETY: as in `bytes`; `&mut self` is the holder's exclusive access.
        unsafe { self.0.as_mut() }
    }
}

/// A bounded lock-free pool of [`Block`]s, all in one allocation (the slab) made and touched
/// when the publisher is created: callers take one for a call whose strings are longer than a
/// slot holds, and the publishing thread gives it back once the call's events are sent, or a
/// caller once it pushed the call out of a full queue.
///
/// Taking and giving back are one `ArrayQueue` pop or push of a block's index each (a
/// compare-and-swap). A publisher's pool has a block for every slot of its queue, every call
/// of a batch the publishing thread holds and [`CALLERS`] calls in progress, so no call
/// allocates, whatever the queue's depth. An empty pool (a test's small one, or more callers
/// at one instant than it covers) is not an error: the caller then allocates.
pub(crate) struct StringPool {
    /// Every block; freed only once they are all back (see `Drop`).
    slab: NonNull<[Slot]>,
    /// Indices of the blocks not taken, oldest given back first.
    free: ArrayQueue<u32>,
}

// SAFETY: the slab's bytes are reached only through blocks, each held by one thread at a time
// (the free list hands an index to one taker); the free list is itself thread-safe.
unsafe impl Send for StringPool {}
// SAFETY: as above.
unsafe impl Sync for StringPool {}

impl StringPool {
    /// A pool of `blocks` blocks (at least one, at most `u32::MAX`), `blocks × 256` bytes
    /// resident from now on.
    pub(crate) fn new(blocks: usize) -> StringPool {
        let blocks = blocks.clamp(1, u32::MAX as usize);
        let slab: Box<[Slot]> = (0..blocks)
            .map(|_| Slot(UnsafeCell::new([0; BLOCK_BYTES])))
            .collect();
        // Touched now: the first calls that fill the queue must not take a page fault each
        // sixteen blocks (docs/performance.md). One write a page, since the compiler may turn
        // the zeroing above into an allocation of zeroed memory that is not resident yet.
        for slot in slab.iter().step_by(4096 / size_of::<Slot>()) {
            // SAFETY: the slab is ours alone until it is shared below.
            unsafe { std::ptr::write_volatile(slot.0.get().cast::<u8>(), 0) };
        }
        let free = ArrayQueue::new(blocks);
        for index in 0..blocks as u32 {
            let _ = free.push(index);
        }
        StringPool {
            slab: NonNull::from(Box::leak(slab)),
            free,
        }
    }

    /// The pool of a queue of `capacity` calls: a block for each of them, for each call of a
    /// batch the publishing thread holds (one more in hand), and for [`CALLERS`] calls in
    /// progress. A default queue's pool is 66,625 blocks, 17.1 MB.
    pub(crate) fn for_queue(capacity: usize) -> StringPool {
        StringPool::new(capacity + MAX_BATCH_EVENTS + 1 + CALLERS)
    }

    fn slots(&self) -> &[Slot] {
        // SAFETY: the slab lives as long as the pool, and `Slot`s are only shared.
        unsafe { self.slab.as_ref() }
    }

    /// A block, or `None` when every block is in use.
    pub(crate) fn take(&self) -> Option<Block> {
        let index = self.free.pop()?;
        let bytes = self.slots()[index as usize].0.get();
        // SAFETY: a pointer into the slab is not null.
        Some(Block(unsafe { NonNull::new_unchecked(bytes) }))
    }

    /// Returns `block` for another call. A block of another pool is not taken (it stays out of
    /// its own, whose slab is then never freed).
    pub(crate) fn give_back(&self, block: Block) {
        let slots = self.slots();
        let offset = (block.0.as_ptr() as usize).wrapping_sub(slots.as_ptr() as usize);
        let index = offset / size_of::<Slot>();
        if index < slots.len() {
            let _ = self.free.push(index as u32);
        }
    }

    /// Blocks in all.
    pub(crate) fn blocks(&self) -> usize {
        self.free.capacity()
    }

    /// Blocks free now.
    pub(crate) fn free(&self) -> usize {
        self.free.len()
    }

    /// One small pool for the tests that only need records of short strings.
    #[cfg(test)]
    pub(crate) fn for_tests() -> &'static StringPool {
        static POOL: std::sync::LazyLock<StringPool> =
            std::sync::LazyLock::new(|| StringPool::new(1));
        &POOL
    }
}

impl Drop for StringPool {
    /// Frees the slab once every block is back. A block still out (a record dropped without
    /// being recycled: a bug) keeps the slab alive for good rather than point into freed memory.
    fn drop(&mut self) {
        if self.free.len() == self.blocks() {
            // SAFETY: the slab came from `Box::leak` in `new`, and no block points into it.
            drop(unsafe { Box::from_raw(self.slab.as_ptr()) });
        }
    }
}

impl std::fmt::Debug for StringPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StringPool")
            .field("blocks", &self.blocks())
            .field("free", &self.free())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_back_and_an_empty_pool_says_so() {
        let pool = StringPool::new(2);
        assert_eq!(pool.free(), 2);
        let (mut a, b) = (pool.take().unwrap(), pool.take().unwrap());
        assert!(pool.take().is_none());
        a.bytes_mut()[255] = 7;
        assert_eq!(a.bytes()[255], 7);
        assert_ne!(a.bytes().as_ptr(), b.bytes().as_ptr());
        pool.give_back(a);
        pool.give_back(b);
        assert_eq!(pool.free(), 2);
        assert_eq!(StringPool::new(0).free(), 1);
    }

    #[test]
    fn a_block_of_another_pool_is_not_taken() {
        let (pool, other) = (StringPool::new(1), StringPool::new(1));
        let foreign = other.take().unwrap();
        pool.give_back(foreign);
        assert_eq!((pool.free(), other.free()), (1, 0));
    }

    #[test]
    fn a_queue_s_pool_covers_its_slots_a_batch_and_the_callers() {
        let pool = StringPool::for_queue(65_536);
        assert_eq!(pool.blocks(), 65_536 + 64 + 1 + 1024);
        assert_eq!(size_of::<Slot>(), BLOCK_BYTES);
        let taken: Vec<Block> = std::iter::from_fn(|| pool.take()).collect();
        assert_eq!(taken.len(), pool.blocks());
        let first = taken[0].bytes().as_ptr() as usize;
        assert_eq!(first % 64, 0, "blocks start on a cache line");
        for block in taken {
            pool.give_back(block);
        }
        assert_eq!(pool.free(), pool.blocks());
    }
}
