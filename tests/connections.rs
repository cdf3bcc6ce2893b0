//! Every connection the publisher closes is counted once, under one reason, however many it
//! closes at once: bursts of idle TCP connections, more than the bounds admit, each either
//! cut at once (`connections_refused`) or closed at the handshake timeout
//! (`handshake_timeouts`). Real sockets on loopback; every wait has a deadline.

use kv_events_testing::{config, tcp_endpoint};
use mooncake_kv_events::{Config, Publisher, Stats};
use std::io::Read as _;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::FromRawFd as _;
use std::time::{Duration, Instant};

/// Loopback addresses a burst comes from, one after the other.
const ADDRESSES: u8 = 10;
/// Idle connections from each address: three times what one address may hold.
const PER_ADDRESS: u64 = 30;
/// Connections one address may hold; the others it opens are cut.
const ADDRESS_BOUND: u32 = 10;
/// Idle connections per burst, three times what the publisher holds at once.
const BURST: u64 = ADDRESSES as u64 * PER_ADDRESS;
/// Connections the publisher holds at once.
const MAX_CONNECTIONS: u32 = 100;
/// Short, so that a burst ends quickly, yet long beside what the table needs to record a
/// connection on a busy machine.
const HANDSHAKE_TIMEOUT_MS: u32 = 1000;
/// How long a burst may take to be closed and counted, on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// A TCP connection from `from` to `to`, both on loopback.
fn connect_from(from: Ipv4Addr, to: SocketAddrV4) -> TcpStream {
    let sockaddr = |a: SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream as soon as it exists; bind and connect read
    // `len` bytes of sockaddr_in structs that live through each call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let stream = TcpStream::from_raw_fd(fd);
        let local = sockaddr(SocketAddrV4::new(from, 0));
        let rc = libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len);
        assert_eq!(rc, 0, "bind {from}: {}", std::io::Error::last_os_error());
        let remote = sockaddr(to);
        let rc = libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len);
        assert_eq!(rc, 0, "connect {to}: {}", std::io::Error::last_os_error());
        stream
    }
}

/// The two ways the publisher closes a peer that never speaks.
fn closed(stats: &Stats) -> u64 {
    stats.connections_refused + stats.handshake_timeouts
}

/// Waits until `done` holds for the publisher's stats, or the deadline passes; the stats then.
fn wait_for(publisher: &Publisher, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let stats = publisher.stats();
        if done(&stats) || Instant::now() >= deadline {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the publisher ended `peer`'s connection: end of file or a reset, read within the
/// deadline.
fn ended_by_the_publisher(peer: &mut TcpStream) -> bool {
    peer.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match peer.read(&mut buf) {
            // The publisher's greeting may come first.
            Ok(n) if n > 0 => continue,
            Ok(_) => return true,
            Err(e) => {
                return matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                )
            }
        }
    }
}

#[test]
fn every_idle_connection_of_a_burst_is_counted_once_refused_or_timed_out() {
    let endpoint = tcp_endpoint();
    let publisher = Publisher::create(&Config {
        handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS,
        max_connections: MAX_CONNECTIONS,
        max_connections_per_address: ADDRESS_BOUND,
        ..config(&endpoint)
    })
    .expect("the publisher binds");
    let to: SocketAddrV4 = endpoint.trim_start_matches("tcp://").parse().unwrap();
    for burst in 1..=3 {
        // Address after address: the connections each may hold come after those of the
        // addresses before it that were cut, so the publisher learns of them late, while it
        // is cutting the others.
        let mut peers: Vec<TcpStream> = (0..ADDRESSES)
            .flat_map(|a| (0..PER_ADDRESS).map(move |_| Ipv4Addr::new(127, 0, 0, 2 + a)))
            .map(|from| connect_from(from, to))
            .collect();
        // Each of the burst is closed by the publisher, and counted, within the deadline.
        let stats = wait_for(&publisher, |s| closed(s) >= burst * BURST);
        assert_eq!(
            closed(&stats),
            burst * BURST,
            "burst {burst}: {} refused + {} timed out, for {} connections closed: {}",
            stats.connections_refused,
            stats.handshake_timeouts,
            burst * BURST,
            publisher.status_json()
        );
        for (i, peer) in peers.iter_mut().enumerate() {
            assert!(ended_by_the_publisher(peer), "burst {burst}: peer {i}");
        }
        // Nothing is left open, and nothing else counted them.
        let stats = wait_for(&publisher, |s| s.connections == 0);
        assert_eq!(stats.connections, 0, "{}", publisher.status_json());
        assert_eq!(closed(&stats), burst * BURST, "{}", publisher.status_json());
        assert_eq!(stats.refused_handshakes, 0, "{}", publisher.status_json());
        // Some were cut at once, the others waited out the timeout (which, depends on when
        // the cut ones' ends are seen: until then they count against the bounds).
        assert!(stats.handshake_timeouts > 0, "{}", publisher.status_json());
        assert!(stats.connections_refused > 0, "{}", publisher.status_json());
    }
}
