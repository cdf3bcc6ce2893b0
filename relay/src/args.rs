//! The command line of `kv-events-relay` (also run as `kv-events relay`).

use crate::error::Error;
use clap::builder::NonEmptyStringValueParser;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Relay a Mooncake master's KV events into NATS JetStream
///
/// Follows the master (or the candidate masters of an HA deployment) through its replay
/// socket, exactly (snapshot at start, replay or snapshot on a gap, a new incarnation
/// noticed), and writes the master's own batches into the JetStream stream STREAM (subject
/// PREFIX.<backend_id>, PREFIX kv-events by default, message ids from the master's
/// sequences, so that nothing is written twice), and now and then a compacted snapshot of
/// the state into the Object Store bucket SNAPSHOTS (one object per backend), from which a
/// reader bootstraps and then consumes the subject. A master's restart or a gap only a
/// snapshot fills is written as the removed and stored events that bring the log to the
/// new truth: a reader of the stream never sees a reset. With --bucket, the current state
/// also goes to a key-value bucket (one entry per object present), beside the log. A
/// status line goes to stderr every --every seconds; Ctrl-C or SIGTERM stops it (exit 0
/// when what it wrote was up to date with the master).
#[derive(Debug, Parser)]
#[command(name = "kv-events relay", version, verbatim_doc_comment)]
#[command(after_help = "Examples:
  kv-events relay tcp://master-0:5557 --replay-endpoint tcp://master-0:5558 --nats nats://127.0.0.1:4222
  kv-events relay tcp://m0:5557 tcp://m1:5557 --replay-endpoint tcp://m0:5558 \\
      --replay-endpoint tcp://m1:5558 --nats nats://nats:4222 --stream KV_EVENTS --replicas 3 \\
      --bucket kv-events")]
pub(crate) struct Args {
    /// A publisher's endpoint; several for the candidate masters of an HA deployment
    #[arg(required = true, value_name = "ENDPOINT", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) endpoints: Vec<String>,
    /// The replay socket of each ENDPOINT, in the same order (kv_events_replay_endpoint)
    #[arg(long = "replay-endpoint", value_name = "REPLAY_ENDPOINT", required = true,
          value_parser = NonEmptyStringValueParser::new())]
    pub(crate) replay_endpoints: Vec<String>,
    /// Subscribe to this topic (the master's kv_events_topic) or a prefix of it; default all
    #[arg(long, value_name = "T", default_value = "")]
    pub(crate) topic: String,
    /// The NATS server, e.g. nats://127.0.0.1:4222
    #[arg(long, value_name = "URL", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) nats: String,
    /// The JetStream stream of the log (made, with the subjects PREFIX.>, if absent)
    #[arg(long, value_name = "NAME", default_value = "KV_EVENTS")]
    pub(crate) stream: String,
    /// The subjects of the log: PREFIX.<backend_id>; another prefix (and --stream) for
    /// each deployment that shares a NATS account
    #[arg(long, value_name = "PREFIX", default_value = "kv-events")]
    pub(crate) subject_prefix: String,
    /// The Object Store bucket of the snapshots (made if absent)
    #[arg(long, value_name = "NAME", default_value = "kv-events-snapshots")]
    pub(crate) snapshots: String,
    /// A snapshot at least every SECS seconds while the log moves (and whenever the log has
    /// as many events since the last one as objects held)
    #[arg(long, value_name = "SECS", default_value = "60", value_parser = seconds)]
    pub(crate) snapshot_every: Duration,
    /// Also write the current state into this key-value bucket, one entry per object
    /// (made if absent; NAME-positions beside it); off by default
    #[arg(long, value_name = "NAME")]
    pub(crate) bucket: Option<String>,
    /// With --bucket: how long a deleted object's delete marker stays in the bucket (for its
    /// watchers) before the relay purges it
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = seconds)]
    pub(crate) bucket_marker_age: Duration,
    /// The replicas of the stream and buckets the relay makes (3 on a NATS cluster)
    #[arg(long, value_name = "N", default_value = "1", value_parser = clap::value_parser!(u8).range(1..=5))]
    pub(crate) replicas: u8,
    /// Print the status line every SECS seconds
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = seconds)]
    pub(crate) every: Duration,
    /// Stop after SECS seconds
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    pub(crate) duration: Option<Duration>,
    /// The publishers' public key file (NAME.pub): once for all, or once per ENDPOINT
    #[arg(
        long = "curve-server-key",
        value_name = "FILE",
        requires = "curve_secret_key"
    )]
    pub(crate) curve_server_keys: Vec<PathBuf>,
    /// This subscriber's key file (its NAME.key), whose .pub the publishers admit
    #[arg(long, value_name = "FILE", requires = "curve_server_keys")]
    pub(crate) curve_secret_key: Option<PathBuf>,
}

/// The longest stream name NATS takes (a file name).
const MAX_NAME: usize = 255;

/// A positive number of seconds.
fn seconds(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs.is_finite() => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!("{text:?} is not a number of seconds above 0")),
    }
}

impl Args {
    /// What the parser cannot check alone: one replay endpoint per endpoint, one server
    /// key for all or one per endpoint, names NATS takes.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let (endpoints, replays) = (self.endpoints.len(), self.replay_endpoints.len());
        if endpoints != replays {
            return Err(Error::Usage(format!(
                "{endpoints} ENDPOINT(s) but {replays} --replay-endpoint(s): give each \
                 ENDPOINT its replay endpoint"
            )));
        }
        let keys = self.curve_server_keys.len();
        if keys > 1 && keys != endpoints {
            return Err(Error::Usage(format!(
                "{keys} --curve-server-key for {endpoints} ENDPOINTs: give one for all, \
                 or one per ENDPOINT"
            )));
        }
        // Each name with the streams made of it: JetStream keeps a stream in a directory
        // named after it, and refuses a name longer than a file name may be.
        let mut names = vec![
            ("--stream", &self.stream, vec![self.stream.clone()]),
            (
                "--snapshots",
                &self.snapshots,
                vec![format!("OBJ_{}", self.snapshots)],
            ),
        ];
        if let Some(bucket) = &self.bucket {
            names.push((
                "--bucket",
                bucket,
                vec![format!("KV_{bucket}"), format!("KV_{bucket}-positions")],
            ));
        }
        for (what, name, streams) in names {
            let fits = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !fits {
                return Err(Error::Usage(format!(
                    "{what} {name:?}: a NATS name is letters, digits, - and _"
                )));
            }
            if let Some(long) = streams.iter().find(|s| s.len() > MAX_NAME) {
                return Err(Error::Usage(format!(
                    "{what}: {} characters; its stream {}... would have {}, and NATS takes                      at most {MAX_NAME}",
                    name.len(),
                    &long[..16],
                    long.len()
                )));
            }
        }
        let prefix = &self.subject_prefix;
        let fits = prefix.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
        if !fits || prefix.len() > MAX_NAME {
            return Err(Error::Usage(format!(
                "--subject-prefix {prefix:?}: subject tokens (letters, digits, - and _)                  joined by dots, at most {MAX_NAME} characters"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_needs_its_replay_endpoint_and_names_must_fit_nats() {
        let parse = |line: &str| Args::try_parse_from(line.split_whitespace());
        let ok = parse("r tcp://a:1 --replay-endpoint tcp://a:2 --nats nats://n:4222").unwrap();
        assert_eq!(ok.stream, "KV_EVENTS");
        assert_eq!(ok.bucket, None, "the bucket is opt-in");
        assert_eq!(ok.snapshots, "kv-events-snapshots");
        assert_eq!(ok.snapshot_every, Duration::from_secs(60));
        assert!(ok.check().is_ok());
        let two = parse("r tcp://a:1 tcp://b:1 --replay-endpoint tcp://a:2 --nats n").unwrap();
        assert!(two
            .check()
            .unwrap_err()
            .to_string()
            .contains("replay endpoint"));
        let dotted = parse("r e --replay-endpoint f --nats n --bucket a.b").unwrap();
        assert!(dotted.check().unwrap_err().to_string().contains("--bucket"));
        let dotted = parse("r e --replay-endpoint f --nats n --snapshots a.b").unwrap();
        assert!(dotted
            .check()
            .unwrap_err()
            .to_string()
            .contains("--snapshots"));
        assert!(parse("r e --replay-endpoint f --nats n --replicas 6").is_err());
        // Refused before anything is made (exit 2), naming the option.
        let long = format!(
            "r e --replay-endpoint f --nats n --bucket {}",
            "b".repeat(300)
        );
        let why = parse(&long).unwrap().check().unwrap_err().to_string();
        assert!(why.starts_with("--bucket: 300 characters"), "{why}");
        let long = format!(
            "r e --replay-endpoint f --nats n --stream {}",
            "S".repeat(256)
        );
        assert!(parse(&long).unwrap().check().is_err());
        let long = format!(
            "r e --replay-endpoint f --nats n --snapshots {}",
            "s".repeat(252)
        );
        assert!(parse(&long).unwrap().check().is_err(), "OBJ_ makes it 256");
        assert_eq!(ok.subject_prefix, "kv-events");
        let prefixed = parse("r e --replay-endpoint f --nats n --subject-prefix prod.kv").unwrap();
        assert!(prefixed.check().is_ok());
        for bad in ["a..b", "a.*", ".a", "a>"] {
            let line = format!("r e --replay-endpoint f --nats n --subject-prefix {bad}");
            assert!(parse(&line).unwrap().check().is_err(), "{bad}");
        }
        assert!(
            parse("r e --replay-endpoint f").is_err(),
            "--nats is required"
        );
    }
}
