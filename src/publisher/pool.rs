//! Blocks for the strings of calls too long to ride in a queue slot.

use crossbeam_queue::ArrayQueue;

/// The most bytes of tenant, key and group that one pooled block holds.
pub(crate) const BLOCK_BYTES: usize = 256;

/// One block's bytes.
pub(crate) type Block = Box<[u8; BLOCK_BYTES]>;

/// A bounded lock-free pool of [`Block`]s, all allocated when the publisher is created:
/// callers take one for a call whose strings are longer than a slot holds, and the
/// publishing thread gives it back once the call's events are sent.
///
/// Taking and giving back are one `ArrayQueue` pop or push each (a compare-and-swap), so
/// in steady state no call allocates and the publishing thread frees nothing. An empty pool
/// (more long calls queued than it has blocks, as when the queue fills) is not an error: the
/// caller then allocates, exactly as it would without a pool, and a block given back to a
/// full pool is freed.
#[derive(Debug)]
pub(crate) struct StringPool {
    blocks: ArrayQueue<Block>,
}

impl StringPool {
    /// A pool of `blocks` blocks (at least one), `blocks × 256` bytes resident from now on.
    pub(crate) fn new(blocks: usize) -> StringPool {
        let pool = ArrayQueue::new(blocks.max(1));
        while pool.push(Box::new([0; BLOCK_BYTES])).is_ok() {}
        StringPool { blocks: pool }
    }

    /// The pool of a queue of `capacity` calls: a block for a quarter of them. In steady state
    /// a few hundred calls are queued at most; a full default queue of long calls then holds
    /// 16,384 pooled blocks (4.2 MB) and allocates for the rest.
    pub(crate) fn for_queue(capacity: usize) -> StringPool {
        StringPool::new(capacity / 4)
    }

    /// A block, or `None` when every block is in use.
    pub(crate) fn take(&self) -> Option<Block> {
        self.blocks.pop()
    }

    /// Returns `block` for another call.
    pub(crate) fn give_back(&self, block: Block) {
        let _ = self.blocks.push(block);
    }

    /// One small pool for the tests that only need records of short strings.
    #[cfg(test)]
    pub(crate) fn for_tests() -> &'static StringPool {
        static POOL: std::sync::LazyLock<StringPool> =
            std::sync::LazyLock::new(|| StringPool::new(1));
        &POOL
    }

    /// Blocks free now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_back_and_an_empty_pool_says_so() {
        let pool = StringPool::new(2);
        assert_eq!(pool.free(), 2);
        let (a, b) = (pool.take().unwrap(), pool.take().unwrap());
        assert!(pool.take().is_none());
        pool.give_back(a);
        pool.give_back(b);
        pool.give_back(Box::new([0; BLOCK_BYTES])); // one too many: freed
        assert_eq!(pool.free(), 2);
        assert_eq!(StringPool::new(0).free(), 1);
    }
}
