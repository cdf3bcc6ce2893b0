//! The subscriber's way back to the stream it missed: a client of the publisher's replay
//! socket (`kv_events_replay_endpoint`), and [`Catchup`], which fills a subscriber's gaps
//! from it and notices a loss at the end of a burst, which no later message would show.

use super::watch::{Batch, Continuity, CurveClient, WatchError};
use crate::wire::replay::verb;
use crate::wire::{decode_message, Info, Replayed, Request};
use std::time::{Duration, Instant};

/// A DEALER connected to a publisher's replay socket, with the subscriber's CURVE keys when
/// the publisher speaks CURVE.
pub struct ReplayClient {
    context: zmq::Context,
    socket: zmq::Socket,
    endpoint: String,
    curve: Option<CurveClient>,
}

impl std::fmt::Debug for ReplayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayClient")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl ReplayClient {
    /// Connects to the replay socket at `endpoint`.
    pub fn connect(endpoint: &str, curve: Option<CurveClient>) -> Result<ReplayClient, zmq::Error> {
        let context = zmq::Context::new();
        let socket = Self::open(&context, endpoint, curve.as_ref())?;
        Ok(ReplayClient {
            context,
            socket,
            endpoint: endpoint.to_owned(),
            curve,
        })
    }

    fn open(
        context: &zmq::Context,
        endpoint: &str,
        curve: Option<&CurveClient>,
    ) -> Result<zmq::Socket, zmq::Error> {
        let socket = context.socket(zmq::DEALER)?;
        socket.set_linger(0)?;
        if let Some(curve) = curve {
            socket.set_curve_serverkey(&curve.server_key.0)?;
            socket.set_curve_publickey(&curve.keys.public.0)?;
            socket.set_curve_secretkey(&curve.keys.secret.0)?;
        }
        socket.connect(endpoint)?;
        Ok(socket)
    }

    /// Asks where the stream stands.
    pub fn info(&mut self, timeout: Duration) -> Result<Info, WatchError> {
        self.send(&Request::Info.frames())?;
        let deadline = Instant::now() + timeout;
        let frames = self.reply(deadline)?;
        match frames.as_slice() {
            [_, head, body] if head.as_slice() == verb::INFO => {
                Info::decode(body).map_err(WatchError::BadReply)
            }
            other => Err(self.unexpected(other)),
        }
    }

    /// The retained messages with sequence at least `from` and below `until`, in order, as
    /// batches whose continuity is not yet known ([`Continuity::Next`]); what the publisher
    /// no longer holds is absent. The publisher sends everything from `from` on: the rest is
    /// read to the end of the replay and left undecoded.
    pub fn replay(
        &mut self,
        from: u64,
        until: u64,
        timeout: Duration,
    ) -> Result<Vec<Batch>, WatchError> {
        self.send(&Request::Replay { from }.frames())?;
        let deadline = Instant::now() + timeout;
        let mut batches = Vec::new();
        loop {
            let frames = self.reply(deadline)?;
            let replayed = match frames.split_first() {
                Some((delimiter, rest)) if delimiter.is_empty() => Replayed::read(rest),
                _ => None,
            };
            match replayed {
                Some(Replayed::End) => return Ok(batches),
                Some(Replayed::Message { sequence, .. }) if !below(sequence, until) => {}
                Some(Replayed::Message { sequence, payload }) => {
                    let message = decode_message(&[&[][..], sequence, payload])?;
                    batches.push(Batch::new(message, Continuity::Next));
                }
                None => return Err(self.unexpected(&frames)),
            }
        }
    }

    fn send(&self, frames: &[Vec<u8>]) -> Result<(), WatchError> {
        self.socket
            .send_multipart(frames, zmq::DONTWAIT)
            .map_err(|e| WatchError::Replay(format!("cannot ask {}: {e}", self.endpoint)))
    }

    /// The next reply, by `deadline`. A reply that does not come in time may still come
    /// later; the socket is replaced so that it cannot be taken for the next request's.
    fn reply(&mut self, deadline: Instant) -> Result<Vec<Vec<u8>>, WatchError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut items = [self.socket.as_poll_item(zmq::POLLIN)];
        let ready = zmq::poll(&mut items, left.as_millis() as i64).map_err(WatchError::Socket)?;
        if ready == 0 {
            if let Ok(fresh) = Self::open(&self.context, &self.endpoint, self.curve.as_ref()) {
                self.socket = fresh;
            }
            return Err(WatchError::Unanswered(self.endpoint.clone()));
        }
        self.socket.recv_multipart(0).map_err(WatchError::Socket)
    }

    fn unexpected(&self, frames: &[Vec<u8>]) -> WatchError {
        match frames {
            [_, head, text] if head.as_slice() == verb::ERROR => WatchError::Replay(format!(
                "{} says: {}",
                self.endpoint,
                String::from_utf8_lossy(text)
            )),
            _ => WatchError::Replay(format!(
                "{} sent a reply of {} frames that is not the protocol's",
                self.endpoint,
                frames.len()
            )),
        }
    }
}

/// Whether an 8-byte big-endian sequence frame is below `until`.
fn below(frame: &[u8], until: u64) -> bool {
    <[u8; 8]>::try_from(frame).is_ok_and(|b| u64::from_be_bytes(b) < until)
}

/// How long a replay may take.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an `info` may take: one small reply.
const INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// After a request the replay socket did not answer, how long it is not asked again: a
/// subscriber that asks on every quiet second would otherwise wait on a dead socket as long
/// as it reads.
const SILENT_FOR: Duration = Duration::from_secs(10);

/// Fills a subscriber's gaps from the replay socket, as far as its buffer reaches. A replay
/// socket that did not answer is not asked again for ten seconds: meanwhile its requests
/// fail at once with [`WatchError::Unanswered`], so that a dead socket never holds up the
/// reading of the stream.
#[derive(Debug)]
pub struct Catchup {
    client: ReplayClient,
    last: Option<u64>,
    /// Until when requests fail without being sent, after one got no answer.
    silent_until: Option<Instant>,
}

impl Catchup {
    /// Follows the stream with `client`.
    pub fn new(client: ReplayClient) -> Catchup {
        Catchup {
            client,
            last: None,
            silent_until: None,
        }
    }

    /// Sends a request with `ask`, unless the socket is known silent; a request that gets no
    /// answer makes it silent for [`SILENT_FOR`].
    fn ask<T>(
        &mut self,
        ask: impl FnOnce(&mut ReplayClient) -> Result<T, WatchError>,
    ) -> Result<T, WatchError> {
        if self
            .silent_until
            .is_some_and(|until| Instant::now() < until)
        {
            return Err(WatchError::Unanswered(self.client.endpoint.clone()));
        }
        let answer = ask(&mut self.client);
        self.silent_until = match &answer {
            Err(e) if e.is_unanswered() => Some(Instant::now() + SILENT_FOR),
            _ => None,
        };
        answer
    }

    /// `batch` came from the stream: the batches to take in its place, in order, each with
    /// its continuity to the one before: the messages of the gap before it that the replay
    /// socket still holds, then `batch`. A gap the replay could not fill stays a gap.
    ///
    /// A replay that fails leaves the gap as it was; the error says why.
    pub fn fill(&mut self, batch: Batch) -> (Vec<Batch>, Option<WatchError>) {
        let mut batches = Vec::new();
        let mut failure = None;
        let gap = self.last.filter(|last| batch.sequence > last + 1);
        if let Some(last) = gap {
            let until = batch.sequence;
            match self.ask(|client| client.replay(last + 1, until, REPLAY_TIMEOUT)) {
                Ok(replayed) => batches.extend(replayed),
                Err(e) => failure = Some(e),
            }
        }
        batches.push(batch);
        (self.sequence(batches), failure)
    }

    /// Asks the publisher where it stands (its `info`), without replaying anything.
    pub fn info(&mut self) -> Result<Info, WatchError> {
        self.ask(|client| client.info(INFO_TIMEOUT))
    }

    /// The stream is quiet: asks the publisher for its next sequence and replays what it
    /// sent after the last message seen. Returns the replayed batches and the sequence
    /// numbers at the end that are lost for good (no later message would show them).
    pub fn check_end(&mut self) -> Result<(Vec<Batch>, u64), WatchError> {
        let Some(last) = self.last else {
            return Ok((Vec::new(), 0));
        };
        let info = self.info()?;
        if info.next_sequence <= last + 1 {
            return Ok((Vec::new(), 0));
        }
        let replayed =
            self.ask(|client| client.replay(last + 1, info.next_sequence, REPLAY_TIMEOUT))?;
        let batches = self.sequence(replayed);
        let reached = self.last.unwrap_or(last);
        self.last = Some(info.next_sequence - 1);
        Ok((batches, info.next_sequence - 1 - reached))
    }

    /// Sets each batch's continuity to the one before it, from the last sequence seen.
    fn sequence(&mut self, mut batches: Vec<Batch>) -> Vec<Batch> {
        for batch in &mut batches {
            if let Some(last) = self.last {
                batch.continuity = Continuity::after(last, batch.sequence);
            }
            self.last = Some(batch.sequence);
        }
        batches
    }
}
