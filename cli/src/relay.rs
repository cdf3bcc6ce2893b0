//! `kv-events relay`: runs the `kv-events-relay` binary found beside this one. The relay
//! lives in a package of its own (`relay/`) so that neither the library the master links nor
//! this command compiles its asynchronous NATS client.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The relay's binary name.
const RELAY: &str = "kv-events-relay";

/// Replaces this process with the relay, given `args`: signals and the exit status are the
/// relay's own. Returns only when it cannot be run.
pub(crate) fn run(args: &[OsString]) -> Result<(), crate::CommandError> {
    let own = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let relay = own.with_file_name(RELAY);
    if !relay.exists() {
        return Err(format!(
            "{} is not built: run `cargo build --release --locked -p {RELAY}` (it goes beside \
             kv-events), see docs/relay.md",
            relay.display()
        )
        .into());
    }
    let error = Command::new(&relay)
        .arg0("kv-events relay")
        .args(args)
        .exec();
    Err(format!("cannot run {}: {error}", relay.display()).into())
}
