"""`Follower`: follows one or more publishers over ZeroMQ, each with its own self-healing index
(`FollowerState`), on the caller's thread (`poll`, `run`) or on a thread of its own."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Callable, Optional, Union

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from .index import Object, merged
from .state import EventCallback, FollowerState, RecoveryCallback

__all__ = ["CurveKeys", "Follower", "PublisherSpec", "Refused", "freshest", "load_curve_keys"]

PublisherSpec = Union[str, tuple[str, Optional[str]]]
"""A publisher to follow: its PUB endpoint, or (PUB endpoint, replay endpoint or None)."""

CurveKeys = tuple[bytes, bytes, bytes]
"""(the publisher's public key, this subscriber's public key, its secret key), Z85."""

PathLike = Union[str, "os.PathLike[str]"]

# Messages (or replies) read from one socket before the others get their turn.
BATCH = 1000


class Refused(Exception):
    """The publisher refused this subscriber's handshake, or it cannot succeed."""

    def __init__(self, publisher: str, reason: str) -> None:
        super().__init__(reason)
        self.publisher = publisher
        """The PUB endpoint of the publisher that refused."""
        self.reason = reason


def load_curve_keys(server_key: PathLike, secret_key: PathLike) -> CurveKeys:
    """Reads the publisher's public key file (its NAME.pub) and this subscriber's key file
    (its NAME.key), as `kv-events keygen` writes them. Raises ValueError, or OSError, saying
    which file is wrong."""
    server_public, _ = zmq.auth.load_certificate(os.fspath(server_key))
    public, secret = zmq.auth.load_certificate(os.fspath(secret_key))
    if secret is None:
        raise ValueError(f"{os.fspath(secret_key)} holds no secret-key (a NAME.key is wanted)")
    return server_public, public, secret


class Handshakes:
    """Watches the SUB socket's handshakes, so that a refusal is an error, not silence.
    ZeroMQ says why only as far as the mechanism lets it: a key not on the allow-list is
    an AUTH failure at once; no keys, or the wrong server key, shows as the publisher
    closing the connection mid-handshake, taken for a refusal the second time in a row.
    A handshake that succeeds after the first is a new connection: `check` says so."""

    EVENTS = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    )

    def __init__(self, socket: zmq.Socket[bytes], name: str, curve: bool) -> None:
        self.monitor = socket.get_monitor_socket(self.EVENTS)
        self.name, self.curve = name, curve
        self.closed = 0
        self.connected = 0

    def check(self) -> bool:
        """True when the socket connected again since the last call; Refused when the
        publisher refused it."""
        again = False
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.closed = 0
                self.connected += 1
                again = again or self.connected > 1
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise Refused(
                    self.name, "this indexer's public key or address is not on its allow-list"
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                raise Refused(
                    self.name,
                    "its security mechanism is not this indexer's"
                    + (
                        ""
                        if self.curve
                        else " (it requires CURVE: --curve-server-key, --curve-secret-key)"
                    ),
                )
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.closed += 1
                if self.closed >= 2:
                    raise Refused(
                        self.name,
                        "it closed the connection during the handshake "
                        "twice in a row: "
                        + (
                            "the server key is not the publisher's"
                            if self.curve
                            else "it probably requires CURVE"
                        ),
                    )
        return again


class Link:
    """The sockets of one publisher, and its FollowerState."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        stream: str,
        replay: str | None,
        curve_keys: CurveKeys | None,
        state: FollowerState,
        topic: bytes,
        receive_hwm: int,
    ) -> None:
        self.context, self.stream, self.replay = context, stream, replay
        self.curve_keys = curve_keys
        self.state = state
        self.sub = self.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, receive_hwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.handshakes = Handshakes(self.sub, stream, curve_keys is not None)
        self.sub.connect(stream)
        self.dealer: zmq.Socket[bytes] | None = None
        if replay is not None:
            self.dealer = self.socket(zmq.DEALER)
            self.dealer.connect(replay)

    def socket(self, kind: int) -> zmq.Socket[bytes]:
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        if self.curve_keys is not None:
            socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = self.curve_keys
        return socket

    def flush(self, poller: zmq.Poller) -> None:
        """Sends what the state asks for, on a fresh replay socket when it wants one."""
        state = self.state
        if state.reset_dealer and self.dealer is not None and self.replay is not None:
            poller.unregister(self.dealer)
            self.dealer.close()
            self.dealer = self.socket(zmq.DEALER)
            self.dealer.connect(self.replay)
            poller.register(self.dealer, zmq.POLLIN)
        state.reset_dealer = False
        for frames in state.outbox:
            if self.dealer is None:
                break
            try:
                self.dealer.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass  # not taken: the request times out and is asked again
        state.outbox.clear()

    def close(self) -> None:
        for socket in (self.sub, self.handshakes.monitor, self.dealer):
            if socket is not None:
                socket.close(linger=0)


def freshest(states: Sequence[FollowerState]) -> FollowerState:
    """The state whose index stands for the publishers: the one in sync heard from last, or
    else the complete one heard from last, or else the one with any index heard from last."""

    def heard(f: FollowerState) -> float:
        return -1.0 if f.heard_at is None else f.heard_at

    wanted: Callable[[FollowerState], bool]
    for wanted in (FollowerState.in_sync, lambda f: f.complete, lambda f: f.last is not None):
        chosen = [f for f in states if wanted(f)]
        if chosen:
            return max(chosen, key=heard)
    return states[0]


class Follower:
    """Follows publishers of the Mooncake KV event stream and keeps, for each, the index of
    which media each object is readable on, right through loss, restarts and malformed input.

    `publishers` names each publisher by its PUB endpoint, or by (PUB endpoint, replay
    endpoint): with a replay endpoint (the master's `kv_events_replay_endpoint`) the follower
    joins by a snapshot and heals every gap by a replay or a snapshot; without one, it
    follows the stream alone and a gap leaves that index incomplete. Several publishers are
    the candidates of an HA deployment: each has its own index, and `objects()` gives that of
    the one in sync heard from last (the leader), or every one merged.

    `topic` subscribes to the master's `kv_events_topic` or a prefix of it (default: every
    message). `curve_server_key` (the publisher's NAME.pub) and `curve_secret_key` (this
    follower's NAME.key, as `kv-events keygen` writes them) read a CURVE stream; `curve_keys`
    gives the keys themselves instead (`load_curve_keys`). `on_event(publisher, sequence,
    event)` is called for each event applied to an index from a stream or a replay, in order;
    `on_recovery(recovery)` for each gap, replay, snapshot, new incarnation, rebuild and
    return to sync (`Recovery`); `note(text)` receives what happens in words, prefixed with
    the publisher (default: the `mooncake_kv_events` logger at INFO). Callbacks run on the
    thread that polls; an exception they raise is logged and ignored.

    The sockets connect at once and the follower asks each replay socket where its publisher
    stands; nothing more happens until `poll` or `run` is called. Those, and `close`, belong
    to one thread at a time; `objects`, `get`, `counters`, `stats`, `in_sync` and `stop` may
    be called from any thread.

        with Follower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
            follower.run(10)
            for tenant, key, media in follower.objects():
                ...
    """

    def __init__(
        self,
        publishers: Iterable[PublisherSpec],
        *,
        topic: str | bytes = b"",
        curve_server_key: PathLike | None = None,
        curve_secret_key: PathLike | None = None,
        curve_keys: CurveKeys | None = None,
        on_event: EventCallback | None = None,
        on_recovery: RecoveryCallback | None = None,
        note: Callable[[str], None] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        receive_hwm: int = 1_000_000,
    ) -> None:
        specs = [(p, None) if isinstance(p, str) else (p[0], p[1]) for p in publishers]
        if not specs:
            raise ValueError("no publisher to follow")
        if (curve_server_key is None) != (curve_secret_key is None):
            raise ValueError("curve_server_key and curve_secret_key go together")
        if curve_server_key is not None and curve_secret_key is not None:
            curve_keys = load_curve_keys(curve_server_key, curve_secret_key)
        topic_bytes = topic.encode("utf-8") if isinstance(topic, str) else topic
        self._owns_context = context is None
        self._context: zmq.Context[zmq.Socket[bytes]] = (
            zmq.Context() if context is None else context
        )
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._poller = zmq.Poller()
        self._links: list[Link] = []
        now = time.monotonic()
        try:
            for stream, replay in specs:
                state = FollowerState(
                    stream,
                    replay is not None,
                    now,
                    note=None if note is None else self._noter(note, stream),
                    on_event=on_event,
                    on_recovery=on_recovery,
                )
                self._links.append(
                    Link(self._context, stream, replay, curve_keys, state, topic_bytes, receive_hwm)
                )
        except BaseException:
            self.close()
            raise
        for link in self._links:
            self._poller.register(link.sub, zmq.POLLIN)
            self._poller.register(link.handshakes.monitor, zmq.POLLIN)
            if link.dealer is not None:
                self._poller.register(link.dealer, zmq.POLLIN)
            link.state.start(now)
            link.flush(self._poller)

    @staticmethod
    def _noter(note: Callable[[str], None], name: str) -> Callable[[str], None]:
        return lambda text: note(f"{name}: {text}")

    # Processing.

    def poll(self, timeout: float = 0.1) -> int:
        """Waits up to `timeout` seconds for messages and replies, handles those that came
        (a bounded batch per socket) and what the time asks for (a request that timed out, a
        retry, a check of a quiet stream). Returns the number of messages and replies
        handled. Raises Refused when a publisher refuses this follower."""
        with self._lock:
            now = time.monotonic()
            for link in self._links:
                if link.handshakes.check():
                    link.state.on_reconnect(now)
                link.state.tick(now)
                link.flush(self._poller)
        ready = dict(self._poller.poll(max(0, int(timeout * 1000))))
        handled = 0
        with self._lock:
            now = time.monotonic()
            for link in self._links:
                for socket, handle in (
                    (link.sub, link.state.on_stream),
                    (link.dealer, link.state.on_reply),
                ):
                    # A bounded batch per socket, so that no publisher starves the others.
                    if socket is None or socket not in ready:
                        continue
                    for _ in range(BATCH):
                        try:
                            frames = socket.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        handle(frames, now)
                        handled += 1
                        # A reply may ask for a fresh socket: read no more from this one.
                        if link.state.reset_dealer:
                            break
                    link.flush(self._poller)
        return handled

    def run(self, seconds: float | None = None, *, idle_timeout: float | None = None) -> None:
        """Polls for `seconds` (None: until `stop`), or until every publisher was silent for
        `idle_timeout` seconds, or until `stop` is called (from another thread or a signal
        handler). Raises Refused when a publisher refuses this follower."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self._stop.is_set():
            step = 0.1
            if deadline is not None:
                step = min(step, deadline - time.monotonic())
                if step <= 0:
                    break
            if idle_timeout is not None:
                with self._lock:
                    active = max(link.state.active_at for link in self._links)
                if time.monotonic() - active >= idle_timeout:
                    break
            self.poll(step)
        self._stop.clear()

    def stop(self) -> None:
        """Makes `run` return within about 0.1 s; safe from any thread and signal handlers."""
        self._stop.set()

    def close(self) -> None:
        """Closes the sockets (and the ZeroMQ context, unless it was given)."""
        for link in self._links:
            link.close()
        if self._owns_context:
            self._context.destroy(linger=0)

    def __enter__(self) -> Follower:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # The indexes.

    @property
    def publishers(self) -> list[str]:
        """The publishers' names: their PUB endpoints, in the order given."""
        return [link.stream for link in self._links]

    @property
    def states(self) -> list[FollowerState]:
        """Each publisher's state machine, with its index, in the order given; read them
        under the thread that polls."""
        return [link.state for link in self._links]

    def _state(self, publisher: str | None) -> FollowerState:
        if publisher is None:
            return freshest(self.states)
        for link in self._links:
            if link.stream == publisher:
                return link.state
        raise KeyError(f"no publisher {publisher!r}")

    def freshest(self) -> str:
        """The publisher whose index `objects()` gives: the one in sync heard from last, or
        else the complete one heard from last, or else the one with any index heard from
        last."""
        with self._lock:
            return freshest(self.states).name

    def objects(self, publisher: str | None = None, *, union: bool = False) -> Iterator[Object]:
        """(tenant, key, media) of every object readable somewhere, in byte order of tenant
        then key: of `publisher`'s index, by default of the `freshest`, or with `union` of
        every publisher's merged. Tenants and keys are the master's bytes; media are "cpu"
        and "disk". Taken at the call: later changes do not show."""
        with self._lock:
            if union:
                indexes = [link.state.index for link in self._links]
            else:
                indexes = [self._state(publisher).index]
            objects = merged(indexes)
        return iter(objects)

    def get(self, tenant: bytes, key: bytes, publisher: str | None = None) -> frozenset[str]:
        """The media `key` of `tenant` is readable on, in `publisher`'s index (by default the
        `freshest`'s); empty when it is readable nowhere."""
        with self._lock:
            return self._state(publisher).index.get(tenant, key)

    def in_sync(self, publisher: str | None = None) -> bool:
        """Whether `publisher`'s index (by default, every one) is complete and follows its
        stream, no recovery under way."""
        with self._lock:
            if publisher is not None:
                return self._state(publisher).in_sync()
            return all(link.state.in_sync() for link in self._links)

    def counters(self, publisher: str | None = None) -> dict[str, int]:
        """The counters (docs/subscribers.md, "The counters") of `publisher`, by default the
        sum over every publisher."""
        with self._lock:
            if publisher is not None:
                return dict(self._state(publisher).counters)
            total: dict[str, int] = {}
            for link in self._links:
                for name, value in link.state.counters.items():
                    total[name] = total.get(name, 0) + value
            return total

    def stats(self) -> list[dict[str, int | float | bool | str | None]]:
        """Per publisher, its counters and state: objects, last_sequence, incarnation,
        complete, in_sync and times to converge, as the indexer's --stats writes them."""
        with self._lock:
            return [link.state.stats() for link in self._links]
