//! A snapshot under way and the requesters it is sent to: one enumeration of the master for
//! every requester of the same scope.
//!
//! The batches the snapshot thread writes are kept in order, shared (never copied) by every
//! requester, each reading at its own pace from its own place. A request of the same scope
//! joins the snapshot under way as long as its first batch is still kept; later ones wait
//! for the next snapshot, which starts as soon as this one ends and serves them all at once.
//! What is kept is bounded by [`RETAIN`]: past it, batches every requester has sent are let
//! go, and the thread waits for the slowest requester. A requester that takes nothing for
//! [`STALLED_FOR`](super::requester::STALLED_FOR), or holds the others back for [`LAGGARD_GRACE`], is given up alone.
//! A request of another scope is answered "busy".

use super::requester::{Reply, Requester};
use super::snapshot::Piece;
use crate::logging::{log, Level};
use crate::stats::PeerCounters;
use crate::transport::connections::Listeners;
use crate::wire::replay::verb;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes of batches a snapshot keeps: those not yet sent to every requester, and, while
/// nothing was let go, those a requester that joins now would need.
pub(crate) const RETAIN: u64 = 32 << 20;
/// How long the slowest requester may hold the others back, taking nothing, before it is
/// given up alone.
pub(crate) const LAGGARD_GRACE: Duration = Duration::from_millis(500);

/// One requester of a snapshot, and the next batch it is to get.
#[derive(Debug)]
struct Reader {
    requester: Requester,
    next: usize,
}

/// How a snapshot ended: the last reply's verb and body, and the objects it held.
#[derive(Debug)]
struct Ending {
    verb: &'static [u8],
    body: Arc<[u8]>,
    objects: Option<u64>,
}

/// A snapshot under way.
pub(crate) struct Fanout {
    scope: Option<Vec<u8>>,
    pieces: Receiver<Piece>,
    thread: JoinHandle<()>,
    /// The batches kept, the first of them numbered `first`.
    batches: VecDeque<Arc<[u8]>>,
    first: usize,
    kept_bytes: u64,
    /// At most this many bytes are kept ([`RETAIN`]).
    retain: u64,
    ending: Option<Ending>,
    readers: Vec<Reader>,
    /// Requests of the same scope that came too late to join, for the next snapshot.
    waiting: Vec<Requester>,
}

/// What a [`Fanout`] says after a turn.
pub(crate) enum Turn {
    Ongoing(Fanout),
    /// Every requester got its end or was given up: the thread to join, and the requests
    /// that wait for the next snapshot of the scope.
    Over(JoinHandle<()>, Option<Vec<u8>>, Vec<Requester>),
}

impl Fanout {
    pub(crate) fn new(
        scope: Option<Vec<u8>>,
        pieces: Receiver<Piece>,
        thread: JoinHandle<()>,
        requesters: Vec<Requester>,
        retain: u64,
    ) -> Fanout {
        Fanout {
            scope,
            pieces,
            thread,
            batches: VecDeque::new(),
            first: 0,
            kept_bytes: 0,
            retain,
            ending: None,
            readers: requesters
                .into_iter()
                .map(|requester| Reader { requester, next: 0 })
                .collect(),
            waiting: Vec::new(),
        }
    }

    /// The snapshot's thread, for a publisher that stops: the source sees the snapshot
    /// abandoned at its next object once the receiver is dropped.
    pub(crate) fn into_thread(self) -> JoinHandle<()> {
        self.thread
    }

    pub(crate) fn scope(&self) -> Option<&[u8]> {
        self.scope.as_deref()
    }

    /// Requesters served by this snapshot or waiting for the next one.
    pub(crate) fn requesters(&self) -> usize {
        self.readers.len() + self.waiting.len()
    }

    /// A request of this snapshot's scope: it joins if it can still get every batch, else
    /// it waits for the next snapshot.
    pub(crate) fn join(&mut self, requester: Requester) {
        if self.first == 0 && self.ending.is_none() {
            self.readers.push(Reader { requester, next: 0 });
        } else {
            self.waiting.push(requester);
        }
    }

    /// Takes what the snapshot thread wrote and sends what each requester can take.
    pub(crate) fn turn(
        mut self,
        socket: &mut zmq::Socket,
        counters: &Arc<PeerCounters>,
        listeners: &Listeners,
    ) -> Turn {
        self.take_pieces();
        let mut i = 0;
        while i < self.readers.len() {
            if self.send(i, socket, counters, listeners) {
                i += 1;
            } else {
                self.readers.swap_remove(i);
            }
        }
        self.give_up_a_laggard(counters, listeners);
        if !self.readers.is_empty() {
            return Turn::Ongoing(self);
        }
        if self.ending.is_none() {
            // Nobody left to send to: dropping the receiver tells the source to stop.
            log(
                Level::Warn,
                "gave up a snapshot: every requester left or stopped reading",
            );
        }
        Turn::Over(self.thread, self.scope, self.waiting)
    }

    /// Takes the thread's batches while fewer than [`RETAIN`] bytes are kept, letting go of
    /// those every requester has sent once that is needed.
    fn take_pieces(&mut self) {
        while self.ending.is_none() {
            if self.kept_bytes >= self.retain && !self.let_go() {
                return;
            }
            match self.pieces.try_recv() {
                Ok(Piece::Batch(batch)) => {
                    self.kept_bytes += batch.len() as u64;
                    self.batches.push_back(batch);
                }
                Ok(Piece::End(body, objects)) => {
                    self.ending = Some(Ending {
                        verb: verb::SNAPSHOT_END,
                        body,
                        objects: Some(objects),
                    });
                }
                Ok(Piece::Failed(why)) => {
                    self.ending = Some(Ending {
                        verb: verb::ERROR,
                        body: why,
                        objects: None,
                    });
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.ending = Some(Ending {
                        verb: verb::ERROR,
                        body: Arc::from(&b"the snapshot stopped: the publisher is stopping"[..]),
                        objects: None,
                    });
                }
            }
        }
    }

    /// Lets go of the batches every requester has sent; whether any went.
    fn let_go(&mut self) -> bool {
        let slowest = self.readers.iter().map(|r| r.next).min().unwrap_or(0);
        let mut went = false;
        while self.first < slowest {
            let Some(batch) = self.batches.pop_front() else {
                break;
            };
            self.kept_bytes -= batch.len() as u64;
            self.first += 1;
            went = true;
        }
        went
    }

    /// Sends reader `i` what it can take; false once it is done or given up.
    fn send(
        &mut self,
        i: usize,
        socket: &mut zmq::Socket,
        counters: &Arc<PeerCounters>,
        listeners: &Listeners,
    ) -> bool {
        let reader = &mut self.readers[i];
        loop {
            let (head, body): (&[u8], &Arc<[u8]>) = match self.batches.get(reader.next - self.first)
            {
                Some(batch) => (verb::SNAPSHOT, batch),
                None => match &self.ending {
                    Some(ending) => (ending.verb, &ending.body),
                    None => return true,
                },
            };
            match reader
                .requester
                .send(socket, counters, &[head], body, false)
            {
                Reply::Yes if reader.next - self.first < self.batches.len() => reader.next += 1,
                Reply::Yes => {
                    if let Some(objects) = self.ending.as_ref().and_then(|e| e.objects) {
                        counters.snapshots_served.fetch_add(1, Relaxed);
                        counters.snapshot_objects.fetch_add(objects, Relaxed);
                    }
                    return false;
                }
                Reply::Wait => return true,
                Reply::Behind => {
                    if !reader.requester.stalled(listeners) {
                        return true;
                    }
                    abandoned(counters, "its requester read nothing for 5 s");
                    return false;
                }
                Reply::Gone => {
                    abandoned(counters, "its requester left");
                    return false;
                }
            }
        }
    }

    /// When the kept batches are full and the slowest requester has taken nothing for
    /// [`LAGGARD_GRACE`], gives it up so that the others go on.
    fn give_up_a_laggard(&mut self, counters: &PeerCounters, listeners: &Listeners) {
        if self.ending.is_some() || self.kept_bytes < self.retain || self.readers.len() < 2 {
            return;
        }
        let Some((i, _)) = self.readers.iter().enumerate().min_by_key(|(_, r)| r.next) else {
            return;
        };
        if self.readers[i].requester.behind_for() < LAGGARD_GRACE {
            return;
        }
        let laggard = self.readers.swap_remove(i);
        laggard.requester.cut(listeners);
        abandoned(counters, "its requester fell behind the others");
    }
}

fn abandoned(counters: &PeerCounters, why: &str) {
    counters.snapshots_abandoned.fetch_add(1, Relaxed);
    log(
        Level::Warn,
        &format!("gave up a snapshot for one requester: {why}"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    /// A requester on a DEALER of its own, connected to `router`'s inproc endpoint, with
    /// its routing id.
    fn dealer(context: &zmq::Context, endpoint: &str, id: &[u8]) -> zmq::Socket {
        let socket = context.socket(zmq::DEALER).unwrap();
        socket.set_identity(id).unwrap();
        socket.set_rcvtimeo(5000).unwrap();
        socket.connect(endpoint).unwrap();
        socket
    }

    #[test]
    fn one_enumeration_reaches_every_requester_and_latecomers_wait_for_the_next() {
        let context = zmq::Context::new();
        let mut router = context.socket(zmq::ROUTER).unwrap();
        router.set_router_mandatory(true).unwrap();
        router.bind("inproc://fanout").unwrap();
        let peers: Vec<zmq::Socket> = [b"a", b"b", b"c", b"d"]
            .iter()
            .map(|id| dealer(&context, "inproc://fanout", *id))
            .collect();
        // The ROUTER learns a peer's routing id from its first message.
        for peer in &peers {
            peer.send("hello", 0).unwrap();
            router.recv_multipart(0).unwrap();
        }
        let (out, pieces) = sync_channel(16);
        let thread = std::thread::spawn(|| {});
        // Keeps two batches of 3 bytes at most.
        let a = Requester::new(b"a".to_vec(), None);
        let mut fanout = Fanout::new(None, pieces, thread, vec![a], 6);
        fanout.join(Requester::new(b"b".to_vec(), None));
        let counters = Arc::new(PeerCounters::default());
        let listeners = Listeners::default();
        out.send(Piece::Batch(Arc::from(&b"one"[..]))).unwrap();
        let Turn::Ongoing(mut fanout) = fanout.turn(&mut router, &counters, &listeners) else {
            panic!("the snapshot goes on");
        };
        // Its first batch is still kept: c joins and gets it too.
        fanout.join(Requester::new(b"c".to_vec(), None));
        for batch in [&b"two"[..], b"six", b"ten"] {
            out.send(Piece::Batch(Arc::from(batch))).unwrap();
        }
        let mut turn = |fanout: Fanout| match fanout.turn(&mut router, &counters, &listeners) {
            Turn::Ongoing(fanout) => fanout,
            Turn::Over(..) => panic!("the snapshot goes on"),
        };
        // Two batches kept: "six" waits until every requester has "one" and "two".
        let fanout = turn(fanout);
        let mut fanout = turn(fanout);
        // "one" was let go to make room: d comes too late for this snapshot.
        fanout.join(Requester::new(b"d".to_vec(), None));
        assert_eq!(fanout.requesters(), 4);
        out.send(Piece::End(Arc::from(&b"end"[..]), 3)).unwrap();
        let Turn::Over(_, scope, waiting) = fanout.turn(&mut router, &counters, &listeners) else {
            panic!("every requester got its end");
        };
        assert_eq!(scope, None);
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].peer, b"d");
        for peer in &peers[..3] {
            for body in [&b"one"[..], b"two", b"six", b"ten"] {
                assert_eq!(
                    peer.recv_multipart(0).unwrap(),
                    [&b""[..], b"snapshot", body]
                );
            }
            assert_eq!(
                peer.recv_multipart(0).unwrap(),
                [&b""[..], b"snapshot-end", b"end"]
            );
        }
        assert_eq!(peers[3].poll(zmq::POLLIN, 100).unwrap(), 0);
        assert_eq!(counters.snapshots_served.load(Relaxed), 3);
        assert_eq!(counters.snapshot_objects.load(Relaxed), 9);
    }
}
