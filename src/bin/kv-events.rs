//! `kv-events`: watch the KV event stream of a running publisher (`tail`), or try one with
//! a synthetic master workload and a watcher that checks it saw every event (`demo`).
//!
//! Run `kv-events --help` for the usage. Exit status: 0 done, 1 runtime error, 2 usage
//! error.
#![warn(missing_debug_implementations, unreachable_pub)]

#[path = "kv_events/args.rs"]
mod args;
#[path = "kv_events/demo.rs"]
mod demo;
#[path = "kv_events/master.rs"]
mod master;
#[path = "kv_events/tail.rs"]
mod tail;
#[path = "kv_events/view.rs"]
mod view;

use args::{Command, DETAILS, SYNOPSIS};
use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    let command = match args::parse(std::env::args_os().skip(1)) {
        Ok(command) => command,
        Err(args::UsageError(why)) => {
            eprintln!("kv-events: {why}\n\n{SYNOPSIS}\nRun kv-events --help for the options and examples.");
            return ExitCode::from(2);
        }
    };
    let outcome = match command {
        Command::Help => {
            // `--help | head` closes stdout early; that is no error.
            let help = format!(
                "kv-events: watch, or try, the KV event stream of Mooncake's metadata master\n\n\
                 {SYNOPSIS}\n{DETAILS}"
            );
            let _ = std::io::stdout().write_all(help.as_bytes());
            Ok(())
        }
        Command::Tail(tail) => tail::run(&tail),
        Command::Demo(demo) => demo::run(&demo),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("kv-events: {why}");
            ExitCode::from(1)
        }
    }
}
