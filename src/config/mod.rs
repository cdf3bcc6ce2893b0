//! The publisher's configuration: one field per master flag, validated once into the
//! [`Settings`] that creating a publisher consumes. Validating reads what the flags point to
//! (the CURVE key files, the allow-lists: `access`), so nothing is read twice and what was
//! checked is what is used.

pub(crate) mod access;

use crate::error::CreateError;
use crate::wire::MAX_TOPIC_BYTES;
use access::Access;
use std::fmt;

// The struct is the `cxx` bridge's own: the C++ layer (`cpp/kv_events.cc`) fills a
// `mooncake::kv_events::bridge::Config` from the C API's `kv_events_config` and `src/ffi.rs` hands
// it to `validate` and `Publisher::create` as it is, so no conversion is written. The C side's
// list of the same fields is `KV_EVENTS_CONFIG_FIELDS` in include/mooncake/kv_events_c.h;
// tests/c_api.rs checks that both have the same names, order and defaults.
#[cxx::bridge(namespace = "mooncake::kv_events::bridge")]
mod bridge {
    /// Everything a publisher needs, one field per master flag (`kv_events_<field>`).
    ///
    /// String fields that are empty and `block_size == 0` go on the wire as nil.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Config {
        /// Master flag `enable_kv_events`, default false: false gives a publisher whose calls do
        /// nothing and cost a branch.
        pub enable_kv_events: bool,
        /// `kv_events_bind_endpoint`, default empty, required when enabled: the ZeroMQ endpoint the
        /// PUB socket binds, e.g. `tcp://*:5557` or `ipc:///run/kv.sock`.
        pub bind_endpoint: String,
        /// `kv_events_backend_id`, default empty, required when enabled: names this store in
        /// every event.
        pub backend_id: String,
        /// `kv_events_model_name`, default empty (nil).
        pub model_name: String,
        /// `kv_events_block_size`, in tokens, default 0 (nil).
        pub block_size: u32,
        /// `kv_events_additional_salt`, default empty (nil).
        pub additional_salt: String,
        /// `kv_events_lora_name`, default empty (nil).
        pub lora_name: String,
        /// `kv_events_dp_rank`, default 0: in every event and in every batch trailer.
        pub dp_rank: u32,
        /// `kv_events_emit_object_key`, default true: false suppresses every `stored` and
        /// `removed` (each counted in `skipped_keyless_events`); `cleared` still goes out.
        pub emit_object_key: bool,
        /// `kv_events_emit_legacy_compat`, default true: adds `type`, `block_hashes` and
        /// `parent_block_hash` for older readers.
        pub emit_legacy_compat: bool,
        /// `kv_events_queue_capacity`, default 65536: how many calls' events wait for the
        /// publishing thread before the oldest are dropped. Zero is refused.
        pub queue_capacity: u32,
        /// `kv_events_curve_secret_key_file`, default empty (no encryption): the path of the
        /// publisher's secret key file, as `kv-events keygen NAME` writes it (`NAME.key`). When
        /// set, the PUB socket is a CURVE server (ZeroMQ RFC 26): only subscribers that know its
        /// public key (`NAME.pub`) can read the stream. A path rather than the key itself, so the
        /// secret never shows in `ps`, shell history or a dump of the flags.
        pub curve_secret_key_file: String,
        /// `kv_events_curve_allow`, default empty (any subscriber with the server's public key):
        /// a subscriber's `.pub` file, or a directory whose `*.pub` files are the subscribers
        /// admitted; every other handshake is refused. Needs `curve_secret_key_file`. Read at
        /// creation.
        pub curve_allow: String,
        /// `kv_events_null_allow_addresses`, default empty (any address): comma-separated IP
        /// addresses that may connect, e.g. `10.0.0.5,10.0.0.6`; every other peer is refused.
        /// For `tcp://` endpoints; with CURVE a peer must pass both checks.
        pub null_allow_addresses: String,
        /// `kv_events_ipc_mode`, default `"0660"` (owner and group): the octal mode of the socket
        /// file of an `ipc://` endpoint, set before any peer can reach it. A local user needs
        /// write permission on the file to connect. Ignored for other endpoints.
        pub ipc_mode: String,
        /// `kv_events_handshake_timeout_ms`, default 3000: how long a connection to the publisher's
        /// sockets may take to finish its ZeroMQ handshake (greeting, CURVE, allow-lists) before
        /// the publisher closes it, so that peers which connect and send nothing hold a descriptor
        /// for seconds at most. Between 100 and 600000.
        pub handshake_timeout_ms: u32,
        /// `kv_events_max_connections`, default 512: connections the publisher's sockets hold at
        /// once, handshaking or not; a connection beyond it is closed as soon as it is accepted and
        /// counted in `connections_refused`. Never more than half the process's descriptor limit
        /// (`ulimit -n`): a larger value is lowered at creation, with a warning, so that the
        /// publisher alone cannot run the master out of descriptors.
        pub max_connections: u32,
        /// `kv_events_max_connections_per_address`, default 64: connections one peer IP address
        /// may hold at once (tcp endpoints); beyond it, refused like `max_connections`.
        pub max_connections_per_address: u32,
        /// `kv_events_send_hwm`, default 10000: messages the PUB socket holds for one subscriber
        /// that has not read them yet; past it that subscriber loses messages (it sees a gap).
        /// Subscribers share the messages they have not read, so the memory at stake is the
        /// slowest subscriber's backlog, at most this many messages of at most 64 events.
        pub send_hwm: u32,
        /// `kv_events_replay_endpoint`, default empty (off): the ZeroMQ endpoint of a ROUTER socket,
        /// beside the PUB socket and under its access rules, that answers `info` (the last sequence,
        /// the oldest replayable one, the incarnation) and replays recently sent messages, so a
        /// subscriber can learn of a loss at the end of a burst and fill a gap.
        pub replay_endpoint: String,
        /// `kv_events_replay_buffer_bytes`, default 64 MiB: how many bytes of recently sent
        /// payloads the replay socket keeps; the oldest go first. 0 keeps none (`info` only).
        pub replay_buffer_bytes: u64,
        /// `kv_events_topic`, default empty: the first frame of every message, live and
        /// replayed, as vLLM's `KVEventsConfig.topic` (llm-d names a stream
        /// `kv@<pod>@<model>`). Subscribers may subscribe to it or to any prefix of it; at most
        /// 255 bytes.
        pub topic: String,
        /// `kv_events_replay_topic_frame`, default true: each replayed message is
        /// `["", topic, seq, payload]` and the end `["", "", -1, ""]`, the replies of vLLM 0.26
        /// and after; false gives `["", seq, payload]` and `["", -1, ""]`, those of earlier
        /// vLLM and SGLang.
        pub replay_topic_frame: bool,
        /// `kv_events_heartbeat_ms`, default 0 (off): after this many milliseconds without a
        /// message, the publisher sends one with the next sequence and no event, so that a
        /// subscriber sees a lost tail as a gap within that time; 0 or 10 to 3600000.
        pub heartbeat_ms: u32,
        /// `kv_events_snapshot_max_requesters`, default 64: requesters one snapshot serves at
        /// once. Requests of the same scope that arrive while a snapshot is taken share it
        /// (one enumeration of the master); past this many, "busy". 1 to 4096.
        pub snapshot_max_requesters: u32,
        /// `kv_events_reannounce_remaining`, default false: a `removed` that leaves the object
        /// readable on another medium is followed, in the same message, by a `stored` for each
        /// medium left, so that a reader keeping only whether a key is present (Dynamo's
        /// Mooncake reader) keeps the object. Per-medium readers are unaffected: a `stored` of
        /// a medium already held changes nothing.
        pub reannounce_remaining: bool,
        /// `kv_events_non_utf8`, default `"skip"` (empty too): how an event whose tenant, key
        /// or group is not UTF-8 goes out ([`NonUtf8`]): `"skip"` (not at all, counted in
        /// `skipped_non_utf8_events`, in snapshots too), `"bin"` (msgpack bin, byte for byte)
        /// or `"str"` (msgpack str holding the raw bytes, as Mooncake's own publisher did).
        pub non_utf8: String,
    }
}

pub use bridge::Config;

impl Default for Config {
    fn default() -> Self {
        Config {
            enable_kv_events: false,
            bind_endpoint: String::new(),
            backend_id: String::new(),
            model_name: String::new(),
            block_size: 0,
            additional_salt: String::new(),
            lora_name: String::new(),
            dp_rank: 0,
            emit_object_key: true,
            emit_legacy_compat: true,
            queue_capacity: 65536,
            curve_secret_key_file: String::new(),
            curve_allow: String::new(),
            null_allow_addresses: String::new(),
            ipc_mode: "0660".into(),
            handshake_timeout_ms: 3000,
            max_connections: 512,
            max_connections_per_address: 64,
            send_hwm: 10_000,
            replay_endpoint: String::new(),
            replay_buffer_bytes: 64 << 20,
            topic: String::new(),
            replay_topic_frame: true,
            heartbeat_ms: 0,
            snapshot_max_requesters: 64,
            reannounce_remaining: false,
            non_utf8: NonUtf8::Skip.as_str().to_owned(),
        }
    }
}

impl Config {
    /// Checks what can be checked without binding: an enabled config needs an endpoint, a
    /// backend id and a capacity above zero; its key files must be readable and hold valid
    /// keys, its address list valid addresses, its ipc mode an octal mode. A disabled config
    /// is always valid. The result is what [`crate::Publisher::start`] takes.
    pub fn validate(&self) -> Result<Settings, CreateError> {
        if !self.enable_kv_events {
            return Ok(Settings {
                config: self.clone(),
                access: None,
            });
        }
        let invalid = |field, reason: &str| {
            Err(CreateError::InvalidConfig {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.bind_endpoint.is_empty() {
            return invalid(
                "kv_events_bind_endpoint",
                "is required when kv events are enabled",
            );
        }
        if self.backend_id.is_empty() {
            return invalid(
                "kv_events_backend_id",
                "is required when kv events are enabled",
            );
        }
        if self.queue_capacity == 0 {
            return invalid("kv_events_queue_capacity", "must be at least 1");
        }
        if !(100..=600_000).contains(&self.handshake_timeout_ms) {
            return invalid(
                "kv_events_handshake_timeout_ms",
                "must be between 100 and 600000 (milliseconds): without a bound, peers that \
                 connect and send nothing hold descriptors for as long as they like",
            );
        }
        if self.max_connections == 0 {
            return invalid("kv_events_max_connections", "must be at least 1");
        }
        if self.max_connections_per_address == 0 {
            return invalid(
                "kv_events_max_connections_per_address",
                "must be at least 1",
            );
        }
        if self.send_hwm == 0 {
            return invalid(
                "kv_events_send_hwm",
                "must be at least 1 (0 would let one stalled subscriber grow the publisher \
                 without bound)",
            );
        }
        if self.topic.len() > MAX_TOPIC_BYTES {
            return invalid(
                "kv_events_topic",
                "must be at most 255 bytes (a subscription to it must fit what the PUB socket \
                 accepts from a peer)",
            );
        }
        if self.heartbeat_ms != 0 && !(10..=3_600_000).contains(&self.heartbeat_ms) {
            return invalid(
                "kv_events_heartbeat_ms",
                "must be 0 (off) or between 10 and 3600000 (milliseconds)",
            );
        }
        if !(1..=4096).contains(&self.snapshot_max_requesters) {
            return invalid(
                "kv_events_snapshot_max_requesters",
                "must be between 1 and 4096",
            );
        }
        if self.non_utf8.parse::<NonUtf8>().is_err() {
            return invalid(
                "kv_events_non_utf8",
                &format!(
                    "must be skip (or empty), bin or str, not {:?}",
                    self.non_utf8
                ),
            );
        }
        if !self.replay_endpoint.is_empty() && self.replay_endpoint == self.bind_endpoint {
            return invalid(
                "kv_events_replay_endpoint",
                "must differ from kv_events_bind_endpoint",
            );
        }
        Ok(Settings {
            config: self.clone(),
            access: Some(Access::read(self)?),
        })
    }
}

/// How an event whose tenant, key or group is not UTF-8 goes out (`kv_events_non_utf8`).
///
/// Readers differ on such strings: a strict decoder into string types refuses a msgpack
/// `bin` where it wants a `str`, and a `str` whose bytes are not UTF-8 (Dynamo's rmp-serde
/// reader refuses both, then takes the lost message for a gap and empties its index;
/// Conductor refuses `bin` alone and takes raw `str`). An event with such a string always
/// goes in a message without other calls' events, so a refusal costs that call alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonUtf8 {
    /// Not published at all: the call's events are dropped before they take a sequence
    /// number, counted in `skipped_non_utf8_events`, and snapshots leave such objects out,
    /// so every reader's index stays exact without them.
    #[default]
    Skip,
    /// As msgpack `bin`, byte for byte.
    Bin,
    /// As msgpack `str` holding the raw bytes.
    Str,
}

impl NonUtf8 {
    /// The flag's value for it.
    pub fn as_str(self) -> &'static str {
        match self {
            NonUtf8::Skip => "skip",
            NonUtf8::Bin => "bin",
            NonUtf8::Str => "str",
        }
    }
}

/// A `kv_events_non_utf8` value that is none of `skip` (or empty), `bin`, `str`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownNonUtf8(pub String);

impl fmt::Display for UnknownNonUtf8 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not skip, bin or str", self.0)
    }
}

impl std::error::Error for UnknownNonUtf8 {}

impl std::str::FromStr for NonUtf8 {
    type Err = UnknownNonUtf8;

    fn from_str(text: &str) -> Result<NonUtf8, UnknownNonUtf8> {
        match text {
            // Empty is the default, as an empty string flag is elsewhere (a C caller's NULL).
            "" | "skip" => Ok(NonUtf8::Skip),
            "bin" => Ok(NonUtf8::Bin),
            "str" => Ok(NonUtf8::Str),
            other => Err(UnknownNonUtf8(other.to_owned())),
        }
    }
}

/// A [`Config`] that passed [`Config::validate`], with what validating it read.
#[derive(Debug)]
pub struct Settings {
    config: Config,
    /// Who may connect; `None` when disabled.
    pub(crate) access: Option<Access>,
}

impl Settings {
    /// The configuration as validated.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

/// The effective configuration in one line, for the log at start: every field as
/// `name=value`, in order, strings quoted and escaped as `Debug` writes them. Read off the
/// derived `Debug`, so a new field shows up without an edit here; nothing in `Config` is
/// secret (keys are named by their files' paths), and nothing may become so.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:#?}` puts each field on a line of its own, `    name: value,`; `Debug` escapes
        // any newline inside a string, so a line is always one whole field.
        let debug = format!("{self:#?}");
        let fields = debug.lines().filter_map(|line| {
            line.strip_prefix("    ")?
                .strip_suffix(',')?
                .split_once(": ")
        });
        for (i, (name, value)) in fields.enumerate() {
            let separator = if i == 0 { "" } else { " " };
            write!(f, "{separator}{name}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled() -> Config {
        Config {
            enable_kv_events: true,
            bind_endpoint: "tcp://127.0.0.1:0".into(),
            backend_id: "store-a".into(),
            ..Config::default()
        }
    }

    #[test]
    fn non_utf8_modes_parse_and_an_unknown_one_is_named() {
        assert_eq!("".parse(), Ok(NonUtf8::Skip));
        assert_eq!("bin".parse(), Ok(NonUtf8::Bin));
        let err = "raw".parse::<NonUtf8>().unwrap_err();
        assert_eq!(err, UnknownNonUtf8("raw".into()));
        assert_eq!(err.to_string(), "\"raw\" is not skip, bin or str");
    }

    #[test]
    fn defaults_are_the_master_flag_defaults() {
        let c = Config::default();
        assert!(!c.enable_kv_events && c.emit_object_key && c.emit_legacy_compat);
        assert_eq!((c.block_size, c.dp_rank, c.queue_capacity), (0, 0, 65536));
        assert!(c.bind_endpoint.is_empty() && c.backend_id.is_empty());
    }

    #[test]
    fn the_log_line_shows_every_field_once_in_order() {
        let config = Config {
            backend_id: "a, b: \"c\"\nd".into(),
            ..enabled()
        };
        let line = config.to_string();
        assert!(
            line.starts_with("enable_kv_events=true bind_endpoint=\"tcp://127.0.0.1:0\" "),
            "{line}"
        );
        assert!(
            line.contains(" backend_id=\"a, b: \\\"c\\\"\\nd\" model_name=\"\" "),
            "{line}"
        );
        assert!(
            line.ends_with(" reannounce_remaining=false non_utf8=\"skip\""),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
        let debug = format!("{config:#?}");
        let names: Vec<&str> = debug
            .lines()
            .filter_map(|l| Some(l.trim().split_once(": ")?.0))
            .collect();
        assert_eq!(names.len(), line.matches('=').count(), "{line}");
        let mut rest = line.as_str();
        for name in names {
            let at = rest
                .find(&format!("{name}="))
                .unwrap_or_else(|| panic!("{name} missing or out of order: {line}"));
            rest = &rest[at..];
        }
    }

    #[test]
    fn a_disabled_config_is_valid_whatever_it_holds() {
        let c = Config {
            queue_capacity: 0,
            ..Config::default()
        };
        assert!(c.validate().is_ok());
    }

    #[test]
    fn each_missing_field_is_named() {
        for (config, field) in [
            (
                Config {
                    bind_endpoint: String::new(),
                    ..enabled()
                },
                "kv_events_bind_endpoint",
            ),
            (
                Config {
                    backend_id: String::new(),
                    ..enabled()
                },
                "kv_events_backend_id",
            ),
            (
                Config {
                    queue_capacity: 0,
                    ..enabled()
                },
                "kv_events_queue_capacity",
            ),
        ] {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().starts_with(field), "{err}");
        }
        assert!(enabled().validate().is_ok());
    }
}
