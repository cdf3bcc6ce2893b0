//! Stopping a subscriber's loop cleanly: SIGINT (Ctrl-C) and SIGTERM set a flag the loop
//! checks, so that a program writes what it holds (an index, what is pending for a log)
//! before it exits, instead of dying mid-write. For programs; a library that embeds a
//! subscriber leaves signals to its host.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, SeqCst);
}

/// From now on, SIGINT and SIGTERM set the flag [`stop_requested`] reads instead of ending
/// the process.
pub fn catch_stop_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Whether SIGINT or SIGTERM came since [`catch_stop_signals`].
pub fn stop_requested() -> bool {
    STOP.load(SeqCst)
}
