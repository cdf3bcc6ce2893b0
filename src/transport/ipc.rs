//! Binding an `ipc://` endpoint whose socket file has the configured mode from the first
//! moment anyone can reach it.

use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Binds an ipc socket whose file has `mode` from the first moment anyone can reach it.
///
/// The mode of a socket file comes from the umask at bind, which is process-wide: changing
/// it in a multithreaded master would race every other thread that creates files. A chmod
/// after binding at the final path would leave a moment with the umask's mode. So the socket
/// is bound in a fresh directory of mode 0700 beside the final path (nobody else can reach
/// it there), given its mode, then renamed into place, atomically, replacing what was there
/// as ZeroMQ's own bind would.
pub(super) fn bind(socket: &zmq::Socket, path: &Path, mode: u32) -> Result<(), String> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    // A name of its own per bind: publishers of one process may bind at the same time, and a
    // directory left by a process that crashed is never reused.
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let private = loop {
        let n = NEXT.fetch_add(1, Relaxed);
        let candidate = parent.join(format!(".kv-events-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
            Ok(()) => break candidate,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", candidate.display())),
        }
    };
    let staged = private.join("s");
    let result = (|| {
        socket
            .bind(&format!("ipc://{}", staged.display()))
            .map_err(|e| e.to_string())?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("cannot set the mode of the socket file: {e}"))?;
        std::fs::rename(&staged, path)
            .map_err(|e| format!("cannot move the socket file into place: {e}"))
    })();
    let _ = std::fs::remove_file(&staged);
    // A socket that failed here may still be bound at the staged name: its caller closes it,
    // which unbinds it, since a failed bind fails the publisher's start.
    let _ = std::fs::remove_dir(&private);
    result
}
