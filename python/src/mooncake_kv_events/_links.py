"""The sockets of one publisher (`Link`): its SUB socket and the monitor of its handshakes,
its replay (DEALER) socket, and its `FollowerState`; what a publisher given by the caller
must be (`publishers_of`, `endpoint`), and where a publisher stands (`Status`).

A link works the same for the blocking `Follower` and for `AsyncFollower`: each socket is
opened by a `Sockets` that gives the one to wait on (registered in the follower's poller and
closed at the end) and the one to read and write without waiting (the same socket, or a
blocking shadow of an asyncio one, so that reading a burst makes no future per message)."""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional, Union

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from ._errors import Refused
from ._state import FollowerState

__all__ = [
    "CurveKeys",
    "Link",
    "PathLike",
    "PublisherSpec",
    "Publishers",
    "Reach",
    "Sockets",
    "Status",
    "endpoint",
    "load_curve_keys",
    "publishers_of",
]

PublisherSpec = Union[str, tuple[str, Optional[str]]]
"""A publisher to follow: its PUB endpoint, or (PUB endpoint, replay endpoint or None)."""

Publishers = Union[list[PublisherSpec], Sequence[tuple[str, Optional[str]]], list[str]]
"""The publishers a follower follows: a list of pairs, of PUB endpoints, or of both (one str is
not one, which mypy says too; a list literal mixing both may need its type given,
`list[PublisherSpec]`)."""

CurveKeys = tuple[bytes, bytes, bytes]
"""(the publisher's public key, this subscriber's public key, its secret key), Z85."""

PathLike = Union[str, "os.PathLike[str]"]

# The transports a SUB or DEALER socket connects over, as libzmq names them.
TRANSPORTS = ("tcp", "ipc", "inproc", "ws", "wss", "tipc", "vmci", "pgm", "epgm")
SHAPE = "transport://address, e.g. tcp://master-0:5557 or ipc:///run/mooncake/kv.sock"


def endpoint(value: object, what: str) -> str:
    """The endpoint to connect to for `value`, a publisher's PUB or replay endpoint;
    TypeError or ValueError naming `what` and the fix. A TCP wildcard host (`*`,
    `0.0.0.0`, as a master binds) means this machine, as for `kv-events mirror`."""
    if not isinstance(value, str):
        raise TypeError(f"{what} is a {type(value).__name__}, not a str: {SHAPE}")
    transport, sep, address = value.partition("://")
    if not sep:
        raise ValueError(f"{what} {value!r} names no transport: {SHAPE}")
    if transport not in TRANSPORTS:
        raise ValueError(
            f"{what} {value!r}: {transport!r} is not a ZeroMQ transport ({', '.join(TRANSPORTS)})"
        )
    if not address:
        raise ValueError(f"{what} {value!r} has no address: {SHAPE}")
    if transport == "tcp":
        # tcp://[source-interface;]host:port, the host an IPv6 address in brackets or not.
        host_port = address.rsplit(";", 1)[-1]
        host, colon, port = host_port.rpartition(":")
        if not colon or not host or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
            raise ValueError(f"{what} {value!r}: a TCP endpoint is tcp://HOST:PORT")
        if host in ("*", "0.0.0.0"):
            return f"tcp://127.0.0.1:{port}"
    return value


def publishers_of(publishers: object) -> list[tuple[str, str | None]]:
    """(PUB endpoint, replay endpoint or None) of each publisher given; TypeError or
    ValueError saying what is wrong and how to give it."""
    example = (
        'Follower([("tcp://master-0:5557", "tcp://master-0:5558")]), or '
        'Follower(["tcp://master-0:5557"]) without a replay socket'
    )
    if isinstance(publishers, (str, bytes)):
        raise TypeError(
            f"publishers is a list of publishers, not one {type(publishers).__name__} "
            f"{publishers!r}: {example}"
        )
    if not isinstance(publishers, Iterable):
        raise TypeError(f"publishers is a {type(publishers).__name__}, not a list: {example}")
    if isinstance(publishers, tuple) and publishers and all(isinstance(p, str) for p in publishers):
        raise TypeError(
            f"publishers is the tuple {publishers!r}: one (PUB, replay) pair or several PUB "
            f"endpoints? Give a list: {example}"
        )
    specs: list[tuple[str, str | None]] = []
    for n, spec in enumerate(publishers):
        what = f"publisher {n}"
        if isinstance(spec, str):
            specs.append((endpoint(spec, f"{what}'s PUB endpoint"), None))
            continue
        if not isinstance(spec, (tuple, list)):
            raise TypeError(
                f"{what} is a {type(spec).__name__}: a publisher is its PUB endpoint, or "
                f"(PUB endpoint, replay endpoint): {example}"
            )
        if len(spec) != 2:
            raise ValueError(
                f"{what} is {tuple(spec)!r}, {len(spec)} item{'s' if len(spec) != 1 else ''}: "
                "a publisher is its PUB endpoint, or (PUB endpoint, replay endpoint or None)"
            )
        stream = endpoint(spec[0], f"{what}'s PUB endpoint")
        replay = None if spec[1] is None else endpoint(spec[1], f"{what}'s replay endpoint")
        if replay == stream:
            raise ValueError(
                f"{what}: its PUB and replay endpoints are both {stream!r}; the replay socket is "
                "the master's kv_events_replay_endpoint, another port"
            )
        specs.append((stream, replay))
    if not specs:
        raise ValueError(f"no publisher to follow: {example}")
    names = [stream for stream, _ in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"a publisher given twice: {', '.join(twice)}")
    return specs


def load_curve_keys(server_key: PathLike, secret_key: PathLike) -> CurveKeys:
    """Reads the publisher's public key file (its NAME.pub) and this subscriber's key file
    (its NAME.key), as `kv-events keygen` writes them. Raises ValueError, or OSError, saying
    which file is wrong."""
    server_public, _ = zmq.auth.load_certificate(os.fspath(server_key))
    public, secret = zmq.auth.load_certificate(os.fspath(secret_key))
    if secret is None:
        raise ValueError(f"{os.fspath(secret_key)} holds no secret-key (a NAME.key is wanted)")
    return server_public, public, secret


class Reach(enum.Enum):
    """How far the SUB socket ever got towards its publisher."""

    UNREACHED = "unreached"
    """No connection was ever established."""
    NO_HANDSHAKE = "no_handshake"
    """Connections were established, but no ZeroMQ handshake completed on one."""
    REACHED = "reached"
    """A handshake completed at least once."""


@dataclasses.dataclass(frozen=True)
class Status:
    """Where one publisher stands, as the Rust follower's `Status` says it: whether it can be
    reached, when it was last heard from, what keeps failing, and its index's position."""

    publisher: str
    """Its PUB endpoint: its name."""
    replay: str | None
    """Its replay endpoint; None when it has none."""
    reached: bool
    """Whether a ZeroMQ handshake with its PUB socket ever completed."""
    connected: bool
    """Whether the SUB socket is connected now (a handshake completed since the last
    disconnection)."""
    last_heard: float | None
    """When it was last heard from, a stream message or a reply (`time.monotonic()`); None:
    never."""
    failing: str | None
    """Why it cannot be reached, or why requests to its replay socket keep failing; None
    while nothing does."""
    in_sync: bool
    """Whether its index is complete and follows the stream, no recovery under way."""
    complete: bool
    """Whether its index is the publisher's whole state (a recovery may be under way)."""
    next_sequence: int | None
    """The sequence of the next stream message its index takes; None before it has one."""
    incarnation: int | None
    """The incarnation its index was built from; None before the first snapshot."""


class Sockets:
    """Opens sockets of one ZeroMQ context: (the socket to wait on and close, the one to
    read and write without waiting)."""

    def __init__(self, context: zmq.Context[Any], asyncio: bool) -> None:
        self.context, self.asyncio = context, asyncio

    def shadow(self, socket: zmq.Socket[Any]) -> zmq.Socket[bytes]:
        if not self.asyncio:
            return socket
        return zmq.Socket.shadow(socket.underlying)

    def open(self, kind: int, curve_keys: CurveKeys | None) -> tuple[Any, zmq.Socket[bytes]]:
        waited = self.context.socket(kind)
        fast = self.shadow(waited)
        fast.setsockopt(zmq.LINGER, 0)
        if curve_keys is not None:
            fast.curve_serverkey, fast.curve_publickey, fast.curve_secretkey = curve_keys
        return waited, fast


# The monitor events a link reads: handshakes (so that a refusal is an error, not silence),
# connections made, attempts failed and connections lost (so that an unreachable publisher
# is said).
MONITORED = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_CONNECTED
    | zmq.EVENT_CONNECT_RETRIED
    | zmq.EVENT_DISCONNECTED
)

NOTHING_ACCEPTED = (
    "nothing accepted a connection there (nothing listening, refused, no such socket file, "
    "or a host name that does not resolve)"
)
NO_ANSWER = (
    "the connection attempt got no answer (a host that does not answer, or a firewall that "
    "drops it)"
)
# A connection made that has had this long to complete its handshake has none.
HANDSHAKE_GRACE = 1.0
NO_HANDSHAKE = (
    "a connection was made, but no ZeroMQ handshake completed on it (is a ZeroMQ publisher "
    "listening there?)"
)


class Link:
    """The sockets of one publisher, and its FollowerState."""

    def __init__(
        self,
        sockets: Sockets,
        stream: str,
        replay: str | None,
        curve_keys: CurveKeys | None,
        state: FollowerState,
        topic: bytes,
        receive_hwm: int,
        warn: Callable[[str], None],
    ) -> None:
        self.sockets, self.stream, self.replay = sockets, stream, replay
        self.curve_keys, self.state, self.warn = curve_keys, state, warn
        self.sub_waited, self.sub = sockets.open(zmq.SUB, curve_keys)
        self.sub.setsockopt(zmq.RCVHWM, receive_hwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.monitor_waited = self.sub_waited.get_monitor_socket(MONITORED)
        self.monitor = sockets.shadow(self.monitor_waited)
        self.dealer_waited: Any = None
        self.dealer: zmq.Socket[bytes] | None = None
        # How far the SUB socket got (Reach), and what was said of it.
        self.reach = Reach.UNREACHED
        self.connected = False
        self.failed_attempts = 0
        self.handshakes = 0
        self.closed_handshakes = 0
        self.said_unreached = False
        self.connected_at = 0.0  # when the first connection without a handshake was made
        self.connect(self.sub, stream, "PUB")
        if replay is not None:
            self.dealer_waited, self.dealer = sockets.open(zmq.DEALER, curve_keys)
            self.connect(self.dealer, replay, "replay")

    @staticmethod
    def connect(socket: zmq.Socket[bytes], endpoint: str, what: str) -> None:
        try:
            socket.connect(endpoint)
        except zmq.ZMQError as e:
            raise ValueError(f"cannot connect to the {what} endpoint {endpoint!r}: {e}") from None

    def waited(self) -> list[Any]:
        """The sockets to wait on."""
        return [s for s in (self.sub_waited, self.monitor_waited, self.dealer_waited) if s]

    def check(self, now: float) -> None:
        """Takes the SUB socket's monitor events: a reconnection asks the state to check the
        publisher's life, a failed attempt is said once, a refusal raises Refused."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.closed_handshakes = 0
                self.handshakes += 1
                self.connected = True
                if self.reach is not Reach.REACHED and self.said_unreached:
                    self.warn("reached")
                self.reach = Reach.REACHED
                if self.handshakes > 1:
                    self.state.on_reconnect(now)
            elif event == zmq.EVENT_CONNECTED:
                if self.reach is Reach.UNREACHED:
                    self.reach, self.connected_at = Reach.NO_HANDSHAKE, now
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected = False
            elif event == zmq.EVENT_CONNECT_RETRIED:
                if self.reach is Reach.UNREACHED:
                    self.failed_attempts += 1
                    if not self.said_unreached:
                        self.said_unreached = True
                        why = self.why(now, final=True)
                        self.warn(f"not reached yet: {why}; still trying")
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise Refused(
                    self.stream, "this follower's public key or address is not on its allow-list"
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                raise Refused(
                    self.stream,
                    "its security mechanism is not this follower's"
                    + (
                        ""
                        if self.curve_keys is not None
                        else " (it requires CURVE: --curve-server-key, --curve-secret-key)"
                    ),
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.closed_handshakes += 1
                if self.closed_handshakes >= 2:
                    raise Refused(
                        self.stream,
                        "it closed the connection during the handshake twice in a row: "
                        + (
                            "the server key is not the publisher's"
                            if self.curve_keys is not None
                            else "it probably requires CURVE"
                        ),
                    )

    def why(self, now: float, final: bool = False) -> str | None:
        """Why the publisher is not reached; None once it was, or while the first attempt
        may still succeed (unless `final`: it had its chance)."""
        if self.reach is Reach.REACHED:
            return None
        if self.reach is Reach.NO_HANDSHAKE:
            if final or now - self.connected_at >= HANDSHAKE_GRACE:
                return NO_HANDSHAKE
            return None
        if self.failed_attempts:
            attempts = self.failed_attempts
            return f"{NOTHING_ACCEPTED}; {attempts} attempt{'s' if attempts > 1 else ''} failed"
        return NO_ANSWER if final else None

    def status(self, now: float) -> Status:
        state = self.state
        heard = [t for t in (state.heard_at, state.replied_at) if t is not None]
        return Status(
            publisher=self.stream,
            replay=self.replay,
            reached=self.reach is Reach.REACHED,
            connected=self.connected,
            last_heard=max(heard) if heard else None,
            failing=self.why(now) or state.failing,
            in_sync=state.in_sync(),
            complete=state.complete,
            next_sequence=state.next,
            incarnation=state.incarnation,
        )

    def flush(self, poller: zmq.Poller) -> None:
        """Sends what the state asks for, on a fresh replay socket when it wants one."""
        state = self.state
        if state.reset_dealer and self.dealer is not None and self.replay is not None:
            poller.unregister(self.dealer_waited)
            self.dealer_waited.close(linger=0)
            self.dealer_waited, self.dealer = self.sockets.open(zmq.DEALER, self.curve_keys)
            self.connect(self.dealer, self.replay, "replay")
            poller.register(self.dealer_waited, zmq.POLLIN)
        state.reset_dealer = False
        if self.dealer is not None:
            for frames in state.outbox:
                try:
                    self.dealer.send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    pass  # not taken: the request times out and is asked again
        state.outbox.clear()

    def close(self) -> None:
        for socket in (self.sub_waited, self.monitor_waited, self.dealer_waited):
            if socket is not None and not socket.closed:
                socket.close(linger=0)
