//! The relay's errors: what failed on the master's side, in NATS, or at the end.

use std::fmt;

/// A request to the store (NATS) that did not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoreError {
    /// The subject's last message is not the one the write was meant to go on top of:
    /// another relay wrote meanwhile.
    NotLast,
    /// The server could not be reached, refused, or did not answer in time: retried.
    Failed {
        /// What was asked.
        what: &'static str,
        /// What the client said.
        why: String,
    },
    /// What the store holds is not what the relay writes (a snapshot that is no batch, a
    /// position that is no JSON): named, so that an operator can remove it.
    Unreadable {
        /// What could not be read.
        what: String,
    },
    /// What is in NATS cannot be used as it is (a stream of that name with other
    /// subjects): not retried.
    Unusable {
        /// What is in the way, and what to do.
        what: String,
    },
}

impl StoreError {
    /// A failure of `what`, from any error the client returns.
    pub(crate) fn failed(what: &'static str, why: impl fmt::Display) -> StoreError {
        StoreError::Failed {
            what,
            why: why.to_string(),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::NotLast => write!(f, "another writer wrote the log meanwhile"),
            StoreError::Failed { what, why } => write!(f, "{what}: {why}"),
            StoreError::Unreadable { what } => write!(f, "unreadable: {what}"),
            StoreError::Unusable { what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// Why the relay stopped, or could not start.
#[derive(Debug)]
pub(crate) enum Error {
    /// A command line that cannot be used.
    Usage(String),
    /// The master's side: keys, endpoints, sockets.
    Master(String),
    /// NATS.
    Store(StoreError),
    /// Stopped (a signal) before any publisher answered.
    Stopped,
    /// Stopped with the log or the bucket behind the followed master.
    Behind,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(why) | Error::Master(why) => write!(f, "{why}"),
            Error::Store(e) => write!(f, "{e}"),
            Error::Stopped => write!(f, "stopped before any publisher answered"),
            Error::Behind => write!(f, "stopped with the log or the bucket behind the master"),
        }
    }
}

impl std::error::Error for Error {}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Error {
        Error::Store(e)
    }
}
