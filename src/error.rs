//! Why a publisher could not be created, naming what failed. Nothing is refused after
//! creation: every error is returned by [`crate::Config::validate`] or
//! [`crate::Publisher::create`].

use std::fmt;

/// Why a publisher could not be created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// A field of an enabled config is missing, out of range or unparsable.
    InvalidConfig {
        /// The master flag at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A key file or allow-list named by a flag cannot be read, or holds no valid key.
    KeyFile {
        /// The master flag that names the file: `kv_events_curve_secret_key_file` or
        /// `kv_events_curve_allow`.
        field: &'static str,
        /// What is wrong, naming the file (never a key).
        reason: String,
    },
    /// A socket could not be bound to its endpoint.
    Bind {
        /// The master flag that names the endpoint: `kv_events_bind_endpoint` or
        /// `kv_events_replay_endpoint`.
        field: &'static str,
        /// The endpoint as configured.
        endpoint: String,
        /// The reason the OS or ZeroMQ gave.
        reason: String,
    },
    /// A socket could not be created or given its options.
    Socket {
        /// Which: "the PUB socket" or "the replay socket".
        socket: &'static str,
        /// The reason ZeroMQ gave.
        reason: String,
    },
    /// The ZAP handler or the connection monitors could not be set up.
    Zap {
        /// The reason ZeroMQ gave.
        reason: String,
    },
    /// One of the publisher's threads could not be started.
    Thread {
        /// The thread's name, e.g. `kv-events-publisher`.
        name: &'static str,
        /// The reason the OS gave.
        reason: String,
    },
}

impl CreateError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> CreateError {
        CreateError::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::InvalidConfig { field, reason }
            | CreateError::KeyFile { field, reason } => write!(f, "{field} {reason}"),
            CreateError::Bind {
                field,
                endpoint,
                reason,
            } => write!(f, "{field} \"{endpoint}\" cannot be bound: {reason}"),
            CreateError::Socket { socket, reason } => {
                write!(f, "cannot set up {socket}: {reason}")
            }
            CreateError::Zap { reason } => {
                write!(
                    f,
                    "cannot set up the ZAP handler and connection monitors: {reason}"
                )
            }
            CreateError::Thread { name, reason } => {
                write!(f, "cannot start the thread {name}: {reason}")
            }
        }
    }
}

impl std::error::Error for CreateError {}
