//! The command line: a small hand-written parser and the usage text.

use crate::view::{EventType, Filter};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// The command lines `kv-events` takes: printed after every usage error.
pub(crate) const SYNOPSIS: &str = "\
Usage:
  kv-events tail ENDPOINT [--tenant T]... [--type TYPE[,TYPE]]... [--key-prefix P]...
                 [--stats] [--count N] [--idle-timeout SECS]
  kv-events demo [--endpoint E] [--objects N] [--show N|all] [--wait SECS]
                 [--dump-index FILE]
  kv-events --help
";

/// What each command does, its options and examples: printed by `--help` after a title
/// and the [`SYNOPSIS`].
pub(crate) const DETAILS: &str = "\
tail  Subscribes to the publisher at ENDPOINT and prints one JSON object per event on
      stdout: the event map plus the batch's \"sequence\"; bytes that are not UTF-8 print
      as {\"hex\": \"...\"}. Sequence gaps (lost events), a join after the first message and
      publisher restarts are reported on stderr, whatever the filters. Runs until
      interrupted unless told:
        --count N            exit after N events that pass the filters
        --idle-timeout SECS  exit after SECS seconds without a message
      Filters: an event is printed (and counted) only if it matches each filter given;
      a filter given several times matches any of its values.
        --tenant T           tenant_id is T (an empty T means \"default\", as on the wire)
        --type TYPES         event_type is one of TYPES: stored, removed, cleared,
                             repeated or comma-separated (--type stored,removed)
        --key-prefix P       object_key starts with the bytes of P; a key sent as bin
                             compares by its bytes; cleared events have no key and
                             never match
      Instead of the events:
        --stats              print one line per second on stdout: the rate of the events
                             that pass the filters, in all and per type; the gaps in that
                             second (a restart or a late join counts as one) and the
                             sequence numbers they missed; the last sequence seen. A last
                             line covers the part of a second before exit

demo  Runs a publisher on E (default tcp://127.0.0.1:5557) and a watcher on the same
      stream, drives it with a synthetic master workload that makes every kind of call
      over N objects (default 1000), and prints what the watcher saw against what was
      published. Exits 0 only if the watcher saw every event with no gap.
        --endpoint E         the endpoint to bind
        --objects N          how many objects the workload creates
        --show N|all         print the first N events of each type (default 2)
        --wait SECS          wait for subscribers before the workload (default 0.5)
        --dump-index FILE    write the index a subscriber that saw every event ends with,
                             as JSON in the format of examples/python/indexer.py --dump

Exit status:
  0  tail: stopped by --count or --idle-timeout, or the reader of its stdout went away;
     demo: the watcher saw every published event, with no gap
  1  runtime error: cannot connect or bind, a socket error, a malformed message, a
     file that cannot be written; demo: the watcher missed events or saw a gap
  2  usage error: unknown command or option, a missing or bad value (with the usage,
     on stderr)
  An interrupted tail (Ctrl-C) ends as the signal ends any command.

Examples:
  kv-events demo
  kv-events demo --wait 10        # time to start a tail in another terminal
  kv-events demo --objects 300 --dump-index expected.json
  kv-events tail tcp://127.0.0.1:5557
  kv-events tail ipc:///run/mooncake/kv-events.sock --count 10
  kv-events tail tcp://master-0:5557 --idle-timeout 30 > events.jsonl
  kv-events tail tcp://master-0:5557 --tenant tenant-a --type stored,removed
  kv-events tail tcp://master-0:5557 --type cleared              # RemoveAll results only
  kv-events tail tcp://master-0:5557 --key-prefix llama/ --count 100 | jq -c .object_key
  kv-events tail tcp://master-0:5557 --stats                     # rates, gaps, sequence
  kv-events tail tcp://master-0:5557 --stats --tenant default --type stored
";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub(crate) enum Command {
    /// `--help`, at the top or after a subcommand.
    Help,
    /// `tail ENDPOINT ...`.
    Tail(TailArgs),
    /// `demo ...`.
    Demo(DemoArgs),
}

/// The options of `tail`.
#[derive(Debug, PartialEq)]
pub(crate) struct TailArgs {
    /// Where to connect.
    pub(crate) endpoint: String,
    /// Exit after this many events; `None`: never.
    pub(crate) count: Option<u64>,
    /// Exit after this long without a message; `None`: never.
    pub(crate) idle_timeout: Option<Duration>,
    /// Which events to print and count.
    pub(crate) filter: Filter,
    /// Print a line of rates per second instead of the events.
    pub(crate) stats: bool,
}

/// The options of `demo`.
#[derive(Debug, PartialEq)]
pub(crate) struct DemoArgs {
    /// Where the publisher binds.
    pub(crate) endpoint: String,
    /// How many objects the workload creates, at least 1.
    pub(crate) objects: usize,
    /// Which events the watcher prints.
    pub(crate) show: Show,
    /// How long to wait for subscribers before the workload starts.
    pub(crate) wait: Duration,
    /// Where to write the index a subscriber should end with; `None`: nowhere.
    pub(crate) dump_index: Option<PathBuf>,
}

/// Which of the events it reads a watcher prints; it counts them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Show {
    /// Every event.
    All,
    /// The first N of each event type.
    FirstOfEachType(u64),
}

/// A command line that cannot be run, and why.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UsageError(pub(crate) String);

/// Parses the arguments after the program name.
pub(crate) fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let args = args
        .into_iter()
        .map(|a| {
            a.into_string()
                .map_err(|a| UsageError(format!("argument {a:?} is not valid UTF-8")))
        })
        .collect::<Result<Vec<String>, _>>()?;
    let mut args = args.into_iter();
    match args.next().as_deref() {
        None => Err(UsageError("no command given".into())),
        Some("-h" | "--help" | "help") => Ok(Command::Help),
        Some("tail") => parse_tail(Options::new(args)),
        Some("demo") => parse_demo(Options::new(args)),
        Some(other) => Err(UsageError(format!(
            "unknown command \"{other}\": expected tail or demo"
        ))),
    }
}

fn parse_tail(mut options: Options) -> Result<Command, UsageError> {
    let mut endpoint = None;
    let mut count = None;
    let mut idle_timeout = None;
    let mut filter = Filter::default();
    let mut stats = false;
    while let Some(arg) = options.next() {
        match arg {
            Arg::Flag(flag) => match flag.as_str() {
                "-h" | "--help" => return Ok(Command::Help),
                "--count" => count = Some(positive(&flag, &options.value(&flag)?)?),
                "--idle-timeout" => idle_timeout = Some(seconds(&flag, &options.value(&flag)?)?),
                "--tenant" => filter.tenants.push(tenant(options.value(&flag)?)),
                "--type" => filter
                    .types
                    .extend(event_types(&flag, &options.value(&flag)?)?),
                "--key-prefix" => filter.key_prefixes.push(options.value(&flag)?.into_bytes()),
                "--stats" => {
                    options.no_value(&flag)?;
                    stats = true;
                }
                _ => return Err(unknown_option("tail", &flag)),
            },
            Arg::Positional(value) if endpoint.is_none() => endpoint = Some(value),
            Arg::Positional(value) => {
                return Err(UsageError(format!(
                    "tail takes one ENDPOINT, \"{value}\" is one too many"
                )))
            }
        }
    }
    let endpoint = endpoint
        .ok_or_else(|| UsageError("tail needs an ENDPOINT, e.g. tcp://127.0.0.1:5557".into()))?;
    Ok(Command::Tail(TailArgs {
        endpoint,
        count,
        idle_timeout,
        filter,
        stats,
    }))
}

fn parse_demo(mut options: Options) -> Result<Command, UsageError> {
    let mut demo = DemoArgs {
        endpoint: "tcp://127.0.0.1:5557".into(),
        objects: 1000,
        show: Show::FirstOfEachType(2),
        wait: Duration::from_millis(500),
        dump_index: None,
    };
    while let Some(arg) = options.next() {
        match arg {
            Arg::Flag(flag) => match flag.as_str() {
                "-h" | "--help" => return Ok(Command::Help),
                "--endpoint" => demo.endpoint = options.value(&flag)?,
                "--objects" => {
                    let n = positive(&flag, &options.value(&flag)?)?;
                    demo.objects = usize::try_from(n)
                        .map_err(|_| UsageError(format!("{flag} {n} is too large")))?;
                }
                "--show" => {
                    demo.show = match options.value(&flag)?.as_str() {
                        "all" => Show::All,
                        n => Show::FirstOfEachType(number(&flag, n)?),
                    }
                }
                "--wait" => demo.wait = seconds_or_zero(&flag, &options.value(&flag)?)?,
                "--dump-index" => match options.value(&flag)? {
                    file if file.is_empty() => {
                        return Err(UsageError(format!("{flag} needs a file name")))
                    }
                    file => demo.dump_index = Some(PathBuf::from(file)),
                },
                _ => return Err(unknown_option("demo", &flag)),
            },
            Arg::Positional(value) => {
                return Err(UsageError(format!(
                    "demo takes no positional argument, got \"{value}\""
                )))
            }
        }
    }
    if demo.endpoint.is_empty() {
        return Err(UsageError("--endpoint must not be empty".into()));
    }
    Ok(Command::Demo(demo))
}

fn unknown_option(command: &str, flag: &str) -> UsageError {
    UsageError(format!("{command} has no option {flag}"))
}

/// A tenant as the stream carries it: empty is `"default"`.
fn tenant(value: String) -> Vec<u8> {
    if value.is_empty() {
        b"default".to_vec()
    } else {
        value.into_bytes()
    }
}

/// `stored,removed`: one or more event types, comma-separated.
fn event_types(flag: &str, value: &str) -> Result<Vec<EventType>, UsageError> {
    value
        .split(',')
        .map(|name| {
            EventType::named(name).ok_or_else(|| {
                UsageError(format!(
                    "{flag} wants stored, removed or cleared (or several, comma-separated), \
                     \"{name}\" is none of them"
                ))
            })
        })
        .collect()
}

fn number(flag: &str, value: &str) -> Result<u64, UsageError> {
    value.parse().map_err(|_| {
        UsageError(format!(
            "{flag} wants a whole number, \"{value}\" is not one"
        ))
    })
}

fn positive(flag: &str, value: &str) -> Result<u64, UsageError> {
    match number(flag, value)? {
        0 => Err(UsageError(format!("{flag} must be at least 1"))),
        n => Ok(n),
    }
}

fn seconds_or_zero(flag: &str, value: &str) -> Result<Duration, UsageError> {
    value
        .parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            UsageError(format!(
                "{flag} wants seconds, e.g. 5 or 0.5, \"{value}\" is not that"
            ))
        })
}

fn seconds(flag: &str, value: &str) -> Result<Duration, UsageError> {
    match seconds_or_zero(flag, value)? {
        d if d.is_zero() => Err(UsageError(format!("{flag} must be more than 0"))),
        d => Ok(d),
    }
}

/// One command-line word: a flag (`--name`; the value of `--name=value` is held back for
/// [`Options::value`]) or a positional argument.
enum Arg {
    Flag(String),
    Positional(String),
}

struct Options {
    args: std::vec::IntoIter<String>,
    /// The value of the last `--name=value`, until the flag takes it.
    inline: Option<String>,
}

impl Options {
    fn new(args: std::vec::IntoIter<String>) -> Options {
        Options { args, inline: None }
    }

    fn next(&mut self) -> Option<Arg> {
        let arg = self.args.next()?;
        if arg.len() > 1 && arg.starts_with('-') {
            match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    self.inline = Some(value.to_owned());
                    Some(Arg::Flag(flag.to_owned()))
                }
                _ => Some(Arg::Flag(arg)),
            }
        } else {
            Some(Arg::Positional(arg))
        }
    }

    /// Refuses `--flag=value` for a flag that takes no value.
    fn no_value(&mut self, flag: &str) -> Result<(), UsageError> {
        match self.inline.take() {
            Some(value) => Err(UsageError(format!(
                "{flag} takes no value, got \"{value}\""
            ))),
            None => Ok(()),
        }
    }

    /// The value of `flag`: from `--flag=value`, or the next word.
    fn value(&mut self, flag: &str) -> Result<String, UsageError> {
        if let Some(value) = self.inline.take() {
            return Ok(value);
        }
        self.args
            .next()
            .ok_or_else(|| UsageError(format!("{flag} needs a value")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<Command, UsageError> {
        parse(words.split_whitespace().map(OsString::from))
    }

    fn error(words: &str) -> String {
        parse_words(words).unwrap_err().0
    }

    #[test]
    fn tail_takes_an_endpoint_and_optional_limits() {
        assert_eq!(
            parse_words("tail tcp://h:1 --count 3 --idle-timeout=0.5"),
            Ok(Command::Tail(TailArgs {
                endpoint: "tcp://h:1".into(),
                count: Some(3),
                idle_timeout: Some(Duration::from_millis(500)),
                filter: Filter::default(),
                stats: false,
            }))
        );
        assert_eq!(
            parse_words("tail --count=1 ipc:///x"),
            Ok(Command::Tail(TailArgs {
                endpoint: "ipc:///x".into(),
                count: Some(1),
                idle_timeout: None,
                filter: Filter::default(),
                stats: false,
            }))
        );
    }

    #[test]
    fn tail_filters_repeat_and_types_take_a_comma_list() {
        let Ok(Command::Tail(tail)) = parse_words(
            "tail ipc:///x --tenant a --tenant= --type stored,removed --type=cleared \
             --key-prefix p/ --key-prefix=q --stats",
        ) else {
            panic!("tail parses")
        };
        assert_eq!(
            tail.filter,
            Filter {
                tenants: vec![b"a".to_vec(), b"default".to_vec()],
                types: vec![EventType::Stored, EventType::Removed, EventType::Cleared],
                key_prefixes: vec![b"p/".to_vec(), b"q".to_vec()],
            }
        );
        assert!(tail.stats);
        assert!(!tail.filter.passes_all());
    }

    #[test]
    fn demo_has_defaults_and_accepts_each_option() {
        let Ok(Command::Demo(demo)) = parse_words("demo") else {
            panic!("demo parses")
        };
        assert_eq!(demo.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(
            (demo.objects, demo.show, demo.wait),
            (1000, Show::FirstOfEachType(2), Duration::from_millis(500))
        );
        assert_eq!(
            parse_words("demo --endpoint ipc:///d --objects 5 --show all --wait 0"),
            Ok(Command::Demo(DemoArgs {
                endpoint: "ipc:///d".into(),
                objects: 5,
                show: Show::All,
                wait: Duration::ZERO,
                dump_index: None,
            }))
        );
        let Ok(Command::Demo(demo)) = parse_words("demo --dump-index out/expected.json") else {
            panic!("demo parses")
        };
        assert_eq!(demo.dump_index, Some(PathBuf::from("out/expected.json")));
    }

    #[test]
    fn help_is_found_anywhere() {
        for words in ["--help", "-h", "help", "tail --help", "demo -h"] {
            assert_eq!(parse_words(words), Ok(Command::Help), "{words}");
        }
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        for (words, why) in [
            ("", "no command"),
            ("watch", "unknown command \"watch\""),
            ("tail", "needs an ENDPOINT"),
            ("tail a b", "one too many"),
            ("tail a --count", "--count needs a value"),
            ("tail a --count x", "whole number"),
            ("tail a --count 0", "at least 1"),
            ("tail a --idle-timeout -1", "wants seconds"),
            ("tail a --idle-timeout 0", "more than 0"),
            ("tail a --follow", "no option --follow"),
            ("tail a --type", "--type needs a value"),
            ("tail a --type stored,", "\"\" is none of them"),
            ("tail a --type Stored", "\"Stored\" is none of them"),
            ("tail a --tenant", "--tenant needs a value"),
            ("tail a --key-prefix", "--key-prefix needs a value"),
            ("tail a --stats=yes", "--stats takes no value"),
            ("demo --dump-index", "--dump-index needs a value"),
            ("demo --dump-index=", "needs a file name"),
            ("demo --objects 0", "at least 1"),
            ("demo --show some", "whole number"),
            ("demo --endpoint=", "must not be empty"),
            ("demo extra", "no positional"),
        ] {
            let err = error(words);
            assert!(err.contains(why), "{words:?}: {err}");
        }
    }
}
