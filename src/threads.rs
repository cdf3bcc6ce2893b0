//! The library's threads start here: each is named (`kv-events-pub`, `kv-events-replay`,
//! `kv-events-snapshot`, `kv-events-zap`), so that `top -H`, a debugger and a sanitizer's
//! report say whose it is, and a thread the system refuses is an error that names it.

use crate::error::CreateError;
use std::thread::{Builder, JoinHandle};

/// Starts `run` on a thread called `name`.
pub(crate) fn spawn<T: Send + 'static>(
    name: &'static str,
    run: impl FnOnce() -> T + Send + 'static,
) -> Result<JoinHandle<T>, CreateError> {
    Builder::new()
        .name(name.into())
        .spawn(run)
        .map_err(|e| CreateError::Thread {
            name,
            reason: e.to_string(),
        })
}
