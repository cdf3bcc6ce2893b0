//! `kv-events tail`: print the stream of a running publisher, one JSON line per event, or
//! (`--stats`) one line of rates per second.

use crate::args::TailArgs;
use crate::view::{Show, Tally, View, RCVHWM};
use mooncake_kv_events::subscriber::{connect_form, Catchup, Info, ReplayClient};
use mooncake_kv_events::subscriber::{
    CurveClient, Reach, Subscriber, SubscriberOptions, WatchError,
};
use std::io::{self, Write};
use std::time::{Duration, Instant};

/// How long one wait for a message lasts at most: it only bounds how long the loop goes
/// without looking at its limits.
const POLL: Duration = Duration::from_secs(1);
/// How long the stream may be quiet before `--replay-endpoint` asks whether its end was lost.
const QUIET: Duration = Duration::from_secs(1);
/// How often `--stats` prints a line.
const STATS_EVERY: Duration = Duration::from_secs(1);

/// Why the loop stopped, when nothing failed.
enum Stop {
    /// `--count` events were taken.
    Count,
    /// No message for `--idle-timeout`, from a publisher that was reached.
    Idle(Duration),
}

/// Why the loop stopped otherwise.
enum Failure {
    /// The reader of stdout went away (`| head`): nobody is left to tell, and no error.
    ReaderGone,
    /// A runtime failure, said in one sentence.
    Error(String),
}

/// Runs `tail` until its limits say stop. `Err` is a runtime failure, said in one sentence.
pub(crate) fn run(args: &TailArgs) -> Result<(), crate::CommandError> {
    let endpoint = connect_form(&args.endpoint);
    let curve = match (&args.curve_server_key, &args.curve_secret_key) {
        (Some(server), Some(own)) => Some(CurveClient::from_files(server, own)?),
        _ => None,
    };
    let options = SubscriberOptions {
        rcvhwm: RCVHWM,
        curve,
        max_message_bytes: args.max_message_bytes,
        topic: args.topic.as_bytes().to_vec(),
    };
    let mut catchup = match &args.replay_endpoint {
        None => None,
        Some(replay) => {
            let replay = connect_form(replay);
            let client = ReplayClient::connect(&replay, options.curve.clone())
                .map_err(|e| format!("cannot connect to {replay}: {e}"))?;
            Some(Catchup::new(client))
        }
    };
    let mut subscriber = Subscriber::open(&endpoint, &options)
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    let (stdout, stderr) = (io::stdout(), io::stderr());
    let (mut out, mut err) = (stdout.lock(), stderr.lock());
    // Notes go to stderr, so that stdout stays pure JSON lines (or stats lines). Failing to
    // write a note is no reason to stop.
    let _ = writeln!(err, "kv-events: watching {endpoint}");

    // With --stats the view prints no event; it still counts them and notes gaps.
    let show = if args.stats {
        Show::FirstOfEachType(0)
    } else {
        Show::All
    };
    let filter = args.filter();
    let passes_all = filter.passes_all();
    let mut view = View::filtered(show, filter);
    let mut stats = args
        .stats
        .then(|| StatsLines::new(Instant::now(), args.json));
    let mut reading = || -> Result<Stop, Failure> {
        let stop = watch(
            args,
            &mut subscriber,
            catchup.as_mut(),
            &mut view,
            &mut stats,
            &mut out,
            &mut err,
        )?;
        if let Some(stats) = &mut stats {
            write_line(
                &mut out,
                stats.tick(Instant::now(), &view, catchup.as_mut()),
            )?;
        }
        Ok(stop)
    };
    match reading() {
        Ok(Stop::Count) | Err(Failure::ReaderGone) => Ok(()),
        Err(Failure::Error(why)) => Err(why.into()),
        Ok(Stop::Idle(idle)) => {
            let t = &view.tally;
            let others = if passes_all {
                String::new()
            } else {
                format!(
                    " that passed the filters ({} other{} left out)",
                    t.filtered_out,
                    if t.filtered_out == 1 { "" } else { "s" }
                )
            };
            let _ = writeln!(
                err,
                "kv-events: no message for {}s, stopping after {} event{}{others}",
                idle.as_secs_f64(),
                t.events,
                if t.events == 1 { "" } else { "s" }
            );
            Ok(())
        }
    }
}

/// Writes `line`, if any, and flushes it.
fn write_line(out: &mut impl Write, line: Option<String>) -> Result<(), Failure> {
    let Some(line) = line else { return Ok(()) };
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| write_failure(&e, "a stats line"))
}

fn write_failure(e: &io::Error, what: &str) -> Failure {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Failure::ReaderGone
    } else {
        Failure::Error(format!("cannot write {what}: {e}"))
    }
}

/// The loop: reads messages into `view`, and with `--stats` prints a line when one is due,
/// until `--count` or `--idle-timeout` says stop.
fn watch(
    args: &TailArgs,
    subscriber: &mut Subscriber,
    mut catchup: Option<&mut Catchup>,
    view: &mut View,
    stats: &mut Option<StatsLines>,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<Stop, Failure> {
    if stats.as_ref().is_some_and(|stats| !stats.json) {
        let mut header = StatsLines::HEADER.to_owned();
        if catchup.is_some() {
            header += &readers_columns(["subscribers", "connects", "disconnects"]);
        }
        write_line(out, Some(header))?;
    }
    let endpoint = connect_form(&args.endpoint);
    let limit = args.count.unwrap_or(u64::MAX);
    let started = Instant::now();
    let mut last_message = started;
    let mut last_check = last_message;
    let mut connections_lost = 0;
    // Whether stderr said that the publisher cannot be reached yet.
    let mut said_unreached = false;
    // Whether stderr said that the replay socket does not answer.
    let mut replay_silent = false;
    loop {
        if view.tally.events >= limit {
            return Ok(Stop::Count);
        }
        let now = Instant::now();
        let mut wait = POLL;
        if let Some(stats) = stats.as_mut() {
            if now >= stats.next_at {
                write_line(out, stats.tick(now, view, catchup.as_deref_mut()))?;
            }
            wait = wait.min(stats.next_at.saturating_duration_since(now));
        }
        if let Some(idle) = args.idle_timeout {
            let deadline = last_message + idle;
            if now >= deadline {
                return match subscriber.reach() {
                    Ok(Reach::Reached) => Ok(Stop::Idle(idle)),
                    Ok(reach) => Err(Failure::Error(never_reached(&endpoint, reach, idle))),
                    Err(e) => Err(Failure::Error(format!("{endpoint}: {e}"))),
                };
            }
            wait = wait.min(deadline - now);
        }
        // Whole milliseconds, rounded up: a wait of 0 would spin until the deadline.
        let wait = Duration::from_millis(
            u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX),
        );
        let received = subscriber.recv(wait);
        // A refusal is for recv to report; here, only how far the subscriber got.
        match subscriber.reach() {
            Ok(Reach::Unreached { failed_attempts }) if failed_attempts > 0 && !said_unreached => {
                said_unreached = true;
                let _ = writeln!(
                    err,
                    "kv-events: cannot reach {endpoint} yet: {}; still trying",
                    unreached(&endpoint)
                );
            }
            Ok(Reach::NoHandshake)
                if !said_unreached && started.elapsed() >= NO_HANDSHAKE_AFTER =>
            {
                said_unreached = true;
                let _ = writeln!(err, "kv-events: {endpoint}: {NO_HANDSHAKE}; still trying");
            }
            Ok(Reach::Reached) if std::mem::take(&mut said_unreached) => {
                let _ = writeln!(err, "kv-events: reached {endpoint}");
            }
            _ => {}
        }
        if subscriber.connections_lost() > connections_lost {
            connections_lost = subscriber.connections_lost();
            let _ = writeln!(
                err,
                "kv-events: the connection to {} closed: the publisher stopped, or sent a \
                 message over --max-message-bytes ({} bytes), which libzmq refuses by \
                 closing; reconnecting, a message lost meanwhile shows as a gap",
                connect_form(&args.endpoint),
                args.max_message_bytes
            );
        }
        let batches = match (received, catchup.as_deref_mut()) {
            (Ok(Some(batch)), None) => Ok(vec![batch]),
            (Ok(Some(batch)), Some(catchup)) => {
                let (batches, failure) = catchup.fill(batch);
                if let Some(e) = failure {
                    let _ = writeln!(err, "kv-events: cannot fill a gap: {e}");
                }
                Ok(batches)
            }
            (Ok(None), Some(catchup)) if last_message.max(last_check).elapsed() >= QUIET => {
                // Quiet: messages lost at the end of a burst show in no later message.
                last_check = Instant::now();
                match catchup.check_end() {
                    Ok((batches, lost)) => {
                        replay_silent = false;
                        if lost > 0 {
                            let _ = writeln!(
                                err,
                                "kv-events: the publisher sent {lost} more message{} than \
                                 arrived here, which its replay buffer no longer holds",
                                if lost == 1 { "" } else { "s" }
                            );
                        }
                        Ok(batches)
                    }
                    // A silent replay socket is said once, until it answers again.
                    Err(e) if e.is_unanswered() && replay_silent => Ok(Vec::new()),
                    Err(e) => {
                        replay_silent = e.is_unanswered();
                        let _ = writeln!(err, "kv-events: cannot ask for the last sequence: {e}");
                        Ok(Vec::new())
                    }
                }
            }
            (Ok(None), _) => Ok(Vec::new()),
            (Err(e), _) => Err(e),
        };
        match batches {
            Ok(batches) => {
                for batch in &batches {
                    last_message = Instant::now();
                    let left = limit.saturating_sub(view.tally.events);
                    view.take(batch, left, out, err)
                        .map_err(|e| write_failure(&e, "an event"))?;
                }
            }
            // One message refused: say so and go on; the next message's gap counts it.
            Err(e @ (WatchError::Malformed(_) | WatchError::TooLarge { .. })) => {
                last_message = Instant::now();
                let _ = writeln!(
                    err,
                    "kv-events: refused a message: {e}; its events are lost, the next \
                     message shows the gap"
                );
            }
            Err(e @ WatchError::Refused(_)) => {
                return Err(Failure::Error(format!(
                    "{}: {e}",
                    connect_form(&args.endpoint)
                )))
            }
            Err(e) => {
                return Err(Failure::Error(format!(
                    "reading {}: {e}",
                    connect_form(&args.endpoint)
                )))
            }
        }
    }
}

/// Why connection attempts to `endpoint` fail: libzmq only says that they do.
pub(crate) fn unreached(endpoint: &str) -> &'static str {
    // tcp://[source-interface;]host:port; libzmq resolves the host at each attempt.
    let host_port = endpoint
        .strip_prefix("tcp://")
        .map(|rest| rest.rsplit(';').next().unwrap_or(rest));
    let resolves = host_port.is_none_or(|host_port| {
        std::net::ToSocketAddrs::to_socket_addrs(host_port).is_ok_and(|mut a| a.next().is_some())
    });
    if resolves {
        "nothing accepted a connection there (nothing listening, refused, or no such socket file)"
    } else {
        "its host name does not resolve"
    }
}

/// The error of a tail that never reached its publisher at `endpoint` within `idle`, for
/// `reach`.
fn never_reached(endpoint: &str, reach: Reach, idle: Duration) -> String {
    let why = match reach {
        Reach::Unreached { failed_attempts } if failed_attempts > 0 => format!(
            "{}; {failed_attempts} attempt{} failed",
            unreached(endpoint),
            if failed_attempts == 1 { "" } else { "s" }
        ),
        reach => not_reached(endpoint, reach)
            .unwrap_or(NO_HANDSHAKE)
            .to_owned(),
    };
    format!(
        "never reached {endpoint} within --idle-timeout ({}s): {why}",
        idle.as_secs_f64()
    )
}

const NO_HANDSHAKE: &str =
    "a connection was made, but no ZeroMQ handshake completed on it: is a ZeroMQ PUB socket \
     listening there? (a master's replay endpoint is a ROUTER: give it as --replay-endpoint)";

/// How long a connection without a handshake is waited for before stderr says so.
const NO_HANDSHAKE_AFTER: Duration = Duration::from_secs(2);

/// Why a subscriber that got as far as `reach` towards its publisher at `endpoint` has not
/// reached it, for `tail` and `mirror`; `None` once it has.
pub(crate) fn not_reached(endpoint: &str, reach: Reach) -> Option<&'static str> {
    match reach {
        Reach::Unreached { failed_attempts } if failed_attempts > 0 => Some(unreached(endpoint)),
        Reach::Unreached { .. } => Some(
            "the connection attempt got no answer (a host that does not answer, or a firewall \
             that drops it)",
        ),
        Reach::NoHandshake => Some(NO_HANDSHAKE),
        Reach::Reached => None,
    }
}

/// `--stats`: one line per interval, from the difference between two [`Tally`]s.
#[derive(Debug)]
struct StatsLines {
    started: Instant,
    /// When the last line's interval ended, and the tally then.
    since: Instant,
    before: Tally,
    /// When the next line is due.
    next_at: Instant,
    /// The publisher's last `info`, with `--replay-endpoint`.
    readers: Option<Info>,
    /// `--json`: each line a JSON object, no header.
    json: bool,
}

impl StatsLines {
    /// The column titles, printed once before the first line.
    const HEADER: &'static str =
        "   time   events/s   stored/s  removed/s  cleared/s   gaps   missed  last_sequence";

    fn new(now: Instant, json: bool) -> StatsLines {
        StatsLines {
            started: now,
            since: now,
            before: Tally::default(),
            next_at: now + STATS_EVERY,
            readers: None,
            json,
        }
    }

    /// The line for the interval that ends `now`, and the next one scheduled; `None` when
    /// the interval is too short to give a rate. With `catchup`, the line ends with the
    /// publisher's readers, which its `info` says.
    fn tick(&mut self, now: Instant, view: &View, catchup: Option<&mut Catchup>) -> Option<String> {
        // A late tick (a long write, a slow machine) starts the next interval now rather
        // than printing a burst of lines to catch up.
        self.next_at = (self.next_at + STATS_EVERY).max(now + STATS_EVERY / 2);
        let row = stats_row(
            now.saturating_duration_since(self.started),
            now.saturating_duration_since(self.since),
            &self.before,
            &view.tally,
            view.last_sequence(),
        );
        self.since = now;
        self.before = view.tally.clone();
        let row = row?;
        let Some(catchup) = catchup else {
            return Some(if self.json {
                row.json(None).to_string()
            } else {
                row.text()
            });
        };
        let info = catchup.info().ok();
        let readers = readers(self.readers.as_ref(), info.as_ref());
        if info.is_some() {
            self.readers = info;
        }
        Some(if self.json {
            row.json(Some(readers)).to_string()
        } else {
            row.text() + &readers_text(readers)
        })
    }
}

/// The publisher's readers for a `--stats` line: the subscribers connected to it now, and
/// those that connected and disconnected since `before` (since the publisher started, on the
/// first line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Readers {
    subscribers: u64,
    connects: u64,
    disconnects: u64,
}

/// The readers `after` says, since `before`; `None` when the publisher did not answer.
fn readers(before: Option<&Info>, after: Option<&Info>) -> Option<Readers> {
    let after = after?;
    let since = |count: fn(&Info) -> u64| count(after).saturating_sub(before.map_or(0, count));
    Some(Readers {
        subscribers: after.subscribers,
        connects: since(|i| i.subscriber_connects),
        disconnects: since(|i| i.subscriber_disconnects),
    })
}

/// The readers' columns after a `--stats` line; `-` when the publisher did not answer.
fn readers_text(readers: Option<Readers>) -> String {
    match readers {
        None => readers_columns(["-", "-", "-"]),
        Some(r) => readers_columns([
            r.subscribers.to_string().as_str(),
            &r.connects.to_string(),
            &r.disconnects.to_string(),
        ]),
    }
}

#[cfg(test)]
fn readers_line(before: Option<&Info>, after: Option<&Info>) -> String {
    readers_text(readers(before, after))
}

/// Three readers' columns, each ending where its title does.
fn readers_columns([now, connects, disconnects]: [&str; 3]) -> String {
    format!(" {now:>12} {connects:>9} {disconnects:>12}")
}

/// What one `--stats` line says: `elapsed` since the start, the rates (per second) over the
/// interval, the discontinuities and sequence numbers missed in it, the last sequence seen.
#[derive(Clone, Debug, PartialEq)]
struct StatsRow {
    elapsed: Duration,
    events: f64,
    stored: f64,
    removed: f64,
    cleared: f64,
    gaps: u64,
    missed: u64,
    last_sequence: Option<u64>,
}

impl StatsRow {
    /// The line under [`StatsLines::HEADER`]; `-` for no sequence yet.
    fn text(&self) -> String {
        let last = self
            .last_sequence
            .map_or_else(|| "-".to_owned(), |s| s.to_string());
        format!(
            "{:>6.1}s {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>6} {:>8} {:>14}",
            self.elapsed.as_secs_f64(),
            self.events,
            self.stored,
            self.removed,
            self.cleared,
            self.gaps,
            self.missed,
            last
        )
    }

    /// `--json`: the same numbers as an object (rates to a tenth, time to a millisecond,
    /// `null` for no sequence yet); with `--replay-endpoint`, `readers` adds the publisher's
    /// subscribers, `null` when it did not answer.
    fn json(&self, readers: Option<Option<Readers>>) -> serde_json::Value {
        let tenth = |rate: f64| (rate * 10.0).round() / 10.0;
        let mut row = serde_json::json!({
            "time_s": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "events_per_s": tenth(self.events),
            "stored_per_s": tenth(self.stored),
            "removed_per_s": tenth(self.removed),
            "cleared_per_s": tenth(self.cleared),
            "gaps": self.gaps,
            "missed": self.missed,
            "last_sequence": self.last_sequence,
        });
        if let Some(readers) = readers {
            row["subscribers"] = readers.map(|r| r.subscribers).into();
            row["connects"] = readers.map(|r| r.connects).into();
            row["disconnects"] = readers.map(|r| r.disconnects).into();
        }
        row
    }
}

/// The row for the `interval` in which the tally went from `before` to `after`. `None` when
/// the interval is under 1 ms.
fn stats_row(
    elapsed: Duration,
    interval: Duration,
    before: &Tally,
    after: &Tally,
    last_sequence: Option<u64>,
) -> Option<StatsRow> {
    let secs = interval.as_secs_f64();
    if secs < 1e-3 {
        return None;
    }
    let rate = |field: fn(&Tally) -> u64| (field(after) - field(before)) as f64 / secs;
    Some(StatsRow {
        elapsed,
        events: rate(|t| t.events),
        stored: rate(|t| t.stored),
        removed: rate(|t| t.removed),
        cleared: rate(|t| t.cleared),
        gaps: discontinuities(after) - discontinuities(before),
        missed: missed(after) - missed(before),
        last_sequence,
    })
}

/// One `--stats` line as text (`-` for no sequence yet).
#[cfg(test)]
fn stats_line(
    elapsed: Duration,
    interval: Duration,
    before: &Tally,
    after: &Tally,
    last_sequence: Option<u64>,
) -> Option<String> {
    stats_row(elapsed, interval, before, after, last_sequence).map(|row| row.text())
}

/// Times the sequence did not simply follow: gaps, restarts, and a first message after 1.
fn discontinuities(t: &Tally) -> u64 {
    t.gaps + t.restarts + u64::from(t.missed_before_first > 0)
}

/// Sequence numbers never seen: skipped by gaps, or before the first message.
fn missed(t: &Tally) -> u64 {
    t.missed + t.missed_before_first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stats_line_gives_rates_over_its_interval_under_the_header() {
        let before = Tally {
            events: 100,
            stored: 60,
            removed: 40,
            ..Tally::default()
        };
        let after = Tally {
            events: 400,
            stored: 260,
            removed: 130,
            cleared: 10,
            gaps: 2,
            missed: 7,
            ..Tally::default()
        };
        let line = stats_line(
            Duration::from_secs(3),
            Duration::from_millis(500),
            &before,
            &after,
            Some(4242),
        )
        .unwrap();
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["3.0s", "600", "400", "180", "20", "2", "7", "4242"]
        );
        // Each value ends where its title does.
        let ends = |s: &str| -> Vec<usize> {
            let b = s.as_bytes();
            (0..b.len())
                .filter(|&i| b[i] != b' ' && b.get(i + 1).is_none_or(|&c| c == b' '))
                .collect()
        };
        assert_eq!(ends(&line), ends(StatsLines::HEADER), "\n{line}");
    }

    #[test]
    fn a_stats_line_counts_restarts_and_late_joins_as_gaps_and_shows_no_sequence_before_the_first()
    {
        let after = Tally {
            restarts: 1,
            missed_before_first: 3,
            ..Tally::default()
        };
        let line = stats_line(
            Duration::from_secs(1),
            Duration::from_secs(1),
            &Tally::default(),
            &after,
            None,
        )
        .unwrap();
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            ["1.0s", "0", "0", "0", "0", "2", "3", "-"]
        );
    }

    #[test]
    fn a_tail_that_never_reached_its_publisher_says_why() {
        let idle = Duration::from_millis(1500);
        let endpoint = "tcp://127.0.0.1:1";
        let refused = never_reached(endpoint, Reach::Unreached { failed_attempts: 3 }, idle);
        assert_eq!(
            refused,
            "never reached tcp://127.0.0.1:1 within --idle-timeout (1.5s): nothing accepted \
             a connection there (nothing listening, refused, or no such socket file); 3 \
             attempts failed"
        );
        let unresolved = never_reached(
            "tcp://no-such-host.invalid:1",
            Reach::Unreached { failed_attempts: 1 },
            idle,
        );
        assert!(
            unresolved.ends_with("its host name does not resolve; 1 attempt failed"),
            "{unresolved}"
        );
        assert!(unreached("ipc:///tmp/x").starts_with("nothing accepted"));
        assert!(unreached("tcp://lo;127.0.0.1:1").starts_with("nothing accepted"));
        let pending = never_reached("tcp://h:1", Reach::Unreached { failed_attempts: 0 }, idle);
        assert!(pending.contains("got no answer"), "{pending}");
        let not_zmq = never_reached("tcp://h:1", Reach::NoHandshake, idle);
        assert!(not_zmq.contains("no ZeroMQ handshake"), "{not_zmq}");
    }

    #[test]
    fn the_readers_columns_give_the_subscribers_and_their_comings_and_goings() {
        let before = Info {
            subscribers: 3,
            subscriber_connects: 5,
            subscriber_disconnects: 2,
            ..Info::default()
        };
        let after = Info {
            subscribers: 4,
            subscriber_connects: 7,
            subscriber_disconnects: 3,
            ..Info::default()
        };
        let words = |s: String| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            words(readers_line(Some(&before), Some(&after))),
            ["4", "2", "1"]
        );
        assert_eq!(words(readers_line(None, Some(&after))), ["4", "7", "3"]);
        assert_eq!(words(readers_line(Some(&before), None)), ["-", "-", "-"]);
        let header = readers_columns(["subscribers", "connects", "disconnects"]);
        let line = readers_line(Some(&before), Some(&after));
        assert_eq!(header.len(), line.len(), "\n{header}\n{line}");
    }

    #[test]
    fn a_json_stats_line_has_the_same_numbers_with_null_for_what_is_not_known() {
        let after = Tally {
            events: 301,
            stored: 200,
            removed: 100,
            cleared: 1,
            gaps: 1,
            missed: 4,
            ..Tally::default()
        };
        let row = stats_row(
            Duration::from_millis(2500),
            Duration::from_secs(2),
            &Tally::default(),
            &after,
            Some(77),
        )
        .unwrap();
        assert_eq!(
            row.json(None),
            serde_json::json!({
                "time_s": 2.5, "events_per_s": 150.5, "stored_per_s": 100.0,
                "removed_per_s": 50.0, "cleared_per_s": 0.5, "gaps": 1, "missed": 4,
                "last_sequence": 77
            })
        );
        let readers = Some(Readers {
            subscribers: 2,
            connects: 3,
            disconnects: 1,
        });
        let with = row.json(Some(readers));
        assert_eq!(
            (
                &with["subscribers"],
                &with["connects"],
                &with["disconnects"]
            ),
            (&2.into(), &3.into(), &1.into())
        );
        let unanswered = row.json(Some(None));
        assert!(unanswered["subscribers"].is_null() && unanswered["connects"].is_null());
        let first = stats_row(
            Duration::from_secs(1),
            Duration::from_secs(1),
            &Tally::default(),
            &Tally::default(),
            None,
        )
        .unwrap();
        assert!(first.json(None)["last_sequence"].is_null());
    }

    #[test]
    fn no_stats_line_for_an_empty_interval() {
        let none = stats_line(
            Duration::ZERO,
            Duration::ZERO,
            &Tally::default(),
            &Tally::default(),
            None,
        );
        assert_eq!(none, None);
    }
}
