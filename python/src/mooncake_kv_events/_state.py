"""The follower of one publisher as a state machine without sockets: its index, and the
recovery protocol of docs/subscribers.md ("The recovery procedure") that keeps the index right
through loss, restarts and malformed input. `Follower` and `AsyncFollower` (_follower.py)
drive one per publisher with real sockets (_links.py); the tests drive it by hand.

Its phases: LIVE (the stream is applied as it comes; a check of a quiet stream may be under
way), ASKING (a request to the replay socket is under way, the stream held back unless it is
a check) and WAITING (a request failed; asking again at `retry_at`)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from typing import Any, Callable

from ._errors import ProtocolError
from ._index import Index
from ._wire import (
    END_OF_REPLAY,
    Event,
    Info,
    decode_batch,
    decode_info,
    decode_map,
    decode_message,
    event_of,
    number,
)

__all__ = [
    "ASK_TIMEOUT",
    "CHECK_EVERY",
    "MAX_HELD",
    "RETRY_FIRST",
    "RETRY_MAX",
    "Counters",
    "EventCallback",
    "FollowerState",
    "Phase",
    "Recovery",
    "RecoveryCallback",
    "RecoveryKind",
]

log = logging.getLogger("mooncake_kv_events")

# A request whose answer stops coming for this long has failed (the socket is replaced).
ASK_TIMEOUT = 5.0
# A stream quiet this long: ask `info` whether the end of a burst was lost.
CHECK_EVERY = 1.0
# Waits before asking again after a failed request: doubled up to the second.
RETRY_FIRST, RETRY_MAX = 0.5, 8.0
# Live messages held back while a request is under way; beyond it the oldest go, and the
# recovery must then rebuild everything.
MAX_HELD = 200_000
# Malformed messages and skipped events described before only counting them.
MAX_NOTES = 10


@dataclasses.dataclass
class Counters:
    """What happened to a publisher's index (docs/subscribers.md, "The counters"): those of
    the Rust follower, and `missed`, `snapshot_events`, `timeouts` and `incomplete`. Adding
    two gives their sum (`Follower.counters()` of every publisher)."""

    messages: int = 0
    """Messages applied to the index, from the stream or a replay."""
    events: int = 0
    """Events applied from those messages (a snapshot's are in `snapshot_events`)."""
    discarded: int = 0
    """Stream messages dropped because the index already had them (below a snapshot's
    next_sequence, or replayed already): the normal overlap, no loss."""
    gaps: int = 0
    """Sequence gaps found: a message that skipped numbers, or `info` saying more was sent
    than arrived."""
    missed: int = 0
    """The sequence numbers those gaps skipped."""
    replays: int = 0
    """Replays that filled all they were asked for."""
    replayed_messages: int = 0
    """Messages replays brought back and applied."""
    snapshots: int = 0
    """Snapshots taken as the index, the first one included."""
    snapshot_events: int = 0
    """Events of those snapshots."""
    incarnations: int = 0
    """New lives of the publisher seen (a new incarnation, or the sequence going back)."""
    malformed: int = 0
    """Messages and replies refused: not the format, or not the replay protocol."""
    skipped_events: int = 0
    """Events of well-formed messages the index cannot take (an unknown type, no key...)."""
    failed_requests: int = 0
    """Requests to the replay socket that failed (each is asked again)."""
    timeouts: int = 0
    """Those that failed because no answer came in time."""
    overflowed: int = 0
    """Live messages dropped because too many were held during a recovery."""
    incomplete: int = 0
    """Times the index was rebuilt from the stream alone, incomplete."""
    convergences: int = 0
    """Times the index came back in sync: after the start, and after each incident."""

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            **{
                field.name: getattr(self, field.name) + getattr(other, field.name)
                for field in dataclasses.fields(self)
            }
        )

    def as_dict(self) -> dict[str, int]:
        """The counters by name, as `--stats` writes them."""
        return dataclasses.asdict(self)


class RecoveryKind(str, enum.Enum):
    """What a `Recovery` tells. A `str` too: `kind == "gap"` holds."""

    GAP = "gap"
    """Sequences are missing: a recovery starts."""
    REPLAY = "replay"
    """A replay filled the gap."""
    SNAPSHOT = "snapshot"
    """A snapshot is the index now."""
    INCARNATION = "incarnation"
    """The publisher restarted, or another took over."""
    INCOMPLETE = "incomplete"
    """The index is rebuilt from the stream alone, incomplete."""
    IN_SYNC = "in_sync"
    """The index is complete and follows the stream again."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


@dataclasses.dataclass(frozen=True)
class Recovery:
    """Something that happened to a publisher's index beyond applying the stream in order."""

    publisher: str
    """The publisher's name: its PUB endpoint."""
    kind: RecoveryKind
    detail: str
    """What happened, in words."""
    sequence: int | None
    """The last sequence the index holds after it (None: no index yet, or one that holds no
    message yet: the publisher's first message is 0)."""
    replaced: bool
    """The index was replaced whole (a snapshot, a replay from 0, a rebuild): whatever was
    derived from earlier events must be derived again from `objects()`."""
    seconds: float | None = None
    """For `in_sync`: how long it took, from the start or from the incident."""


EventCallback = Callable[[str, int, Event], None]
"""Called with (publisher, sequence, event) for each event applied to a publisher's index from
its stream or a replay, in order. A snapshot's events are not passed one by one: its
`Recovery` says the index was replaced."""
RecoveryCallback = Callable[[Recovery], None]
"""Called with each `Recovery`."""


class Phase(enum.Enum):
    """Where the recovery of one publisher stands."""

    LIVE = "live"
    ASKING = "asking"
    WAITING = "waiting"


class Purpose(enum.Enum):
    """Why an `info` is asked."""

    RECOVER = "recover"
    """To know where the publisher stands before a replay or a snapshot."""
    CHECK = "check"
    """To know whether a quiet stream lost its end, or a reconnection is a restart."""


class Ask:
    """A request to the replay socket under way."""

    name = ""

    def __init__(self, now: float) -> None:
        self.deadline = now + ASK_TIMEOUT


class AskInfo(Ask):
    name = "info"

    def __init__(self, now: float, purpose: Purpose) -> None:
        super().__init__(now)
        self.purpose = purpose


class AskReplay(Ask):
    name = "replay"

    def __init__(self, now: float, start: int, info: Info, full: bool) -> None:
        super().__init__(now)
        self.start, self.info, self.full = start, info, full
        # (sequence, events; None when malformed), as they come.
        self.messages: list[tuple[int, tuple[Any, ...] | None]] = []


class AskSnapshot(Ask):
    name = "snapshot"

    def __init__(self, now: float) -> None:
        super().__init__(now)
        self.index = Index()
        self.events = 0


class FollowerState:
    """The index of one publisher and the state of its recovery, without sockets: the
    stream's messages go to on_stream, the replay socket's replies to on_reply, the time to
    tick; the requests to send wait in `outbox`, and `reset_dealer` asks for a fresh replay
    socket (a reply to an abandoned request must not be taken for the next one's).

    `replay` says whether the publisher has a replay socket. `note` receives what happens, in
    words (by default the `mooncake_kv_events` logger at INFO); `on_event` and `on_recovery`
    are called as `EventCallback` and `RecoveryCallback` say; an exception they raise is
    logged and ignored."""

    def __init__(
        self,
        name: str,
        replay: bool = True,
        now: float = 0.0,
        note: Callable[[str], None] | None = None,
        on_event: EventCallback | None = None,
        on_recovery: RecoveryCallback | None = None,
    ) -> None:
        self.name, self.replay = name, replay
        self.note: Callable[[str], None] = note or (lambda text: log.info("%s: %s", name, text))
        self.on_event, self.on_recovery = on_event, on_recovery
        self.index = Index()
        self.incarnation: int | None = None
        # The sequence of the next stream message the index takes: it holds every one below
        # (0: none yet, the publisher's first message is 0). None: no index to go on from.
        self.next: int | None = None
        self.stream_last: int | None = None  # the last sequence this life's stream delivered
        self.complete = False  # whether the index is the publisher's state, no part missing
        self.need_full = False  # the recovery under way must rebuild the whole index
        self.phase = Phase.LIVE
        self.asked: AskInfo | AskReplay | AskSnapshot | None = None
        self.held: collections.deque[tuple[int, tuple[Any, ...]]] = collections.deque()
        self.outbox: list[list[bytes]] = []
        self.reset_dealer = False
        self.info: Info | None = None
        self.suspect: int | None = None  # a next_sequence beyond the index a check saw
        self.retry_at, self.backoff = 0.0, RETRY_FIRST
        self.started = now
        self.active_at = self.checked_at = now
        self.converged_at: float | None = None
        self.recovery_since: float | None = None
        self.last_convergence = self.longest_convergence = 0.0
        self.heard_at: float | None = None  # the last stream message
        self.replied_at: float | None = None  # the last reply of the replay socket
        self.failing: str | None = None  # why requests keep failing, until one succeeds
        self.restarted = False  # a restart the stream showed, the info about it not yet in
        self.counters = Counters()

    @property
    def last(self) -> int | None:
        """The last sequence the index holds: None when it holds none, or there is none."""
        return None if not self.next else self.next - 1

    # Callbacks.

    def recovered(
        self,
        kind: RecoveryKind,
        detail: str,
        replaced: bool = False,
        seconds: float | None = None,
    ) -> None:
        """Tells on_recovery, if any."""
        if self.on_recovery is not None:
            try:
                self.on_recovery(Recovery(self.name, kind, detail, self.last, replaced, seconds))
            except Exception:
                log.exception("%s: the recovery callback failed", self.name)

    # The stream.

    def start(self, now: float) -> None:
        """Starts following: with a replay socket, by asking where the publisher stands."""
        if self.replay:
            self.recover(now, full=True, why="start")

    def on_stream(self, frames: list[bytes], now: float) -> None:
        """Takes a message of the stream (SUB) socket."""
        try:
            sequence, events = decode_message(frames)
        except ProtocolError as e:
            self.malformed(f"skipped a malformed message: {e}")
            return
        self.active_at = self.heard_at = self.checked_at = now
        self.suspect = None
        if self.stream_last is not None and sequence <= self.stream_last:
            # One life of a publisher sends increasing sequences: this is another one.
            self.counters.incarnations += 1
            why = f"sequence {sequence} after {self.stream_last}: the publisher restarted"
            self.note(why)
            self.stream_last = sequence
            self.held.clear()
            if self.replay:
                self.recovered(RecoveryKind.INCARNATION, why)
                self.restarted = True  # the info that follows shows the same new life
                self.held.append((sequence, events))
                self.recover(now, full=True, why="restart")
            else:
                self.index, self.next = Index(), sequence
                self.complete = sequence == 0  # a new life starts at 0
                self.recovered(RecoveryKind.INCARNATION, why, replaced=True)
                self.take(sequence, events, now)
            return
        self.stream_last = sequence
        if self.phase is Phase.LIVE:
            self.take(sequence, events, now)
            return
        self.held.append((sequence, events))
        if len(self.held) > MAX_HELD:
            self.held.popleft()
            self.counters.overflowed += 1
            self.need_full = True

    def take(self, sequence: int, events: tuple[Any, ...], now: float) -> None:
        """Applies a live message in order; a gap starts a recovery."""
        following = self.next
        if following is not None:
            if sequence < following:
                self.counters.discarded += 1  # a snapshot or a replay had it already
                return
            if sequence != following:
                self.counters.gaps += 1
                self.counters.missed += sequence - following
                missing = f"sequences {following}..{sequence - 1} missing"
                self.recovered(RecoveryKind.GAP, missing)
                if self.replay:
                    self.held.appendleft((sequence, events))
                    self.recover(now, why=missing)
                    return
                self.note(f"{missing}: rebuilding from the stream, incomplete")
                self.index, self.complete = Index(), False
                self.counters.incomplete += 1
                self.recovered(
                    RecoveryKind.INCOMPLETE, f"{missing}: rebuilding from the stream", replaced=True
                )
        elif not self.replay:
            # The first message ever: complete only when nothing came before it, 0 being a
            # publisher's first.
            self.complete = sequence == 0
            if self.complete and self.converged_at is None:
                self.converged_at = now
                self.converged(now - self.started)
                self.recovered(RecoveryKind.IN_SYNC, "converged", seconds=now - self.started)
        self.counters.messages += 1
        self.counters.events += self.apply(self.index, events, sequence)
        self.next = sequence + 1

    def apply(self, index: Index, events: tuple[Any, ...], sequence: int) -> int:
        """Applies a message's events to `index` and returns how many it applied, counting
        those it skipped; those applied to the follower's own index go to on_event too."""
        on_event = self.on_event
        if on_event is None or index is not self.index:
            skipped = index.apply_events(events)
            if skipped:
                self.skipped(events, skipped)
            return len(events) - skipped
        applied = 0
        for raw in events:
            try:
                event = event_of(raw)
            except ProtocolError as e:
                self.skipped(e, 1)
                continue
            index.apply(event)
            applied += 1
            try:
                on_event(self.name, sequence, event)
            except Exception:
                log.exception("%s: the event callback failed", self.name)
        return applied

    def skipped(self, events: tuple[Any, ...] | ProtocolError, count: int) -> None:
        """Counts `count` events the index skipped (of `events`, or the one `events` says
        why of), and says why for the first ones."""
        noted = self.counters.skipped_events
        self.counters.skipped_events += count
        if noted >= MAX_NOTES:
            return
        if isinstance(events, ProtocolError):
            self.note(f"skipped an event: {events}")
            return
        for raw in events:
            try:
                event_of(raw)
            except ProtocolError as e:
                self.note(f"skipped an event: {e}")
                noted += 1
                if noted >= MAX_NOTES:
                    return

    def malformed(self, text: str) -> None:
        self.counters.malformed += 1
        if self.counters.malformed <= MAX_NOTES:
            more = "" if self.counters.malformed < MAX_NOTES else " (further ones are only counted)"
            self.note(text + more)

    # Recovery.

    def recover(self, now: float, full: bool = False, why: str = "") -> None:
        """Asks where the publisher stands, holding the stream back until it is known."""
        self.need_full = self.need_full or full
        if self.recovery_since is None:
            self.recovery_since = now
        if why and why not in ("start", "retry"):
            self.note(f"{why}: recovering")
        self.ask(AskInfo(now, Purpose.RECOVER), [b"", b"info"])

    def ask(self, request: AskInfo | AskReplay | AskSnapshot, frames: list[bytes]) -> None:
        if self.asked is not None:
            self.reset_dealer = True
        self.asked, self.phase = request, Phase.ASKING
        self.outbox.append(frames)

    def checking(self) -> bool:
        """Whether the request under way is a check, which holds nothing back."""
        request = self.asked
        return isinstance(request, AskInfo) and request.purpose is Purpose.CHECK

    def on_reply(self, frames: list[bytes], now: float) -> None:
        """Takes a reply of the replay (DEALER) socket."""
        self.replied_at = now
        request = self.asked
        if request is None:
            return  # a late answer to an abandoned request on a socket not yet replaced
        rest = frames[1:]
        if isinstance(request, AskReplay) and len(rest) == 3:
            rest = rest[1:]  # the topic frame of a replayed message (vLLM 0.26 and after)
        if len(rest) != 2 or frames[0] != b"":
            self.malformed(f"a reply of {len(frames)} frames from the replay socket")
            self.failed(now, "the replay socket's reply is not the protocol's")
            return
        verb, body = rest
        request.deadline = now + ASK_TIMEOUT
        if verb == b"error":
            self.on_error(request, body.decode("utf-8", "replace"), now)
        elif isinstance(request, AskInfo) and verb == b"info":
            try:
                info = decode_info(body)
            except ProtocolError as e:
                self.malformed(str(e))
                self.failed(now, "a malformed info reply")
                return
            self.on_info(info, request, now)
        elif isinstance(request, AskReplay) and len(verb) == 8:
            self.active_at = now
            if verb == END_OF_REPLAY and body == b"":
                self.end_replay(request, now)
                return
            sequence = int.from_bytes(verb, "big")
            try:
                request.messages.append((sequence, decode_batch(body)))
            except ProtocolError as e:
                self.malformed(f"a malformed replayed message: {e}")
                request.messages.append((sequence, None))
        elif isinstance(request, AskSnapshot) and verb == b"snapshot":
            self.active_at = now
            try:
                events = decode_batch(body)
            except ProtocolError as e:
                self.malformed(f"a malformed snapshot batch: {e}")
                self.failed(now, "the snapshot is damaged")
                return
            request.events += len(events)
            self.counters.snapshot_events += self.apply(request.index, events, 0)
        elif isinstance(request, AskSnapshot) and verb == b"snapshot-end":
            self.end_snapshot(request, body, now)
        else:
            self.malformed(f"an unexpected {verb[:16]!r} reply to {request.name}")
            self.failed(now, "the replay socket's reply is not the protocol's")

    def on_error(self, request: Ask, text: str, now: float) -> None:
        if isinstance(request, AskSnapshot) and "not available" in text and self.info is not None:
            self.counters.failed_requests += 1
            self.note(f"no snapshots here ({text})")
            self.info = self.info._replace(snapshots=False)
            self.without_snapshot(self.info, now)
        else:
            self.failed(now, f"the replay socket says: {text}")

    def on_info(self, info: Info, request: AskInfo, now: float) -> None:
        self.info, self.asked, self.failing = info, None, None
        restarted, self.restarted = self.restarted, False
        old = self.incarnation
        new_life = old is not None and info.incarnation != old
        if old is not None and new_life:
            why = f"incarnation {info.incarnation:#x} instead of {old:#x}: the publisher restarted"
            self.note(why)
            if not restarted:
                self.counters.incarnations += 1
                self.recovered(RecoveryKind.INCARNATION, why)
                # What the stream delivers from now on is the new life's, numbered from 0
                # again: not a restart of its own (the Rust follower does the same).
                self.stream_last = None
            # Messages carry no incarnation: what was held may be the old life's. The new
            # life's that are forgotten here show as a gap after the snapshot, and are replayed.
            self.counters.discarded += len(self.held)
            self.held.clear()
        elif self.held and self.held[0][0] > info.next_sequence:
            # Numbered beyond what this life sent (info lags a sent message by one at most:
            # message next_sequence may be on its way already): the old life's, still queued
            # when it ended. A new life's message taken for one is missed, and shows as a gap.
            self.counters.discarded += len(self.held)
            self.held.clear()
        following = self.next
        if request.purpose is Purpose.CHECK and following is None and not new_life:
            self.go_live(now)  # following the stream from the next message: nothing to compare
            return
        # A next_sequence at or below the index's means nothing is missing (info may lag a
        # snapshot's next_sequence, read a moment later): no restart, no loss.
        if following is not None and not (self.need_full or new_life):
            if info.next_sequence <= following or (self.held and self.held[0][0] == following):
                self.go_live(now)  # nothing missing, or the held messages go on from the index
                return
            if request.purpose is Purpose.CHECK:
                if not self.held and self.suspect is None:
                    # Those messages may still be on their way: lost only if the stream is
                    # still short at the next check, with nothing come meanwhile.
                    self.suspect = info.next_sequence
                    self.go_live(now)
                    return
                # The end of a burst was lost: no later message would have shown it.
                self.suspect = None
                upto = self.held[0][0] if self.held else info.next_sequence
                self.counters.gaps += 1
                self.counters.missed += upto - following
                self.recovery_since = now
                missing = f"sequences {following}..{upto - 1} missing at the end of a burst"
                self.note(missing)
                self.recovered(RecoveryKind.GAP, missing)
            # The replay socket holds from oldest_sequence on; holding nothing, it says its
            # next_sequence, beyond the index here.
            if info.oldest_sequence <= following:
                self.ask_replay(now, following, info)
                return
            self.note(
                f"the replay socket holds from {info.oldest_sequence} only: "
                "rebuilding the whole index"
            )
        self.rebuild(info, now)

    def rebuild(self, info: Info, now: float) -> None:
        if self.recovery_since is None:
            self.recovery_since = now  # a check found a restart
        if info.snapshots:
            self.ask(AskSnapshot(now), [b"", b"snapshot"])
        else:
            self.without_snapshot(info, now)

    def without_snapshot(self, info: Info, now: float) -> None:
        if info.next_sequence == 0:
            self.install(Index(), 0, info.incarnation, now)  # nothing sent yet
        elif info.oldest_sequence == 0:
            # It holds every message since its first, 0: they rebuild the whole index.
            self.ask_replay(now, 0, info, full=True)
        else:
            self.incomplete(
                info.incarnation,
                now,
                f"no snapshots and the replay socket holds from {info.oldest_sequence} only",
            )

    def incomplete(self, incarnation: int | None, now: float, why: str) -> None:
        self.note(f"{why}: following the stream from here, the index incomplete")
        self.counters.incomplete += 1
        self.index, self.next, self.incarnation = Index(), None, incarnation
        self.complete = self.need_full = False
        self.recovered(RecoveryKind.INCOMPLETE, why, replaced=True)
        self.go_live(now)

    def ask_replay(self, now: float, start: int, info: Info, full: bool = False) -> None:
        self.ask(AskReplay(now, start, info, full), [b"", start.to_bytes(8, "big")])

    def end_replay(self, request: AskReplay, now: float) -> None:
        self.asked, self.failing = None, None
        index = Index() if request.full else self.index
        # The sequence the index takes next, as the replay goes on.
        wanted, hole = request.start, False
        for sequence, events in request.messages:
            if sequence < wanted:
                continue
            if sequence != wanted or events is None:
                hole = True
                break
            self.counters.messages += 1
            self.counters.events += self.apply(index, events, sequence)
            self.counters.replayed_messages += 1
            wanted = sequence + 1
        self.counters.replays += not hole
        if request.full:
            if hole:
                self.incomplete(
                    request.info.incarnation, now, f"the replay from 0 misses sequence {wanted}"
                )
            else:
                self.install(index, wanted, request.info.incarnation, now, how=RecoveryKind.REPLAY)
            return
        self.next = wanted
        if hole:
            # Never sent (dropped before encoding) or no longer held: only a rebuild helps.
            self.note(f"the replay misses sequence {wanted}: rebuilding the whole index")
            self.need_full = True
            self.rebuild(request.info, now)
        else:
            self.recovered(RecoveryKind.REPLAY, f"sequences {request.start}..{wanted - 1} replayed")
            self.go_live(now)

    def end_snapshot(self, request: AskSnapshot, body: bytes, now: float) -> None:
        try:
            end = decode_map(body, "a snapshot-end")
            next_sequence = number(end, "next_sequence", "a snapshot-end")
            incarnation = number(end, "incarnation", "a snapshot-end")
            promised = end.get("events")
        except ProtocolError as e:
            self.malformed(str(e))
            self.failed(now, "a malformed snapshot-end")
            return
        if type(promised) is int and promised != request.events:
            self.failed(now, f"the snapshot announced {promised} events, {request.events} came")
            return
        self.asked, self.failing = None, None
        self.counters.snapshots += 1
        self.install(request.index, next_sequence, incarnation, now)

    def install(
        self,
        index: Index,
        next_sequence: int,
        incarnation: int | None,
        now: float,
        how: RecoveryKind = RecoveryKind.SNAPSHOT,
    ) -> None:
        """The index is the publisher's state before message `next_sequence`: the held
        messages numbered from it on go on."""
        self.index, self.next, self.incarnation = index, next_sequence, incarnation
        self.complete, self.need_full = True, False
        if how is RecoveryKind.SNAPSHOT:
            detail = f"{len(index)} objects, next sequence {next_sequence}"
        else:
            detail = f"rebuilt by a replay from sequence 0, next sequence {next_sequence}"
        self.recovered(how, detail, replaced=True)
        self.go_live(now)

    def go_live(self, now: float) -> None:
        self.phase, self.asked, self.backoff = Phase.LIVE, None, RETRY_FIRST
        self.checked_at = now
        while self.held and self.phase is Phase.LIVE:
            sequence, events = self.held.popleft()
            self.take(sequence, events, now)
        if self.phase is Phase.LIVE and self.complete:
            if self.converged_at is None:
                self.converged_at = now
                self.converged(now - self.started)
                self.note(
                    f"converged in {1e3 * (now - self.started):.1f} ms, "
                    f"{len(self.index)} objects, next sequence {self.next}"
                )
                self.recovered(RecoveryKind.IN_SYNC, "converged", seconds=now - self.started)
            elif self.recovery_since is not None:
                took = now - self.recovery_since
                self.converged(took)
                self.note(f"recovered in {1e3 * took:.1f} ms")
                self.recovered(RecoveryKind.IN_SYNC, "recovered", seconds=took)
            self.recovery_since = None

    def converged(self, took: float) -> None:
        self.counters.convergences += 1
        self.last_convergence = took
        self.longest_convergence = max(self.longest_convergence, took)

    def failed(self, now: float, why: str) -> None:
        checking = self.checking()
        self.asked, self.reset_dealer = None, True
        self.counters.failed_requests += 1
        self.failing = why
        if checking:
            self.go_live(now)  # a check that fails loses nothing: the next one asks again
            return
        self.note(f"{why}: asking again in {self.backoff:.1f} s")
        self.phase, self.retry_at = Phase.WAITING, now + self.backoff
        self.backoff = min(2 * self.backoff, RETRY_MAX)

    def on_reconnect(self, now: float) -> None:
        """The stream socket connected again: the publisher may be another life of it."""
        if self.replay and self.phase is Phase.LIVE:
            self.ask(AskInfo(now, Purpose.CHECK), [b"", b"info"])

    def tick(self, now: float) -> None:
        """Lets time pass: a request times out, a retry is due, a quiet stream is checked."""
        request = self.asked
        if self.phase is Phase.ASKING and request is not None and now >= request.deadline:
            self.counters.timeouts += 1
            self.failed(now, f"no answer to {request.name} in {ASK_TIMEOUT:g} s")
        elif self.phase is Phase.WAITING and now >= self.retry_at:
            self.recover(now, why="retry")
        elif self.phase is Phase.LIVE and self.replay and now - self.checked_at >= CHECK_EVERY:
            self.checked_at = now
            self.ask(AskInfo(now, Purpose.CHECK), [b"", b"info"])

    def in_sync(self) -> bool:
        """Complete and following the stream: no recovery under way (a check may be)."""
        return self.complete and (
            self.phase is Phase.LIVE or (self.phase is Phase.ASKING and self.checking())
        )

    def summary(self) -> str:
        """The counters in one line, as the indexer prints them."""
        c = self.counters
        converged = (
            "not yet"
            if self.converged_at is None
            else f"{1e3 * (self.converged_at - self.started):.1f} ms"
        )
        sync = "in sync" if self.in_sync() else "complete" if self.complete else "INCOMPLETE"
        return (
            f"{self.name}: {len(self.index)} objects, next sequence {self.next}, "
            f"{sync}, "
            f"converged in {converged} (longest {1e3 * self.longest_convergence:.1f} ms); "
            f"gaps {c.gaps} ({c.missed} numbers), replays {c.replays} "
            f"({c.replayed_messages} messages), snapshots {c.snapshots} "
            f"({c.snapshot_events} events), incarnations {c.incarnations}, "
            f"malformed {c.malformed}, skipped events {c.skipped_events}, "
            f"failed requests {c.failed_requests}"
        )

    def stats(self) -> dict[str, int | float | bool | str | None]:
        """The counters and the state, as the indexer's --stats writes them."""

        def ms(seconds: float) -> float:
            return round(1e3 * seconds, 1)

        stats: dict[str, int | float | bool | str | None] = dict(self.counters.as_dict())
        stats.update(
            publisher=self.name,
            objects=len(self.index),
            last_sequence=self.last,
            next_sequence=self.next,
            incarnation=self.incarnation,
            complete=self.complete,
            in_sync=self.in_sync(),
            converged_ms=(
                None if self.converged_at is None else ms(self.converged_at - self.started)
            ),
            last_convergence_ms=ms(self.last_convergence),
            longest_convergence_ms=ms(self.longest_convergence),
        )
        return stats
