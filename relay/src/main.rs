//! `kv-events-relay` (also `kv-events relay`): follows a Mooncake master's KV event stream
//! and writes it into NATS JetStream, so that a fleet of readers never touches the master.
//! See docs/relay.md. Exit status: 0 stopped with the log up to date, 1 runtime error,
//! 2 usage error.
#![warn(missing_debug_implementations, unreachable_pub)]

mod args;
mod batch;
mod bucket;
mod counters;
mod diff;
mod error;
mod heap;
mod held;
mod log;
#[cfg(test)]
mod memory;
mod names;
mod nats;
mod relay;
mod source;
mod status;
mod store;

use clap::Parser;
use error::{Error, StoreError};
use mooncake_kv_events::keys;
use mooncake_kv_events::subscriber::{
    catch_stop_signals, connect_form, stop_requested, CurveClient, FollowOptions, Follower,
    ReplayClient, Upstream,
};
use relay::Relay;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The longest one turn waits on the master when nothing arrives: it bounds how late a
/// signal is seen. The follower returns as soon as it applied a message.
const TURN: Duration = Duration::from_millis(50);
/// The follower's SUB socket's receive high-water mark: what it drops it recovers by a
/// replay or a snapshot. It absorbs a turn that holds the follower back, and a turn is
/// bounded (100 ms of writes; a difference's walk, under a second at millions of objects):
/// 8,192 of the master's messages (4-8 KB at 64 events: 32-64 MB) are 3 s of a master at
/// 100,000 calls/s. A relay slower than its master for longer overflows whatever the
/// bound (32,768 did, 38 s into a run at 100,000 calls/s on two busy cores, 11 s behind;
/// the relay's peak then held them all, 130-260 MB).
const RCVHWM: i32 = 8_192;
/// How long the relay goes on writing at the end, for what came last.
const LAST_WRITES: Duration = Duration::from_secs(10);
/// How often a failure that goes on is said again.
const STILL_FAILING: Duration = Duration::from_secs(30);
/// How long a start that NATS failed waits before it tries again.
const RETRY: Duration = Duration::from_secs(1);
/// How long after the follower's news (a snapshot of the master loaded, a gap) or a
/// difference written the relay hands freed memory back to the system ([`heap::trim`]):
/// the large allocations go then, and trimming in steady state would only make the
/// allocator fault its pages in again.
const TRIM_AFTER: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let args = args::Args::parse();
    if let Err(why) = args.check() {
        eprintln!("kv-events relay: {why}");
        return ExitCode::from(2);
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("kv-events relay: {why}");
            ExitCode::from(1)
        }
    }
}

/// The publishers to follow, with their CURVE keys.
fn upstreams(args: &args::Args) -> Result<Vec<Upstream>, Error> {
    let own_keys = match &args.curve_secret_key {
        Some(path) => {
            keys::curve_available().map_err(|e| Error::Master(e.to_string()))?;
            Some(keys::read_key_pair(path).map_err(|e| Error::Master(e.to_string()))?)
        }
        None => None,
    };
    let mut upstreams = Vec::with_capacity(args.endpoints.len());
    for (i, (endpoint, replay)) in args
        .endpoints
        .iter()
        .zip(&args.replay_endpoints)
        .enumerate()
    {
        let curve = match &own_keys {
            Some(pair) => {
                let server = &args.curve_server_keys[if args.curve_server_keys.len() == 1 {
                    0
                } else {
                    i
                }];
                Some(CurveClient {
                    server_key: keys::read_public_key(server)
                        .map_err(|e| Error::Master(e.to_string()))?,
                    keys: pair.clone(),
                })
            }
            None => None,
        };
        upstreams.push(Upstream {
            endpoint: connect_form(endpoint),
            replay_endpoint: Some(connect_form(replay)),
            curve,
            topic: args.topic.as_bytes().to_vec(),
        });
    }
    Ok(upstreams)
}

/// The backend id of the first publisher that answers `info`: the subject and the keys are
/// named after it. Waits for one (a master not up yet), until a signal.
fn backend_id(upstreams: &[Upstream]) -> Result<String, Error> {
    let mut clients = Vec::with_capacity(upstreams.len());
    for upstream in upstreams {
        let replay = upstream.replay_endpoint.as_deref().unwrap_or_default();
        let client = ReplayClient::connect(replay, upstream.curve.clone())
            .map_err(|e| Error::Master(format!("cannot connect to {replay}: {e}")))?;
        clients.push(client);
    }
    let mut said = false;
    while !stop_requested() {
        for client in &mut clients {
            if let Ok(info) = client.info(Duration::from_millis(500)) {
                return Ok(info.backend_id);
            }
        }
        if !said {
            let endpoints: Vec<&str> = upstreams
                .iter()
                .map(|u| u.replay_endpoint.as_deref().unwrap_or_default())
                .collect();
            eprintln!(
                "kv-events relay: waiting for a publisher to answer info at {} (its replay \
                 endpoint: the master up, kv_events_replay_endpoint set?)",
                endpoints.join(", ")
            );
            said = true;
        }
    }
    Err(Error::Stopped)
}

/// Runs the relay until `--duration`, Ctrl-C or SIGTERM.
fn run(args: &args::Args) -> Result<(), Error> {
    // Ctrl-C and SIGTERM end the loop, after what is pending is written.
    catch_stop_signals();
    let upstreams = upstreams(args)?;
    let names: Vec<String> = upstreams.iter().map(|s| s.endpoint.clone()).collect();
    let backend = backend_id(&upstreams)?;
    let mut relay = start(args, &upstreams, &backend)?;
    eprintln!(
        "kv-events relay: relaying backend {backend} from {} into NATS {} (stream {}, \
         subject {}, snapshots {}{})",
        names.join(", "),
        args.nats,
        args.stream,
        relay.log.subject,
        args.snapshots,
        args.bucket
            .as_ref()
            .map_or_else(String::new, |b| format!(", bucket {b}")),
    );
    follow(&mut relay, args, &names)
}

/// The relay started: connected to NATS, the stream and the buckets in place, the log and
/// the snapshot read. A failure NATS may get over (not up yet, a node restarting, a leader
/// being elected) is said, then retried every second; anything else stops the relay.
fn start(
    args: &args::Args,
    upstreams: &[Upstream],
    backend: &str,
) -> Result<Relay<Follower, nats::Nats>, Error> {
    let mut failing: Option<(String, Instant)> = None;
    loop {
        match start_once(args, upstreams, backend) {
            Err(Error::Store(why @ StoreError::Failed { .. })) if !stop_requested() => {
                let why = why.to_string();
                if failing.as_ref().is_none_or(|(said, _)| *said != why) {
                    eprintln!(
                        "kv-events relay: NATS at {} failing at start: {why}; retrying every \
                         second",
                        args.nats
                    );
                    let since = failing.map_or_else(Instant::now, |f| f.1);
                    failing = Some((why, since));
                }
                std::thread::sleep(RETRY);
            }
            Ok(relay) => {
                if let Some((_, since)) = failing {
                    eprintln!(
                        "kv-events relay: NATS at {} answers again (after {} s)",
                        args.nats,
                        since.elapsed().as_secs()
                    );
                }
                return Ok(relay);
            }
            Err(e) => return Err(e),
        }
    }
}

/// One attempt at [`start`].
fn start_once(
    args: &args::Args,
    upstreams: &[Upstream],
    backend: &str,
) -> Result<Relay<Follower, nats::Nats>, Error> {
    let store = nats::Nats::connect(
        &args.nats,
        nats::Names {
            stream: args.stream.clone(),
            subject_prefix: args.subject_prefix.clone(),
            snapshots: args.snapshots.clone(),
            bucket: args.bucket.clone(),
            replicas: usize::from(args.replicas),
            marker_age: args.bucket_marker_age,
        },
    )?;
    let options = FollowOptions {
        rcvhwm: RCVHWM,
        track_changes: true,
        keep_applied: true,
        // Live messages held while a snapshot of the master loads: a master flat out fills
        // this in about 2 s, and a snapshot taking longer than that loads again anyway;
        // past it, memory spent for nothing (the relay's peak at 4.3 M objects).
        max_held_bytes: 64 << 20,
        ..FollowOptions::default()
    };
    let follower =
        Follower::new(upstreams.to_vec(), options).map_err(|e| Error::Master(e.to_string()))?;
    Ok(Relay::start(
        follower,
        store,
        relay::Options {
            backend: backend.to_owned(),
            subject_prefix: args.subject_prefix.clone(),
            snapshot_every: args.snapshot_every,
            bucket: args.bucket.is_some(),
        },
    )?)
}

/// The loop: turns until the end, a status line every `--every`.
fn follow<S: source::Source, T: store::Store>(
    relay: &mut Relay<S, T>,
    args: &args::Args,
    names: &[String],
) -> Result<(), Error> {
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    let mut next_status = started + args.every;
    let mut trim_at: Option<Instant> = None;
    let mut diffs = 0;
    // The failure being retried: what it said, since when, when last said.
    let mut failing: Option<(String, Instant, Instant)> = None;
    // stderr is not held locked: the NATS client's thread writes on it too.
    let err = std::io::stderr();
    while !stop_requested() && deadline.is_none_or(|d| Instant::now() < d) {
        let (notices, outcome) = relay.turn(TURN);
        if !notices.is_empty() || relay.counters.diffs != diffs {
            diffs = relay.counters.diffs;
            trim_at.get_or_insert_with(|| Instant::now() + TRIM_AFTER);
        }
        for notice in notices {
            let _ = writeln!(
                err.lock(),
                "kv-events relay: {}: {}",
                names[notice.upstream],
                notice.kind
            );
        }
        for failure in relay.take_failures() {
            let _ = writeln!(err.lock(), "kv-events relay: {failure}");
        }
        let now = Instant::now();
        match outcome {
            Err(why) => {
                let why = why.to_string();
                let say = match &failing {
                    None => Some(format!(
                        "NATS at {} failing: {why}; retrying every second",
                        args.nats
                    )),
                    Some((said, since, at)) if *said != why || now - *at >= STILL_FAILING => {
                        Some(format!(
                            "NATS at {} still failing after {} s: {why}",
                            args.nats,
                            (now - *since).as_secs()
                        ))
                    }
                    Some(_) => None,
                };
                if let Some(say) = say {
                    let _ = writeln!(err.lock(), "kv-events relay: {say}");
                    let since = failing.as_ref().map_or(now, |f| f.1);
                    failing = Some((why, since, now));
                }
            }
            // A turn that waits for the retry asked NATS nothing: no news.
            Ok(()) if relay.backing_off() => {}
            Ok(()) => {
                if let Some((_, since, _)) = failing.take() {
                    let _ = writeln!(
                        err.lock(),
                        "kv-events relay: NATS at {} answers again (after {} s)",
                        args.nats,
                        (now - since).as_secs()
                    );
                }
            }
        }
        if trim_at.is_some_and(|at| now >= at) {
            heap::trim();
            trim_at = None;
        }
        if now >= next_status {
            let _ = write!(
                err.lock(),
                "{}",
                status::line(relay, names, started.elapsed())
            );
            // Ticks missed by a stall are skipped, not printed in a burst.
            while next_status <= now {
                next_status += args.every;
            }
        }
    }
    // What came last is written before the end, when the master and NATS allow.
    let end = Instant::now() + LAST_WRITES;
    while !relay.up_to_date() && Instant::now() < end {
        if relay.turn(Duration::from_millis(10)).1.is_err() {
            break;
        }
    }
    let _ = write!(
        err.lock(),
        "{}",
        status::line(relay, names, started.elapsed())
    );
    if relay.up_to_date() {
        Ok(())
    } else {
        Err(Error::Behind)
    }
}
