//! `kv-events demo`: a publisher, a watcher reading it the way `tail` does, and a synthetic
//! master workload between them; then what the watcher saw against what was published.

use crate::args::DemoArgs;
use crate::master::{self, Counts, Master, Policy};
use crate::view::{Show, View, RCVHWM};
use mooncake_kv_events::keys::{self, KeyPair};
use mooncake_kv_events::subscriber::{connect_form, CurveClient, Subscriber};
use mooncake_kv_events::{Config, Publisher, Stats};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

const BACKEND_ID: &str = "demo-store";
const MODEL_NAME: &str = "demo-model";
const BLOCK_SIZE: u32 = 16;
/// How long the publisher may take to send what the workload queued.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the watcher, after the flush, may go without an event before it stops short of
/// what was sent: a loaded machine slows it down, but it keeps reading while events come.
/// Heartbeats do not count: they go on for ever, and a watcher that lost events would wait
/// for ever for the rest.
const DRAIN_QUIET: Duration = Duration::from_secs(10);
/// How long one wait of the watcher for a message lasts: it bounds how late it sees its
/// stop order.
const WATCH_POLL: Duration = Duration::from_millis(20);

/// The line said when the workload starts.
const WORKLOAD_STARTS: &str = "The workload starts.\n";
/// The start of the line said when the workload has made its last call.
const WORKLOAD_DONE: &str = "The workload is done";

/// The watcher's stop order: read until `events` events arrived, or none came for `quiet`
/// (heartbeats aside).
#[derive(Debug)]
struct Drain {
    events: u64,
    quiet: Duration,
}

/// What the watcher thread hands back: what it read, and why it stopped early, if it did.
type Watched = (View, Option<String>);

/// Runs the demo. `Err` says why it failed, in one sentence.
pub(crate) fn run(args: &DemoArgs) -> Result<(), crate::CommandError> {
    // `_run_dir` is removed when the demo ends: the allow-list of the run, with the
    // watcher's key in it.
    let (config, watcher_keys, _run_dir) = configure(args)?;
    let publisher = Publisher::create(&config)
        .map_err(|e| format!("cannot start the publisher: {e} (pick another with --endpoint)"))?;
    let endpoint = connect_form(&args.endpoint);
    say(&introduction(args, &endpoint));
    let subscriber = Subscriber::connect_with(&endpoint, RCVHWM, watcher_keys.as_ref())
        .map_err(|e| format!("the watcher cannot connect to {endpoint}: {e}"))?;
    let (to_watcher, orders) = mpsc::channel();
    let show = args.show;
    let watcher = thread::Builder::new()
        .name("kv-events-watcher".into())
        .spawn(move || watch(subscriber, show, &orders))
        .map_err(|e| format!("cannot start the watcher thread: {e}"))?;
    say(&match show {
        Show::All => "The watcher prints every event:\n".to_owned(),
        Show::FirstOfEachType(n) => format!(
            "The watcher prints the first {n} events of each type (--show all: every one):\n"
        ),
    });
    // ZeroMQ's slow joiner: a subscription takes a moment to reach the PUB socket, and a
    // message sent before that is not delivered to it.
    thread::sleep(args.wait);

    // Said as it happens, so that whoever runs something beside the demo (scripts/hostile.sh,
    // an attack) can tell whether it ran during the workload.
    say(WORKLOAD_STARTS);
    // Numbers taken before the workload are heartbeats' (no call was made yet): a watcher
    // that joined after some of them missed no event.
    let before_workload = publisher.stats().next_sequence;
    let started = Instant::now();
    let master = master::run(&publisher, Policy::of(&config), args.objects, args.rate);
    say(&format!(
        "{WORKLOAD_DONE} in {:.1}s.\n",
        started.elapsed().as_secs_f64()
    ));
    let flushed = publisher.flush(FLUSH_TIMEOUT);
    // If the watcher already stopped, it said why; the send failing adds nothing.
    let _ = to_watcher.send(Drain {
        events: publisher.stats().published_events,
        quiet: DRAIN_QUIET,
    });
    let (view, watcher_failure) = watcher
        .join()
        .map_err(|_| "the watcher thread panicked".to_owned())?;
    if !args.linger.is_zero() {
        say(&format!(
            "The publisher stays up {:.1}s for late subscribers.\n",
            args.linger.as_secs_f64()
        ));
        thread::sleep(args.linger);
    }
    publisher.shutdown();
    let stats = publisher.stats();
    say(&summary(args, &master, &view, &stats, started));
    let mut problems = Vec::new();
    if !flushed {
        problems.push(format!(
            "the publisher did not send everything within {}s",
            FLUSH_TIMEOUT.as_secs()
        ));
    }
    problems.extend(watcher_failure);
    problems.extend(verdict(&master, &view, &stats, before_workload));
    problems.extend(dump_index_if_asked(args, &master, &stats));
    if problems.is_empty() {
        say(&format!(
            "\nOK: the watcher saw all {} published events, in order, with no gap.\n",
            stats.published_events
        ));
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}

/// The publisher's config for `args`, the watcher's CURVE keys when the stream is encrypted,
/// and the directory of the run's allow-list when there is one.
fn configure(
    args: &DemoArgs,
) -> Result<(Config, Option<CurveClient>, Option<RunDir>), crate::CommandError> {
    let mut config = Config {
        enable_kv_events: true,
        bind_endpoint: args.endpoint.clone(),
        backend_id: BACKEND_ID.into(),
        model_name: MODEL_NAME.into(),
        block_size: BLOCK_SIZE,
        replay_endpoint: args.replay_endpoint.clone().unwrap_or_default(),
        topic: args.topic.clone(),
        replay_topic_frame: !args.replay_without_topic_frame,
        heartbeat_ms: args.heartbeat_ms,
        reannounce_remaining: args.reannounce_remaining,
        non_utf8: args.non_utf8.as_str().to_owned(),
        ..Config::default()
    };
    if let Some(send_hwm) = args.send_hwm {
        config.send_hwm = send_hwm;
    }
    let Some(secret) = &args.curve_secret_key else {
        return Ok((config, None, None));
    };
    let (client, allow) = curve_setup(secret, args.curve_allow.as_deref())?;
    config.curve_secret_key_file = secret.display().to_string();
    if let Some(allow) = &allow {
        config.curve_allow = allow.0.display().to_string();
    }
    Ok((config, Some(client), allow))
}

/// What the demo publishes, and how to watch it from another terminal.
fn introduction(args: &DemoArgs, endpoint: &str) -> String {
    let keys = match &args.curve_secret_key {
        None => String::new(),
        Some(secret) => format!(
            " --curve-server-key {} --curve-secret-key YOURS.key\n\
             The stream is encrypted with CURVE{}.",
            shell_word(&secret.with_extension("pub").display().to_string()),
            if args.curve_allow.is_some() {
                "; YOURS.pub must be on --curve-allow"
            } else {
                ""
            }
        ),
    };
    format!(
        "kv-events demo: publishing on {} as backend_id \"{BACKEND_ID}\", model_name \
         \"{MODEL_NAME}\", block_size {BLOCK_SIZE}\n\
         To watch it from another terminal (start it, then run the demo again, or give the \
         demo --wait 10):\n    {} tail {}{keys}\n",
        args.endpoint,
        program(),
        shell_word(endpoint),
    )
}

/// Writes the index a subscriber should end with when `--dump-index` asks for it; the
/// problem, if writing failed.
fn dump_index_if_asked(args: &DemoArgs, master: &Master<'_>, stats: &Stats) -> Option<String> {
    let path = args.dump_index.as_ref()?;
    match dump_index(path, master, stats) {
        Ok(objects) => {
            say(&format!(
                "\nThe index a subscriber should end with ({objects} objects) is in {}.\n",
                path.display()
            ));
            None
        }
        Err(e) => Some(format!("cannot write {}: {e}", path.display())),
    }
}

/// A directory the demo made for one run, removed when dropped.
#[derive(Debug)]
struct RunDir(std::path::PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The watcher's CURVE keys for a publisher whose key file is `secret`: the publisher's
/// public key and a key pair made for the run. With `allow`, also the allow-list the
/// publisher gets: the `.pub` files of `allow` (a file or a directory) copied into a
/// private directory, with the watcher's own public key beside them, so that the demo
/// still watches its own stream.
fn curve_setup(
    secret: &Path,
    allow: Option<&Path>,
) -> Result<(CurveClient, Option<RunDir>), crate::CommandError> {
    let server = keys::read_key_pair(secret).map_err(|why| format!("--curve-secret-key: {why}"))?;
    let watcher = KeyPair::generate()?;
    let client = CurveClient {
        server_key: server.public,
        keys: watcher.clone(),
    };
    let Some(allow) = allow else {
        return Ok((client, None));
    };
    let listed = keys::read_allow_list(allow).map_err(|why| format!("--curve-allow: {why}"))?;
    let dir =
        RunDir(std::env::temp_dir().join(format!("kv-events-demo-allow-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir(&dir.0).map_err(|e| format!("cannot create {}: {e}", dir.0.display()))?;
    for (i, (file, _)) in listed.iter().enumerate() {
        let copy = dir.0.join(format!("{i}.pub"));
        std::fs::copy(file, &copy).map_err(|e| format!("cannot copy {}: {e}", file.display()))?;
    }
    keys::write_key_files(&dir.0.join("demo-watcher"), &watcher)?;
    // The watcher's secret stays in memory; the run's directory needs only its .pub.
    let _ = std::fs::remove_file(dir.0.join("demo-watcher.key"));
    Ok((client, Some(dir)))
}

/// The watcher thread: reads and prints like `tail` until its stop order is met.
fn watch(mut subscriber: Subscriber, show: Show, orders: &Receiver<Drain>) -> Watched {
    let mut view = View::new(show);
    let mut drain = None;
    let mut last_event = Instant::now();
    loop {
        if drain.is_none() {
            match orders.try_recv() {
                Ok(order) => drain = Some(order),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return (view, None),
            }
        }
        if let Some(Drain { events, quiet }) = drain {
            // Falling short is for the verdict to say.
            if view.tally.events >= events || last_event.elapsed() >= quiet {
                return (view, None);
            }
        }
        match subscriber.recv(WATCH_POLL) {
            Ok(Some(batch)) => {
                if !batch.events.is_empty() {
                    last_event = Instant::now();
                }
                let printed = view.take(
                    &batch,
                    u64::MAX,
                    &mut io::stdout().lock(),
                    &mut io::stderr().lock(),
                );
                if let Err(e) = printed {
                    return (view, Some(format!("the watcher cannot print: {e}")));
                }
            }
            Ok(None) => {}
            Err(e) => return (view, Some(format!("the watcher failed: {e}"))),
        }
    }
}

/// What went wrong, if anything: every published event seen, in order, and each type as
/// many times as the model of the master expects. The first `before_workload` sequence
/// numbers were heartbeats', which a watcher that joined after them may miss.
fn verdict(master: &Master<'_>, view: &View, stats: &Stats, before_workload: u64) -> Vec<String> {
    let tally = &view.tally;
    let mut problems = Vec::new();
    if tally.events != stats.published_events {
        problems.push(format!(
            "the watcher saw {} of {} published events",
            tally.events, stats.published_events
        ));
    }
    if tally.missed_before_first > before_workload {
        problems.push(format!(
            "the watcher joined late, after {} sequence numbers (give it longer with --wait)",
            tally.missed_before_first
        ));
    }
    if tally.gaps > 0 {
        problems.push(format!(
            "{} sequence gaps ({} numbers missed)",
            tally.gaps, tally.missed
        ));
    }
    if tally.restarts > 0 {
        problems.push(format!("the sequence restarted {} times", tally.restarts));
    }
    if stats.dropped_events > 0 {
        problems.push(format!(
            "the publisher dropped {} events",
            stats.dropped_events
        ));
    }
    let expected = master.expected();
    let seen = Counts {
        stored: tally.stored,
        removed: tally.removed,
        cleared: tally.cleared,
    };
    // A watcher that missed events cannot match the model either: said once, above.
    let saw_all = problems.is_empty();
    if saw_all && (seen != expected || tally.other > 0) {
        problems.push(format!(
            "the watcher saw {} stored, {} removed, {} cleared and {} others where the \
             workload should publish {} stored, {} removed, {} cleared",
            seen.stored,
            seen.removed,
            seen.cleared,
            tally.other,
            expected.stored,
            expected.removed,
            expected.cleared
        ));
    }
    if stats.cleared_suppressed != master.cleared_suppressed {
        problems.push(format!(
            "the publisher suppressed {} cleared events where the workload expects {}",
            stats.cleared_suppressed, master.cleared_suppressed
        ));
    }
    problems
}

fn summary(
    args: &DemoArgs,
    master: &Master<'_>,
    view: &View,
    stats: &Stats,
    started: Instant,
) -> String {
    let mut s = String::new();
    let tenants = master::TENANTS.map(|t| if t.is_empty() { "default" } else { t });
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "\nWorkload: {} objects over tenants {}; what each master operation should publish:",
        args.objects,
        tenants.join(", ")
    );
    let _ = writeln!(
        s,
        "  {:<40} {:>7} {:>7} {:>7} {:>7}",
        "master operation", "objects", "stored", "removed", "cleared"
    );
    for row in &master.rows {
        let e = row.expected;
        let _ = writeln!(
            s,
            "  {:<40} {:>7} {:>7} {:>7} {:>7}",
            row.operation, row.objects, e.stored, e.removed, e.cleared
        );
    }
    let e = master.expected();
    let _ = writeln!(
        s,
        "  {:<40} {:>7} {:>7} {:>7} {:>7}",
        "total", "", e.stored, e.removed, e.cleared
    );
    let _ = writeln!(s, "  objects left: {}", master.live_objects());

    let t = &view.tally;
    let _ = writeln!(s, "\nWatcher (read as kv-events tail reads):");
    for (label, value) in [
        ("batches", t.batches),
        ("events", t.events),
        ("stored", t.stored),
        ("removed", t.removed),
        ("cleared", t.cleared),
    ] {
        let _ = writeln!(s, "  {label:<23} {value:>9}");
    }
    let _ = writeln!(
        s,
        "  {:<23} {:>9}  ({} sequence numbers missed, {} before the first message, {} restarts)",
        "gaps", t.gaps, t.missed, t.missed_before_first, t.restarts
    );
    match t.last_event_at {
        Some(last) if t.events > 0 => {
            let took = last.saturating_duration_since(started);
            let rate = t.events as f64 / took.as_secs_f64().max(1e-9);
            let _ = writeln!(
                s,
                "  {:<23} {:>9.0}  ({} events from the first call to the last event seen, {:.1} ms)",
                "events/s",
                rate,
                t.events,
                took.as_secs_f64() * 1e3
            );
        }
        _ => {
            let _ = writeln!(s, "  {:<23} {:>9}", "events/s", "-");
        }
    }

    // Every field, named and ordered as in the status and the metrics, from the list they
    // are made from: a counter added to the library shows here without an edit.
    let _ = writeln!(s, "\nPublisher stats:");
    for (label, value) in stats.fields() {
        let _ = writeln!(s, "  {label:<23} {value:>9}");
    }
    s
}

/// The final index a subscriber that saw every event of the workload ends with
/// (`cli/tests/python_indexer.rs` compares it with `examples/python/indexer.py --dump`).
#[derive(Debug, Serialize)]
struct IndexDump {
    /// `[backend, tenant, key, [media]]`, sorted; keys and tenants as the script renders
    /// them: `str` as is, `bin` as `"hex:<hex>"`.
    objects: Vec<(String, String, String, Vec<&'static str>)>,
    /// The sequence the publisher's next message would take: every message of the workload
    /// is numbered below it.
    next_sequence: u64,
    /// Resyncs: none when nothing was lost.
    resyncs: u64,
}

/// Writes the index the model of the master expects to `path`; returns how many objects it
/// holds.
fn dump_index(path: &Path, master: &Master<'_>, stats: &Stats) -> io::Result<usize> {
    let mut objects: Vec<_> = master
        .holdings()
        .into_iter()
        .map(|(tenant, key, media)| {
            let tenant = if tenant.is_empty() { "default" } else { tenant };
            (
                BACKEND_ID.to_owned(),
                tenant.to_owned(),
                rendered_key(&key),
                media.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            )
        })
        .collect();
    // Python sorts str by code point, which is the byte order of their UTF-8.
    objects.sort();
    let dump = IndexDump {
        next_sequence: stats.next_sequence,
        resyncs: 0,
        objects,
    };
    let mut json = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(
        &mut json,
        serde_json::ser::PrettyFormatter::with_indent(b" "),
    );
    dump.serialize(&mut serializer).map_err(io::Error::other)?;
    json.push(b'\n');
    std::fs::write(path, json)?;
    Ok(dump.objects.len())
}

/// A key in the expected index (`--dump-index`): UTF-8 as is, anything else as `hex:` and
/// its bytes.
fn rendered_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => text.to_owned(),
        Err(_) => format!(
            "hex:{}",
            key.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

/// Writes `text` to stdout. A closed stdout is no reason to fail the demo, whose verdict
/// is also its exit status.
fn say(text: &str) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// How to run this program again from another terminal: its path, relative to the working
/// directory when it is under it.
fn program() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "kv-events".into();
    };
    let relative = std::env::current_dir()
        .ok()
        .and_then(|dir| exe.strip_prefix(dir).ok().map(|p| p.display().to_string()));
    match relative {
        // A bare name would be looked up in PATH.
        Some(path) if !path.contains('/') => shell_word(&format!("./{path}")),
        Some(path) => shell_word(&path),
        None => shell_word(&exe.display().to_string()),
    }
}

/// `word` as one shell word: quoted when it holds anything but the usual path characters.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-:+=@%,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_render_as_text_or_hex_in_the_expected_index() {
        assert_eq!(rendered_key(b"obj-1"), "obj-1");
        assert_eq!(rendered_key(b"k\xff\x00"), "hex:6bff00");
        assert_eq!(rendered_key("caf\u{e9}".as_bytes()), "caf\u{e9}");
    }

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        assert_eq!(shell_word("tcp://127.0.0.1:5557"), "tcp://127.0.0.1:5557");
        assert_eq!(shell_word("ipc:///tmp/a b"), "'ipc:///tmp/a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
