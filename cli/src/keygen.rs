//! `kv-events keygen NAME`: a CURVE key pair in NAME.key (mode 0600) and NAME.pub.

use mooncake_kv_events::keys::{self, KeyPair};
use std::path::Path;

/// Writes the two files and says what goes where. `Err` says why not, in one sentence.
pub(crate) fn run(name: &Path) -> Result<(), crate::CommandError> {
    let pair = KeyPair::generate()?;
    let (secret, public) = keys::write_key_files(name, &pair)?;
    println!(
        "{} (secret key, mode 0600): for the one process it identifies, nobody else\n\
         {} (public key): for the peers that admit or reach it",
        secret.display(),
        public.display()
    );
    Ok(())
}
