//! Who holds a connection to the publisher's sockets, and how many.
//!
//! libzmq accepts every connection its listeners see and gives its user no say, and the
//! descriptors it spends are the whole master's. So the thread `kv-events-zap` learns of each
//! accepted connection from the sockets' monitors, keeps this table, and cuts at once a
//! connection over the bounds (in all, and per peer address): it shuts the connection down
//! and libzmq closes it as if the peer had left. libzmq's own handshake timeout closes peers
//! that connect and never finish their handshake.
//!
//! When the process has no descriptor left, libzmq's accept fails while the connection stays
//! queued, and its I/O thread retries at once, forever: a core at 100 %. The table keeps one
//! descriptor in reserve for that moment: it gives it up, takes the queued connections off
//! the listeners itself and closes them, then takes the reserve again.

use crate::config::access::{canonical, Limits};
use std::collections::HashMap;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A socket's address as getsockname or getpeername give it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Name {
    Inet(SocketAddr),
    Unix(Vec<u8>),
}

impl Name {
    /// The local address of `fd` (`peer` false) or its peer's.
    fn of(fd: RawFd, peer: bool) -> Option<Name> {
        // SAFETY: an all-zero sockaddr_storage is a valid value of that plain C struct.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let address = (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
        // SAFETY: the call writes at most `len` bytes into `storage`, which has that size.
        let rc = unsafe {
            if peer {
                libc::getpeername(fd, address, &mut len)
            } else {
                libc::getsockname(fd, address, &mut len)
            }
        };
        if rc != 0 {
            return None;
        }
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let a = unsafe { &*(address as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Some(Name::Inet(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(a.sin_port),
                ))))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let a = unsafe { &*(address as *const libc::sockaddr_in6) };
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(Name::Inet(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                ))))
            }
            libc::AF_UNIX => {
                // SAFETY: the family says the storage holds a sockaddr_un.
                let a = unsafe { &*(address as *const libc::sockaddr_un) };
                let path_len = (len as usize).saturating_sub(size_of::<libc::sa_family_t>());
                let path = a.sun_path[..path_len.min(a.sun_path.len())]
                    .iter()
                    .map(|&c| c as u8)
                    .collect();
                Some(Name::Unix(path))
            }
            _ => None,
        }
    }

    /// Whether a connection whose local address is `self` was accepted by a listener bound
    /// to `listener` (a wildcard listener accepts on any address of its port).
    fn accepted_by(&self, listener: &Name) -> bool {
        match (self, listener) {
            (Name::Inet(local), Name::Inet(bound)) => {
                local.port() == bound.port()
                    && (bound.ip().is_unspecified()
                        || canonical(local.ip()) == canonical(bound.ip()))
            }
            (Name::Unix(local), Name::Unix(bound)) => local == bound,
            _ => false,
        }
    }
}

/// The listeners of the publisher's sockets, for cutting connections safely from any thread.
#[derive(Debug, Default)]
pub(crate) struct Listeners(Mutex<Vec<(RawFd, Name)>>);

impl Listeners {
    /// A socket is listening on descriptor `fd` (the monitor's LISTENING event).
    fn add(&self, fd: RawFd) {
        if let Some(name) = Name::of(fd, false) {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((fd, name));
        }
    }

    /// Shuts down the connection libzmq holds on descriptor `fd`, so that libzmq closes it;
    /// false when `fd` is no longer one of the listeners' connections.
    ///
    /// The descriptor number comes from an event that may be stale: libzmq may have closed
    /// it since, and the master may have opened something else under the same number. So
    /// the connection is first duplicated (the duplicate names the same connection whatever
    /// happens to the number), and shut down only if its local address is a listener's.
    pub(crate) fn cut(&self, fd: RawFd) -> bool {
        // SAFETY: F_DUPFD_CLOEXEC only creates a new descriptor; a stale `fd` makes it fail
        // or duplicate some other open file, which the check below then leaves alone.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return self.cut_without_a_descriptor(fd);
        }
        // SAFETY: `dup` was just created and is owned here alone.
        let dup = unsafe { OwnedFd::from_raw_fd(dup) };
        let Some(local) = Name::of(dup.as_raw_fd(), false) else {
            return false;
        };
        let ours = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|(_, listener)| local.accepted_by(listener));
        // SAFETY: shutdown on a descriptor this function owns; libzmq's own descriptor for
        // the same connection then reads end-of-file and closes.
        ours && unsafe { libc::shutdown(dup.as_raw_fd(), libc::SHUT_RDWR) } == 0
    }

    /// [`Listeners::cut`] when the process has no descriptor left for the duplicate: the
    /// connection is shut down under its own number, if its local address is a listener's.
    /// Only a connection one of the listeners accepted has that address, so nothing of the
    /// master's can be cut; the number could only be reused between the check and the
    /// shutdown, two system calls apart, and then by another of the publisher's connections.
    fn cut_without_a_descriptor(&self, fd: RawFd) -> bool {
        let errno = std::io::Error::last_os_error().raw_os_error();
        if !matches!(errno, Some(libc::EMFILE | libc::ENFILE)) {
            return false;
        }
        let ours = Name::of(fd, false).is_some_and(|local| {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .any(|(_, listener)| local.accepted_by(listener))
        });
        // SAFETY: shutdown of a connection one of the listeners accepted (checked above);
        // libzmq then reads end-of-file on it and closes it.
        ours && unsafe { libc::shutdown(fd, libc::SHUT_RDWR) } == 0
    }

    /// Whether a connection waits on a listener.
    fn any_queued(&self) -> bool {
        let listeners = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        listeners.iter().any(|(fd, _)| readable(*fd))
    }

    /// Takes the connections queued on every listener and closes them, until none is left
    /// or no descriptor is; how many. For when the process has no descriptor to give
    /// libzmq's accept.
    fn refuse_queued(&self) -> usize {
        let listeners = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut refused = 0;
        for (fd, name) in listeners.iter() {
            // The number is libzmq's until the socket closes; make sure it is still the
            // listener before taking anything from it.
            if Name::of(*fd, false).as_ref() != Some(name) {
                continue;
            }
            // libzmq's I/O thread accepts on the same listener and may take a connection seen
            // waiting here before this accept runs; a blocking accept would then wait for the
            // next connection and hold up the publisher's shutdown (seen: a test's child that
            // never exited). Non-blocking, it says EAGAIN, which libzmq's own accept handles.
            set_nonblocking(*fd);
            while refused < 4096 && readable(*fd) {
                // SAFETY: accept4 on a listening socket, with no address wanted back.
                let taken = unsafe {
                    libc::accept4(
                        *fd,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    )
                };
                if taken < 0 {
                    break;
                }
                // SAFETY: `taken` was just accepted and is owned here alone.
                drop(unsafe { OwnedFd::from_raw_fd(taken) });
                refused += 1;
            }
        }
        refused
    }
}

/// One accepted connection.
#[derive(Debug)]
struct Open {
    peer: Peer,
    /// An instant before libzmq accepted it, hence before its handshake timer started.
    since: Instant,
    /// Cut by the bounds: its end is already counted.
    cut: bool,
}

/// Who is at the other end of a connection, as far as the table could see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    At(IpAddr),
    /// An ipc peer: it has no address.
    Local,
    /// The connection was closed before the table looked at it (a peer that failed its
    /// handshake at once can be gone by then), so its address is unknown.
    Gone,
}

impl Peer {
    fn address(self) -> Option<IpAddr> {
        match self {
            Peer::At(address) => Some(address),
            Peer::Local | Peer::Gone => None,
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::At(address) => address.fmt(f),
            Peer::Local => f.write_str("a local (ipc) peer"),
            Peer::Gone => f.write_str("a peer that left before its address was read"),
        }
    }
}

/// How one connection ended, as far as the table can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Cut at once by the bounds (already counted).
    Cut,
    /// Open at least the handshake timeout: libzmq's timer closed it.
    AfterTimeout,
    /// Anything else: the peer left, or a handshake failed for a reason said elsewhere.
    Other,
}

/// A connection as its socket's monitor names it: the socket's place among the watched ones,
/// and the descriptor. Two sockets' monitors are read in turn, so one socket's accept may be
/// read before the other's disconnection of the same, reused, number.
type Id = (usize, RawFd);

/// The connections the publisher's sockets hold, kept by the thread `kv-events-zap`.
#[derive(Debug)]
pub(crate) struct Connections {
    limits: Limits,
    open: HashMap<Id, Open>,
    per_address: HashMap<IpAddr, u32>,
    /// Spent when the process has no descriptor left; see the module's doc.
    reserve: Vec<OwnedFd>,
    /// When libzmq last failed to accept for want of a descriptor.
    exhausted_at: Option<Instant>,
}

/// How long after libzmq failed to accept for want of a descriptor every connection it
/// accepts is cut: those took a descriptor the reserve gave up for draining the listeners.
const EXHAUSTION_LASTS: Duration = Duration::from_secs(1);

/// Descriptors kept in reserve for taking queued connections when the process has none.
const RESERVE: usize = 4;

/// How much earlier than the handshake timeout libzmq's timer may close a connection: it
/// counts in whole milliseconds of a clock it reads only now and then.
const TIMER_SLACK: Duration = Duration::from_millis(10);

/// A connection was refused: why, in words for the log.
pub(crate) type Refusal = String;

impl Connections {
    pub(crate) fn new(limits: Limits) -> Connections {
        let mut connections = Connections {
            limits,
            open: HashMap::new(),
            per_address: HashMap::new(),
            reserve: Vec::new(),
            exhausted_at: None,
        };
        connections.keep_reserve();
        connections
    }

    /// How many connections are open now.
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }

    /// A listener of the publisher's sockets is bound on `fd`.
    pub(crate) fn listening(&self, listeners: &Listeners, fd: RawFd) {
        listeners.add(fd);
    }

    /// libzmq accepted a connection on `fd` of socket `socket`, after the instant `since`:
    /// recorded, and cut at once when it is over a bound.
    pub(crate) fn accepted(
        &mut self,
        listeners: &Listeners,
        socket: usize,
        fd: RawFd,
        since: Instant,
    ) -> Option<Refusal> {
        let peer = match Name::of(fd, true) {
            Some(Name::Inet(at)) => Peer::At(canonical(at.ip())),
            Some(Name::Unix(_)) => Peer::Local,
            None => Peer::Gone,
        };
        let address = peer.address();
        // A number reused before its disconnection was seen: the older connection is gone.
        self.forget((socket, fd));
        let from_address = address.map_or(0, |a| self.per_address.get(&a).copied().unwrap_or(0));
        let exhausted = self
            .exhausted_at
            .is_some_and(|at| at.elapsed() < EXHAUSTION_LASTS);
        let refusal = if exhausted {
            Some("the process has no descriptor to spare".to_owned())
        } else if self.open.len() >= self.limits.total as usize {
            Some(format!(
                "the publisher holds {} connections, kv_events_max_connections",
                self.limits.total
            ))
        } else if from_address >= self.limits.per_address {
            Some(format!(
                "{} holds {from_address} connections, kv_events_max_connections_per_address",
                address.map_or_else(String::new, |a| a.to_string())
            ))
        } else {
            None
        };
        let cut = refusal.is_some() && listeners.cut(fd);
        if let Some(address) = address {
            *self.per_address.entry(address).or_default() += 1;
        }
        self.open.insert((socket, fd), Open { peer, since, cut });
        refusal.filter(|_| cut)
    }

    /// libzmq closed the connection on `fd` of socket `socket`: how it ended, and who the
    /// peer was.
    ///
    /// Its age is measured from before libzmq accepted it to now, after libzmq closed it: never
    /// less than it was, so that no connection libzmq's timer closed is taken for one whose
    /// peer left. A peer that leaves by itself just before the timeout (closer to it than the
    /// thread lagged behind the monitor when it read the accept) is counted as timed out,
    /// which it would have been a moment later.
    pub(crate) fn disconnected(&mut self, socket: usize, fd: RawFd) -> (Ended, Peer) {
        let open = self.forget((socket, fd));
        let ended = match &open {
            Some(open) if open.cut => Ended::Cut,
            Some(open) if open.since.elapsed() + TIMER_SLACK >= self.limits.handshake_timeout => {
                Ended::AfterTimeout
            }
            _ => Ended::Other,
        };
        (ended, open.map_or(Peer::Gone, |o| o.peer))
    }

    fn forget(&mut self, id: Id) -> Option<Open> {
        let open = self.open.remove(&id)?;
        if let Some(address) = open.peer.address() {
            if let Some(n) = self.per_address.get_mut(&address) {
                *n -= 1;
                if *n == 0 {
                    self.per_address.remove(&address);
                }
            }
        }
        Some(open)
    }

    /// libzmq could not accept for want of descriptors: gives up the reserve, one
    /// descriptor at a time, to take the queued connections off the listeners and close
    /// them; how many. libzmq's I/O thread, which retries its accept meanwhile, may take a
    /// freed descriptor first: hence more than one in reserve.
    pub(crate) fn out_of_descriptors(&mut self, listeners: &Listeners) -> usize {
        // libzmq's retries may have won some of the descriptors given up: the connections
        // it accepts meanwhile are cut as soon as they are seen.
        self.exhausted_at = Some(Instant::now());
        let mut refused = 0;
        while listeners.any_queued() {
            let Some(spare) = self.reserve.pop() else {
                break;
            };
            drop(spare);
            refused += listeners.refuse_queued();
        }
        self.keep_reserve();
        refused
    }

    /// Takes the reserve again, as far as the process has descriptors for it.
    pub(crate) fn keep_reserve(&mut self) {
        while self.reserve.len() < RESERVE {
            match open_reserve() {
                Some(fd) => self.reserve.push(fd),
                None => break,
            }
        }
    }
}

/// Whether `fd` has something to read (for a listener: a queued connection), without
/// waiting: libzmq's listeners are non-blocking, but the library does not rely on it.
fn readable(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one pollfd it is given, and does not wait.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready == 1 && poll.revents & libc::POLLIN != 0
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl reads and sets the file status flags of a descriptor; nothing else.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 && flags & libc::O_NONBLOCK == 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

fn open_reserve() -> Option<OwnedFd> {
    std::fs::File::open("/dev/null").ok().map(OwnedFd::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn refusing_queued_connections_never_blocks_on_the_listener() {
        // A blocking listener, as libzmq's may be: the connection it holds is taken and
        // closed, and the listener is left non-blocking, so that an accept that loses a race
        // with libzmq's own returns at once instead of waiting for the next connection.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let listeners = Listeners::default();
        listeners.add(listener.as_raw_fd());
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        while !readable(listener.as_raw_fd()) {
            std::thread::yield_now();
        }
        assert_eq!(listeners.refuse_queued(), 1);
        assert_eq!(listeners.refuse_queued(), 0);
        // SAFETY: reads the file status flags of a descriptor this test owns.
        let flags = unsafe { libc::fcntl(listener.as_raw_fd(), libc::F_GETFL) };
        assert_ne!(flags & libc::O_NONBLOCK, 0);
        assert_eq!(
            listener.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }

    #[test]
    fn a_cut_shuts_down_a_listeners_connection_and_nothing_else() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let listeners = Listeners::default();
        listeners.add(listener.as_raw_fd());
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // A connection of another listener is not ours to cut.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let _stranger = TcpStream::connect(other.local_addr().unwrap()).unwrap();
        let (foreign, _) = other.accept().unwrap();
        assert!(!listeners.cut(foreign.as_raw_fd()));
        assert!(listeners.cut(accepted.as_raw_fd()));
        let mut buf = [0u8; 1];
        use std::io::Read as _;
        assert_eq!(
            (&client).read(&mut buf).unwrap(),
            0,
            "the peer sees the end"
        );
        // A number that names nothing is refused, not a crash.
        assert!(!listeners.cut(1 << 20));
    }

    #[test]
    fn bounds_refuse_past_the_total_and_per_address() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let listeners = Listeners::default();
        listeners.add(listener.as_raw_fd());
        let mut table = Connections::new(Limits {
            total: 3,
            per_address: 2,
            handshake_timeout: Duration::from_secs(3),
        });
        let mut kept = Vec::new();
        let mut refusals = Vec::new();
        for _ in 0..3 {
            let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (accepted, _) = listener.accept().unwrap();
            refusals.push(table.accepted(&listeners, 0, accepted.as_raw_fd(), Instant::now()));
            kept.push((client, accepted));
        }
        assert!(refusals[0].is_none() && refusals[1].is_none());
        let why = refusals[2].as_deref().unwrap();
        assert!(
            why.contains("kv_events_max_connections_per_address"),
            "{why}"
        );
        assert_eq!(table.len(), 3);
        assert_eq!(table.disconnected(0, kept[2].1.as_raw_fd()).0, Ended::Cut);
        assert_eq!(table.disconnected(0, kept[0].1.as_raw_fd()).0, Ended::Other);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn a_connection_is_as_old_as_the_instant_before_its_accept_and_known_per_socket() {
        let listeners = Listeners::default();
        let mut table = Connections::new(Limits::new(16, 16, 3000));
        let timeout = Duration::from_millis(3000);
        let now = Instant::now();
        // Read late: the accept was sent 3 s before the thread took it, and its timer has
        // fired since.
        assert_eq!(table.accepted(&listeners, 0, 7, now - timeout), None);
        // The same number on the other socket is another connection.
        assert_eq!(table.accepted(&listeners, 1, 7, now), None);
        assert_eq!(table.len(), 2);
        assert_eq!(table.disconnected(0, 7).0, Ended::AfterTimeout);
        assert_eq!(table.disconnected(1, 7).0, Ended::Other);
        assert_eq!(table.disconnected(1, 7), (Ended::Other, Peer::Gone));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn queued_connections_are_taken_and_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let listeners = Listeners::default();
        listeners.add(listener.as_raw_fd());
        let clients: Vec<_> = (0..3)
            .map(|_| TcpStream::connect(listener.local_addr().unwrap()).unwrap())
            .collect();
        let mut table = Connections::new(Limits::new(16, 16, 3000));
        assert_eq!(table.out_of_descriptors(&listeners), 3);
        assert_eq!(table.reserve.len(), RESERVE);
        drop(clients);
    }
}
