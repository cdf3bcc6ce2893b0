//! Follows KV event publishers with `Follower` (a snapshot from the replay socket, then the
//! stream, gaps replayed, restarts followed) for some seconds, then prints the index of the
//! freshest one as JSON lines on stdout and what it counted on stderr. Exits 1 when no
//! publisher was in sync at the end.
//!
//! ```sh
//! cargo run --manifest-path examples/rust-follower/Cargo.toml -- 10 tcp://127.0.0.1:5557 tcp://127.0.0.1:5558
//! ```

use mooncake_kv_events::keys;
use mooncake_kv_events::subscriber::{FollowOptions, Follower, Upstream};
use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (seconds, endpoints) = match args.split_first() {
        Some((seconds, endpoints)) if !endpoints.is_empty() && endpoints.len() % 2 == 0 => {
            match seconds.parse::<f64>() {
                Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => (seconds, endpoints),
                _ => return usage(),
            }
        }
        _ => return usage(),
    };
    match keys::curve_available() {
        Ok(()) => eprintln!("CURVE available"),
        Err(reason) => eprintln!("CURVE not available: {reason}"),
    }
    let upstreams = endpoints
        .chunks(2)
        .map(|pair| Upstream::new(pair[0].as_str(), pair[1].as_str()))
        .collect();
    let mut follower = match Follower::new(upstreams, FollowOptions::default()) {
        Ok(follower) => follower,
        Err(error) => {
            eprintln!("rust-follower: {error}");
            return ExitCode::FAILURE;
        }
    };
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        for notice in follower.poll(left.min(Duration::from_millis(100))) {
            eprintln!("publisher {}: {}", notice.upstream, notice.kind);
        }
    }
    let Some(leader) = follower.freshest() else {
        eprintln!("rust-follower: no publisher in sync after {seconds}s");
        return ExitCode::FAILURE;
    };
    let index = follower.index(leader);
    let mut out = io::stdout().lock();
    if let Err(error) = index.write_json_lines(&mut out).and_then(|()| out.flush()) {
        eprintln!("rust-follower: {error}");
        return ExitCode::FAILURE;
    }
    eprintln!("objects {}", index.objects());
    eprintln!("{:?}", follower.counters());
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: rust-follower SECONDS ENDPOINT REPLAY_ENDPOINT [ENDPOINT REPLAY_ENDPOINT]..."
    );
    ExitCode::from(2)
}
