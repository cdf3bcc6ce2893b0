//! The command line, declared with clap's derive API: the commands, their options and the
//! help text with its examples. clap gives the `-h`/`--help`, `--version`, `--opt=value`,
//! suggestions for mistyped options and the completion scripts; this module adds the checks
//! of each value and the usage on every usage error.

use crate::view::{EventType, Filter, Show};
use clap::builder::{NonEmptyStringValueParser, TypedValueParser as _};
use clap::error::{ContextKind, ContextValue};
use clap::{Args, CommandFactory, Parser, Subcommand};
use clap_complete::Shell;
use mooncake_kv_events::NonUtf8;
use std::ffi::OsString;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::time::Duration;

// The examples are macros, not consts, so that `concat!` can put each command's own in its
// `--help` and all of them in `kv-events --help`.
macro_rules! demo_examples {
    () => {
        "  kv-events demo
  kv-events demo --wait 10        # time to start a tail in another terminal
  kv-events demo --objects 300 --dump-index expected.json
  kv-events demo --curve-secret-key master-0.key --curve-allow allowed/
"
    };
}

macro_rules! tail_examples {
    () => {
        "  kv-events tail tcp://127.0.0.1:5557
  kv-events tail ipc:///run/mooncake/kv-events.sock --count 10
  kv-events tail tcp://master-0:5557 --idle-timeout 30 > events.jsonl
  kv-events tail tcp://master-0:5557 --tenant tenant-a --type stored,removed
  kv-events tail tcp://master-0:5557 --type cleared              # RemoveAll results only
  kv-events tail tcp://master-0:5557 --key-prefix llama/ --count 100 | jq -c .object_key
  kv-events tail tcp://master-0:5557 --stats                     # rates, gaps, sequence
  kv-events tail tcp://master-0:5557 --stats --tenant default --type stored
  kv-events tail tcp://master-0:5557 --stats --json | jq -c '[.time_s, .events_per_s, .gaps]'
  kv-events tail tcp://master-0:5557 --curve-server-key master-0.pub --curve-secret-key indexer-a.key
"
    };
}

macro_rules! mirror_examples {
    () => {
        "  kv-events mirror tcp://master-0:5557 --replay-endpoint tcp://master-0:5558
  kv-events mirror tcp://master-0:5557 --replay-endpoint tcp://master-0:5558 \\
                   tcp://master-1:5557 --replay-endpoint tcp://master-1:5558 --every 30
  kv-events mirror tcp://master-0:5557 --replay-endpoint tcp://master-0:5558 --duration 60 > index.jsonl
  kv-events mirror tcp://master-0:5557 --replay-endpoint tcp://master-0:5558 --dump index.jsonl
"
    };
}

macro_rules! relay_examples {
    () => {
        "  kv-events relay tcp://master-0:5557 --replay-endpoint tcp://master-0:5558 --nats nats://nats-0:4222
"
    };
}

macro_rules! keygen_examples {
    () => {
        "  kv-events keygen master-0        # master-0.key (secret, mode 0600) and master-0.pub
  kv-events keygen keys/indexer-a  # then copy indexer-a.pub into the master's allow directory
"
    };
}

macro_rules! completions_examples {
    () => {
        "  kv-events completions bash > ~/.local/share/bash-completion/completions/kv-events
  kv-events completions zsh > ~/.zfunc/_kv-events     # with fpath+=(~/.zfunc) in ~/.zshrc
  kv-events completions fish > ~/.config/fish/completions/kv-events.fish
"
    };
}

/// Watch, or try, the KV event stream of Mooncake's metadata master
#[derive(Debug, Parser)]
#[command(
    name = "kv-events",
    version = version(),
    propagate_version = true,
    after_help = concat!(
        "Exit status:
  0  tail: stopped by --count, or by --idle-timeout after it reached the publisher, or
     the reader of its stdout went away;
     demo: the watcher saw every published event, with no gap; mirror: stopped by
     --duration, Ctrl-C or SIGTERM with the index it wrote in sync; relay: stopped by
     --duration, Ctrl-C or SIGTERM with what it writes up to date with the master
  1  runtime error: cannot connect or bind, a socket error, a file that cannot be
     written or read, a bad key file; tail: the publisher refused it, or --idle-timeout
     passed without it ever reaching the publisher (nothing listening, refused, a host
     name that does not resolve; a malformed or oversized message is reported on stderr
     and skipped); keygen: a file exists;
     demo: the watcher missed events, saw a gap or a malformed message; mirror: the
     index it wrote was not in sync with its publisher; relay: its binary is not built,
     NATS or the stream cannot be used, or it stopped behind the master
  2  usage error: unknown command or option, a missing or bad value (with the usage,
     on stderr)
  An interrupted tail (Ctrl-C) ends as the signal ends any command.

Examples:
",
        demo_examples!(),
        tail_examples!(),
        mirror_examples!(),
        relay_examples!(),
        keygen_examples!(),
        completions_examples!()
    )
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What the command line asks for.
#[derive(Debug, PartialEq, Subcommand)]
pub(crate) enum Command {
    /// Print the stream of a running publisher, one JSON line per event
    ///
    /// Subscribes to the publisher at ENDPOINT and prints one JSON object per event on
    /// stdout: the event map plus the batch's "sequence"; bytes that are not UTF-8 print
    /// as {"hex": "..."}. Sequence gaps (lost events), a join after the first message and
    /// publisher restarts are reported on stderr, whatever the filters. Runs until
    /// interrupted unless --count or --idle-timeout says stop. A publisher it cannot
    /// reach is said on stderr while it tries; with --idle-timeout it then exits 1.
    ///
    /// Filters: an event is printed (and counted) only if it matches each filter given;
    /// a filter given several times matches any of its values.
    #[command(verbatim_doc_comment, after_help = concat!("Examples:\n", tail_examples!()))]
    Tail(TailArgs),
    /// Run a publisher, a watcher and a synthetic master workload; compare what was seen
    ///
    /// Runs a publisher on ENDPOINT and a watcher on the same stream, drives it with a synthetic
    /// master workload that makes every kind of call over N objects, and prints what the
    /// watcher saw against what was published. Exits 0 only if the watcher saw every
    /// event with no gap.
    #[command(verbatim_doc_comment, after_help = concat!("Examples:\n", demo_examples!()))]
    Demo(DemoArgs),
    /// Keep a self-healing copy of the publishers' index; write it as JSON lines on exit
    ///
    /// Follows each ENDPOINT (a publisher's PUB socket) with its --replay-endpoint (the
    /// same publisher's replay socket, the master's kv_events_replay_endpoint): takes a
    /// snapshot, then applies the stream, filling gaps by replay or by a new snapshot and
    /// taking a new snapshot when a publisher restarts. Several ENDPOINTs are the
    /// candidate masters of an HA deployment, each with its own index; the one written is
    /// that of the publisher in sync heard from last (--union: all of them merged).
    ///
    /// Each recovery is one line on stderr, and a summary (objects per tenant and medium,
    /// counters) every --every seconds. On exit (--duration, Ctrl-C, SIGTERM) the index goes
    /// to stdout, or to --dump PATH, one JSON object per object: {"tenant", "key", "media"};
    /// a tenant or key that is not UTF-8 is written {"hex": "..."}.
    #[command(verbatim_doc_comment, after_help = concat!("Examples:\n", mirror_examples!()))]
    Mirror(MirrorArgs),
    /// Relay publishers into NATS JetStream: a stream for the log, snapshots for a bootstrap
    ///
    /// Runs the kv-events-relay binary beside this one with the same arguments (built by
    /// `cargo build --release -p kv-events-relay`): `kv-events relay --help` is its help,
    /// and docs/relay.md says the rest.
    #[command(verbatim_doc_comment, disable_help_flag = true)]
    Relay {
        /// ENDPOINT... --replay-endpoint REPLAY_ENDPOINT... --nats URL [--stream NAME]
        /// [--snapshots NAME] [--bucket NAME] [--replicas N]
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<OsString>,
    },
    /// Write a CURVE key pair: NAME.key (secret, mode 0600) and NAME.pub
    ///
    /// NAME.key holds the secret and the public key: give it to the one process it is for
    /// (the master's --kv_events_curve_secret_key_file, or a subscriber's --curve-secret-key)
    /// and to nobody else. NAME.pub holds the public key: give the master's to its
    /// subscribers (--curve-server-key), and put a subscriber's in the master's allow-list
    /// (--kv_events_curve_allow). Never replaces an existing file.
    #[command(verbatim_doc_comment, after_help = concat!("Examples:\n", keygen_examples!()))]
    Keygen {
        /// The files' path without extension, e.g. master-0 or keys/indexer-a
        #[arg(value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
        name: PathBuf,
    },
    /// Print the completion script of a shell on stdout
    #[command(after_help = concat!("Examples:\n", completions_examples!()))]
    Completions {
        /// The shell to complete for
        shell: Shell,
    },
}

/// The options of `tail`.
#[derive(Debug, PartialEq, Args)]
pub(crate) struct TailArgs {
    /// The publisher's endpoint, e.g. tcp://127.0.0.1:5557 or ipc:///run/kv.sock
    pub(crate) endpoint: String,
    /// Exit after N events that pass the filters
    #[arg(long, value_name = "N", value_parser = at_least_one, allow_negative_numbers = true)]
    pub(crate) count: Option<u64>,
    /// Exit after SECS seconds without a message (1 if the publisher was never reached)
    #[arg(long, value_name = "SECS", value_parser = more_than_zero_seconds, allow_negative_numbers = true)]
    pub(crate) idle_timeout: Option<Duration>,
    /// Only events of tenant T (an empty T is "default", as on the wire)
    #[arg(long = "tenant", value_name = "T")]
    tenants: Vec<String>,
    /// Only events of these types: stored, removed, cleared (comma-separated)
    #[arg(
        long = "type",
        value_name = "TYPES",
        value_delimiter = ',',
        hide_possible_values = true
    )]
    types: Vec<EventType>,
    /// Only events whose object_key starts with the bytes of P
    ///
    /// A key sent as bin compares by its bytes; cleared events have no key and never match.
    #[arg(long = "key-prefix", value_name = "P", verbatim_doc_comment)]
    key_prefixes: Vec<String>,
    /// Print a line of rates, gaps and sequence per second instead of the events
    ///
    /// Each line has the rate of the events that pass the filters, in all and per type;
    /// the gaps in that second (a restart or a late join counts as one) and the sequence
    /// numbers they missed; the last sequence seen. A last line covers the part of a
    /// second before exit. With --replay-endpoint, the publisher's subscribers too:
    /// connected now, and connected and disconnected in that second.
    #[arg(long, verbatim_doc_comment)]
    pub(crate) stats: bool,
    /// With --stats: each line a JSON object, for programs (no header)
    ///
    /// {"time_s", "events_per_s", "stored_per_s", "removed_per_s", "cleared_per_s",
    /// "gaps", "missed", "last_sequence"}, and with --replay-endpoint "subscribers",
    /// "connects" and "disconnects"; null where the text line has "-".
    #[arg(long, requires = "stats", verbatim_doc_comment)]
    pub(crate) json: bool,
    /// The publisher's public key file (its NAME.pub): read a CURVE stream
    #[arg(long, value_name = "FILE", requires = "curve_secret_key",
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) curve_server_key: Option<PathBuf>,
    /// This subscriber's key file (its NAME.key), whose .pub the publisher admits
    #[arg(long, value_name = "FILE", requires = "curve_server_key",
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) curve_secret_key: Option<PathBuf>,
    /// Refuse a message over N bytes: it is lost, said on stderr, and shows as a gap
    ///
    /// libzmq closes the connection before buffering a frame over N bytes and reconnects
    /// (stderr says the connection closed); a message over N bytes in all is dropped with
    /// its size. Either way the next message shows the gap.
    #[arg(long, value_name = "N", default_value = "16777216", verbatim_doc_comment,
          value_parser = at_least_one_usize, allow_negative_numbers = true)]
    pub(crate) max_message_bytes: usize,
    /// The publisher's replay socket: fill gaps from it, and ask it when the stream is
    /// quiet whether messages at the end of a burst were lost
    ///
    /// The master's kv_events_replay_endpoint. stderr says what could not be filled.
    #[arg(long, value_name = "REPLAY_ENDPOINT", verbatim_doc_comment,
          value_parser = NonEmptyStringValueParser::new())]
    pub(crate) replay_endpoint: Option<String>,
    /// Subscribe to this topic (the master's kv_events_topic) or a prefix of it
    ///
    /// Default: every message, whatever its topic.
    #[arg(long, value_name = "T", default_value = "", verbatim_doc_comment)]
    pub(crate) topic: String,
}

impl TailArgs {
    /// The events the filter options let through: all, when none is given.
    pub(crate) fn filter(&self) -> Filter {
        Filter {
            tenants: self
                .tenants
                .iter()
                .map(|t| if t.is_empty() { "default" } else { t })
                .map(|t| t.as_bytes().to_vec())
                .collect(),
            types: self.types.clone(),
            key_prefixes: self
                .key_prefixes
                .iter()
                .map(|p| p.as_bytes().to_vec())
                .collect(),
        }
    }
}

/// The options of `demo`.
#[derive(Debug, PartialEq, Args)]
pub(crate) struct DemoArgs {
    /// The endpoint the publisher binds
    #[arg(long, value_name = "ENDPOINT", default_value = "tcp://127.0.0.1:5557",
          value_parser = NonEmptyStringValueParser::new())]
    pub(crate) endpoint: String,
    /// How many objects the workload creates
    #[arg(long, value_name = "N", default_value = "1000", value_parser = at_least_one_usize, allow_negative_numbers = true)]
    pub(crate) objects: usize,
    /// Print the first N events of each type, or all of them
    #[arg(long, value_name = "N|all", default_value = "2", value_parser = show)]
    pub(crate) show: Show,
    /// Wait SECS seconds for subscribers before the workload starts
    #[arg(long, value_name = "SECS", default_value = "0.5", value_parser = seconds, allow_negative_numbers = true)]
    pub(crate) wait: Duration,
    /// Write the index a subscriber that saw every event ends with
    ///
    /// As JSON: objects [backend, tenant, key, media], and next_sequence.
    #[arg(long, value_name = "FILE", verbatim_doc_comment,
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) dump_index: Option<PathBuf>,
    /// The publisher's key file (NAME.key): publish with CURVE
    ///
    /// The watcher reads the stream as a CURVE client with a key pair of its own.
    #[arg(long, value_name = "FILE", verbatim_doc_comment,
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) curve_secret_key: Option<PathBuf>,
    /// Admit only these subscribers: a .pub file or a directory of them
    ///
    /// The demo's own watcher is admitted too, with a key made for the run.
    #[arg(long, value_name = "PATH", requires = "curve_secret_key", verbatim_doc_comment,
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) curve_allow: Option<PathBuf>,
    /// Serve info, replays and snapshots on this endpoint too (kv_events_replay_endpoint)
    ///
    /// The model master is the publisher's object source: a subscriber that joins mid-run
    /// takes a snapshot and converges (kv-events mirror).
    #[arg(long, value_name = "REPLAY_ENDPOINT", verbatim_doc_comment,
          value_parser = NonEmptyStringValueParser::new())]
    pub(crate) replay_endpoint: Option<String>,
    /// Make at most this many calls a second, so that the workload lasts (default: flat out)
    #[arg(long, value_name = "CALLS_PER_S", value_parser = calls_per_second)]
    pub(crate) rate: Option<f64>,
    /// Messages held for a subscriber that has not read them (kv_events_send_hwm)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) send_hwm: Option<u32>,
    /// Keep the publisher up SECS seconds after the workload, for late subscribers
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = seconds, allow_negative_numbers = true)]
    pub(crate) linger: Duration,
    /// The first frame of every message (kv_events_topic), e.g. kv@pod-1@model-a
    #[arg(long, value_name = "T", default_value = "")]
    pub(crate) topic: String,
    /// Replay replies without the topic frame, as before vLLM 0.26
    /// (kv_events_replay_topic_frame=false)
    #[arg(long, verbatim_doc_comment)]
    pub(crate) replay_without_topic_frame: bool,
    /// After MS milliseconds without a message, send one with no event
    /// (kv_events_heartbeat_ms; 0: never)
    #[arg(long, value_name = "MS", default_value = "0", verbatim_doc_comment)]
    pub(crate) heartbeat_ms: u32,
    /// After a removed that leaves the object on another medium, a stored for each medium
    /// left, in the same message (kv_events_reannounce_remaining), for readers of presence
    #[arg(long, verbatim_doc_comment)]
    pub(crate) reannounce_remaining: bool,
    /// A tenant, key or group that is not UTF-8: skip (not published, counted), bin (msgpack
    /// bin) or str (msgpack str of the raw bytes) (kv_events_non_utf8)
    #[arg(long = "non-utf8", value_name = "MODE", default_value = "skip", verbatim_doc_comment,
          value_parser = clap::builder::PossibleValuesParser::new(["skip", "bin", "str"])
              .map(|mode| mode.parse::<NonUtf8>().unwrap_or_default()))]
    pub(crate) non_utf8: NonUtf8,
}

/// The options of `mirror`.
#[derive(Debug, PartialEq, Args)]
pub(crate) struct MirrorArgs {
    /// A publisher's endpoint; several for the candidate masters of an HA deployment
    #[arg(required = true, value_name = "ENDPOINT",
          value_parser = NonEmptyStringValueParser::new())]
    pub(crate) endpoints: Vec<String>,
    /// The replay socket of each ENDPOINT, in the same order (kv_events_replay_endpoint);
    /// none: the publisher has none, its stream from the join on is all the mirror gets
    #[arg(long = "replay-endpoint", value_name = "REPLAY_ENDPOINT", required = true,
          value_parser = NonEmptyStringValueParser::new())]
    pub(crate) replay_endpoints: Vec<String>,
    /// Print a summary of the index every SECS seconds
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = more_than_zero_seconds, allow_negative_numbers = true)]
    pub(crate) every: Duration,
    /// Stop after SECS seconds, writing the index
    #[arg(long, value_name = "SECS", value_parser = more_than_zero_seconds, allow_negative_numbers = true)]
    pub(crate) duration: Option<Duration>,
    /// Write the index to PATH (at each summary and on exit) instead of stdout
    #[arg(long, value_name = "PATH",
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) dump: Option<PathBuf>,
    /// Write every publisher's index merged, not only the freshest publisher's
    #[arg(long)]
    pub(crate) union: bool,
    /// The publishers' public key file (NAME.pub): once for all, or once per ENDPOINT
    #[arg(long = "curve-server-key", value_name = "FILE", requires = "curve_secret_key",
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) curve_server_keys: Vec<PathBuf>,
    /// This subscriber's key file (its NAME.key), whose .pub the publishers admit
    #[arg(long, value_name = "FILE", requires = "curve_server_keys",
          value_parser = NonEmptyStringValueParser::new().map(PathBuf::from))]
    pub(crate) curve_secret_key: Option<PathBuf>,
    /// Refuse a message over N bytes: it is lost, and recovered like any loss
    #[arg(long, value_name = "N", default_value = "16777216",
          value_parser = at_least_one_usize, allow_negative_numbers = true)]
    pub(crate) max_message_bytes: usize,
    /// Subscribe to this topic (the master's kv_events_topic) or a prefix of it
    ///
    /// Default: every message, whatever its topic.
    #[arg(long, value_name = "T", default_value = "", verbatim_doc_comment)]
    pub(crate) topic: String,
}

impl MirrorArgs {
    /// What the parser cannot check alone: one replay endpoint per endpoint, and one
    /// server key for all or one per endpoint.
    fn check(&self) -> Result<(), String> {
        let (endpoints, replays) = (self.endpoints.len(), self.replay_endpoints.len());
        if endpoints != replays {
            return Err(format!(
                "{endpoints} ENDPOINT{} but {replays} --replay-endpoint{}: give each ENDPOINT \
                 its replay endpoint",
                if endpoints == 1 { "" } else { "s" },
                if replays == 1 { "" } else { "s" }
            ));
        }
        let keys = self.curve_server_keys.len();
        if keys > 1 && keys != endpoints {
            return Err(format!(
                "{keys} --curve-server-key for {endpoints} ENDPOINTs: give one for all, or \
                 one per ENDPOINT"
            ));
        }
        Ok(())
    }
}

/// What `--version` says: the library's version, the libzmq the process runs with, and
/// whether that has CURVE, as the metric `mooncake_kv_events_build_info` says them.
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| mooncake_kv_events::BuildInfo::current().to_string())
}

/// The command the process's arguments ask for. On `--help` or `--version` this prints
/// and exits 0; on a usage error it prints the error and the usage on stderr and exits 2.
pub(crate) fn parse() -> Command {
    let args: Vec<OsString> = std::env::args_os().collect();
    match try_parse(&args) {
        Ok(command) => command,
        Err(err) => with_usage(err, &args).exit(),
    }
}

/// The command `args` ask for, checked beyond what clap checks.
fn try_parse(args: &[OsString]) -> Result<Command, clap::Error> {
    let command = Cli::try_parse_from(args)?.command;
    if let Command::Mirror(mirror) = &command {
        if let Err(why) = mirror.check() {
            let mut cli = Cli::command();
            cli.build();
            let mirror = cli
                .find_subcommand_mut("mirror")
                .expect("mirror is a command");
            return Err(mirror.error(clap::error::ErrorKind::ArgumentConflict, why));
        }
    }
    Ok(command)
}

/// `err`, with the usage of the command at fault added if clap left it out: it does for a
/// value its parser refused (`--count many`), and every usage error shows the usage.
fn with_usage(mut err: clap::Error, args: &[OsString]) -> clap::Error {
    if !err.use_stderr() || err.render().to_string().contains("Usage:") {
        return err;
    }
    let mut cli = Cli::command();
    cli.build();
    let named = args.get(1).and_then(|a| a.to_str());
    let usage = match named.and_then(|name| cli.find_subcommand_mut(name)) {
        Some(command) => command.render_usage(),
        None => cli.render_usage(),
    };
    err.insert(ContextKind::Usage, ContextValue::StyledStr(usage));
    err
}

/// Writes the completion script for `shell` on stdout. A reader that went away (`| head`)
/// is no error.
pub(crate) fn print_completions(shell: Shell) -> Result<(), crate::CommandError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kv-events", &mut script);
    let mut script = String::from_utf8_lossy(&script).into_owned();
    if shell == Shell::Bash {
        // clap_complete names the case arm of a subcommand of a hyphenated binary
        // `kv__subcmd__events__subcmd__tail` where its dispatch loop says
        // `kv__events__subcmd__tail`, so no subcommand's options would complete
        // (clap-rs/clap#6421, open in clap_complete 4.6.12).
        script = script.replace("kv__subcmd__events", "kv__events");
    }
    match io::stdout().write_all(script.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write the completion script: {e}").into())
        }
        _ => Ok(()),
    }
}

fn number(value: &str) -> Result<u64, String> {
    value.parse().map_err(|_| "wants a whole number".to_owned())
}

fn at_least_one(value: &str) -> Result<u64, String> {
    match number(value)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

fn at_least_one_usize(value: &str) -> Result<usize, String> {
    let n = at_least_one(value)?;
    usize::try_from(n).map_err(|_| "is too large".into())
}

fn show(value: &str) -> Result<Show, String> {
    match value {
        "all" => Ok(Show::All),
        n => number(n)
            .map(Show::FirstOfEachType)
            .map_err(|_| "wants a whole number or all".into()),
    }
}

fn seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| "wants seconds, e.g. 5 or 0.5".into())
}

fn calls_per_second(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err("wants a number of calls a second above 0, e.g. 200 or 0.5".into()),
    }
}

fn more_than_zero_seconds(value: &str) -> Result<Duration, String> {
    match seconds(value)? {
        d if d.is_zero() => Err("must be more than 0".into()),
        d => Ok(d),
    }
}

/// The `--type` values, for the parser: each `EventType` but `Other`.
impl clap::ValueEnum for EventType {
    fn value_variants<'a>() -> &'a [Self] {
        &[EventType::Stored, EventType::Removed, EventType::Cleared]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            EventType::Stored => Some("stored".into()),
            EventType::Removed => Some("removed".into()),
            EventType::Cleared => Some("cleared".into()),
            EventType::Other => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &str) -> Result<Command, clap::Error> {
        let args: Vec<OsString> = std::iter::once("kv-events")
            .chain(words.split_whitespace())
            .map(OsString::from)
            .collect();
        try_parse(&args)
    }

    fn mirror(words: &str) -> MirrorArgs {
        match parse_words(words) {
            Ok(Command::Mirror(mirror)) => mirror,
            other => panic!("{words}: {other:?}"),
        }
    }

    #[test]
    fn mirror_pairs_each_endpoint_with_its_replay_endpoint() {
        let m = mirror(
            "mirror tcp://a:1 --replay-endpoint tcp://a:2 tcp://b:1 --replay-endpoint=tcp://b:2",
        );
        assert_eq!(m.endpoints, ["tcp://a:1", "tcp://b:1"]);
        assert_eq!(m.replay_endpoints, ["tcp://a:2", "tcp://b:2"]);
        assert_eq!(
            (m.every, m.duration, m.union),
            (Duration::from_secs(10), None, false)
        );
        let m = mirror(
            "mirror ipc:///p --replay-endpoint ipc:///r --every 0.5 --duration 3 --dump out.jsonl \
             --union --curve-server-key m.pub --curve-secret-key me.key --max-message-bytes 9",
        );
        assert_eq!(
            m,
            MirrorArgs {
                endpoints: vec!["ipc:///p".into()],
                replay_endpoints: vec!["ipc:///r".into()],
                every: Duration::from_millis(500),
                duration: Some(Duration::from_secs(3)),
                dump: Some(PathBuf::from("out.jsonl")),
                union: true,
                curve_server_keys: vec![PathBuf::from("m.pub")],
                curve_secret_key: Some(PathBuf::from("me.key")),
                max_message_bytes: 9,
                topic: String::new(),
            }
        );
    }

    fn tail(words: &str) -> TailArgs {
        match parse_words(words) {
            Ok(Command::Tail(tail)) => tail,
            other => panic!("{words}: {other:?}"),
        }
    }

    fn demo(words: &str) -> DemoArgs {
        match parse_words(words) {
            Ok(Command::Demo(demo)) => demo,
            other => panic!("{words}: {other:?}"),
        }
    }

    /// The usage error of `words`, as the user reads it.
    fn error(words: &str) -> String {
        let err = parse_words(words).expect_err(words);
        assert!(err.use_stderr(), "{words}: {err}");
        assert_eq!(err.exit_code(), 2, "{words}: {err}");
        let args: Vec<OsString> = std::iter::once("kv-events")
            .chain(words.split_whitespace())
            .map(OsString::from)
            .collect();
        with_usage(err, &args).render().to_string()
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn tail_takes_an_endpoint_and_optional_limits() {
        let t = tail("tail tcp://h:1 --count 3 --idle-timeout=0.5");
        assert_eq!(
            (t.endpoint.as_str(), t.count, t.idle_timeout, t.stats),
            (
                "tcp://h:1",
                Some(3),
                Some(Duration::from_millis(500)),
                false
            )
        );
        assert!(t.filter().passes_all());
        let t = tail("tail --count=1 ipc:///x");
        assert_eq!(
            (t.endpoint.as_str(), t.count, t.idle_timeout),
            ("ipc:///x", Some(1), None)
        );
    }

    #[test]
    fn tail_filters_repeat_and_types_take_a_comma_list() {
        let t = tail(
            "tail ipc:///x --tenant a --tenant= --type stored,removed --type=cleared \
             --key-prefix p/ --key-prefix=q --stats",
        );
        assert_eq!(
            t.filter(),
            Filter {
                tenants: vec![b"a".to_vec(), b"default".to_vec()],
                types: vec![EventType::Stored, EventType::Removed, EventType::Cleared],
                key_prefixes: vec![b"p/".to_vec(), b"q".to_vec()],
            }
        );
        assert!(t.stats);
    }

    #[test]
    fn demo_has_defaults_and_accepts_each_option() {
        let d = demo("demo");
        assert_eq!(d.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(
            (d.objects, d.show, d.wait, d.dump_index),
            (
                1000,
                Show::FirstOfEachType(2),
                Duration::from_millis(500),
                None
            )
        );
        assert_eq!(
            demo("demo --endpoint ipc:///d --objects 5 --show all --wait 0"),
            DemoArgs {
                endpoint: "ipc:///d".into(),
                objects: 5,
                show: Show::All,
                wait: Duration::ZERO,
                dump_index: None,
                curve_secret_key: None,
                curve_allow: None,
                replay_endpoint: None,
                send_hwm: None,
                rate: None,
                linger: Duration::ZERO,
                topic: String::new(),
                replay_without_topic_frame: false,
                heartbeat_ms: 0,
                reannounce_remaining: false,
                non_utf8: NonUtf8::Skip,
            }
        );
        assert_eq!(demo("demo --non-utf8 bin").non_utf8, NonUtf8::Bin);
        assert!(demo("demo --reannounce-remaining").reannounce_remaining);
        assert!(error("demo --non-utf8 latin1").contains("possible values: skip, bin, str"));
        assert_eq!(demo("demo --rate 250").rate, Some(250.0));
        assert!(error("demo --rate 0").contains("above 0"));
        assert_eq!(
            demo("demo --dump-index out/expected.json").dump_index,
            Some(PathBuf::from("out/expected.json"))
        );
    }

    #[test]
    fn a_mistyped_option_or_command_gets_a_suggestion() {
        let e = error("tail a --idle-timout 3");
        assert!(
            e.contains("tip: a similar argument exists: '--idle-timeout'"),
            "{e}"
        );
        let e = error("tial a");
        assert!(
            e.contains("tip: a similar subcommand exists: 'tail'"),
            "{e}"
        );
        let e = error("tail a --type stord");
        assert!(e.contains("tip: a similar value exists: 'stored'"), "{e}");
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong_with_the_usage() {
        for (words, why) in [
            ("", "Commands:"),
            ("watch", "unrecognized subcommand 'watch'"),
            ("tail", "<ENDPOINT>"),
            ("tail a b", "unexpected argument 'b'"),
            ("tail a --count", "a value is required"),
            ("tail a --count x", "wants a whole number"),
            ("tail a --count -3", "'-3' for '--count <N>'"),
            ("tail a --count 0", "must be at least 1"),
            ("tail a --idle-timeout -1", "wants seconds"),
            ("tail a --idle-timeout 0", "must be more than 0"),
            ("tail a --follow", "unexpected argument '--follow'"),
            ("tail a --type stored,", "a value is required"),
            ("tail a --type Stored", "[possible values: stored,"),
            ("tail a --stats=yes", "unexpected value 'yes'"),
            ("tail a --json", "--stats"),
            ("demo --dump-index=", "a value is required"),
            ("demo --objects 0", "must be at least 1"),
            ("demo --show some", "wants a whole number or all"),
            ("demo --wait soon", "wants seconds"),
            ("demo --endpoint=", "a value is required"),
            ("demo extra", "unexpected argument 'extra'"),
            ("demo --curve-allow a/", "--curve-secret-key <FILE>"),
            (
                "tail a --curve-server-key s.pub",
                "--curve-secret-key <FILE>",
            ),
            ("keygen", "<NAME>"),
            ("mirror", "<ENDPOINT>..."),
            ("mirror a", "--replay-endpoint <REPLAY_ENDPOINT>"),
            (
                "mirror a b --replay-endpoint r",
                "2 ENDPOINTs but 1 --replay-endpoint:",
            ),
            (
                "mirror a --replay-endpoint r --replay-endpoint s",
                "1 ENDPOINT but 2",
            ),
            (
                "mirror a --replay-endpoint r --every 0",
                "must be more than 0",
            ),
            (
                "mirror a --replay-endpoint r --curve-server-key s.pub",
                "--curve-secret-key <FILE>",
            ),
            (
                "mirror a b --replay-endpoint r --replay-endpoint s --curve-server-key 1 \
                 --curve-server-key 2 --curve-server-key 3 --curve-secret-key k",
                "3 --curve-server-key for 2 ENDPOINTs",
            ),
        ] {
            let usage = match words.split_whitespace().next() {
                Some(command @ ("tail" | "demo" | "keygen" | "mirror")) => {
                    format!("Usage: kv-events {command} ")
                }
                _ => "Usage: kv-events <COMMAND>".to_owned(),
            };
            let err = error(words);
            assert!(err.contains(why), "{words:?}: {err}");
            assert!(err.contains(&usage), "{words:?}: {err}");
        }
    }
}
