//! One publisher's sockets (its stream's SUB, its replay socket's DEALER) and the state machine
//! they feed: what arrives goes to the [`FollowerState`], what it asks for goes out.

use super::notice::NoticeKind;
use super::options::{FollowOptions, Upstream};
use super::state::{Action, FollowerState};
use crate::subscriber::watch::{Subscriber, SubscriberOptions, WatchError};
use std::error::Error;
use std::fmt;
use std::time::{Duration, Instant};

/// How long one publisher's sockets are read before the others, and the timers, get their
/// turn: half of it for the stream, the rest for the replay socket.
const READ_BUDGET: Duration = Duration::from_millis(20);

/// Why [`Follower::new`](super::Follower::new) cannot follow an upstream.
#[derive(Debug)]
pub enum FollowError {
    /// The PUB endpoint cannot be subscribed to (a malformed endpoint, bad CURVE keys).
    Subscribe {
        /// The PUB endpoint.
        endpoint: String,
        /// What ZeroMQ said.
        source: zmq::Error,
    },
    /// The replay endpoint cannot be connected to.
    Replay {
        /// The replay endpoint.
        endpoint: String,
        /// What ZeroMQ said.
        source: zmq::Error,
    },
}

impl fmt::Display for FollowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FollowError::Subscribe { endpoint, source } => {
                write!(f, "cannot subscribe to {endpoint}: {source}")
            }
            FollowError::Replay { endpoint, source } => {
                write!(f, "cannot connect to {endpoint}: {source}")
            }
        }
    }
}

impl Error for FollowError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            FollowError::Subscribe { source, .. } => Some(source),
            FollowError::Replay { source, .. } => Some(source),
        }
    }
}

/// One publisher followed: its sockets and its state.
pub(super) struct Followed {
    pub(super) upstream: Upstream,
    context: zmq::Context,
    subscriber: Subscriber,
    /// The replay socket; `None` when the publisher has none.
    dealer: Option<zmq::Socket>,
    /// The stream connections lost so far, as the subscriber counts them.
    connections_lost: u64,
    pub(super) state: FollowerState<zmq::Message>,
}

impl fmt::Debug for Followed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Followed")
            .field("endpoint", &self.upstream.endpoint)
            .field("status", &self.state.status(&self.upstream.endpoint))
            .finish_non_exhaustive()
    }
}

impl Followed {
    /// Subscribes to `upstream` and connects its replay socket, if it has one.
    pub(super) fn open(
        upstream: Upstream,
        options: &FollowOptions,
        now: Instant,
    ) -> Result<Followed, FollowError> {
        let subscriber = Subscriber::open(
            &upstream.endpoint,
            &SubscriberOptions {
                rcvhwm: options.rcvhwm,
                curve: upstream.curve.clone(),
                max_message_bytes: options.max_message_bytes,
                topic: upstream.topic.clone(),
            },
        )
        .map_err(|source| FollowError::Subscribe {
            endpoint: upstream.endpoint.clone(),
            source,
        })?;
        let context = zmq::Context::new();
        let dealer = match &upstream.replay_endpoint {
            Some(endpoint) => Some(open_dealer(&context, endpoint, &upstream, options)?),
            None => None,
        };
        Ok(Followed {
            state: FollowerState::new(options, upstream.replay_endpoint.clone(), now),
            upstream,
            context,
            subscriber,
            dealer,
            connections_lost: 0,
        })
    }

    /// What the follower's poll waits on: the stream and the replay socket.
    pub(super) fn poll_items(&self) -> Vec<zmq::PollItem<'_>> {
        let mut items = vec![self.subscriber.poll_item()];
        items.extend(self.dealer.iter().map(|d| d.as_poll_item(zmq::POLLIN)));
        items
    }

    /// Reads what the sockets hold, lets time pass, and does what the state asks;
    /// `notice` takes what happened.
    pub(super) fn step(&mut self, options: &FollowOptions, notice: &mut impl FnMut(NoticeKind)) {
        let start = Instant::now();
        while start.elapsed() < READ_BUDGET / 2 {
            let actions = match self.subscriber.recv_checked(Duration::ZERO) {
                Ok(Some((message, _))) => self.state.on_stream(message, Instant::now()),
                Ok(None) => break,
                Err(e @ (WatchError::Malformed(_) | WatchError::TooLarge { .. })) => {
                    self.state.malformed(e.to_string())
                }
                // A signal interrupted the wait: nothing to say.
                Err(WatchError::Socket(zmq::Error::EINTR)) => break,
                Err(WatchError::Refused(why)) => {
                    let actions = self.state.refused(why);
                    self.perform(actions, options, notice);
                    break;
                }
                Err(e) => {
                    let why = format!("reading {}: {e}", self.upstream.endpoint);
                    let actions = self.state.read_failed(why);
                    self.perform(actions, options, notice);
                    break;
                }
            };
            self.perform(actions, options, notice);
        }
        while start.elapsed() < READ_BUDGET {
            let Some(Ok(frames)) = self
                .dealer
                .as_ref()
                .map(|d| d.recv_multipart(zmq::DONTWAIT))
            else {
                break;
            };
            let actions = self.state.on_reply(&frames, Instant::now());
            self.perform(actions, options, notice);
        }
        let lost = self.subscriber.connections_lost();
        if lost > self.connections_lost {
            self.connections_lost = lost;
            let actions = self.state.disconnected(Instant::now());
            self.perform(actions, options, notice);
        }
        let actions = self.state.tick(Instant::now());
        self.perform(actions, options, notice);
    }

    /// Does what the state asks, and what it asks then when a request cannot go.
    fn perform(
        &mut self,
        mut actions: Vec<Action>,
        options: &FollowOptions,
        notice: &mut impl FnMut(NoticeKind),
    ) {
        while !actions.is_empty() {
            let mut more = Vec::new();
            for action in actions {
                match action {
                    Action::Notice(kind) => notice(kind),
                    Action::Send(request) => {
                        let sent = match &self.dealer {
                            Some(dealer) => dealer
                                .send_multipart(request.frames(), zmq::DONTWAIT)
                                .map_err(|e| e.to_string()),
                            None => Err("no replay socket".to_owned()),
                        };
                        if let Err(e) = sent {
                            let endpoint = self.upstream.replay_endpoint.as_deref();
                            let why = format!("cannot ask {}: {e}", endpoint.unwrap_or_default());
                            more.extend(self.state.send_failed(why, Instant::now()));
                        }
                    }
                    Action::Cancel => self.replace_dealer(options),
                }
            }
            actions = more;
        }
    }

    /// A fresh replay socket, so that no late reply to a request given up is read as the
    /// next one's; the old one is kept if no new one can be made.
    fn replace_dealer(&mut self, options: &FollowOptions) {
        let Some(endpoint) = &self.upstream.replay_endpoint else {
            return;
        };
        if let Ok(fresh) = open_dealer(&self.context, endpoint, &self.upstream, options) {
            self.dealer = Some(fresh);
        }
    }
}

fn open_dealer(
    context: &zmq::Context,
    endpoint: &str,
    upstream: &Upstream,
    options: &FollowOptions,
) -> Result<zmq::Socket, FollowError> {
    let failed = |source| FollowError::Replay {
        endpoint: endpoint.to_owned(),
        source,
    };
    let socket = context.socket(zmq::DEALER).map_err(failed)?;
    socket.set_linger(0).map_err(failed)?;
    socket
        .set_maxmsgsize(i64::try_from(options.max_message_bytes).unwrap_or(i64::MAX))
        .map_err(failed)?;
    if let Some(curve) = &upstream.curve {
        socket
            .set_curve_serverkey(&curve.server_key.0)
            .map_err(failed)?;
        socket
            .set_curve_publickey(&curve.keys.public.0)
            .map_err(failed)?;
        socket
            .set_curve_secretkey(&curve.keys.secret.0)
            .map_err(failed)?;
    }
    socket.connect(endpoint).map_err(failed)?;
    Ok(socket)
}
