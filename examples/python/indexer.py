#!/usr/bin/env python3
"""A self-healing indexer for the Mooncake KV event stream.

It keeps, per publisher, the media each object (backend_id, tenant_id, object_key) is
readable on, and keeps it right through loss. For each publisher it subscribes to the PUB
socket first, then asks the replay socket for a snapshot, holding the live messages back
meanwhile; it installs the snapshot, drops the held messages it already covers and applies
the rest in order. A gap in the sequence is filled by a replay while the publisher still
holds the range, and by a new snapshot when it does not; a new incarnation, or a sequence
going back, is a restart, answered by a snapshot. A publisher without snapshots is rebuilt
by a replay from sequence 1 while it holds it, and otherwise followed from the stream with
its index marked incomplete. Without a replay endpoint it does what it can alone: on a gap
it forgets that publisher's index and rebuilds it from the stream (incomplete).
Malformed messages are counted and skipped, never fatal.

    apt install python3-zmq python3-msgpack     # Debian (scripts/install-deps.sh does it)
    pip install ./examples/python               # or: the mooncake-kv-indexer command
    /usr/bin/python3 examples/python/indexer.py \\
        --publisher tcp://master-0:5557,tcp://master-0:5558 \\
        --publisher tcp://master-1:5557,tcp://master-1:5558 --dump index.jsonl

A master that publishes with CURVE (docs/security.md) wants the master's public key and a key
pair of this indexer's, both as `kv-events keygen` writes them (one server key for every
publisher given):

    /usr/bin/python3 examples/python/indexer.py --publisher tcp://master-0:5557,tcp://master-0:5558 \\
        --curve-server-key master-0.pub --curve-secret-key indexer-a.key

A publisher that refuses the indexer makes it exit 1 with the reason instead of waiting.
Ctrl-C or SIGTERM stops it cleanly: it writes --dump and --stats, prints its counters and
exits 0.

The dump is JSON lines, one per object, in byte order of tenant then key, as
`kv-events mirror` writes them:
    {"key":"prefix/0001","media":["cpu","disk"],"tenant":"default"}
Tenants and keys are the master's bytes: a JSON string when they are UTF-8, else
{"hex": "<their bytes in hex>"}. With several publishers it holds the index of the one in
sync heard from last (the leader of an HA deployment), or with --union all of them merged.

cli/tests/python_indexer.rs runs it against `kv-events demo` and checks its final index;
tests/python/test_indexer.py tests its recovery step by step.
"""

import argparse
import collections
import json
import os
import signal
import sys
import time

import msgpack
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

# The sequence frame that ends a replay: -1 as 8 signed big-endian bytes.
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
# The longest topic frame a publisher sends (kv_events_topic).
MAX_TOPIC_BYTES = 255
# A request whose answer stops coming for this long has failed (the socket is replaced).
ASK_TIMEOUT = 5.0
# A stream quiet this long: ask `info` whether the end of a burst was lost.
CHECK_EVERY = 1.0
# Waits before asking again after a failed request: doubled up to the second.
RETRY_FIRST, RETRY_MAX = 0.5, 8.0
# Live messages held back while a request is under way; beyond it the oldest go, and the
# recovery must then rebuild everything.
MAX_HELD = 200_000
# Malformed messages described on stderr before only counting them.
MAX_NOTES = 10

# The counters of kv-events mirror's follower (docs/subscribers.md, "The counters"), and a few
# more: missed, snapshot_events, timeouts, incomplete.
COUNTERS = ("messages", "events", "discarded", "gaps", "missed", "replays", "replayed_messages",
            "snapshots", "snapshot_events", "incarnations", "malformed", "skipped_events",
            "failed_requests", "timeouts", "overflowed", "incomplete", "convergences")


class Malformed(ValueError):
    """Something that is not the protocol: counted and skipped."""


def as_bytes(value, what):
    """Tenants and keys are msgpack str, or bin when not UTF-8: bytes either way."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    raise Malformed(f"{what} is a {type(value).__name__}, not str or bin")


def unpack(payload, what):
    # raw=False: str arrives as str (valid UTF-8) and bin as bytes, never mistaken for text.
    # Map keys that are not str stay apart (and the event that has them is skipped alone).
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for bytes that are not msgpack
        raise Malformed(f"{what} is not msgpack ({type(e).__name__}: {e})") from None


def decode_batch(payload):
    """The events of a payload `[timestamp_ms, [events], dp_rank]`, still as msgpack maps."""
    batch = unpack(payload, "the payload")
    if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[1], list)):
        raise Malformed("the payload is not [timestamp_ms, [events], dp_rank]")
    return batch[1]


def decode_message(frames):
    """(sequence, events) of a stream message: frames topic, sequence, payload. A heartbeat
    has no event."""
    if len(frames) != 3:
        raise Malformed(f"{len(frames)} frames, expected 3")
    topic, sequence, payload = frames
    if len(topic) > MAX_TOPIC_BYTES:
        raise Malformed(f"a topic of {len(topic)} bytes, expected at most {MAX_TOPIC_BYTES}")
    if len(sequence) != 8:
        raise Malformed(f"a sequence of {len(sequence)} bytes, expected 8")
    return int.from_bytes(sequence, "big"), decode_batch(payload)


def parse_event(raw):
    """(kind, backend, tenant, key, medium) of one event map; Malformed when it is not one."""
    if not isinstance(raw, dict):
        raise Malformed("an event is not a map")
    kind, backend = raw.get("event_type"), raw.get("backend_id")
    if not isinstance(backend, str):
        raise Malformed("an event without a str backend_id")
    tenant = as_bytes(raw.get("tenant_id"), "tenant_id")
    if kind == "cleared":
        return kind, backend, tenant, None, None
    if kind not in ("stored", "removed"):
        raise Malformed(f"an event_type {kind!r}")
    medium = raw.get("medium")
    if not isinstance(medium, str):
        raise Malformed(f"a {kind} event without a medium")
    return kind, backend, tenant, as_bytes(raw.get("object_key"), "object_key"), medium


def decode_map(body, what):
    value = unpack(body, what)
    if not isinstance(value, dict):
        raise Malformed(f"{what} is not a map")
    return value


def number(fields, name, what):
    value = fields.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Malformed(f"{what} has no {name}")
    return value


def decode_info(body):
    info = decode_map(body, "an info reply")
    return {
        "incarnation": number(info, "incarnation", "an info reply"),
        "last_sequence": number(info, "last_sequence", "an info reply"),
        "oldest_sequence": number(info, "oldest_sequence", "an info reply"),
        "snapshots": info.get("snapshots") is True,
        "backend_id": info.get("backend_id"),
    }


def rendered(value):
    """A tenant or key for JSON: the text when it is UTF-8, else {"hex": its bytes}."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": value.hex()}


class Index:
    """(backend, tenant) -> {key: set of media}; tenants and keys are bytes."""

    def __init__(self):
        self.tenants = {}

    def apply(self, event):
        kind, backend, tenant, key, medium = event
        if kind == "cleared":
            self.tenants.pop((backend, tenant), None)
            return
        objects = self.tenants.get((backend, tenant))
        # Both are idempotent per (backend, tenant, key, medium): a repeated stored or a
        # removed of something unknown changes nothing.
        if kind == "stored":
            if objects is None:
                objects = self.tenants[(backend, tenant)] = {}
            objects.setdefault(key, set()).add(medium)
        elif objects is not None and key in objects:
            media = objects[key]
            media.discard(medium)
            if not media:
                del objects[key]
                if not objects:
                    del self.tenants[(backend, tenant)]

    def __len__(self):
        return sum(len(objects) for objects in self.tenants.values())

    def entries(self):
        """(backend, tenant, key, sorted media), in order."""
        for backend, tenant in sorted(self.tenants):
            objects = self.tenants[(backend, tenant)]
            for key in sorted(objects):
                yield backend, tenant, key, sorted(objects[key])


class Ask:
    """A request to the replay socket under way."""

    def __init__(self, kind, now, purpose="recover", start=None, full=False, incarnation=None):
        self.kind, self.purpose = kind, purpose
        self.deadline = now + ASK_TIMEOUT
        self.start, self.full, self.incarnation = start, full, incarnation
        self.messages = []          # a replay's (sequence, events or None when malformed)
        self.index = Index()        # a snapshot's objects
        self.events = 0


class Follower:
    """The index of one publisher and the state of its recovery, without sockets: the
    stream's messages go to on_stream, the replay socket's replies to on_reply, the time to
    tick; the requests to send wait in `outbox`, and `reset_dealer` asks for a fresh replay
    socket (a reply to an abandoned request must not be taken for the next one's)."""

    def __init__(self, name, replay=True, now=0.0, note=None):
        self.name, self.replay = name, replay
        self.note = note or (lambda text: print(f"{name}: {text}", file=sys.stderr, flush=True))
        self.index = Index()
        self.incarnation = None
        self.last = None          # the index holds what the stream said up to here
        self.stream_last = None   # the last sequence the stream socket delivered
        self.complete = False     # whether the index is the publisher's state, no part missing
        self.need_full = False    # the recovery under way must rebuild the whole index
        self.state = "live"       # live | asking | waiting
        self.asked = None
        self.held = collections.deque()
        self.outbox, self.reset_dealer = [], False
        self.info = None
        self.suspect = None       # a last_sequence beyond the index that a check saw
        self.retry_at, self.backoff = None, RETRY_FIRST
        self.started = now
        self.active_at = self.checked_at = now
        self.converged_at, self.recovery_since = None, None
        self.last_convergence = self.longest_convergence = 0.0
        self.heard_at = None      # the last stream message
        self.counters = dict.fromkeys(COUNTERS, 0)

    # The stream.

    def start(self, now):
        if self.replay:
            self.recover(now, full=True, why="start")

    def on_stream(self, frames, now):
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
            self.note(f"sequence {sequence} after {self.stream_last}: the publisher restarted")
            self.stream_last = sequence
            self.held.clear()
            if self.replay:
                self.held.append((sequence, events))
                self.recover(now, full=True, why="restart")
            else:
                self.index, self.last = Index(), sequence - 1
                self.complete = sequence == 1
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

    def take(self, sequence, events, now):
        """Applies a live message in order; a gap starts a recovery."""
        if self.last is not None:
            if sequence <= self.last:
                self.counters["discarded"] += 1    # a snapshot or a replay had it already
                return
            if sequence != self.last + 1:
                self.counters["gaps"] += 1
                self.counters["missed"] += sequence - self.last - 1
                if self.replay:
                    self.held.appendleft((sequence, events))
                    self.recover(now, why=f"sequences {self.last + 1}..{sequence - 1} missing")
                    return
                self.note(f"sequences {self.last + 1}..{sequence - 1} missing: rebuilding "
                          "from the stream, incomplete")
                self.index, self.complete = Index(), False
                self.counters["incomplete"] += 1
        elif not self.replay:
            # The first message ever: complete only when nothing came before it.
            self.complete = sequence == 1
            if self.complete and self.converged_at is None:
                self.converged_at = now
                self.converged(now - self.started)
        self.apply(self.index, events)
        self.last = sequence

    def apply(self, index, events, counted="events"):
        """Applies a message's events; counts them, in `snapshot_events` for a snapshot's."""
        if counted == "events":
            self.counters["messages"] += 1
        for raw in events:
            try:
                index.apply(parse_event(raw))
                self.counters[counted] += 1
            except Malformed as e:
                self.counters["skipped_events"] += 1
                if self.counters["skipped_events"] <= MAX_NOTES:
                    self.note(f"skipped an event: {e}")

    def malformed(self, text):
        self.counters["malformed"] += 1
        if self.counters["malformed"] <= MAX_NOTES:
            self.note(text + ("" if self.counters["malformed"] < MAX_NOTES
                              else " (further ones are only counted)"))

    # Recovery.

    def recover(self, now, full=False, why=""):
        """Asks where the publisher stands, holding the stream back until it is known."""
        self.need_full = self.need_full or full
        if self.recovery_since is None:
            self.recovery_since = now
        if why and why not in ("start", "retry"):
            self.note(f"{why}: recovering")
        self.ask(Ask("info", now), [b"", b"info"])

    def ask(self, request, frames):
        if self.asked is not None:
            self.reset_dealer = True
        self.asked, self.state = request, "asking"
        self.outbox.append(frames)

    def on_reply(self, frames, now):
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

    def on_error(self, text, now):
        request = self.asked
        if request.kind == "snapshot" and "not available" in text:
            self.counters["failed_requests"] += 1
            self.note(f"no snapshots here ({text})")
            self.info["snapshots"] = False
            self.without_snapshot(self.info, now)
        else:
            self.failed(now, f"the replay socket says: {text}")

    def on_info(self, info, request, now):
        self.info, self.asked = info, None
        new_life = self.incarnation is not None and info["incarnation"] != self.incarnation
        if new_life:
            self.counters["incarnations"] += 1
            self.note(f"incarnation {info['incarnation']:#x} instead of {self.incarnation:#x}: "
                      "the publisher restarted")
            # Messages carry no incarnation: what was held may be the old life's. The new
            # life's that are forgotten here show as a gap after the snapshot, and are replayed.
            self.counters["discarded"] += len(self.held)
            self.held.clear()
        elif self.held and self.held[0][0] > info["last_sequence"] + 1:
            # Numbered beyond what this life sent (info lags a sent message by one at most):
            # the old life's, still queued when it ended. A new life's message taken for one
            # is missed, and shows as a gap.
            self.counters["discarded"] += len(self.held)
            self.held.clear()
        if request.purpose == "check" and self.last is None and not new_life:
            self.go_live(now)   # following the stream from the next message: nothing to compare
            return
        # A last_sequence at or below the index's means nothing is missing (info may lag a
        # snapshot's S, read a moment later): no restart, no loss.
        if not (self.need_full or new_life or self.last is None):
            if info["last_sequence"] <= self.last or (self.held and self.held[0][0] == self.last + 1):
                self.go_live(now)  # nothing missing, or the held messages go on from the index
                return
            if request.purpose == "check":
                if not self.held and self.suspect is None:
                    # Those messages may still be on their way: lost only if the stream is
                    # still short at the next check, with nothing come meanwhile.
                    self.suspect = info["last_sequence"]
                    self.go_live(now)
                    return
                # The end of a burst was lost: no later message would have shown it.
                self.suspect = None
                upto = self.held[0][0] if self.held else info["last_sequence"] + 1
                self.counters["gaps"] += 1
                self.counters["missed"] += upto - self.last - 1
                self.recovery_since = now
                self.note(f"sequences {self.last + 1}..{upto - 1} missing at the end of a burst")
            if 0 < info["oldest_sequence"] <= self.last + 1:
                self.ask_replay(now, self.last + 1)
                return
            self.note(f"the replay socket holds from {info['oldest_sequence']} only: "
                      "rebuilding the whole index")
        self.rebuild(info, now)

    def rebuild(self, info, now):
        if self.recovery_since is None:
            self.recovery_since = now   # a check found a restart
        if info["snapshots"]:
            self.ask(Ask("snapshot", now, incarnation=info["incarnation"]), [b"", b"snapshot"])
        else:
            self.without_snapshot(info, now)

    def without_snapshot(self, info, now):
        if info["last_sequence"] == 0:
            self.install(Index(), 0, info["incarnation"], now)    # nothing sent yet
        elif info["oldest_sequence"] == 1:
            self.ask_replay(now, 1, full=True, incarnation=info["incarnation"])
        else:
            self.incomplete(info["incarnation"], now,
                            f"no snapshots and the replay socket holds from "
                            f"{info['oldest_sequence']} only")

    def incomplete(self, incarnation, now, why):
        self.note(f"{why}: following the stream from here, the index incomplete")
        self.counters["incomplete"] += 1
        self.index, self.last, self.incarnation = Index(), None, incarnation
        self.complete = self.need_full = False
        self.go_live(now)

    def ask_replay(self, now, start, full=False, incarnation=None):
        self.ask(Ask("replay", now, start=start, full=full, incarnation=incarnation),
                 [b"", start.to_bytes(8, "big")])

    def end_replay(self, request, now):
        self.asked = None
        index = Index() if request.full else self.index
        last, hole = request.start - 1, False
        for sequence, events in request.messages:
            if sequence <= last:
                continue
            if sequence != last + 1 or events is None:
                hole = True
                break
            self.apply(index, events)
            self.counters["replayed_messages"] += 1
            last = sequence
        self.counters["replays"] += not hole
        if request.full:
            if hole:
                self.incomplete(request.incarnation, now,
                                f"the replay from 1 misses sequence {last + 1}")
            else:
                self.install(index, last, request.incarnation, now)
            return
        self.last = last
        if hole:
            # Never sent (dropped before encoding) or no longer held: only a rebuild helps.
            self.note(f"the replay misses sequence {last + 1}: rebuilding the whole index")
            self.need_full = True
            self.rebuild(self.info, now)
        else:
            self.go_live(now)

    def end_snapshot(self, request, body, now):
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

    def install(self, index, sequence, incarnation, now):
        """The index is the publisher's state at `sequence`: the held messages after it go on."""
        self.index, self.last, self.incarnation = index, sequence, incarnation
        self.complete, self.need_full = True, False
        self.go_live(now)

    def go_live(self, now):
        self.state, self.asked, self.backoff = "live", None, RETRY_FIRST
        self.checked_at = now
        while self.held and self.state == "live":
            sequence, events = self.held.popleft()
            self.take(sequence, events, now)
        if self.state == "live" and self.complete:
            if self.converged_at is None:
                self.converged_at = now
                self.converged(now - self.started)
                self.note(f"converged in {1e3 * (now - self.started):.1f} ms, "
                          f"{len(self.index)} objects at sequence {self.last}")
            elif self.recovery_since is not None:
                self.converged(now - self.recovery_since)
                self.note(f"recovered in {1e3 * (now - self.recovery_since):.1f} ms")
            self.recovery_since = None

    def converged(self, took):
        self.counters["convergences"] += 1
        self.last_convergence = took
        self.longest_convergence = max(self.longest_convergence, took)

    def failed(self, now, why):
        request = self.asked
        self.asked, self.reset_dealer = None, True
        self.counters["failed_requests"] += 1
        if request is not None and request.purpose == "check":
            self.go_live(now)   # a check that fails loses nothing: the next one asks again
            return
        self.note(f"{why}: asking again in {self.backoff:.1f} s")
        self.state, self.retry_at = "waiting", now + self.backoff
        self.backoff = min(2 * self.backoff, RETRY_MAX)

    def on_reconnect(self, now):
        """The stream socket connected again: the publisher may be another life of it."""
        if self.replay and self.state == "live":
            self.ask(Ask("info", now, purpose="check"), [b"", b"info"])

    def tick(self, now):
        if self.state == "asking" and now >= self.asked.deadline:
            self.counters["timeouts"] += 1
            self.failed(now, f"no answer to {self.asked.kind} in {ASK_TIMEOUT:.0f} s")
        elif self.state == "waiting" and now >= self.retry_at:
            self.recover(now, why="retry")
        elif self.state == "live" and self.replay and now - self.checked_at >= CHECK_EVERY:
            self.checked_at = now
            self.ask(Ask("info", now, purpose="check"), [b"", b"info"])

    def in_sync(self):
        """Complete and following the stream: no recovery under way (a check may be)."""
        checking = self.state == "asking" and self.asked is not None \
            and self.asked.purpose == "check"
        return self.complete and (self.state == "live" or checking)

    def summary(self):
        c = self.counters
        converged = ("not yet" if self.converged_at is None
                     else f"{1e3 * (self.converged_at - self.started):.1f} ms")
        return (f"{self.name}: {len(self.index)} objects, last sequence {self.last}, "
                f"{'in sync' if self.in_sync() else 'complete' if self.complete else 'INCOMPLETE'}, "
                f"converged in {converged} (longest {1e3 * self.longest_convergence:.1f} ms); "
                f"gaps {c['gaps']} ({c['missed']} numbers), replays {c['replays']} "
                f"({c['replayed_messages']} messages), snapshots {c['snapshots']} "
                f"({c['snapshot_events']} events), incarnations {c['incarnations']}, "
                f"malformed {c['malformed']}, skipped events {c['skipped_events']}, "
                f"failed requests {c['failed_requests']}")

    def stats(self):
        ms = lambda seconds: round(1e3 * seconds, 1)  # noqa: E731
        return dict(
            self.counters, publisher=self.name, objects=len(self.index), last_sequence=self.last,
            incarnation=self.incarnation, complete=self.complete, in_sync=self.in_sync(),
            converged_ms=(None if self.converged_at is None
                          else ms(self.converged_at - self.started)),
            last_convergence_ms=ms(self.last_convergence),
            longest_convergence_ms=ms(self.longest_convergence))


class Refused(Exception):
    """The publisher refused this subscriber's handshake, or it cannot succeed."""


class Handshakes:
    """Watches the SUB socket's handshakes, so that a refusal is an error, not silence.
    ZeroMQ says why only as far as the mechanism lets it: a key not on the allow-list is
    an AUTH failure at once; no keys, or the wrong server key, shows as the publisher
    closing the connection mid-handshake, taken for a refusal the second time in a row.
    A handshake that succeeds after the first is a new connection: `check` says so."""

    EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    def __init__(self, socket, curve):
        self.monitor = socket.get_monitor_socket(self.EVENTS)
        self.curve = curve
        self.closed = 0
        self.connected = 0

    def check(self):
        """True when the socket connected again since the last call."""
        again = False
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.closed = 0
                self.connected += 1
                again = again or self.connected > 1
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise Refused("this indexer's public key or address is not on its allow-list")
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                raise Refused("its security mechanism is not this indexer's"
                              + ("" if self.curve else " (it requires CURVE: "
                                 "--curve-server-key, --curve-secret-key)"))
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.closed += 1
                if self.closed >= 2:
                    raise Refused("it closed the connection during the handshake twice in a row: "
                                  + ("the server key is not the publisher's" if self.curve
                                     else "it probably requires CURVE"))
        return again


class Link:
    """The sockets of one publisher, and its Follower."""

    def __init__(self, context, stream, replay, curve_keys, now, topic=b""):
        self.context, self.stream, self.replay, self.curve_keys = context, stream, replay, curve_keys
        self.follower = Follower(stream, replay is not None, now)
        self.sub = self.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 1_000_000)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.handshakes = Handshakes(self.sub, curve_keys is not None)
        self.sub.connect(stream)
        self.dealer = None
        if replay is not None:
            self.dealer = self.socket(zmq.DEALER)
            self.dealer.connect(replay)

    def socket(self, kind):
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        if self.curve_keys is not None:
            socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = self.curve_keys
        return socket

    def flush(self, poller):
        """Sends what the follower asks for, on a fresh replay socket when it wants one."""
        follower = self.follower
        if follower.reset_dealer and self.dealer is not None:
            poller.unregister(self.dealer)
            self.dealer.close()
            self.dealer = self.socket(zmq.DEALER)
            self.dealer.connect(self.replay)
            poller.register(self.dealer, zmq.POLLIN)
        follower.reset_dealer = False
        for frames in follower.outbox:
            try:
                self.dealer.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass    # not taken: the request times out and is asked again
        follower.outbox.clear()


def parse_publisher(text):
    parts = text.split(",")
    if len(parts) > 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected PUB_ENDPOINT[,REPLAY_ENDPOINT]")
    return parts[0], parts[1] if len(parts) == 2 else None


def read_curve_keys(args):
    try:
        server_public, _ = zmq.auth.load_certificate(args.curve_server_key)
        public, secret = zmq.auth.load_certificate(args.curve_secret_key)
    except (OSError, ValueError) as e:
        sys.exit(f"indexer: cannot read a key file: {e}")
    if secret is None:
        sys.exit(f"indexer: {args.curve_secret_key} holds no secret-key (a NAME.key is wanted)")
    return server_public, public, secret


def freshest(followers):
    """The follower whose index the dump holds: the one in sync heard from last, or else the
    complete one heard from last, or else the one with any index heard from last."""
    def heard(f):
        return -1.0 if f.heard_at is None else f.heard_at
    for wanted in (Follower.in_sync, lambda f: f.complete, lambda f: f.last is not None):
        chosen = [f for f in followers if wanted(f)]
        if chosen:
            return max(chosen, key=heard)
    return followers[0]


def dump_lines(indexes):
    """The JSON lines of the union of `indexes`: {"key", "media", "tenant"} per object, in
    byte order of tenant then key, as kv-events mirror writes them."""
    union = {}
    for index in indexes:
        for _, tenant, key, media in index.entries():
            union.setdefault((tenant, key), set()).update(media)
    for (tenant, key), media in sorted(union.items()):
        yield json.dumps({"tenant": rendered(tenant), "key": rendered(key),
                          "media": sorted(media)},
                         sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write_dump(path, indexes):
    """Writes the dump beside `path`, then renames it over: a reader never sees half of it."""
    count = 0
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        for line in dump_lines(indexes):
            out.write(line + "\n")
            count += 1
    os.replace(path + ".tmp", path)
    return count


def run(links, idle_timeout):
    """Follows every publisher until a signal, or until all were silent for idle_timeout."""
    stop = []
    for number_ in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number_, lambda signum, frame: stop.append(signum))
    poller = zmq.Poller()
    now = time.monotonic()
    for link in links:
        poller.register(link.sub, zmq.POLLIN)
        poller.register(link.handshakes.monitor, zmq.POLLIN)
        if link.dealer is not None:
            poller.register(link.dealer, zmq.POLLIN)
        link.follower.start(now)
        link.flush(poller)
    while not stop:
        now = time.monotonic()
        for link in links:
            try:
                if link.handshakes.check():
                    link.follower.on_reconnect(now)
            except Refused as why:
                sys.exit(f"indexer: {link.stream}: the publisher refused this indexer: {why}")
            link.follower.tick(now)
            link.flush(poller)
        if idle_timeout is not None:
            active = max(link.follower.active_at for link in links)
            if now - active >= idle_timeout:
                break
        ready = dict(poller.poll(100))
        now = time.monotonic()
        for link in links:
            for socket, handle in ((link.sub, link.follower.on_stream),
                                   (link.dealer, link.follower.on_reply)):
                # A bounded batch per socket, so that no publisher starves the others.
                for _ in range(1000 if socket in ready else 0):
                    try:
                        frames = socket.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    handle(frames, now)
                    # A reply may ask for a fresh socket: read no more from this one.
                    if link.follower.reset_dealer:
                        break
                link.flush(poller)
    return stop


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("endpoint", nargs="*", type=parse_publisher,
                        help="the same as --publisher")
    parser.add_argument("--publisher", action="append", default=[], type=parse_publisher,
                        metavar="PUB_ENDPOINT[,REPLAY_ENDPOINT]",
                        help="a publisher to follow: its PUB socket and its replay socket "
                             "(kv_events_replay_endpoint); repeat it for several")
    parser.add_argument("--idle-timeout", type=float, default=None,
                        help="exit after this many seconds without a message")
    parser.add_argument("--dump", metavar="PATH",
                        help="write the final index here, as JSON lines: that of the publisher "
                             "in sync heard from last")
    parser.add_argument("--union", action="store_true",
                        help="dump every publisher's index merged instead")
    parser.add_argument("--stats", metavar="PATH", help="write the final counters here, as JSON")
    parser.add_argument("--curve-server-key", metavar="FILE",
                        help="the publisher's public key file (its NAME.pub): read a CURVE stream")
    parser.add_argument("--curve-secret-key", metavar="FILE",
                        help="this indexer's key file (its NAME.key), whose .pub the publisher admits")
    parser.add_argument("--topic", default="",
                        help="subscribe to this topic (the master's kv_events_topic) or a prefix "
                             "of it; default: every message")
    args = parser.parse_args(argv)
    publishers = args.endpoint + args.publisher
    if not publishers:
        parser.error("give at least one publisher")
    if (args.curve_server_key is None) != (args.curve_secret_key is None):
        parser.error("--curve-server-key and --curve-secret-key go together")
    curve_keys = read_curve_keys(args) if args.curve_server_key is not None else None

    context = zmq.Context()
    now = time.monotonic()
    topic = args.topic.encode()
    links = [Link(context, stream, replay, curve_keys, now, topic) for stream, replay in publishers]
    for link in links:
        print(f"subscribed to {link.stream}" + (f", replay socket {link.replay}" if link.replay
                                                 else ""), file=sys.stderr, flush=True)
    stopped = run(links, args.idle_timeout)
    if stopped:
        print(f"stopped by signal {stopped[0]}", file=sys.stderr, flush=True)
    followers = [link.follower for link in links]
    chosen = None if args.union else freshest(followers)
    indexes = [f.index for f in followers] if chosen is None else [chosen.index]
    if args.dump:
        objects = write_dump(args.dump, indexes)
    else:
        objects = sum(1 for _ in dump_lines(indexes))
    if args.stats:
        with open(args.stats, "w") as out:
            json.dump({"dumped": "union" if chosen is None else chosen.name,
                       "publishers": [f.stats() for f in followers]}, out, indent=1)
    for follower in followers:
        print(follower.summary())
    whose = ("the union of the publishers' indexes" if chosen is None
             else f"the index of {chosen.name}")
    print(f"{objects} objects indexed: {whose}", flush=True)
    context.destroy(linger=0)


if __name__ == "__main__":
    main()
