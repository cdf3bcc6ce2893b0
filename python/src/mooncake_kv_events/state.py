"""The follower of one publisher as a state machine without sockets: its index, and the
recovery protocol of docs/subscribers.md ("The recovery procedure") that keeps the index right
through loss, restarts and malformed input. `Follower` (follower.py) drives one per publisher
with real sockets; tests drive it by hand."""

from __future__ import annotations

import collections
import logging
from typing import Any, Callable, NamedTuple

from .index import Index
from .wire import (
    END_OF_REPLAY,
    Event,
    Info,
    Malformed,
    decode_batch,
    decode_info,
    decode_map,
    decode_message,
    number,
    parse_event,
)

__all__ = [
    "ASK_TIMEOUT",
    "CHECK_EVERY",
    "COUNTERS",
    "MAX_HELD",
    "RETRY_FIRST",
    "RETRY_MAX",
    "Ask",
    "EventCallback",
    "FollowerState",
    "Recovery",
    "RecoveryCallback",
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
# Malformed messages described before only counting them.
MAX_NOTES = 10

COUNTERS = (
    "messages",
    "events",
    "discarded",
    "gaps",
    "missed",
    "replays",
    "replayed_messages",
    "snapshots",
    "snapshot_events",
    "incarnations",
    "malformed",
    "skipped_events",
    "failed_requests",
    "timeouts",
    "overflowed",
    "incomplete",
    "convergences",
)
"""The counters of kv-events mirror's follower (docs/subscribers.md, "The counters"), and a
few more: missed, snapshot_events, timeouts, incomplete."""


class Recovery(NamedTuple):
    """Something that happened to a publisher's index beyond applying the stream in order."""

    publisher: str
    """The publisher's name: its PUB endpoint."""
    kind: str
    """`gap` (sequences missing, a recovery starts), `replay` (a replay filled it),
    `snapshot` (a snapshot is the index now), `incarnation` (the publisher restarted, or
    another took over), `incomplete` (the index is rebuilt from the stream alone, incomplete)
    or `in_sync` (complete and following the stream again)."""
    detail: str
    """What happened, in words."""
    sequence: int | None
    """The last sequence the index holds after it (None: none yet)."""
    replaced: bool
    """The index was replaced whole (a snapshot, a replay from 1, a rebuild): whatever was
    derived from earlier events must be derived again from `objects()`."""
    seconds: float | None = None
    """For `in_sync`: how long it took, from the start or from the incident."""


EventCallback = Callable[[str, int, Event], None]
"""Called with (publisher, sequence, event) for each event applied to a publisher's index from
its stream or a replay, in order. A snapshot's events are not passed one by one: its
`Recovery` says the index was replaced."""
RecoveryCallback = Callable[[Recovery], None]
"""Called with each `Recovery`."""


class Ask:
    """A request to the replay socket under way."""

    def __init__(
        self,
        kind: str,
        now: float,
        purpose: str = "recover",
        start: int | None = None,
        full: bool = False,
        incarnation: int | None = None,
    ) -> None:
        self.kind, self.purpose = kind, purpose
        self.deadline = now + ASK_TIMEOUT
        self.start, self.full, self.incarnation = start, full, incarnation
        # A replay's (sequence, events or None when malformed).
        self.messages: list[tuple[int, list[Any] | None]] = []
        self.index = Index()  # a snapshot's objects
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
        self.last: int | None = None  # the index holds the stream up to here
        self.stream_last: int | None = None  # the last sequence the stream socket delivered
        self.complete = False  # whether the index is the publisher's state, no part missing
        self.need_full = False  # the recovery under way must rebuild the whole index
        self.state = "live"  # live | asking | waiting
        self.asked: Ask | None = None
        self.held: collections.deque[tuple[int, list[Any]]] = collections.deque()
        self.outbox: list[list[bytes]] = []
        self.reset_dealer = False
        self.info: Info | None = None
        self.suspect: int | None = None  # a last_sequence beyond the index a check saw
        self.retry_at, self.backoff = 0.0, RETRY_FIRST
        self.started = now
        self.active_at = self.checked_at = now
        self.converged_at: float | None = None
        self.recovery_since: float | None = None
        self.last_convergence = self.longest_convergence = 0.0
        self.heard_at: float | None = None  # the last stream message
        self.restarted = False  # a restart the stream showed, the info about it not yet in
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    # Callbacks.

    def recovered(
        self, kind: str, detail: str, replaced: bool = False, seconds: float | None = None
    ) -> None:
        """Tells on_recovery, if any."""
        if self.on_recovery is not None:
            try:
                self.on_recovery(Recovery(self.name, kind, detail, self.last, replaced, seconds))
            except Exception:
                log.exception("%s: the recovery callback failed", self.name)

    def emit(self, sequence: int, event: Event) -> None:
        assert self.on_event is not None
        try:
            self.on_event(self.name, sequence, event)
        except Exception:
            log.exception("%s: the event callback failed", self.name)

    # The stream.

    def start(self, now: float) -> None:
        """Starts following: with a replay socket, by asking where the publisher stands."""
        if self.replay:
            self.recover(now, full=True, why="start")

    def on_stream(self, frames: list[bytes], now: float) -> None:
        """Takes a message of the stream (SUB) socket."""
        try:
            sequence, events = decode_message(frames)
        except Malformed as e:
            self.malformed(f"skipped a malformed message: {e}")
            return
        self.active_at = self.heard_at = self.checked_at = now
        self.suspect = None
        if self.stream_last is not None and sequence <= self.stream_last:
            # One life of a publisher sends increasing sequences: this is another one.
            self.counters["incarnations"] += 1
            why = f"sequence {sequence} after {self.stream_last}: the publisher restarted"
            self.note(why)
            self.stream_last = sequence
            self.held.clear()
            if self.replay:
                self.recovered("incarnation", why)
                self.restarted = True  # the info that follows shows the same new life
                self.held.append((sequence, events))
                self.recover(now, full=True, why="restart")
            else:
                self.index, self.last = Index(), sequence - 1
                self.complete = sequence == 1
                self.recovered("incarnation", why, replaced=True)
                self.take(sequence, events, now)
            return
        self.stream_last = sequence
        if self.state == "live":
            self.take(sequence, events, now)
            return
        self.held.append((sequence, events))
        if len(self.held) > MAX_HELD:
            self.held.popleft()
            self.counters["overflowed"] += 1
            self.need_full = True

    def take(self, sequence: int, events: list[Any], now: float) -> None:
        """Applies a live message in order; a gap starts a recovery."""
        if self.last is not None:
            if sequence <= self.last:
                self.counters["discarded"] += 1  # a snapshot or a replay had it already
                return
            if sequence != self.last + 1:
                self.counters["gaps"] += 1
                self.counters["missed"] += sequence - self.last - 1
                missing = f"sequences {self.last + 1}..{sequence - 1} missing"
                self.recovered("gap", missing)
                if self.replay:
                    self.held.appendleft((sequence, events))
                    self.recover(now, why=missing)
                    return
                self.note(f"{missing}: rebuilding from the stream, incomplete")
                self.index, self.complete = Index(), False
                self.counters["incomplete"] += 1
                self.recovered(
                    "incomplete", f"{missing}: rebuilding from the stream", replaced=True
                )
        elif not self.replay:
            # The first message ever: complete only when nothing came before it.
            self.complete = sequence == 1
            if self.complete and self.converged_at is None:
                self.converged_at = now
                self.converged(now - self.started)
                self.recovered("in_sync", "converged", seconds=now - self.started)
        self.apply(self.index, events, sequence=sequence)
        self.last = sequence

    def apply(
        self, index: Index, events: list[Any], counted: str = "events", sequence: int = 0
    ) -> None:
        """Applies a message's events; counts them, in `snapshot_events` for a snapshot's.
        Those applied to the follower's own index go to on_event too."""
        counters = self.counters
        if counted == "events":
            counters["messages"] += 1
        emit = self.on_event is not None and index is self.index
        apply = index.apply
        applied = 0
        for raw in events:
            try:
                event = parse_event(raw)
            except Malformed as e:
                counters["skipped_events"] += 1
                if counters["skipped_events"] <= MAX_NOTES:
                    self.note(f"skipped an event: {e}")
                continue
            apply(event)
            applied += 1
            if emit:
                self.emit(sequence, event)
        counters[counted] += applied

    def malformed(self, text: str) -> None:
        self.counters["malformed"] += 1
        if self.counters["malformed"] <= MAX_NOTES:
            self.note(
                text
                + (
                    ""
                    if self.counters["malformed"] < MAX_NOTES
                    else " (further ones are only counted)"
                )
            )

    # Recovery.

    def recover(self, now: float, full: bool = False, why: str = "") -> None:
        """Asks where the publisher stands, holding the stream back until it is known."""
        self.need_full = self.need_full or full
        if self.recovery_since is None:
            self.recovery_since = now
        if why and why not in ("start", "retry"):
            self.note(f"{why}: recovering")
        self.ask(Ask("info", now), [b"", b"info"])

    def ask(self, request: Ask, frames: list[bytes]) -> None:
        if self.asked is not None:
            self.reset_dealer = True
        self.asked, self.state = request, "asking"
        self.outbox.append(frames)

    def on_reply(self, frames: list[bytes], now: float) -> None:
        """Takes a reply of the replay (DEALER) socket."""
        request = self.asked
        if request is None:
            return  # a late answer to an abandoned request on a socket not yet replaced
        rest = frames[1:]
        if request.kind == "replay" and len(rest) == 3:
            rest = rest[1:]  # the topic frame of a replayed message (vLLM 0.26 and after)
        if len(rest) != 2 or frames[0] != b"":
            self.malformed(f"a reply of {len(frames)} frames from the replay socket")
            self.failed(now, "the replay socket's reply is not the protocol's")
            return
        verb, body = rest
        request.deadline = now + ASK_TIMEOUT
        if verb == b"error":
            self.on_error(body.decode("utf-8", "replace"), now)
        elif request.kind == "info" and verb == b"info":
            try:
                info = decode_info(body)
            except Malformed as e:
                self.malformed(str(e))
                self.failed(now, "a malformed info reply")
                return
            self.on_info(info, request, now)
        elif request.kind == "replay" and len(verb) == 8:
            self.active_at = now
            if verb == END_OF_REPLAY and body == b"":
                self.end_replay(request, now)
                return
            try:
                request.messages.append((int.from_bytes(verb, "big"), decode_batch(body)))
            except Malformed as e:
                self.malformed(f"a malformed replayed message: {e}")
                request.messages.append((int.from_bytes(verb, "big"), None))
        elif request.kind == "snapshot" and verb == b"snapshot":
            self.active_at = now
            try:
                events = decode_batch(body)
            except Malformed as e:
                self.malformed(f"a malformed snapshot batch: {e}")
                self.failed(now, "the snapshot is damaged")
                return
            request.events += len(events)
            self.apply(request.index, events, counted="snapshot_events")
        elif request.kind == "snapshot" and verb == b"snapshot-end":
            self.end_snapshot(request, body, now)
        else:
            self.malformed(f"an unexpected {verb[:16]!r} reply to {request.kind}")
            self.failed(now, "the replay socket's reply is not the protocol's")

    def on_error(self, text: str, now: float) -> None:
        request = self.asked
        assert request is not None
        if request.kind == "snapshot" and "not available" in text and self.info is not None:
            self.counters["failed_requests"] += 1
            self.note(f"no snapshots here ({text})")
            self.info = self.info._replace(snapshots=False)
            self.without_snapshot(self.info, now)
        else:
            self.failed(now, f"the replay socket says: {text}")

    def on_info(self, info: Info, request: Ask, now: float) -> None:
        self.info, self.asked = info, None
        restarted, self.restarted = self.restarted, False
        new_life = self.incarnation is not None and info.incarnation != self.incarnation
        if new_life:
            assert self.incarnation is not None
            why = (
                f"incarnation {info.incarnation:#x} instead of {self.incarnation:#x}: "
                "the publisher restarted"
            )
            self.note(why)
            if not restarted:
                self.counters["incarnations"] += 1
                self.recovered("incarnation", why)
            # Messages carry no incarnation: what was held may be the old life's. The new
            # life's that are forgotten here show as a gap after the snapshot, and are replayed.
            self.counters["discarded"] += len(self.held)
            self.held.clear()
        elif self.held and self.held[0][0] > info.last_sequence + 1:
            # Numbered beyond what this life sent (info lags a sent message by one at most):
            # the old life's, still queued when it ended. A new life's message taken for one
            # is missed, and shows as a gap.
            self.counters["discarded"] += len(self.held)
            self.held.clear()
        if request.purpose == "check" and self.last is None and not new_life:
            self.go_live(now)  # following the stream from the next message: nothing to compare
            return
        # A last_sequence at or below the index's means nothing is missing (info may lag a
        # snapshot's S, read a moment later): no restart, no loss.
        if not (self.need_full or new_life or self.last is None):
            if info.last_sequence <= self.last or (self.held and self.held[0][0] == self.last + 1):
                self.go_live(now)  # nothing missing, or the held messages go on from the index
                return
            if request.purpose == "check":
                if not self.held and self.suspect is None:
                    # Those messages may still be on their way: lost only if the stream is
                    # still short at the next check, with nothing come meanwhile.
                    self.suspect = info.last_sequence
                    self.go_live(now)
                    return
                # The end of a burst was lost: no later message would have shown it.
                self.suspect = None
                upto = self.held[0][0] if self.held else info.last_sequence + 1
                self.counters["gaps"] += 1
                self.counters["missed"] += upto - self.last - 1
                self.recovery_since = now
                missing = f"sequences {self.last + 1}..{upto - 1} missing at the end of a burst"
                self.note(missing)
                self.recovered("gap", missing)
            if 0 < info.oldest_sequence <= self.last + 1:
                self.ask_replay(now, self.last + 1)
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
            self.ask(Ask("snapshot", now, incarnation=info.incarnation), [b"", b"snapshot"])
        else:
            self.without_snapshot(info, now)

    def without_snapshot(self, info: Info, now: float) -> None:
        if info.last_sequence == 0:
            self.install(Index(), 0, info.incarnation, now)  # nothing sent yet
        elif info.oldest_sequence == 1:
            self.ask_replay(now, 1, full=True, incarnation=info.incarnation)
        else:
            self.incomplete(
                info.incarnation,
                now,
                f"no snapshots and the replay socket holds from {info.oldest_sequence} only",
            )

    def incomplete(self, incarnation: int | None, now: float, why: str) -> None:
        self.note(f"{why}: following the stream from here, the index incomplete")
        self.counters["incomplete"] += 1
        self.index, self.last, self.incarnation = Index(), None, incarnation
        self.complete = self.need_full = False
        self.recovered("incomplete", why, replaced=True)
        self.go_live(now)

    def ask_replay(
        self, now: float, start: int, full: bool = False, incarnation: int | None = None
    ) -> None:
        self.ask(
            Ask("replay", now, start=start, full=full, incarnation=incarnation),
            [b"", start.to_bytes(8, "big")],
        )

    def end_replay(self, request: Ask, now: float) -> None:
        self.asked = None
        assert request.start is not None
        index = Index() if request.full else self.index
        last, hole = request.start - 1, False
        for sequence, events in request.messages:
            if sequence <= last:
                continue
            if sequence != last + 1 or events is None:
                hole = True
                break
            self.apply(index, events, sequence=sequence)
            self.counters["replayed_messages"] += 1
            last = sequence
        self.counters["replays"] += not hole
        if request.full:
            if hole:
                self.incomplete(
                    request.incarnation, now, f"the replay from 1 misses sequence {last + 1}"
                )
            else:
                self.install(index, last, request.incarnation, now, how="replay")
            return
        self.last = last
        if hole:
            # Never sent (dropped before encoding) or no longer held: only a rebuild helps.
            self.note(f"the replay misses sequence {last + 1}: rebuilding the whole index")
            self.need_full = True
            assert self.info is not None
            self.rebuild(self.info, now)
        else:
            self.recovered("replay", f"sequences {request.start}..{last} replayed")
            self.go_live(now)

    def end_snapshot(self, request: Ask, body: bytes, now: float) -> None:
        try:
            end = decode_map(body, "a snapshot-end")
            sequence = number(end, "sequence", "a snapshot-end")
            incarnation = number(end, "incarnation", "a snapshot-end")
            promised = end.get("events")
        except Malformed as e:
            self.malformed(str(e))
            self.failed(now, "a malformed snapshot-end")
            return
        if isinstance(promised, int) and promised != request.events:
            self.failed(now, f"the snapshot announced {promised} events, {request.events} came")
            return
        self.asked = None
        self.counters["snapshots"] += 1
        self.install(request.index, sequence, incarnation, now)

    def install(
        self,
        index: Index,
        sequence: int,
        incarnation: int | None,
        now: float,
        how: str = "snapshot",
    ) -> None:
        """The index is the publisher's state at `sequence`: the held messages after it go on."""
        self.index, self.last, self.incarnation = index, sequence, incarnation
        self.complete, self.need_full = True, False
        if how == "snapshot":
            detail = f"{len(index)} objects at sequence {sequence}"
        else:
            detail = f"rebuilt from sequence 1 to {sequence}"
        self.recovered(how, detail, replaced=True)
        self.go_live(now)

    def go_live(self, now: float) -> None:
        self.state, self.asked, self.backoff = "live", None, RETRY_FIRST
        self.checked_at = now
        while self.held and self.state == "live":
            sequence, events = self.held.popleft()
            self.take(sequence, events, now)
        if self.state == "live" and self.complete:
            if self.converged_at is None:
                self.converged_at = now
                self.converged(now - self.started)
                self.note(
                    f"converged in {1e3 * (now - self.started):.1f} ms, "
                    f"{len(self.index)} objects at sequence {self.last}"
                )
                self.recovered("in_sync", "converged", seconds=now - self.started)
            elif self.recovery_since is not None:
                took = now - self.recovery_since
                self.converged(took)
                self.note(f"recovered in {1e3 * took:.1f} ms")
                self.recovered("in_sync", "recovered", seconds=took)
            self.recovery_since = None

    def converged(self, took: float) -> None:
        self.counters["convergences"] += 1
        self.last_convergence = took
        self.longest_convergence = max(self.longest_convergence, took)

    def failed(self, now: float, why: str) -> None:
        request = self.asked
        self.asked, self.reset_dealer = None, True
        self.counters["failed_requests"] += 1
        if request is not None and request.purpose == "check":
            self.go_live(now)  # a check that fails loses nothing: the next one asks again
            return
        self.note(f"{why}: asking again in {self.backoff:.1f} s")
        self.state, self.retry_at = "waiting", now + self.backoff
        self.backoff = min(2 * self.backoff, RETRY_MAX)

    def on_reconnect(self, now: float) -> None:
        """The stream socket connected again: the publisher may be another life of it."""
        if self.replay and self.state == "live":
            self.ask(Ask("info", now, purpose="check"), [b"", b"info"])

    def tick(self, now: float) -> None:
        """Lets time pass: a request times out, a retry is due, a quiet stream is checked."""
        if self.state == "asking" and self.asked is not None and now >= self.asked.deadline:
            self.counters["timeouts"] += 1
            self.failed(now, f"no answer to {self.asked.kind} in {ASK_TIMEOUT:.0f} s")
        elif self.state == "waiting" and now >= self.retry_at:
            self.recover(now, why="retry")
        elif self.state == "live" and self.replay and now - self.checked_at >= CHECK_EVERY:
            self.checked_at = now
            self.ask(Ask("info", now, purpose="check"), [b"", b"info"])

    def in_sync(self) -> bool:
        """Complete and following the stream: no recovery under way (a check may be)."""
        checking = (
            self.state == "asking" and self.asked is not None and self.asked.purpose == "check"
        )
        return self.complete and (self.state == "live" or checking)

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
            f"{self.name}: {len(self.index)} objects, last sequence {self.last}, "
            f"{sync}, "
            f"converged in {converged} (longest {1e3 * self.longest_convergence:.1f} ms); "
            f"gaps {c['gaps']} ({c['missed']} numbers), replays {c['replays']} "
            f"({c['replayed_messages']} messages), snapshots {c['snapshots']} "
            f"({c['snapshot_events']} events), incarnations {c['incarnations']}, "
            f"malformed {c['malformed']}, skipped events {c['skipped_events']}, "
            f"failed requests {c['failed_requests']}"
        )

    def stats(self) -> dict[str, int | float | bool | str | None]:
        """The counters and the state, as the indexer's --stats writes them."""

        def ms(seconds: float) -> float:
            return round(1e3 * seconds, 1)

        stats: dict[str, int | float | bool | str | None] = dict(self.counters)
        stats.update(
            publisher=self.name,
            objects=len(self.index),
            last_sequence=self.last,
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
