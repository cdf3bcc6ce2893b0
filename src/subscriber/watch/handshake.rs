//! What a subscriber's socket monitor tells: how far it got towards its publisher, whether
//! the publisher refuses it, connections lost and when to connect again.

use super::{Subscriber, WatchError};
use crate::transport::monitor::{
    monitor_event, EVENT_CONNECTED, EVENT_CONNECT_RETRIED, EVENT_DISCONNECTED,
    EVENT_HANDSHAKE_FAILED_AUTH, EVENT_HANDSHAKE_FAILED_NO_DETAIL, EVENT_HANDSHAKE_FAILED_PROTOCOL,
    EVENT_HANDSHAKE_SUCCEEDED, PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC,
    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
};
use std::time::{Duration, Instant};

/// How long after a lost connection libzmq has to schedule its reconnection (it does within
/// milliseconds) before the subscriber connects again itself. libzmq 4.3 never reconnects
/// after a protocol error, and a frame over `ZMQ_MAXMSGSIZE` is one: without this, one
/// oversized message would end the stream for good.
pub(super) const REJOIN_AFTER: Duration = Duration::from_secs(1);
/// Handshakes in a row that end with the publisher closing the connection before that is
/// taken for a refusal (a wrong server key, CURVE asked of a plain subscriber) rather than
/// a publisher that went away in the middle of one.
const CLOSED_HANDSHAKES_REFUSED: u32 = 2;

/// How far a [`Subscriber`] got towards its publisher, from its socket's monitor:
/// [`Subscriber::reach`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// No connection was ever established: nothing accepted one at the endpoint (nothing
    /// listening, the connection refused, no such ipc socket file) in `failed_attempts`
    /// attempts; none has failed yet while the first is pending (a host that does not
    /// answer keeps it pending).
    Unreached {
        /// Connection attempts that failed, after each of which libzmq tried again.
        failed_attempts: u64,
    },
    /// Connections were established, but no ZeroMQ handshake ever completed on one: what
    /// listens there is not a ZeroMQ publisher, or has not answered yet.
    NoHandshake,
    /// A handshake completed at least once: the publisher was reached.
    Reached,
}

impl Subscriber {
    /// Connections to the publisher that closed after their handshake succeeded: the
    /// publisher stopped or restarted, or libzmq closed one that sent a frame over
    /// [`SubscriberOptions::max_message_bytes`]. The subscriber reconnects by itself; a
    /// message lost meanwhile shows as a gap. Counted as [`Subscriber::recv`] sees them.
    ///
    /// [`SubscriberOptions::max_message_bytes`]: super::SubscriberOptions::max_message_bytes
    pub fn connections_lost(&self) -> u64 {
        self.connections_lost
    }

    /// How far this subscriber ever got towards its publisher, the socket's events so far
    /// taken: a subscriber that never reached it can say why. [`WatchError::Refused`] when
    /// an event says the publisher refuses this subscriber, as [`Subscriber::recv`] would.
    pub fn reach(&mut self) -> Result<Reach, WatchError> {
        self.check_handshakes()?;
        Ok(if self.ever_reached {
            Reach::Reached
        } else if self.ever_connected {
            Reach::NoHandshake
        } else {
            Reach::Unreached {
                failed_attempts: self.failed_attempts,
            }
        })
    }

    /// Takes the handshake events that arrived; an error when one says the publisher will
    /// not let this subscriber in.
    pub(super) fn check_handshakes(&mut self) -> Result<(), WatchError> {
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let Some((event, value)) = monitor_event(&frames) else {
                continue;
            };
            let why = match event {
                EVENT_HANDSHAKE_SUCCEEDED => {
                    self.closed_handshakes = 0;
                    self.connected = true;
                    self.ever_reached = true;
                    continue;
                }
                EVENT_CONNECTED => {
                    self.ever_connected = true;
                    continue;
                }
                EVENT_DISCONNECTED => {
                    if std::mem::take(&mut self.connected) {
                        self.connections_lost += 1;
                        self.lost_at = Some(Instant::now());
                    }
                    continue;
                }
                EVENT_CONNECT_RETRIED => {
                    self.lost_at = None;
                    if !self.ever_connected {
                        self.failed_attempts += 1;
                    }
                    continue;
                }
                EVENT_HANDSHAKE_FAILED_AUTH => format!(
                    "it answered the handshake with status {value}: this subscriber's public \
                     key or address is not on its allow-list"
                ),
                EVENT_HANDSHAKE_FAILED_PROTOCOL => match value {
                    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH if self.curve => {
                        "it does not use CURVE (connect without CURVE keys)".to_owned()
                    }
                    PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH => {
                        "it requires CURVE: give its public key and a key pair of this \
                         subscriber's (--curve-server-key, --curve-secret-key)"
                            .to_owned()
                    }
                    PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC => {
                        "the CURVE handshake does not decrypt: the server key is not the \
                         publisher's"
                            .to_owned()
                    }
                    other => format!("ZMTP protocol error 0x{other:08x} in the handshake"),
                },
                EVENT_HANDSHAKE_FAILED_NO_DETAIL => {
                    self.closed_handshakes += 1;
                    if self.closed_handshakes < CLOSED_HANDSHAKES_REFUSED {
                        continue;
                    }
                    format!(
                        "it closed the connection during the handshake {} times in a row: {}",
                        self.closed_handshakes,
                        if self.curve {
                            "the server key is not the publisher's, or it does not use CURVE"
                        } else {
                            "it probably requires CURVE (--curve-server-key, --curve-secret-key), \
                             or it is no PUB socket (a master's replay endpoint is a ROUTER)"
                        }
                    )
                }
                _ => continue,
            };
            return Err(WatchError::Refused(why));
        }
        if self.lost_at.is_some_and(|at| at.elapsed() >= REJOIN_AFTER) {
            self.lost_at = None;
            // The endpoint stays registered after its connection ended, and libzmq ignores
            // a SUB socket's second connect to an endpoint it holds.
            match self.socket.disconnect(&self.endpoint) {
                Ok(()) | Err(zmq::Error::ENOENT) => {}
                Err(e) => return Err(e.into()),
            }
            self.socket.connect(&self.endpoint)?;
        }
        Ok(())
    }
}
