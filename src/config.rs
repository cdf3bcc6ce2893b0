//! The publisher's configuration: one fixed context per publisher, validated once at creation.

use std::fmt;

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
}

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
        }
    }
}

impl Config {
    /// Checks what can be checked without binding: an enabled config needs an endpoint, a
    /// backend id and a capacity above zero. A disabled config is always valid.
    pub fn validate(&self) -> Result<(), CreateError> {
        if !self.enable_kv_events {
            return Ok(());
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
        Ok(())
    }
}

/// The effective configuration in one line, for the log at start.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bind_endpoint={:?} backend_id={:?} model_name={:?} block_size={} additional_salt={:?} \
             lora_name={:?} dp_rank={} emit_object_key={} emit_legacy_compat={} queue_capacity={}",
            self.bind_endpoint,
            self.backend_id,
            self.model_name,
            self.block_size,
            self.additional_salt,
            self.lora_name,
            self.dp_rank,
            self.emit_object_key,
            self.emit_legacy_compat,
            self.queue_capacity,
        )
    }
}

/// Why a publisher could not be created. Nothing is refused after creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// A field of an enabled config is missing or out of range.
    InvalidConfig {
        /// The master flag at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The PUB socket or the publishing thread could not be set up.
    Endpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// The reason the OS or ZeroMQ gave.
        reason: String,
    },
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::InvalidConfig { field, reason } => write!(f, "{field} {reason}"),
            CreateError::Endpoint { endpoint, reason } => {
                write!(
                    f,
                    "kv_events_bind_endpoint \"{endpoint}\" cannot be bound: {reason}"
                )
            }
        }
    }
}

impl std::error::Error for CreateError {}

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
    fn defaults_are_the_master_flag_defaults() {
        let c = Config::default();
        assert!(!c.enable_kv_events && c.emit_object_key && c.emit_legacy_compat);
        assert_eq!((c.block_size, c.dp_rank, c.queue_capacity), (0, 0, 65536));
        assert!(c.bind_endpoint.is_empty() && c.backend_id.is_empty());
    }

    #[test]
    fn a_disabled_config_is_valid_whatever_it_holds() {
        let c = Config {
            queue_capacity: 0,
            ..Config::default()
        };
        assert_eq!(c.validate(), Ok(()));
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
        assert_eq!(enabled().validate(), Ok(()));
    }
}
