//! `kv-events tail`: print the stream of a running publisher, one JSON line per event.

use crate::args::{Show, TailArgs};
use crate::view::{connect_form, View, RCVHWM};
use mooncake_kv_events::watch::Subscriber;
use std::io::{self, Write};
use std::time::Duration;

/// How long one wait for a message lasts when no idle timeout is set: it only bounds how
/// long the loop goes without looking at its limits.
const POLL: Duration = Duration::from_secs(1);

/// Runs `tail` until its limits say stop. `Err` is a runtime failure, said in one sentence.
pub(crate) fn run(args: &TailArgs) -> Result<(), String> {
    let endpoint = connect_form(&args.endpoint);
    let mut subscriber = Subscriber::connect(&endpoint, RCVHWM)
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    let (stdout, stderr) = (io::stdout(), io::stderr());
    let (mut out, mut err) = (stdout.lock(), stderr.lock());
    // Notes go to stderr, so that stdout stays pure JSON lines. Failing to write a note is
    // no reason to stop.
    let _ = writeln!(err, "kv-events: watching {endpoint}");

    let mut view = View::new(Show::All);
    let limit = args.count.unwrap_or(u64::MAX);
    while view.tally.events < limit {
        let batch = subscriber
            .recv(args.idle_timeout.unwrap_or(POLL))
            .map_err(|e| format!("reading {endpoint}: {e}"))?;
        match batch {
            Some(batch) => {
                let wrote = view.take(&batch, limit - view.tally.events, &mut out, &mut err);
                match wrote {
                    Ok(_) => {}
                    // The reader of stdout went away (`| head`): nobody is left to tell.
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(format!("cannot write an event: {e}")),
                }
            }
            None => {
                if let Some(idle) = args.idle_timeout {
                    let _ = writeln!(
                        err,
                        "kv-events: no message for {}s, stopping after {} event{}",
                        idle.as_secs_f64(),
                        view.tally.events,
                        if view.tally.events == 1 { "" } else { "s" }
                    );
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}
