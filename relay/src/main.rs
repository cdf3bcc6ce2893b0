//! `kv-events-relay` (also `kv-events relay`): follows a Mooncake master's KV event stream
//! and writes it into NATS JetStream, so that a fleet of readers never touches the master.
//! See docs/relay.md. Exit status: 0 stopped with the log up to date, 1 runtime error,
//! 2 usage error.
#![warn(missing_debug_implementations, unreachable_pub)]

mod args;
mod batch;
mod bucket;
mod counters;
mod held;
mod log;
mod names;
mod nats;
mod raw;
mod relay;
mod status;

use clap::Parser;
use mooncake_kv_events::keys;
use mooncake_kv_events::subscriber::{
    catch_stop_signals, connect_form, stop_requested, CurveClient, FollowOptions, Follower,
    ReplayClient, SubscriberOptions, Upstream,
};
use raw::Raw;
use relay::Relay;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The longest one turn waits on the master: it bounds how late a signal is seen, and how
/// many of the master's messages one log message gathers under load.
const TURN: Duration = Duration::from_millis(50);
/// The follower's SUB socket's receive high-water mark, as `mirror`'s: what it drops it
/// recovers by a replay or a snapshot.
const RCVHWM: i32 = 1_000_000;
/// The high-water mark of the relay's own SUB socket, which reads the stream a second time
/// for the log: about as much as the relay holds (`raw.rs`); what it drops past it the log
/// gets as a difference, so a master far ahead costs no more memory here.
const RAW_RCVHWM: i32 = 16_384;

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
fn upstreams(args: &args::Args) -> Result<Vec<Upstream>, String> {
    let own_keys = match &args.curve_secret_key {
        Some(path) => {
            keys::curve_available()?;
            Some(keys::read_key_pair(path)?)
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
                    server_key: keys::read_public_key(server)?,
                    keys: pair.clone(),
                })
            }
            None => None,
        };
        upstreams.push(Upstream {
            endpoint: connect_form(endpoint),
            replay_endpoint: connect_form(replay),
            curve,
            topic: args.topic.as_bytes().to_vec(),
        });
    }
    Ok(upstreams)
}

/// The backend id of the first publisher that answers `info`: the subject and the keys are
/// named after it. Waits for one (a master not up yet), until a signal.
fn backend_id(upstreams: &[Upstream]) -> Result<String, String> {
    let mut clients = Vec::with_capacity(upstreams.len());
    for upstream in upstreams {
        let client = ReplayClient::connect(&upstream.replay_endpoint, upstream.curve.clone())
            .map_err(|e| format!("cannot connect to {}: {e}", upstream.replay_endpoint))?;
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
            eprintln!("kv-events relay: waiting for a publisher to answer info");
            said = true;
        }
    }
    Err("stopped before any publisher answered".into())
}

/// Runs the relay until `--duration`, Ctrl-C or SIGTERM.
fn run(args: &args::Args) -> Result<(), String> {
    // Ctrl-C and SIGTERM end the loop, after what is pending is written.
    catch_stop_signals();
    let upstreams = upstreams(args)?;
    let names: Vec<String> = upstreams.iter().map(|s| s.endpoint.clone()).collect();
    let backend = backend_id(&upstreams)?;
    let nats = nats::Nats::connect(
        &args.nats,
        nats::Names {
            stream: args.stream.clone(),
            bucket: args.bucket.clone(),
        },
    )?;
    let mut raws = Vec::with_capacity(upstreams.len());
    for upstream in &upstreams {
        let options = SubscriberOptions {
            rcvhwm: RAW_RCVHWM,
            curve: upstream.curve.clone(),
            topic: upstream.topic.clone(),
            ..SubscriberOptions::default()
        };
        raws.push(Raw::open(&upstream.endpoint, &options)?);
    }
    let options = FollowOptions {
        rcvhwm: RCVHWM,
        track_changes: true,
        ..FollowOptions::default()
    };
    let follower = Follower::new(upstreams, options)?;
    let mut relay = Relay::start(follower, raws, nats, backend.clone())?;
    eprintln!(
        "kv-events relay: relaying backend {backend} from {} into NATS {} (stream {}, \
         subject {}, bucket {})",
        names.join(", "),
        args.nats,
        args.stream,
        relay.log.subject,
        args.bucket
    );
    follow(&mut relay, args, &names)
}

/// The loop: turns until the end, a status line every `--every`.
fn follow(relay: &mut Relay, args: &args::Args, names: &[String]) -> Result<(), String> {
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    let mut next_status = started + args.every;
    let mut failing: Option<String> = None;
    let mut err = std::io::stderr().lock();
    while !stop_requested() && deadline.is_none_or(|d| Instant::now() < d) {
        let (notices, outcome) = relay.turn(TURN);
        for notice in notices {
            let _ = writeln!(
                err,
                "kv-events relay: {}: {}",
                names[notice.upstream], notice.event
            );
        }
        match outcome {
            Err(why) if failing.as_ref() != Some(&why) => {
                let _ = writeln!(err, "kv-events relay: {why}; retrying");
                failing = Some(why);
            }
            Ok(()) => failing = None,
            Err(_) => {}
        }
        if Instant::now() >= next_status {
            let _ = write!(err, "{}", status::line(relay, names, started.elapsed()));
            next_status += args.every;
        }
    }
    // What came last is written before the end, when the master and NATS allow; the bucket
    // takes a bounded number of entries a turn.
    loop {
        let before = relay.pending();
        let written = relay.turn(Duration::ZERO).1.is_ok();
        if !written || relay.pending() == 0 || relay.pending() >= before {
            break;
        }
    }
    let _ = write!(err, "{}", status::line(relay, names, started.elapsed()));
    if relay.up_to_date() {
        Ok(())
    } else {
        Err("stopped with the log or the bucket behind the master".into())
    }
}
