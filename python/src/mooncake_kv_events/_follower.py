"""`Follower` (blocking: `poll`, `run`) and `AsyncFollower` (`await poll()`, `await run()`):
both drive the library's Rust follower (`_native.NativeFollower`: its sockets, its state
machine, its indexes) and differ only in how they wait. This module checks what it is given,
so that a mistake is a clear TypeError or ValueError before anything reaches Rust, and turns
what comes back into the package's types."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Callable, Optional, Union

from ._errors import Refused, Unreachable
from ._native import NativeFollower
from ._wire import Event, events_of

__all__ = [
    "AsyncFollower",
    "EventCallback",
    "Follower",
    "FollowerCounters",
    "Notice",
    "NoticeCallback",
    "NoticeKind",
    "Object",
    "Status",
    "Upstream",
    "endpoint",
]

log = logging.getLogger("mooncake_kv_events")

# run(): the longest one poll waits, which bounds how late `stop` is seen.
STEP = 0.1

Object = tuple[bytes, bytes, frozenset[str]]
"""(tenant, key, media) of one object: the master's bytes, and "cpu" and/or "disk"."""
PathLike = Union[str, "os.PathLike[str]"]
UpstreamLike = Union["Upstream", tuple[str, Optional[str]]]

# The transports libzmq knows (zmq_connect(3)): anything else is a typo the error message
# names.
TRANSPORTS = ("tcp", "ipc", "inproc", "ws", "wss", "tipc", "vmci", "pgm", "epgm")
SHAPE = "transport://address, e.g. tcp://master-0:5557 or ipc:///run/mooncake/kv.sock"
EXAMPLE = 'Follower([("tcp://master-0:5557", "tcp://master-0:5558")])'


def endpoint(value: object, what: str) -> str:
    """The endpoint to connect to for `value`; TypeError or ValueError naming `what` and the
    fix. A TCP wildcard host (`*`, `0.0.0.0`, as a master binds) means this machine, as for
    `kv-events mirror`."""
    if not isinstance(value, str):
        raise TypeError(f"{what} is a {type(value).__name__}, not a str: {SHAPE}")
    transport, sep, address = value.partition("://")
    if not sep:
        raise ValueError(f"{what} {value!r} names no transport: {SHAPE}")
    if transport not in TRANSPORTS:
        raise ValueError(
            f"{what} {value!r}: {transport!r} is not a ZeroMQ transport ({', '.join(TRANSPORTS)})"
        )
    if not address or "\0" in address:
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


@dataclasses.dataclass(frozen=True)
class Upstream:
    """A publisher to follow: its PUB endpoint (the master's `kv_events_bind_endpoint`), its
    replay endpoint (`kv_events_replay_endpoint`), from which the follower joins by a
    snapshot and heals every gap (None for a publisher without one: the index then holds the
    stream from the join on, and gaps are counted `unrecoverable`), and the topic to
    subscribe to (the master's `kv_events_topic` or a prefix of it; empty: every message).
    Checked when made: TypeError or ValueError saying what is wrong."""

    endpoint: str
    replay_endpoint: str | None
    topic: bytes = b""

    def __post_init__(self) -> None:
        stream = endpoint(self.endpoint, "the endpoint")
        replay = (
            None
            if self.replay_endpoint is None
            else endpoint(self.replay_endpoint, "the replay endpoint")
        )
        if replay == stream:
            raise ValueError(
                f"the endpoint and the replay endpoint are both {stream!r}: the replay socket "
                "is the master's kv_events_replay_endpoint, another port"
            )
        topic: object = self.topic
        if isinstance(topic, str):
            topic = topic.encode("utf-8")
        if not isinstance(topic, bytes):
            raise TypeError(f"topic is a {type(topic).__name__}, not bytes or str")
        # Frozen: set what was normalized through object's own __setattr__.
        object.__setattr__(self, "endpoint", stream)
        object.__setattr__(self, "replay_endpoint", replay)
        object.__setattr__(self, "topic", topic)


def upstreams_of(upstreams: object) -> list[Upstream]:
    """The `Upstream` of each one given; TypeError or ValueError saying what is wrong and how
    to give it."""
    if isinstance(upstreams, (str, bytes)):
        raise TypeError(
            f"upstreams is a list of upstreams, not one {type(upstreams).__name__} "
            f"{upstreams!r}: {EXAMPLE}"
        )
    if not isinstance(upstreams, Iterable):
        raise TypeError(f"upstreams is a {type(upstreams).__name__}, not a list: {EXAMPLE}")
    if isinstance(upstreams, tuple) and upstreams and all(isinstance(u, str) for u in upstreams):
        raise TypeError(f"upstreams is the tuple {upstreams!r}, not a list of them: {EXAMPLE}")
    out: list[Upstream] = []
    for n, given in enumerate(upstreams):
        what = f"upstream {n}"
        if isinstance(given, Upstream):
            out.append(given)
            continue
        if isinstance(given, str):
            raise TypeError(
                f"{what} is {given!r} alone: an upstream is (endpoint, replay endpoint), the "
                f"follower joins by a snapshot from the replay socket: {EXAMPLE}"
            )
        if not isinstance(given, (tuple, list)):
            raise TypeError(
                f"{what} is a {type(given).__name__}: an upstream is an Upstream or "
                f"(endpoint, replay endpoint): {EXAMPLE}"
            )
        if len(given) != 2:
            raise ValueError(
                f"{what} is {tuple(given)!r}, {len(given)} item{'s' if len(given) != 1 else ''}: "
                "an upstream is (endpoint, replay endpoint)"
            )
        try:
            out.append(Upstream(given[0], given[1]))
        except (TypeError, ValueError) as e:
            raise type(e)(f"{what}: {e}") from None
    if not out:
        raise ValueError(f"no upstream to follow: {EXAMPLE}")
    names = [u.endpoint for u in out]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"an upstream given twice: {', '.join(twice)}")
    return out


class NoticeKind(str, enum.Enum):
    """What a `Notice` tells. A `str` too: `kind == "snapshot"` holds."""

    SNAPSHOT = "snapshot"
    """A snapshot became the index (numbers: objects, events, next_sequence, incarnation)."""
    REPLAYED = "replayed"
    """The gap from..through was filled by a replay."""
    NOT_HELD = "not_held"
    """The replay buffer no longer holds the gap from..through (it holds from oldest on): a
    snapshot follows."""
    REPLAY_SHORT = "replay_short"
    """A replay of from..through stopped before next: a snapshot follows."""
    NEW_INCARNATION = "new_incarnation"
    """The publisher has a new incarnation (old, new): a restart, a snapshot follows."""
    SEQUENCE_BACK = "sequence_back"
    """The stream's sequence went back (last, sequence): a restart, a snapshot follows."""
    UNRECOVERABLE = "unrecoverable"
    """The gap from..through cannot be filled: the upstream has no replay endpoint."""
    IN_SYNC = "in_sync"
    """The index is in sync again, `took` seconds after the start or the incident."""
    DISCONNECTED = "disconnected"
    """The connection to the PUB endpoint closed; the follower reconnects and checks."""
    MALFORMED = "malformed"
    """A message or reply was refused and skipped."""
    SKIPPED = "skipped"
    """Events of a message were skipped."""
    FAILED = "failed"
    """A request failed; it is retried."""
    REFUSED = "refused"
    """The publisher refused this follower's handshake: `poll` raises `Refused`."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclasses.dataclass(frozen=True)
class Notice:
    """Something that happened to an upstream's index beyond applying the stream in order."""

    upstream: str
    """The upstream's endpoint: its name."""
    kind: NoticeKind
    text: str
    """What happened, in one line for people."""
    numbers: dict[str, int] = dataclasses.field(default_factory=dict)
    """The numbers `kind` names (sequences, incarnations, counts), by name."""
    took: float | None = None
    """How long it took, in seconds, for a snapshot, a replay and a return to sync."""


@dataclasses.dataclass(frozen=True)
class FollowerCounters:
    """What a follower counted, for one upstream or all together (docs/subscribers.md, "The
    counters"); the Rust follower's counters, field for field."""

    messages: int = 0
    """Messages applied to the index, from the stream or a replay."""
    events: int = 0
    """Events applied from those messages (snapshots' events not included)."""
    discarded: int = 0
    """Stream messages the index already covered: the normal overlap, no loss."""
    gaps: int = 0
    """Sequence gaps found, each filled by a replay or a snapshot."""
    replays: int = 0
    replayed_messages: int = 0
    snapshots: int = 0
    """Snapshots taken as the index, the first one included."""
    incarnations: int = 0
    """New lives of a publisher seen (a restart): each is followed by a snapshot."""
    malformed: int = 0
    """Messages and replies refused and skipped."""
    skipped_events: int = 0
    """Events of well-formed messages the index cannot take."""
    failed_requests: int = 0
    """Requests to the replay socket that failed; each is retried."""
    unrecoverable: int = 0
    """Gaps no replay endpoint could fill (an upstream without one): the index misses them."""
    overflowed: int = 0
    """Live messages dropped because `max_held` were held already (recovered as a loss)."""
    convergences: int = 0
    """Times the index came back in sync: after the start and after each incident."""
    last_convergence: float | None = None
    """How long the last of those took, in seconds."""
    longest_convergence: float = 0.0
    """The longest of them, in seconds."""

    def as_dict(self) -> dict[str, int | float | None]:
        """The counters by name."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Status:
    """Where one upstream stands: whether it was ever heard from, how long it has been
    silent, what keeps failing, and its index's position."""

    upstream: str
    """Its endpoint: its name."""
    replay_endpoint: str | None
    reached: bool
    """Whether it was ever heard from: a stream message or a reply of its replay socket."""
    last_heard: float | None
    """When it was last heard from (`time.monotonic()`); None: never."""
    silent_for: float | None
    """Seconds since then, when the status was taken; None: never heard from."""
    failing: str | None
    """Why requests to its replay socket keep failing; None while they do not."""
    in_sync: bool
    """Whether its index is complete and follows the stream, no recovery under way."""
    next_sequence: int | None
    """The first sequence its index has not applied; None before the first snapshot."""
    incarnation: int | None
    """The incarnation its index was built from; None before the first snapshot."""


EventCallback = Callable[[str, int, Event], None]
"""Called with (upstream, sequence, event) for each event applied to an upstream's index from
its stream or a replay, in order. A snapshot's events are not passed one by one: its `Notice`
says the index was replaced."""
NoticeCallback = Callable[[Notice], None]
"""Called with each `Notice`."""

Polled = tuple[
    list[tuple[int, str, str, list[tuple[str, int]], Optional[float]]],
    list[tuple[int, int, int, bytes]],
]


def _positive(name: str, value: object, integer: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        what = "an int" if integer else "a number of seconds"
        raise TypeError(f"{name} is a {type(value).__name__}, not {what}")
    number = float(value)  # type: ignore[arg-type]  # an int or a float: checked above
    if not 0 <= number < float("inf") or (integer and number > 2**62):
        raise ValueError(f"{name} is {value!r}: a finite number, at least 0")


class _Following:
    """What `Follower` and `AsyncFollower` share: the native follower, the checks of what is
    given, the callbacks, and the readers of the indexes."""

    def __init__(
        self,
        upstreams: Iterable[UpstreamLike],
        *,
        curve_server_key: PathLike | None = None,
        curve_secret_key: PathLike | None = None,
        on_event: EventCallback | None = None,
        on_notice: NoticeCallback | None = None,
        note: Callable[[str], None] | None = None,
        receive_hwm: int = 1_000_000,
        max_message_bytes: int = 16 << 20,
        request_timeout: float = 5.0,
        retry_after: float = 1.0,
        quiet_check: float = 1.0,
        max_held: int = 1_000_000,
        max_held_bytes: int = 1 << 30,
    ) -> None:
        self._upstreams = upstreams_of(upstreams)
        if (curve_server_key is None) != (curve_secret_key is None):
            raise ValueError("curve_server_key and curve_secret_key go together")
        curve = None
        if curve_server_key is not None and curve_secret_key is not None:
            curve = (os.fspath(curve_server_key), os.fspath(curve_secret_key))
        for name, callback in (("on_event", on_event), ("on_notice", on_notice), ("note", note)):
            if callback is not None and not callable(callback):
                raise TypeError(f"{name} is a {type(callback).__name__}, not a callable")
        if isinstance(receive_hwm, int) and not isinstance(receive_hwm, bool):
            if receive_hwm > 2**31 - 1:
                raise ValueError(f"receive_hwm is {receive_hwm}: at most 2**31 - 1 messages")
        _positive("receive_hwm", receive_hwm, integer=True)
        _positive("max_message_bytes", max_message_bytes, integer=True)
        _positive("max_held", max_held, integer=True)
        _positive("max_held_bytes", max_held_bytes, integer=True)
        _positive("request_timeout", request_timeout)
        _positive("retry_after", retry_after)
        _positive("quiet_check", quiet_check)
        self._on_event, self._on_notice, self._note = on_event, on_notice, note
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # What a poll brought that is not handed out yet: an AsyncFollower's poll cancelled
        # while its thread was in Rust leaves it here for the next.
        self._pending: list[Polled] = []
        self._started = time.monotonic()
        # What the counters showed of the stream, and when that last changed (`_last_message`).
        self._seen: tuple[object, ...] = ()
        self._active = self._started
        self._native = NativeFollower(
            [(u.endpoint, u.replay_endpoint, u.topic) for u in self._upstreams],
            curve,
            receive_hwm,
            max_message_bytes,
            float(request_timeout),
            float(retry_after),
            float(quiet_check),
            max_held,
            max_held_bytes,
            on_event is not None,
        )

    # Polling: `_fetch` on any thread (it waits in Rust, without the GIL), `_deliver` on the
    # caller's.

    def _fetch(self, timeout: float) -> None:
        polled = self._native.poll(timeout)
        with self._lock:
            self._pending.append(polled)

    def _deliver(self) -> list[Notice]:
        """Runs the callbacks for what was fetched; the notices. Raises Refused when an
        upstream refused this follower."""
        with self._lock:
            pending, self._pending = self._pending, []
        notices: list[Notice] = []
        refused: Refused | None = None
        for raw_notices, applied in pending:
            if self._on_event is not None:
                for upstream, _incarnation, sequence, payload in applied:
                    name = self._upstreams[upstream].endpoint
                    for event in events_of(payload):
                        self._call(self._on_event, name, sequence, event)
            for upstream, kind, text, numbers, took in raw_notices:
                notice = Notice(
                    self._upstreams[upstream].endpoint, NoticeKind(kind), text, dict(numbers), took
                )
                notices.append(notice)
                if notice.kind is NoticeKind.REFUSED:
                    refused = refused or Refused(notice.upstream, notice.text)
                    continue
                self._say(notice)
                if self._on_notice is not None:
                    self._call(self._on_notice, notice)
        if refused is not None:
            raise refused
        return notices

    def _say(self, notice: Notice) -> None:
        if self._note is not None:
            self._call(self._note, f"{notice.upstream}: {notice.text}")
        else:
            log.info("%s: %s", notice.upstream, notice.text)

    @staticmethod
    def _call(callback: Callable[..., None], *args: object) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("a callback raised; the follower goes on")

    def _run_step(
        self, started: float, deadline: float | None, idle_timeout: float | None
    ) -> float | None:
        """How long the next poll of a run begun at `started` may wait; None when the run is
        over. Raises Unreachable when `idle_timeout` ends it and no upstream was ever heard
        from."""
        if self._stop.is_set():
            return None
        step = STEP
        now = time.monotonic()
        if deadline is not None:
            step = min(step, deadline - now)
            if step <= 0:
                return None
        if idle_timeout is not None and now - self._last_message(now, started) >= idle_timeout:
            statuses = self.statuses()
            if not any(s.reached for s in statuses):
                reasons = "; ".join(
                    f"{s.upstream}: {s.failing or 'never heard from'}" for s in statuses
                )
                raise Unreachable(
                    statuses,
                    f"no upstream reached in {now - self._started:.1f} s "
                    f"(idle_timeout={idle_timeout:g}): {reasons}",
                )
            return None
        return step

    def _last_message(self, now: float, started: float) -> float:
        """When a stream message last came (applied, discarded or refused) or a snapshot was
        taken, as far as the counters show; `started` at the latest. Replies to the quiet
        checks do not count: a silent publisher still answers them."""
        c = self._native.counters(None)
        seen = (c["messages"], c["discarded"], c["malformed"], c["snapshots"])
        if seen != self._seen:
            self._seen, self._active = seen, now
        return max(self._active, started)

    def stop(self) -> None:
        """Makes `run` return within about 0.1 s; safe from any thread and signal handlers."""
        self._stop.set()

    def close(self) -> None:
        """Closes the sockets; every call after it raises KvEventsError."""
        self._native.close()

    # The indexes and where each upstream stands: from any thread.

    @property
    def upstreams(self) -> list[Upstream]:
        """The upstreams, in the order given."""
        return list(self._upstreams)

    def _number(self, upstream: str | None) -> int | None:
        if upstream is None:
            return None
        if not isinstance(upstream, str):
            raise TypeError(f"upstream is a {type(upstream).__name__}, not its endpoint (a str)")
        for n, u in enumerate(self._upstreams):
            if u.endpoint == upstream:
                return n
        names = [u.endpoint for u in self._upstreams]
        raise KeyError(f"no upstream {upstream!r}: the upstreams are {names}")

    def _chosen(self, upstream: str | None, union: bool) -> int | None:
        """The upstream whose index to read (None: every one merged)."""
        if union:
            if upstream is not None:
                raise ValueError("give an upstream, or union=True, not both")
            return None
        number = self._number(upstream)
        if number is None:
            number = self._native.freshest()
        return 0 if number is None else number

    def statuses(self) -> list[Status]:
        """Where each upstream stands, in the order given."""
        now = time.monotonic()
        return [
            Status(
                upstream=name,
                replay_endpoint=self._upstreams[n].replay_endpoint,
                reached=ago is not None,
                last_heard=None if ago is None else now - ago,
                silent_for=ago,
                failing=failing,
                in_sync=in_sync,
                next_sequence=next_sequence,
                incarnation=incarnation,
            )
            for n, (name, incarnation, next_sequence, in_sync, ago, failing) in enumerate(
                self._native.statuses()
            )
        ]

    def freshest(self) -> str | None:
        """The upstream in sync heard from last (in an HA deployment, the leader), whose index
        `objects()` gives by default; None while none is in sync (`objects()` then gives the
        first upstream's)."""
        number = self._native.freshest()
        return None if number is None else self._upstreams[number].endpoint

    def objects(self, upstream: str | None = None, *, union: bool = False) -> Iterator[Object]:
        """(tenant, key, media) of every object in `upstream`'s index (by default the
        `freshest`'s; with `union`, every upstream's merged), in byte order of tenant then
        key; taken at the call."""
        listed = self._native.objects(self._chosen(upstream, union))
        return ((tenant, key, frozenset(media)) for tenant, key, media in listed)

    def count(self, upstream: str | None = None, *, union: bool = False) -> int:
        """How many objects `objects()` would give."""
        return self._native.count(self._chosen(upstream, union))

    def get(self, tenant: bytes, key: bytes, upstream: str | None = None) -> frozenset[str]:
        """The media `key` of `tenant` is readable on in `upstream`'s index (by default the
        `freshest`'s); empty when readable nowhere."""
        if not isinstance(tenant, bytes) or not isinstance(key, bytes):
            raise TypeError("tenant and key are bytes: the master's, e.g. b'default'")
        number = self._number(upstream)
        if number is None:
            number = self._native.freshest() or 0
        return frozenset(self._native.get(number, tenant, key))

    def dump(self, path: PathLike, upstream: str | None = None, *, union: bool = False) -> int:
        """Writes `upstream`'s index (as `objects()` chooses it) to `path` as JSON lines, byte
        for byte what `kv-events mirror --dump` writes; returns how many objects."""
        chosen = self._chosen(upstream, union)
        lines = self._native.json_lines(chosen)
        with open(path, "wb") as out:
            out.write(lines)
        return lines.count(b"\n")

    def in_sync(self, upstream: str | None = None) -> bool:
        """Whether `upstream`'s index (by default, every one) is complete and follows its
        stream, no recovery under way."""
        number = self._number(upstream)
        if number is None:
            return self._native.in_sync()
        return self.statuses()[number].in_sync

    def counters(self, upstream: str | None = None) -> FollowerCounters:
        """The counters of `upstream`, by default every upstream's added up."""
        counted: dict[str, Any] = self._native.counters(self._number(upstream))
        return FollowerCounters(**counted)

    def stats(self) -> list[dict[str, object]]:
        """Per upstream, its status and counters, as the indexer's --stats writes them."""
        out: list[dict[str, object]] = []
        for n, status in enumerate(self.statuses()):
            entry: dict[str, object] = dataclasses.asdict(status)
            del entry["last_heard"]  # a monotonic clock reading: nothing to anyone else
            entry["objects"] = self._native.count(n)
            entry.update(self._native.counters(n))
            out.append(entry)
        return out

    def summaries(self) -> list[str]:
        """Per upstream, its counters in one line, as `mooncake-kv-indexer` prints them."""
        lines = []
        for status in self.statuses():
            c = self.counters(status.upstream)
            lines.append(
                f"{status.upstream}: {c.messages} messages, {c.events} events, {c.gaps} gaps, "
                f"{c.replays} replays, {c.snapshots} snapshots, {c.incarnations} incarnations, "
                f"{c.malformed} malformed, {c.failed_requests} failed requests, "
                f"in sync: {'yes' if status.in_sync else 'no'}"
            )
        return lines


class Follower(_Following):
    """Follows upstreams (publishers) of the Mooncake KV event stream and keeps, for each, the
    index of which media each object is readable on, right through loss, restarts and
    malformed input: the library's Rust follower, driven from Python.

    `upstreams` is a list of `Upstream`s, or of (endpoint, replay endpoint) pairs. The
    follower joins each by a snapshot from its replay socket and heals every gap by a replay
    or a snapshot. Several upstreams are the candidates of an HA deployment: each has its own
    index, and `objects()` gives that of the one in sync heard from last (the leader), or
    every one merged. An endpoint is `transport://address` (`tcp://master-0:5557`,
    `ipc:///run/kv.sock`); a TCP wildcard host (`tcp://*:5557`) means this machine. Anything
    given wrong raises TypeError or ValueError saying how to give it.

    `curve_server_key` (the publisher's NAME.pub) and `curve_secret_key` (this follower's
    NAME.key, as `kv-events keygen` writes them) read a CURVE stream. `on_event(upstream,
    sequence, event)` is called for each event applied from a stream or a replay, in order
    (only then are payloads decoded in Python); `on_notice(notice)` for each `Notice`;
    `note(text)` receives the notices in words, prefixed with the upstream (default: the
    `mooncake_kv_events` logger at INFO). Callbacks run on the thread that polls; an
    exception they raise is logged and ignored. The rest are the Rust follower's options
    (`FollowOptions`), times in seconds.

    `poll`, `run` and `close` belong to one thread at a time; the readers (`objects`, `get`,
    `count`, `counters`, `statuses`, `in_sync`, `stats`) and `stop` may be called from any
    thread. `poll` waits in Rust without holding the GIL.

        with Follower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
            follower.run(10)
            for tenant, key, media in follower.objects():
                ...
    """

    def poll(self, timeout: float = 0.1) -> list[Notice]:
        """Reads what arrived, applies it, and sends the requests the state calls for, for up
        to `timeout` seconds; returns sooner when something was applied or noticed. Returns
        the notices. Raises Refused when an upstream refuses this follower."""
        _positive("timeout", timeout)
        self._fetch(float(timeout))
        return self._deliver()

    def run(self, seconds: float | None = None, *, idle_timeout: float | None = None) -> None:
        """Polls for `seconds` (None: until `stop`), or until no stream message came for
        `idle_timeout` seconds, or until `stop` is called (from another thread or a signal
        handler). Raises Refused when an upstream refuses this follower, and Unreachable when
        `idle_timeout` ends the run and no upstream was ever heard from."""
        started = time.monotonic()
        deadline = None if seconds is None else started + seconds
        try:
            while True:
                step = self._run_step(started, deadline, idle_timeout)
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
    """`Follower` for asyncio: the same arguments, but `poll` and `run` are coroutines that
    never block the loop: each poll waits in Rust on a thread of the loop's default executor
    (without the GIL), and the callbacks run on the loop's thread.

        async with AsyncFollower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
            await follower.run(10)                 # or: while True: await follower.poll()
            print(follower.counters())

    Cancelling `run` or `poll` is safe: what the cancelled poll brought is handed out by the
    next."""

    async def poll(self, timeout: float = 0.1) -> list[Notice]:
        """As `Follower.poll`, without blocking the loop."""
        _positive("timeout", timeout)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._fetch, float(timeout))
        return self._deliver()

    async def run(self, seconds: float | None = None, *, idle_timeout: float | None = None) -> None:
        """As `Follower.run`, without blocking the loop (None: until `stop` or cancelled)."""
        started = time.monotonic()
        deadline = None if seconds is None else started + seconds
        try:
            while True:
                step = self._run_step(started, deadline, idle_timeout)
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
