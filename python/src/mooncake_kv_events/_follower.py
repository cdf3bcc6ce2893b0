"""`Follower` (blocking: `poll`, `run`, on the caller's thread or one of its own) and
`AsyncFollower` (`await poll()`, `await run()` on an asyncio loop): both follow one or more
publishers over ZeroMQ with one `FollowerState` per publisher (_state.py) and the same
links (_links.py); they differ only in how they wait."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Callable, Union, cast

import zmq
import zmq.asyncio

from ._errors import KvEventsError, Unreachable
from ._index import Object, merged
from ._links import (
    CurveKeys,
    Link,
    PathLike,
    Publishers,
    Sockets,
    Status,
    load_curve_keys,
    publishers_of,
)
from ._state import Counters, EventCallback, FollowerState, RecoveryCallback, log

__all__ = ["AsyncFollower", "Follower", "freshest"]

# Messages (or replies) read from one socket per poll before the others get their turn.
BATCH = 1000
# AsyncFollower: messages read from one socket before the loop gets its turn (64 messages
# of 64 events: a few milliseconds).
SLICE = 64
# run(): the longest one poll waits, which bounds how late `stop` is seen.
STEP = 0.1

Stats = dict[str, Union[int, float, bool, str, None]]


def freshest(states: Sequence[FollowerState]) -> FollowerState:
    """The state whose index stands for the publishers: the one in sync heard from last, or
    else the complete one heard from last, or else the one with any index heard from last."""

    def heard(state: FollowerState) -> float:
        return -1.0 if state.heard_at is None else state.heard_at

    def complete(state: FollowerState) -> bool:
        return state.complete

    def indexed(state: FollowerState) -> bool:
        return state.next is not None

    wanted: Callable[[FollowerState], bool]
    for wanted in (FollowerState.in_sync, complete, indexed):
        chosen = [state for state in states if wanted(state)]
        if chosen:
            return max(chosen, key=heard)
    return states[0]


class _Following:
    """What `Follower` and `AsyncFollower` share: the publishers' links, the readers of their
    indexes, and the steps of a poll that do not wait."""

    _asyncio = False

    def __init__(
        self,
        publishers: Publishers,
        *,
        topic: str | bytes = b"",
        curve_server_key: PathLike | None = None,
        curve_secret_key: PathLike | None = None,
        curve_keys: CurveKeys | None = None,
        on_event: EventCallback | None = None,
        on_recovery: RecoveryCallback | None = None,
        note: Callable[[str], None] | None = None,
        context: zmq.Context[Any] | None = None,
        receive_hwm: int = 1_000_000,
    ) -> None:
        self._links: list[Link] = []
        self._owned: zmq.Context[Any] | None = None
        self._closed = False
        specs = publishers_of(publishers)
        if (curve_server_key is None) != (curve_secret_key is None):
            raise ValueError("curve_server_key and curve_secret_key go together")
        if curve_server_key is not None and curve_secret_key is not None:
            if curve_keys is not None:
                raise ValueError("give curve_keys, or curve_server_key and curve_secret_key")
            curve_keys = load_curve_keys(curve_server_key, curve_secret_key)
        if curve_keys is not None and (
            not isinstance(curve_keys, tuple)
            or len(curve_keys) != 3
            or not all(isinstance(key, bytes) for key in curve_keys)
        ):
            raise TypeError("curve_keys is (server public, public, secret), Z85 bytes each")
        if not isinstance(topic, (str, bytes)):
            raise TypeError(f"topic is a {type(topic).__name__}, not a str or bytes")
        if not isinstance(receive_hwm, int) or isinstance(receive_hwm, bool) or receive_hwm < 0:
            raise ValueError(f"receive_hwm is {receive_hwm!r}: messages, 0 for no bound")
        for name, callback in (
            ("on_event", on_event),
            ("on_recovery", on_recovery),
            ("note", note),
        ):
            if callback is not None and not callable(callback):
                raise TypeError(f"{name} is a {type(callback).__name__}, not a callable")
        topic_bytes = topic.encode("utf-8") if isinstance(topic, str) else topic
        sockets = Sockets(self._context_of(context), self._asyncio)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._poller: zmq.Poller = zmq.asyncio.Poller() if self._asyncio else zmq.Poller()
        self._started = now = time.monotonic()
        try:
            for stream, replay in specs:
                noted = None if note is None else self._noter(note, stream)
                state = FollowerState(
                    stream,
                    replay is not None,
                    now,
                    note=noted,
                    on_event=on_event,
                    on_recovery=on_recovery,
                )
                warn = noted if noted is not None else self._warner(stream)
                self._links.append(
                    Link(sockets, stream, replay, curve_keys, state, topic_bytes, receive_hwm, warn)
                )
        except BaseException:
            self.close()
            raise
        for link in self._links:
            for socket in link.waited():
                self._poller.register(socket, zmq.POLLIN)
            link.state.start(now)
            link.flush(self._poller)

    def _context_of(self, context: zmq.Context[Any] | None) -> zmq.Context[Any]:
        if context is not None and not isinstance(context, zmq.Context):
            raise TypeError(f"context is a {type(context).__name__}, not a zmq.Context")
        if isinstance(context, zmq.asyncio.Context):
            raise TypeError(
                "context is a zmq.asyncio.Context, and Follower blocks: in asyncio, use "
                "AsyncFollower(publishers, context=...), whose poll and run are coroutines"
            )
        if context is None:
            self._owned = context = zmq.Context()
        return context

    @staticmethod
    def _noter(note: Callable[[str], None], name: str) -> Callable[[str], None]:
        return lambda text: note(f"{name}: {text}")

    @staticmethod
    def _warner(name: str) -> Callable[[str], None]:
        return lambda text: log.warning("%s: %s", name, text)

    # The steps of a poll.

    def _prepare(self) -> None:
        """What the time asks for, before waiting: the monitors' events (Refused when a
        publisher refuses), a request that timed out, a retry, the check of a quiet stream."""
        if self._closed:
            raise KvEventsError("this follower is closed: make a new one")
        with self._lock:
            now = time.monotonic()
            for link in self._links:
                link.check(now)
                link.state.tick(now)
                link.flush(self._poller)

    def _handle(self, ready: dict[Any, int], limit: int) -> tuple[int, bool]:
        """Reads up to `limit` messages and replies from each socket `ready` names and hands
        them to the states. Returns how many, and whether a socket had more."""
        handled, more = 0, False
        with self._lock:
            now = time.monotonic()
            for link in self._links:
                for waited, handle in (
                    (link.sub_waited, link.state.on_stream),
                    (link.dealer_waited, link.state.on_reply),
                ):
                    if waited is None or waited not in ready:
                        continue
                    # The fast socket of `waited`, as it is now (a reply may replace the
                    # dealer: read no more from it then).
                    socket = link.sub if waited is link.sub_waited else link.dealer
                    if socket is None:
                        continue
                    read = 0
                    while read < limit:
                        try:
                            frames = socket.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        handle(frames, now)
                        read += 1
                        if link.state.reset_dealer:
                            break
                    else:
                        more = True
                    handled += read
                    link.flush(self._poller)
        return handled, more

    def _idle(self, idle_timeout: float | None) -> bool:
        """Whether every publisher was silent for `idle_timeout` seconds."""
        if idle_timeout is None:
            return False
        with self._lock:
            active = max(link.state.active_at for link in self._links)
        return time.monotonic() - active >= idle_timeout

    def _check_reached(self, idle_timeout: float) -> None:
        """After a run ended by its idle timeout: Unreachable when no publisher was reached."""
        statuses = self.statuses()
        if any(status.reached for status in statuses):
            return
        now = time.monotonic()
        with self._lock:
            reasons = "; ".join(
                f"{link.stream}: {link.why(now, final=True)}" for link in self._links
            )
        raise Unreachable(
            statuses,
            f"no publisher reached in {time.monotonic() - self._started:.1f} s "
            f"(idle_timeout={idle_timeout:g}): {reasons}",
        )

    def _run_step(self, deadline: float | None, idle_timeout: float | None) -> float | None:
        """How long the next poll of a run may wait; None when the run is over."""
        if self._stop.is_set():
            return None
        step = STEP
        if deadline is not None:
            step = min(step, deadline - time.monotonic())
            if step <= 0:
                return None
        if self._idle(idle_timeout):
            if idle_timeout is not None:
                self._check_reached(idle_timeout)
            return None
        return step

    def stop(self) -> None:
        """Makes `run` return within about 0.1 s; safe from any thread and signal handlers."""
        self._stop.set()

    def close(self) -> None:
        """Closes the sockets (and the ZeroMQ context, unless it was given). The indexes can
        still be read; `poll` and `run` raise KvEventsError."""
        self._closed = True
        for link in self._links:
            link.close()
        if self._owned is not None:
            self._owned.destroy(linger=0)
            self._owned = None

    # The indexes and where each publisher stands: from any thread.

    @property
    def publishers(self) -> list[str]:
        """The publishers' names: their PUB endpoints, in the order given."""
        return [link.stream for link in self._links]

    def statuses(self) -> list[Status]:
        """Where each publisher stands, in the order given: whether it was reached, when it
        was last heard from, what keeps failing, and its index's position."""
        with self._lock:
            now = time.monotonic()
            return [link.status(now) for link in self._links]

    def _state(self, publisher: str | None) -> FollowerState:
        if publisher is None:
            return freshest([link.state for link in self._links])
        for link in self._links:
            if link.stream == publisher:
                return link.state
        raise KeyError(f"no publisher {publisher!r}: the publishers are {self.publishers}")

    def freshest(self) -> str:
        """The publisher whose index `objects()` gives: the one in sync heard from last, or
        else the complete one heard from last, or else the one with any index heard from
        last."""
        with self._lock:
            return self._state(None).name

    def objects(self, publisher: str | None = None, *, union: bool = False) -> Iterator[Object]:
        """(tenant, key, media) of every object readable somewhere, in byte order of tenant
        then key: of `publisher`'s index, by default of the `freshest`, or with `union` of
        every publisher's merged. Tenants and keys are the master's bytes; media a frozenset
        of "cpu" and "disk". Taken at the call: later changes do not show."""
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
        if not isinstance(tenant, bytes) or not isinstance(key, bytes):
            raise TypeError("tenant and key are bytes: the master's, e.g. b'default'")
        with self._lock:
            return self._state(publisher).index.get(tenant, key)

    def in_sync(self, publisher: str | None = None) -> bool:
        """Whether `publisher`'s index (by default, every one) is complete and follows its
        stream, no recovery under way."""
        with self._lock:
            if publisher is not None:
                return self._state(publisher).in_sync()
            return all(link.state.in_sync() for link in self._links)

    def counters(self, publisher: str | None = None) -> Counters:
        """The counters (docs/subscribers.md, "The counters") of `publisher`, by default the
        sum over every publisher; a copy."""
        with self._lock:
            if publisher is not None:
                return self._state(publisher).counters + Counters()
            total = Counters()
            for link in self._links:
                total = total + link.state.counters
            return total

    def stats(self) -> list[Stats]:
        """Per publisher, its counters and state: objects, next_sequence (that of the next
        stream message its index takes; None: no index yet), last_sequence (the last message
        its index holds; None: none yet), incarnation, complete, in_sync and times to
        converge, and reached, connected and failing as `statuses()` says them, as the
        indexer's --stats writes them."""
        with self._lock:
            return [self._stats(link) for link in self._links]

    @staticmethod
    def _stats(link: Link) -> Stats:
        stats = link.state.stats()
        status = link.status(time.monotonic())
        stats.update(reached=status.reached, connected=status.connected, failing=status.failing)
        return stats

    def summaries(self) -> list[str]:
        """Per publisher, its counters in one line, as `mooncake-kv-indexer` prints them."""
        with self._lock:
            return [link.state.summary() for link in self._links]


class Follower(_Following):
    """Follows publishers of the Mooncake KV event stream and keeps, for each, the index of
    which media each object is readable on, right through loss, restarts and malformed input.

    `publishers` is a list: each publisher is its PUB endpoint, or (PUB endpoint, replay
    endpoint): with a replay endpoint (the master's `kv_events_replay_endpoint`) the
    follower joins by a snapshot and heals every gap by a replay or a snapshot; without one,
    it follows the stream alone and a gap leaves that index incomplete. Several publishers
    are the candidates of an HA deployment: each has its own index, and `objects()` gives
    that of the one in sync heard from last (the leader), or every one merged. An endpoint is
    `transport://address` (`tcp://master-0:5557`, `ipc:///run/kv.sock`); a TCP wildcard host
    (`tcp://*:5557`, as a master binds) means this machine. A publisher given otherwise
    raises TypeError or ValueError saying how to give it.

    `topic` subscribes to the master's `kv_events_topic` or a prefix of it (default: every
    message). `curve_server_key` (the publisher's NAME.pub) and `curve_secret_key` (this
    follower's NAME.key, as `kv-events keygen` writes them) read a CURVE stream; `curve_keys`
    gives the keys themselves instead (`load_curve_keys`). `on_event(publisher, sequence,
    event)` is called for each event applied to an index from a stream or a replay, in order;
    `on_recovery(recovery)` for each gap, replay, snapshot, new incarnation, rebuild and
    return to sync (`Recovery`); `note(text)` receives what happens in words, prefixed with
    the publisher (default: the `mooncake_kv_events` logger, at INFO, and at WARNING that a
    publisher cannot be reached). Callbacks run on the thread that polls; an exception they
    raise is logged and ignored. `context` is a `zmq.Context` to open the sockets in (not a
    `zmq.asyncio.Context`: that is `AsyncFollower`'s).

    The sockets connect at once and the follower asks each replay socket where its publisher
    stands; nothing more happens until `poll` or `run` is called. Those, and `close`, belong
    to one thread at a time; `objects`, `get`, `counters`, `stats`, `statuses`, `in_sync` and
    `stop` may be called from any thread.

        with Follower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
            follower.run(10)
            for tenant, key, media in follower.objects():
                ...
    """

    def poll(self, timeout: float = 0.1) -> int:
        """Waits up to `timeout` seconds for messages and replies, handles those that came
        (a bounded batch per socket) and what the time asks for (a request that timed out, a
        retry, a check of a quiet stream). Returns the number of messages and replies
        handled. Raises Refused when a publisher refuses this follower."""
        self._prepare()
        ready = dict(self._poller.poll(max(0, int(timeout * 1000))))
        return self._handle(ready, BATCH)[0]

    def run(self, seconds: float | None = None, *, idle_timeout: float | None = None) -> None:
        """Polls for `seconds` (None: until `stop`), or until every publisher was silent for
        `idle_timeout` seconds, or until `stop` is called (from another thread or a signal
        handler).

        Raises Refused when a publisher refuses this follower, and Unreachable when
        `idle_timeout` ends the run and no publisher was ever reached (each `Status` says
        why). A publisher that cannot be reached while others can is said (`note`, or the
        logger at WARNING) as soon as an attempt fails, and `statuses()` shows it."""
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            while True:
                step = self._run_step(deadline, idle_timeout)
                if step is None:
                    return
                self.poll(step)
        finally:
            self._stop.clear()

    def __enter__(self) -> Follower:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncFollower(_Following):
    """`Follower` for asyncio: the same arguments, the same state machine and readers, but
    `poll` and `run` are coroutines that wait on the loop and never block it: a burst is
    read a slice at a time (64 messages, a few milliseconds), the loop's other tasks running
    between slices. Callbacks run on the loop's thread. `context` may be a
    `zmq.asyncio.Context` (or a `zmq.Context`, whose sockets it shares).

        async with AsyncFollower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
            await follower.run(10)                 # or: while True: await follower.poll()
            print(follower.counters())

    Cancelling `run` or `poll` is safe: what was read is applied, and the follower goes on at
    the next call."""

    _asyncio = True

    def _context_of(self, context: zmq.Context[Any] | None) -> zmq.Context[Any]:
        if context is None:
            self._owned = context = zmq.asyncio.Context()
            return context
        if isinstance(context, zmq.asyncio.Context):
            return context
        if isinstance(context, zmq.Context):
            return zmq.asyncio.Context.shadow(context.underlying)
        raise TypeError(f"context is a {type(context).__name__}, not a zmq.asyncio.Context")

    async def poll(self, timeout: float = 0.1) -> int:
        """Waits up to `timeout` seconds for messages and replies without blocking the loop,
        and handles those that came (as `Follower.poll`), yielding to the loop between
        slices. Returns the number handled. Raises Refused when a publisher refuses."""
        self._prepare()
        poller = cast(zmq.asyncio.Poller, self._poller)
        ready = dict(await poller.poll(max(0, int(timeout * 1000))))
        handled = 0
        for _ in range(BATCH // SLICE):
            read, more = self._handle(ready, SLICE)
            handled += read
            if not more:
                break
            await asyncio.sleep(0)
            ready = dict(await poller.poll(0))
        return handled

    async def run(self, seconds: float | None = None, *, idle_timeout: float | None = None) -> None:
        """Polls for `seconds` (None: until `stop` or cancelled), or until every publisher
        was silent for `idle_timeout` seconds; raises as `Follower.run` does."""
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            while True:
                step = self._run_step(deadline, idle_timeout)
                if step is None:
                    return
                await self.poll(step)
        finally:
            self._stop.clear()

    async def __aenter__(self) -> AsyncFollower:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
