//! The readers that exist in the field, as their code is at a pinned commit, against the real
//! `kv-events demo`: each module transcribes one consumer's receive, replay and apply logic
//! (citing repository, commit and file) and asserts its final index against `--dump-index`.

mod consumers {
    pub mod conductor;
    pub mod demo;
    pub mod dynamo_shared_cache;
    pub mod llmd_router;
}
