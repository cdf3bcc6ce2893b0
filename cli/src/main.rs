//! `kv-events`: watch the KV event stream of a running publisher (`tail`), try one with a
//! synthetic master workload and a watcher that checks it saw every event (`demo`), keep a
//! self-healing copy of the publishers' index (`mirror`), relay it into NATS JetStream
//! (`relay`, the `kv-events-relay` binary), or make the CURVE keys that protect
//! a stream (`keygen`).
//!
//! Run `kv-events --help` for the usage. Exit status: 0 done, 1 runtime error, 2 usage
//! error.
#![warn(missing_debug_implementations, unreachable_pub)]

mod args;
mod demo;
mod keygen;
mod master;
mod mirror;
mod relay;
mod tail;
mod view;

use args::Command;
use std::process::ExitCode;

/// Why a command failed: said on stderr in one line, and the exit status is 1. Boxed, as
/// nothing branches on it: the library's typed errors are matched where a command can act
/// on them, and reach this point only to be said.
type CommandError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let outcome = match args::parse() {
        Command::Tail(tail) => tail::run(&tail),
        Command::Demo(demo) => demo::run(&demo),
        Command::Mirror(mirror) => mirror::run(&mirror).map_err(CommandError::from),
        Command::Relay { args } => relay::run(&args),
        Command::Keygen { name } => keygen::run(&name),
        Command::Completions { shell } => args::print_completions(shell),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("kv-events: {why}");
            ExitCode::from(1)
        }
    }
}
