//! A requester of the replay socket: where its replies go, what they hold of the master's
//! memory, and when it has stopped reading.
//!
//! A reply's payload is never copied: the message handed to libzmq points at bytes the ring
//! (or a snapshot) already holds, and keeps them alive until libzmq lets go of it, which it
//! does once it has written them to the connection, or when the requester is gone. Each such
//! loan counts against its requester's [`WINDOW`] and, for replays, against [`TOTAL`] for
//! every requester together (a snapshot's batches are shared by its requesters and bounded
//! where they are kept, `fanout`); libzmq gives it back itself, on its I/O thread, through
//! [`give_back`]. So replays hold at most `TOTAL` bytes beyond the ring, however many
//! requesters there are and however slowly they read. A requester whose window or queue stays
//! full for [`STALLED_FOR`] is not reading: it is given up and its connection cut, since only
//! closing the connection makes libzmq let go of what it holds for it.

use crate::stats::PeerCounters;
use crate::transport::connections::Listeners;
use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes one requester's replies may hold before it reads some: a few hundred messages,
/// more than a reading requester's connection has in flight.
pub(crate) const WINDOW: u64 = 2 << 20;
/// Bytes the replays of every requester together may hold.
pub(crate) const TOTAL: u64 = 16 << 20;
/// A requester whose window or queue stays full this long is given up.
pub(crate) const STALLED_FOR: Duration = Duration::from_secs(5);

/// A requester: its routing id, the connection it asked on (when libzmq said), what its
/// replies hold, and since when it has taken nothing.
#[derive(Debug)]
pub(crate) struct Requester {
    pub(crate) peer: Vec<u8>,
    fd: Option<RawFd>,
    window: Arc<Window>,
    stalled_since: Option<Instant>,
}

/// What became of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Yes,
    /// Not sent: the requester has not taken what it was sent (its window or queue is full).
    Behind,
    /// Not sent: the replays of every requester together hold their total; wait.
    Wait,
    /// Not sent: the requester is gone.
    Gone,
}

impl Requester {
    pub(crate) fn new(peer: Vec<u8>, fd: Option<RawFd>) -> Requester {
        Requester {
            peer,
            fd,
            window: Arc::default(),
            stalled_since: None,
        }
    }

    /// Sends `[peer, "", head..., payload]`, the payload lent to libzmq, never copied;
    /// counted against the replays' total when `counted`.
    pub(crate) fn send(
        &mut self,
        socket: &mut zmq::Socket,
        counters: &Arc<PeerCounters>,
        head: &[&[u8]],
        payload: &Arc<[u8]>,
        counted: bool,
    ) -> Reply {
        match self.window.room(payload.len(), counters, counted) {
            Room::Yes => {}
            Room::RequesterFull => return Reply::Behind,
            Room::AllFull => return Reply::Wait,
        }
        let more = zmq::DONTWAIT | zmq::SNDMORE;
        match socket.send(&self.peer[..], more) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) => return Reply::Behind,
            Err(_) => return Reply::Gone,
        }
        // Once ROUTER took the routing frame, it takes the rest of the message.
        for frame in [&b""[..]].iter().chain(head) {
            if socket.send(*frame, more).is_err() {
                return Reply::Gone;
            }
        }
        match send(socket, Arc::clone(payload), self, counters, counted) {
            Ok(()) => {
                self.stalled_since = None;
                Reply::Yes
            }
            Err(_) => Reply::Gone,
        }
    }

    /// Whether the requester, found [`Reply::Behind`], has been so for [`STALLED_FOR`]: then
    /// its connection is cut, and it is to be given up.
    pub(crate) fn stalled(&mut self, listeners: &Listeners) -> bool {
        if self.behind_for() < STALLED_FOR {
            return false;
        }
        self.cut(listeners);
        true
    }

    /// How long the requester has taken nothing, counting from the first time this is asked
    /// since it last took something.
    pub(crate) fn behind_for(&mut self) -> Duration {
        self.stalled_since
            .get_or_insert_with(Instant::now)
            .elapsed()
    }

    /// Cuts the requester's connection off: libzmq then lets go of what it held for it.
    pub(crate) fn cut(&self, listeners: &Listeners) {
        if let Some(fd) = self.fd {
            listeners.cut(fd);
        }
    }
}

/// The bytes lent to libzmq for one requester and not yet given back.
#[derive(Debug, Default)]
struct Window(AtomicU64);

/// Whether a reply of some bytes may be lent now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Room {
    Yes,
    /// The requester's own window is full: it has not read what it was sent.
    RequesterFull,
    /// Every requester together holds [`TOTAL`]: wait for the others, this one is not late.
    AllFull,
}

impl Window {
    /// Bytes lent for this requester now.
    fn lent(&self) -> u64 {
        self.0.load(Relaxed)
    }

    /// Whether `len` more bytes may be lent, counted against the total when `counted`. A
    /// window holding nothing takes any one reply, so that a payload larger than the window
    /// still goes out.
    pub(crate) fn room(&self, len: usize, counters: &PeerCounters, counted: bool) -> Room {
        let mine = self.lent();
        if mine > 0 && mine + len as u64 > WINDOW {
            return Room::RequesterFull;
        }
        if !counted {
            return Room::Yes;
        }
        let all = counters.replay_bytes_in_flight.load(Relaxed);
        if all > 0 && all + len as u64 > TOTAL {
            return Room::AllFull;
        }
        Room::Yes
    }
}

/// A payload lent to libzmq: its bytes stay alive, and counted, until libzmq gives it back.
struct Loan {
    payload: Arc<[u8]>,
    window: Arc<Window>,
    /// Counted against the replays' total, which it is to leave.
    total: Option<Arc<PeerCounters>>,
}

impl Drop for Loan {
    fn drop(&mut self) {
        let len = self.payload.len() as u64;
        self.window.0.fetch_sub(len, Relaxed);
        if let Some(counters) = &self.total {
            counters.replay_bytes_in_flight.fetch_sub(len, Relaxed);
        }
    }
}

/// libzmq's free function for a lent payload: called once, when libzmq is done with it.
///
/// # Safety
/// `hint` must be the pointer [`send`] made with `Box::into_raw` for this message.
unsafe extern "C" fn give_back(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: libzmq calls the free function exactly once per message, with the hint `send`
    // gave it, a `Box<Loan>` leaked for this message alone.
    drop(unsafe { Box::from_raw(hint.cast::<Loan>()) });
}

/// Sends `payload` as the last frame of a message on `socket` without copying it, counted
/// against the requester's window (and the total when `counted`) until libzmq gives it back.
fn send(
    socket: &mut zmq::Socket,
    payload: Arc<[u8]>,
    requester: &Requester,
    counters: &Arc<PeerCounters>,
    counted: bool,
) -> Result<(), zmq::Error> {
    let len = payload.len() as u64;
    requester.window.0.fetch_add(len, Relaxed);
    if counted {
        counters.replay_bytes_in_flight.fetch_add(len, Relaxed);
    }
    let len = len as usize;
    let data = payload.as_ptr().cast_mut().cast::<c_void>();
    let loan = Box::into_raw(Box::new(Loan {
        payload,
        window: Arc::clone(&requester.window),
        total: counted.then(|| Arc::clone(counters)),
    }));
    let mut message = zmq_sys::zmq_msg_t::default();
    // SAFETY: `data` points at `len` bytes owned by the Arc inside `*loan`, which stays alive
    // until `give_back` drops it; libzmq only reads them. `message` is a fresh zmq_msg_t.
    let rc = unsafe {
        zmq_sys::zmq_msg_init_data(&mut message, data, len, Some(give_back), loan.cast())
    };
    if rc != 0 {
        // libzmq took nothing: the loan is still ours to give back.
        // SAFETY: `loan` came from Box::into_raw above and libzmq did not keep it.
        drop(unsafe { Box::from_raw(loan) });
        return Err(last_error());
    }
    // SAFETY: `message` was initialised above; the socket pointer is valid while `socket` is
    // borrowed, and only this thread uses the socket.
    let rc = unsafe { zmq_sys::zmq_msg_send(&mut message, socket.as_mut_ptr(), zmq::DONTWAIT) };
    if rc < 0 {
        let error = last_error();
        // A message that was not sent is still ours: closing it calls `give_back`.
        // SAFETY: `message` is initialised and was not sent.
        unsafe { zmq_sys::zmq_msg_close(&mut message) };
        return Err(error);
    }
    Ok(())
}

/// Receives one request without waiting: its frames, and the descriptor of the connection it
/// came on when libzmq knows it, so that a requester given up can be cut off (only closing
/// its connection makes libzmq let go of what it holds for it).
pub(crate) fn recv_request(
    socket: &zmq::Socket,
) -> Result<(Vec<Vec<u8>>, Option<RawFd>), zmq::Error> {
    let mut message = zmq::Message::new();
    let (mut frames, mut fd) = (Vec::new(), None);
    loop {
        let flags = if frames.is_empty() { zmq::DONTWAIT } else { 0 };
        socket.recv(&mut message, flags)?;
        frames.push(message.to_vec());
        // The routing id is made by the ROUTER socket; the frames from the wire carry this.
        if let Some(source) = message.gets("__fd").and_then(|fd| fd.parse().ok()) {
            fd = Some(source);
        }
        if !message.get_more() {
            return Ok((frames, fd));
        }
    }
}

fn last_error() -> zmq::Error {
    // SAFETY: zmq_errno only reads this thread's errno.
    zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_counted_until_the_receiver_has_it_and_the_window_bounds_a_requester() {
        let context = zmq::Context::new();
        let mut push = context.socket(zmq::PAIR).unwrap();
        let pull = context.socket(zmq::PAIR).unwrap();
        push.bind("inproc://window").unwrap();
        pull.connect("inproc://window").unwrap();
        let counters = Arc::new(PeerCounters::default());
        let requester = Requester::new(Vec::new(), None);
        let window = &requester.window;
        let payload: Arc<[u8]> = Arc::from(vec![7u8; 1 << 20]);
        assert_eq!(window.room(payload.len(), &counters, true), Room::Yes);
        send(&mut push, Arc::clone(&payload), &requester, &counters, true).unwrap();
        assert_eq!(window.lent(), 1 << 20);
        assert_eq!(counters.replay_bytes_in_flight.load(Relaxed), 1 << 20);
        // A second MiB fits the window of 2, uncounted in the total; a third does not.
        assert_eq!(window.room(1 << 20, &counters, false), Room::Yes);
        send(
            &mut push,
            Arc::clone(&payload),
            &requester,
            &counters,
            false,
        )
        .unwrap();
        assert_eq!(window.room(1, &counters, false), Room::RequesterFull);
        assert_eq!(counters.replay_bytes_in_flight.load(Relaxed), 1 << 20);
        // The bytes were shared, not copied: three owners of one allocation.
        assert_eq!(Arc::strong_count(&payload), 3);
        for _ in 0..2 {
            let got = pull.recv_bytes(0).unwrap();
            assert_eq!(got.len(), 1 << 20);
        }
        assert_eq!(window.lent(), 0);
        assert_eq!(counters.replay_bytes_in_flight.load(Relaxed), 0);
        assert_eq!(Arc::strong_count(&payload), 1);
    }

    #[test]
    fn the_total_holds_back_a_requester_that_is_not_late() {
        let counters = PeerCounters::default();
        counters.replay_bytes_in_flight.store(TOTAL, Relaxed);
        let idle = Window::default();
        assert_eq!(idle.room(1, &counters, true), Room::AllFull);
        // A snapshot's shared batches are bounded where they are kept, not by the total.
        assert_eq!(idle.room(1, &counters, false), Room::Yes);
        counters.replay_bytes_in_flight.store(0, Relaxed);
        // An empty window takes one reply of any size.
        assert_eq!(idle.room(3 * WINDOW as usize, &counters, true), Room::Yes);
    }
}
