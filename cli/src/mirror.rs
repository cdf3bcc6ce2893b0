//! `kv-events mirror`: keep a self-healing copy of one or several publishers' index with
//! [`Follower`], say each recovery and a periodic summary on stderr, and write the index as
//! JSON lines on exit.

use crate::args::MirrorArgs;
use crate::tail::not_reached;
use crate::view::RCVHWM;
use mooncake_kv_events::keys;
use mooncake_kv_events::subscriber::stop_requested;
use mooncake_kv_events::subscriber::{catch_stop_signals, connect_form, json_bytes, Index};
use mooncake_kv_events::subscriber::{CurveClient, Reach, Subscriber, SubscriberOptions};
use mooncake_kv_events::subscriber::{FollowOptions, Follower, Notice, NoticeKind, Upstream};
use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// The longest one wait for the follower lasts: it bounds how late a signal is seen.
const POLL: Duration = Duration::from_millis(100);
/// Refused messages and skipped events said on stderr per publisher; the rest are counted.
const MALFORMED_SAID: u32 = 10;
/// The `--replay-endpoint` of a publisher that has no replay socket.
const NO_REPLAY: &str = "none";

/// Runs `mirror` until `--duration`, Ctrl-C or SIGTERM. `Err` is a runtime failure, said in
/// one sentence.
pub(crate) fn run(args: &MirrorArgs) -> Result<(), String> {
    let own_keys = match &args.curve_secret_key {
        Some(path) => Some(keys::read_key_pair(path).map_err(|e| e.to_string())?),
        None => None,
    };
    if own_keys.is_some() {
        keys::curve_available().map_err(|e| e.to_string())?;
    }
    let mut upstreams = Vec::with_capacity(args.endpoints.len());
    for (i, (endpoint, replay)) in args
        .endpoints
        .iter()
        .zip(&args.replay_endpoints)
        .enumerate()
    {
        let curve = match (&own_keys, args.curve_server_keys.as_slice()) {
            (Some(pair), [one]) => Some((one, pair)),
            (Some(pair), each) if !each.is_empty() => Some((&each[i], pair)),
            _ => None,
        };
        let curve = match curve {
            None => None,
            Some((server, pair)) => Some(CurveClient {
                server_key: keys::read_public_key(server).map_err(|e| e.to_string())?,
                keys: pair.clone(),
            }),
        };
        upstreams.push(Upstream {
            endpoint: connect_form(endpoint),
            // A publisher without a replay socket: its stream is all there is.
            replay_endpoint: (replay != NO_REPLAY).then(|| connect_form(replay)),
            curve,
            topic: args.topic.as_bytes().to_vec(),
        });
    }
    let names: Vec<String> = upstreams.iter().map(|s| s.endpoint.clone()).collect();
    let mut probes: Vec<Probe> = upstreams.iter().map(Probe::open).collect();
    let options = FollowOptions {
        rcvhwm: RCVHWM,
        max_message_bytes: args.max_message_bytes,
        ..FollowOptions::default()
    };
    let described: Vec<String> = upstreams
        .iter()
        .map(|s| match &s.replay_endpoint {
            Some(replay) => format!("{} (replay {replay})", s.endpoint),
            None => format!(
                "{} (no replay endpoint: the stream from now on only)",
                s.endpoint
            ),
        })
        .collect();
    let mut follower = Follower::new(upstreams, options).map_err(|e| e.to_string())?;
    // Ctrl-C and SIGTERM end the loop, so that the index is written.
    catch_stop_signals();
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "kv-events: mirroring {}", described.join(", "));

    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    let mut next_summary = started + args.every;
    let mut said = vec![0u32; names.len()];
    let mut dumps = Dumps::default();
    while !stop_requested() {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        for (i, probe) in probes.iter_mut().enumerate() {
            probe.check(&follower, i, &mut err);
        }
        if now >= next_summary {
            let _ = write!(
                err,
                "{}",
                summary(&follower, &names, &probes, now - started)
            );
            if let Some(path) = &args.dump {
                dumps.offer(path, &follower, args.union)?;
            }
            next_summary = next_due(next_summary, args.every, Instant::now());
        }
        let mut wait = POLL.min(next_summary.saturating_duration_since(now));
        if let Some(deadline) = deadline {
            wait = wait.min(deadline.saturating_duration_since(now));
        }
        for notice in follower.poll(wait) {
            say(&mut err, &notice, &names, &mut said);
        }
    }

    let elapsed = started.elapsed();
    for (i, probe) in probes.iter_mut().enumerate() {
        probe.check(&follower, i, &mut err);
    }
    let _ = write!(err, "{}", summary(&follower, &names, &probes, elapsed));
    dumps.finish()?;
    let (which, index, in_sync) = chosen(&follower, args.union);
    match &args.dump {
        Some(path) => write_dump(path, &index)?,
        None => {
            let mut out = io::stdout().lock();
            match index.write_json_lines(&mut out).and_then(|()| out.flush()) {
                Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                    return Err(format!("cannot write the index: {e}"))
                }
                _ => {}
            }
        }
    }
    let whose = match which {
        Some(i) => format!("the index of {}", names[i]),
        None if args.union => "the union of the publishers' indexes".to_owned(),
        None if probes.iter().all(|p| p.why.is_some()) => {
            "an empty index: no publisher could be reached".to_owned()
        }
        None => "an empty index: no publisher was followed yet".to_owned(),
    };
    let _ = writeln!(
        err,
        "kv-events: wrote {whose}, {} objects, {}",
        index.objects(),
        if in_sync { "in sync" } else { "NOT in sync" }
    );
    if in_sync {
        Ok(())
    } else {
        Err("the index written is not in sync with its publisher".into())
    }
}

/// Whether a publisher the follower has no snapshot of yet can be reached, watched as `tail`
/// watches it: a SUB socket of its own (a receive buffer of one message), whose monitor says
/// whether connections fail, are made without a ZeroMQ handshake, or are refused. Closed as
/// soon as the publisher is reached or the follower has a snapshot of it.
struct Probe {
    endpoint: String,
    /// The publisher has no replay socket: its index is the stream since the mirror joined.
    stream_only: bool,
    subscriber: Option<Subscriber>,
    /// Why the publisher is not reached yet, said once on stderr.
    why: Option<String>,
}

impl Probe {
    fn open(upstream: &Upstream) -> Probe {
        let options = SubscriberOptions {
            rcvhwm: 1,
            curve: upstream.curve.clone(),
            topic: upstream.topic.clone(),
            ..SubscriberOptions::default()
        };
        Probe {
            endpoint: upstream.endpoint.clone(),
            stream_only: upstream.replay_endpoint.is_none(),
            // A probe that cannot open leaves the summary as it was.
            subscriber: Subscriber::open(&upstream.endpoint, &options).ok(),
            why: None,
        }
    }

    /// Takes the probe's socket events for publisher `i` of `follower`; says on stderr when
    /// it cannot be reached yet, and when it is reached after that.
    fn check(&mut self, follower: &Follower, i: usize, err: &mut impl Write) {
        let Some(subscriber) = &mut self.subscriber else {
            return;
        };
        let why = match subscriber.reach() {
            _ if follower.status(i).next_sequence.is_some() => None,
            // No attempt has failed yet: nothing to say, and nothing known either.
            Ok(Reach::Unreached { failed_attempts: 0 }) => return,
            Ok(reach) => not_reached(&self.endpoint, reach).map(str::to_owned),
            Err(refused) => Some(refused.to_string()),
        };
        match (why, &self.why) {
            (Some(why), None) => {
                let _ = writeln!(
                    err,
                    "kv-events: cannot reach {} yet: {why}; still trying",
                    self.endpoint
                );
                self.why = Some(why);
            }
            (Some(_), Some(_)) => {}
            (None, said) => {
                if said.is_some() {
                    let _ = writeln!(err, "kv-events: reached {}", self.endpoint);
                }
                self.why = None;
                self.subscriber = None;
            }
        }
    }
}

/// When the summary after the one due at `due` is due, the one at `due` having finished at
/// `finished`: an interval later, or, when the summary (and the dump of a large index) took
/// longer than that, half an interval after it finished, so that the mirror always has time
/// to read between two dumps instead of dumping back to back and falling behind the stream.
fn next_due(due: Instant, every: Duration, finished: Instant) -> Instant {
    (due + every).max(finished + every / 2)
}

/// The index to write: the union (in sync when every publisher is), or the index of the
/// publisher in sync heard from last, or else of the one with a snapshot heard from last.
/// Which publisher, the index, and whether it is in sync.
fn chosen(follower: &Follower, union: bool) -> (Option<usize>, Index, bool) {
    if union {
        return (None, follower.union(), follower.in_sync());
    }
    let which = follower.freshest().or_else(|| {
        (0..follower.upstreams())
            .filter(|&i| follower.status(i).next_sequence.is_some())
            .max_by_key(|&i| follower.status(i).last_heard)
    });
    match which {
        Some(i) => (
            Some(i),
            follower.index(i).clone(),
            follower.status(i).in_sync,
        ),
        None => (None, Index::new(), false),
    }
}

/// The periodic dumps, written by a thread of their own from a copy of the index, so that
/// the follower goes on applying while a large index is written (a million objects take
/// seconds, which the stream would otherwise have to wait for).
#[derive(Default)]
struct Dumps {
    writing: Option<thread::JoinHandle<Result<(), String>>>,
    /// What the follower had applied when the last dump was taken: no new dump until it
    /// moves.
    taken: Option<(Option<usize>, u64, u64, u64)>,
}

impl Dumps {
    /// Starts a dump of the index unless the last one is still being written (the next
    /// summary offers again) or the index has not changed since.
    fn offer(&mut self, path: &Path, follower: &Follower, union: bool) -> Result<(), String> {
        if self.writing.as_ref().is_some_and(|w| !w.is_finished()) {
            return Ok(());
        }
        self.finish()?;
        let counters = follower.counters();
        let taken = Some((
            follower.freshest(),
            counters.messages,
            counters.snapshots,
            counters.incarnations,
        ));
        if taken == self.taken {
            return Ok(());
        }
        self.taken = taken;
        let (_, index, _) = chosen(follower, union);
        let path = path.to_owned();
        self.writing = Some(
            thread::Builder::new()
                .name("kv-events-dump".into())
                .spawn(move || write_dump(&path, &index))
                .map_err(|e| format!("cannot start the dump thread: {e}"))?,
        );
        Ok(())
    }

    /// Waits for the dump being written; its error if it failed.
    fn finish(&mut self) -> Result<(), String> {
        match self.writing.take().map(thread::JoinHandle::join) {
            None => Ok(()),
            Some(Ok(written)) => written,
            Some(Err(_)) => Err("the dump thread panicked".into()),
        }
    }
}

/// Writes the index to `path` whole or not at all: to a file beside it, then renamed.
fn write_dump(path: &Path, index: &Index) -> Result<(), String> {
    let failed = |e: io::Error| format!("cannot write {}: {e}", path.display());
    // What is not a regular file (/dev/null, a FIFO, a terminal) is written into as it is: a
    // rename would put a regular file in its place, and nobody reads such a file half-written.
    if fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let file = fs::OpenOptions::new().write(true).open(path);
        return file
            .and_then(|file| write_lines(file, index))
            .map(drop)
            .map_err(failed);
    }
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let temporary = path.with_file_name(name);
    fs::File::create(&temporary)
        .and_then(|file| write_lines(file, index)?.sync_all())
        .and_then(|()| fs::rename(&temporary, path))
        .map_err(failed)
}

/// Writes `index` as JSON lines into `file`, and gives the file back once flushed.
fn write_lines(file: fs::File, index: &Index) -> io::Result<fs::File> {
    let mut out = io::BufWriter::new(file);
    index.write_json_lines(&mut out)?;
    out.into_inner().map_err(|e| e.into_error())
}

/// One notice on stderr; refused messages and skipped events only up to
/// [`MALFORMED_SAID`] per publisher.
fn say(err: &mut impl Write, notice: &Notice, names: &[String], said: &mut [u32]) {
    let from = if names.len() > 1 {
        format!("{}: ", names[notice.upstream])
    } else {
        String::new()
    };
    if matches!(
        notice.kind,
        NoticeKind::Malformed(_) | NoticeKind::Skipped(_)
    ) {
        let count = &mut said[notice.upstream];
        *count += 1;
        if *count > MALFORMED_SAID {
            return;
        }
        if *count == MALFORMED_SAID {
            let _ = writeln!(
                err,
                "kv-events: {from}{}; further refused messages and skipped events are only \
                 counted in the summaries",
                notice.kind
            );
            return;
        }
    }
    let _ = writeln!(err, "kv-events: {from}{}", notice.kind);
}

/// A tenant for people: its text, or `{"hex": "..."}` when it is not UTF-8.
fn tenant_name(tenant: &[u8]) -> String {
    match json_bytes(tenant) {
        serde_json::Value::String(text) => text,
        other => other.to_string(),
    }
}

/// The summary: per publisher, where its index stands, its objects per tenant and medium,
/// and its counters.
fn summary(follower: &Follower, names: &[String], probes: &[Probe], elapsed: Duration) -> String {
    let mut text = String::new();
    for (i, name) in names.iter().enumerate() {
        let status = follower.status(i);
        let index = follower.index(i);
        let state = match (status.in_sync, status.next_sequence, &status.failing) {
            (_, None, _) if probes[i].why.is_some() => {
                format!(
                    "not reached ({})",
                    probes[i].why.as_deref().unwrap_or_default()
                )
            }
            (true, Some(next), _) if probes[i].stream_only => {
                format!("in sync before sequence {next}, every message since 0 applied")
            }
            (true, Some(next), _) => format!(
                "in sync before sequence {next}, incarnation {:016x}",
                status.incarnation.unwrap_or_default()
            ),
            (false, Some(next), _) if probes[i].stream_only => {
                format!("incomplete (the stream since the join only) before sequence {next}")
            }
            (false, Some(next), _) => format!("recovering from sequence {next}"),
            (_, None, _) if probes[i].stream_only => "no message yet".to_owned(),
            (_, None, Some(why)) => format!("no snapshot yet ({why})"),
            (_, None, None) => "no snapshot yet".to_owned(),
        };
        text += &format!(
            "kv-events: {:.1}s: {name}: {state}: {} objects\n",
            elapsed.as_secs_f64(),
            index.objects()
        );
        let summary = index.summary();
        if !summary.is_empty() {
            text += &format!(
                "  {:<24} {:>10} {:>10} {:>10}\n",
                "tenant", "objects", "cpu", "disk"
            );
            for (tenant, [objects, cpu, disk]) in summary {
                text += &format!(
                    "  {:<24} {objects:>10} {cpu:>10} {disk:>10}\n",
                    tenant_name(tenant)
                );
            }
        }
        let c = follower.upstream_counters(i);
        let unrecoverable = if probes[i].stream_only {
            format!(" ({} unrecoverable)", c.unrecoverable)
        } else {
            String::new()
        };
        text += &format!(
            "  gaps {}{unrecoverable}, replays {}, snapshots {}, new incarnations {}, malformed \
             {}, skipped events {}, failed requests {}, last time to converge {}\n",
            c.gaps,
            c.replays,
            c.snapshots,
            c.incarnations,
            c.malformed,
            c.skipped_events,
            c.failed_requests,
            c.last_convergence.map_or_else(
                || "-".to_owned(),
                |d| format!("{:.0} ms", d.as_secs_f64() * 1000.0)
            ),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::next_due;
    use std::time::{Duration, Instant};

    #[test]
    fn a_summary_that_outlasts_its_interval_leaves_half_an_interval_to_read() {
        let every = Duration::from_secs(2);
        let due = Instant::now();
        // On time: the next one an interval later.
        assert_eq!(
            next_due(due, every, due + Duration::from_millis(10)),
            due + every
        );
        // A dump of 2.3 s: not due at once, but 1 s after it finished.
        let finished = due + Duration::from_millis(2300);
        assert_eq!(next_due(due, every, finished), finished + every / 2);
    }
}
