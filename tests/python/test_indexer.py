"""Tests of the indexer, the `mooncake_kv_events` package of python/ and its program
examples/python/indexer.py: its index, the recovery of its state machine (`_state`) step by
step (fed messages and replies by hand, no sockets), its decoding of anything at all, and the
whole program against a fake publisher (tests/python/fake_publisher.py). Run by pytest
(tests/python/conftest.py puts the package under test on sys.path): cli/tests/python_indexer.rs
runs `/usr/bin/python3 -B -m pytest tests/python/test_indexer.py`. tests/python/test_follower.py
tests the package's followers with sockets."""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile

import msgpack
import pytest

import conftest  # noqa: F401  (the package under test on sys.path, as a script too)
import fake_publisher
from mooncake_kv_events import Counters, Event, EventKind
from mooncake_kv_events._follower import freshest
from mooncake_kv_events._index import MAX_MEDIA, Index, merged, write_dump
from mooncake_kv_events._state import (
    ASK_TIMEOUT,
    CHECK_EVERY,
    RETRY_FIRST,
    AskSnapshot,
    FollowerState,
    Phase,
)
from mooncake_kv_events._wire import event_of, rendered

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "indexer.py"
END = (-1).to_bytes(8, "big", signed=True)


def event(kind, key=None, medium="cpu", tenant="t", backend="b"):
    """An event map as the publisher sends it; only the fields the indexer reads."""
    e = {"event_type": kind, "backend_id": backend, "tenant_id": tenant}
    if kind != "cleared":
        e["object_key"], e["medium"] = key, medium
    return e


def stored(key, medium="cpu", **where):
    return event("stored", key, medium, **where)


def removed(key, medium="cpu", **where):
    return event("removed", key, medium, **where)


def cleared(**where):
    return event("cleared", **where)


def payload(events):
    return msgpack.packb([1764694800123, events, 0])


def message(sequence, *events):
    return [b"", sequence.to_bytes(8, "big"), payload(list(events))]


def info(incarnation=7, next_sequence=0, oldest=None, snapshots=True):
    """An info reply: the publisher's next message takes `next_sequence`; its replay buffer
    holds from `oldest` on, by default nothing (then it says `next_sequence`)."""
    return [
        b"",
        b"info",
        msgpack.packb(
            {
                "incarnation": incarnation,
                "backend_id": "b",
                "dp_rank": 0,
                "next_sequence": next_sequence,
                "oldest_sequence": next_sequence if oldest is None else oldest,
                "snapshots": snapshots,
            }
        ),
    ]


def snapshot(*events):
    return [b"", b"snapshot", payload(list(events))]


def snapshot_end(next_sequence, events, incarnation=7):
    """The end of a snapshot that holds every message below `next_sequence`."""
    return [
        b"",
        b"snapshot-end",
        msgpack.packb(
            {
                "next_sequence": next_sequence,
                "objects": events,
                "events": events,
                "incarnation": incarnation,
                "tenant": None,
            }
        ),
    ]


def replayed(sequence, *events):
    return [b"", sequence.to_bytes(8, "big"), payload(list(events))]


def end_of_replay():
    return [b"", END, b""]


def objects(follower):
    return [(b.encode(), t, k, m) for b, t, k, m in follower.index.entries()]


def plain(follower):
    """The index as (tenant, key, media) with text tenants and keys, for short asserts."""
    return [(t.decode(), k.decode(), m) for _, t, k, m in follower.index.entries()]


class Run:
    """A Follower, its clock, the requests it sent and its notes."""

    def __init__(self, replay=True):
        self.now = 100.0
        self.notes = []
        self.f = FollowerState("pub", replay, self.now, note=self.notes.append)
        self.f.start(self.now)

    def sent(self):
        out, self.f.outbox = self.f.outbox, []
        return out

    def stream(self, *messages):
        for m in messages:
            self.f.on_stream(m, self.now)

    def reply(self, *replies):
        for r in replies:
            self.f.on_reply(r, self.now)

    def later(self, seconds):
        self.now += seconds
        self.f.tick(self.now)

    def live_before(self, next_sequence, *events, incarnation=7):
        """Brings the follower to live by a snapshot of `events`, complete before message
        `next_sequence`: the stream goes on from it."""
        assert self.sent() == [[b"", b"info"]]
        self.reply(info(incarnation, next_sequence, 0))
        assert self.sent() == [[b"", b"snapshot"]]
        self.reply(snapshot(*events), snapshot_end(next_sequence, len(events), incarnation))
        assert self.f.phase is Phase.LIVE and self.f.complete, self.notes
        assert self.f.next == next_sequence, self.f.next


INFO = [b"", b"info"]
SNAPSHOT = [b"", b"snapshot"]


def replay_from(sequence):
    return [b"", sequence.to_bytes(8, "big")]


# The index.


def decoded(*events):
    """Events as the follower decodes a payload's: maps with bytes keys, tuples."""
    return msgpack.unpackb(
        msgpack.packb(list(events)), raw=True, use_list=False, strict_map_key=False
    )


def applied(*events):
    """An Index that took `events` by both of its paths, checked to agree."""
    fast, one_by_one = Index(), Index()
    assert fast.apply_events(decoded(*events)) == 0
    for raw in decoded(*events):
        one_by_one.apply(event_of(raw))
    assert list(fast.entries()) == list(one_by_one.entries()) and fast.is_sound()
    return fast


def test_stored_and_removed_are_idempotent():
    index = applied(
        stored("k"), stored("k"), stored("k", "disk"), stored("k", "disk"), removed("never-seen")
    )
    assert list(index.entries()) == [("b", b"t", b"k", ["cpu", "disk"])]
    index.apply_events(decoded(removed("k"), removed("k")))
    assert list(index.entries()) == [("b", b"t", b"k", ["disk"])]
    assert index.get(b"t", b"k") == frozenset({"disk"}) and index.get(b"t", b"x") == frozenset()
    index.apply_events(decoded(removed("k", "disk")))
    assert list(index.entries()) == [] and len(index) == 0 and index.backends == {}


def test_cleared_wipes_only_its_backend_and_tenant():
    index = applied(
        stored("k1"),
        stored("k2", "disk"),
        stored("k1", tenant="u"),
        stored("k1", backend="c"),
        cleared(),
    )
    assert list(index.entries()) == [("b", b"u", b"k1", ["cpu"]), ("c", b"t", b"k1", ["cpu"])]
    index.apply_events(decoded(cleared(tenant="u"), cleared(backend="c")))
    assert index.backends == {}


def test_bin_keys_stay_bytes_and_dump_as_hex():
    index = applied(stored(b"k\xff"), stored("k", tenant=b"\xfet"), stored(b"k"))
    # A str key and a bin key of the same bytes are the same key: the master's bytes.
    assert list(index.entries()) == [
        ("b", b"t", b"k", ["cpu"]),
        ("b", b"t", b"k\xff", ["cpu"]),
        ("b", b"\xfet", b"k", ["cpu"]),
    ]
    assert rendered(b"caf\xc3\xa9") == "caf\u00e9"
    assert rendered(b"k\xff") == {"hex": "6bff"}


def test_a_medium_the_index_never_saw_is_kept_by_name():
    index = applied(stored("k", "ssd"), stored("k"), removed("k", "cpu"))
    assert list(index.entries()) == [("b", b"t", b"k", ["ssd"])]
    assert index.get(b"t", b"k") == frozenset({"ssd"})


def test_too_many_media_are_skipped_not_grown_without_bound():
    index = Index()
    names = [f"medium-{i}" for i in range(2 * MAX_MEDIA)]
    skipped = index.apply_events(decoded(*[stored("k", name) for name in names]))
    # cpu and disk, then the first that come.
    assert skipped == 2 * MAX_MEDIA - (MAX_MEDIA - 2) and index.is_sound()
    assert len(index.get(b"t", b"k")) == MAX_MEDIA - 2
    # Another index, another publisher's, tells its own media apart.
    assert Index().apply_events(decoded(stored("k", names[-1]))) == 0


def test_both_paths_of_the_index_refuse_the_same_events():
    bad = [
        5,
        {"event_type": "stored"},
        stored(7),
        event("renamed", "x"),
        {1: 2},
        stored("c", medium=None),
        stored("c", medium=3),
        stored("c", tenant=None),
        removed(None),
        removed("c", tenant=[1]),
        cleared(tenant=4),
        stored("c", backend=b"\xff"),
        stored("c", medium=b"\xff"),
        stored("c", medium={"a": 1}),
        dict(stored("c"), backend_id=None),
    ]
    for raw in decoded(*bad):
        with pytest.raises(ValueError):
            event_of(raw)
    index = Index()
    assert index.apply_events(decoded(*bad)) == len(bad)
    assert index.backends == {}
    good = [stored("a"), removed("b"), cleared(tenant="u"), stored("d", tenant=b"\xfe")]
    assert Index().apply_events(decoded(*good)) == 0


def test_an_event_carries_every_field_of_the_wire():
    wire = {
        "event_id": 1337,
        "timestamp": 1764694800123,
        "event_type": "stored",
        "type": "BlockStored",
        "model_name": "llama-3-8b",
        "block_size": 16,
        "additional_salt": None,
        "lora_name": None,
        "tenant_id": "default",
        "backend_id": "store-a",
        "medium": "cpu",
        "dp_rank": 2,
        "group_id": "g-7",
        "object_key": b"prefix/\xff",
        "seq_hashes": [],
        "block_hashes": [],
        "base_block_idx": None,
        "token_ids": None,
        "parent_hash": None,
        "parent_block_hash": None,
        "a_key_added_later": 1,
    }
    [raw] = decoded(wire)
    assert event_of(raw) == Event(
        EventKind.STORED,
        "store-a",
        b"default",
        b"prefix/\xff",
        "cpu",
        event_id=1337,
        timestamp=1764694800123,
        model_name="llama-3-8b",
        block_size=16,
        lora_name=None,
        additional_salt=None,
        dp_rank=2,
        group_id=b"g-7",
        seq_hashes=(),
        base_block_idx=None,
        token_ids=None,
        parent_hash=None,
    )
    assert event_of(raw).kind == "stored" and f"{event_of(raw).kind}" == "stored"
    # A field an index does not read, of a type it does not expect, is None: never a reason
    # to skip the event.
    [odd] = decoded(dict(wire, event_id="x", model_name=b"\xff", group_id=7))
    event = event_of(odd)
    assert (event.event_id, event.model_name, event.group_id, event.key) == (
        None,
        None,
        None,
        b"prefix/\xff",
    )
    [clear] = decoded({k: wire[k] for k in list(wire)[:12]} | {"event_type": "cleared"})
    assert event_of(clear)[:5] == (EventKind.CLEARED, "store-a", b"default", None, None)


def test_counters_add_up_and_read_by_name():
    one, two = Counters(events=3, gaps=1), Counters(events=4, snapshots=2)
    total = one + two
    assert (total.events, total.gaps, total.snapshots, total.replays) == (7, 1, 2, 0)
    assert total.as_dict()["events"] == 7 and one.events == 3
    assert list(total.as_dict())[:3] == ["messages", "events", "discarded"]


def test_the_dump_is_sorted_json_lines_of_one_index_or_the_union():
    a = applied(stored(b"k\xff", "disk"), stored("z"), stored("caf\u00e9", tenant="u"))
    b = applied(stored("z", "disk", backend="c"), stored("b"))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "index.jsonl")
        assert write_dump(path, merged([a])) == 3
        text = open(path, encoding="utf-8").read()
        assert write_dump(path, merged([a, b])) == 4
        union = [json.loads(line) for line in open(path, encoding="utf-8")]
    # Byte order of tenant then key; compact, keys sorted, UTF-8 as is: as kv-events mirror.
    assert text == (
        '{"key":{"hex":"6bff"},"media":["disk"],"tenant":"t"}\n'
        '{"key":"z","media":["cpu"],"tenant":"t"}\n'
        '{"key":"caf\u00e9","media":["cpu"],"tenant":"u"}\n'
    ), text
    assert union == [
        {"tenant": "t", "key": "b", "media": ["cpu"]},
        {"tenant": "t", "key": {"hex": "6bff"}, "media": ["disk"]},
        {"tenant": "t", "key": "z", "media": ["cpu", "disk"]},  # two publishers' views
        {"tenant": "u", "key": "caf\u00e9", "media": ["cpu"]},
    ]


def test_the_dump_is_of_the_publisher_in_sync_heard_from_last():
    old, new, behind = (FollowerState(n, False, note=lambda _: None) for n in "onb")
    for f, at in ((old, 5.0), (new, 9.0), (behind, 12.0)):
        f.complete, f.heard_at = True, at
    behind.phase, behind.asked = Phase.ASKING, AskSnapshot(12.0)  # recovering
    assert freshest([old, new, behind]) is new
    new.complete = False
    assert freshest([old, new, behind]) is old
    old.complete = False
    behind.phase, behind.asked = Phase.LIVE, None
    assert freshest([old, new, behind]) is behind
    # A check under way is no recovery.
    behind.replay = True
    behind.tick(behind.checked_at + CHECK_EVERY)
    assert behind.phase is Phase.ASKING and behind.in_sync()
    # None complete: the one with an index heard from last, even an index that holds no
    # message yet (the publisher's first, 0, is its next).
    for f in (old, new, behind):
        f.complete = False
    old.next = 0
    assert freshest([new, behind, old]) is old


# Joining: subscribe, snapshot, then the held messages after it.


def test_a_join_installs_the_snapshot_then_the_held_messages_after_it():
    r = Run()
    assert r.sent() == [INFO]
    r.stream(message(4, stored("old")))  # held while asking
    r.reply(info(next_sequence=6, oldest=0))
    assert r.sent() == [SNAPSHOT]
    r.stream(message(5, stored("in-snapshot")), message(6, stored("after")))
    r.reply(snapshot(stored("a"), stored("in-snapshot")), snapshot(stored("a", "disk")))
    assert r.f.phase is Phase.ASKING and objects(r.f) == []  # nothing before the end
    r.reply(snapshot_end(6, 3))
    # 4 and 5 are below the snapshot's next sequence, so in it; 6 goes on from it.
    assert plain(r.f) == [
        ("t", "a", ["cpu", "disk"]),
        ("t", "after", ["cpu"]),
        ("t", "in-snapshot", ["cpu"]),
    ]
    assert (r.f.next, r.f.last, r.f.incarnation, r.f.complete) == (7, 6, 7, True)
    assert r.f.counters.snapshots == 1 and r.f.counters.gaps == 0
    assert r.f.counters.discarded == 2 and r.f.counters.messages == 1
    assert r.f.converged_at == r.now
    r.stream(message(7, removed("a")))
    assert plain(r.f)[0] == ("t", "a", ["disk"])


def test_a_join_before_the_first_message_takes_the_stream_from_0():
    """A snapshot taken before the publisher sent anything says next_sequence 0: the
    publisher's first message, 0, goes on from it."""
    r = Run()
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=0))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("a")), snapshot_end(0, 1))
    assert (r.f.next, r.f.last, r.f.complete, r.f.phase) == (0, None, True, Phase.LIVE)
    assert r.f.stats()["next_sequence"] == 0 and r.f.stats()["last_sequence"] is None
    r.stream(message(0, stored("b")), message(1, removed("a")))
    assert plain(r.f) == [("t", "b", ["cpu"])] and r.sent() == []
    assert (r.f.next, r.f.last) == (2, 1)
    assert r.f.counters.gaps == 0 and r.f.counters.discarded == 0


def test_a_join_whose_first_held_message_is_not_next_replays_the_rest():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=6, oldest=0))
    r.sent()
    r.stream(message(9, stored("nine")))  # 6..8 never reached the socket
    r.reply(snapshot(stored("a")), snapshot_end(6, 1))
    assert r.sent() == [INFO] and r.f.phase is Phase.ASKING
    r.reply(info(next_sequence=10, oldest=0))
    assert r.sent() == [replay_from(6)]
    r.reply(
        replayed(6, stored("six")),
        replayed(7, removed("a")),
        replayed(8, stored("eight")),
        replayed(9, stored("nine")),
        end_of_replay(),
    )
    assert plain(r.f) == [("t", "eight", ["cpu"]), ("t", "nine", ["cpu"]), ("t", "six", ["cpu"])]
    assert (r.f.next, r.f.phase, r.f.complete) == (10, Phase.LIVE, True)
    assert r.f.counters.gaps == 1 and r.f.counters.missed == 3
    assert r.f.counters.replays == 1 and r.f.counters.replayed_messages == 4


def test_a_publisher_that_sent_nothing_needs_no_snapshot_to_start():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=0, oldest=0, snapshots=False))
    assert r.sent() == [] and r.f.complete and (r.f.next, r.f.last) == (0, None)
    r.stream(message(0, stored("k")))
    assert plain(r.f) == [("t", "k", ["cpu"])] and (r.f.next, r.f.last) == (1, 0)
    assert r.f.counters.gaps == 0


# Gaps.


def test_a_gap_still_held_is_replayed():
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(11, stored("b")), message(14, stored("e")), message(15, stored("f")))
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=16, oldest=3))
    assert r.sent() == [replay_from(12)]
    r.reply(
        replayed(12, stored("c")),
        replayed(13, removed("a")),
        replayed(14, stored("e")),
        replayed(15, stored("f")),
        end_of_replay(),
    )
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "bcef"]
    assert r.f.next == 16 and r.f.counters.discarded == 2  # 14 and 15, held
    assert r.f.counters.snapshots == 1 and r.f.counters.replays == 1
    assert r.f.counters.gaps == 1 and r.f.counters.missed == 2


def test_replies_with_the_topic_frame_and_topics_on_the_stream_are_read_alike():
    # vLLM 0.26 and after: ["", topic, seq, payload], the end ["", "", -1, ""]; live
    # messages carry the topic too.
    topic = b"kv@pod-1@model-a"
    r = Run()
    r.live_before(11, stored("a"))
    r.stream([topic] + message(11, stored("b"))[1:], [topic] + message(14, stored("e"))[1:])
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=15, oldest=3))
    assert r.sent() == [replay_from(12)]
    r.reply(
        *[
            [b"", topic] + replayed(n, *e)[1:]
            for n, e in [(12, [stored("c")]), (13, [removed("a")]), (14, [stored("e")])]
        ],
        [b"", b"", END, b""],
    )
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "bce"]
    assert r.f.next == 15 and r.f.counters.malformed == 0, r.notes


def test_a_heartbeat_moves_the_sequence_on_and_shows_a_lost_tail():
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(11))  # a heartbeat: no event
    assert r.f.next == 12 and r.sent() == []
    r.stream(message(13))  # 12 was lost before a silence
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=14, oldest=3))
    assert r.sent() == [replay_from(12)]
    r.reply(replayed(12, stored("b")), replayed(13), end_of_replay())
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "ab"] and r.f.next == 14


def test_a_gap_no_longer_held_is_a_snapshot():
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(20, stored("late")))
    r.sent()
    r.reply(info(next_sequence=21, oldest=15))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("truth")), snapshot_end(20, 1))
    assert plain(r.f) == [("t", "late", ["cpu"]), ("t", "truth", ["cpu"])]
    assert r.f.counters.snapshots == 2 and r.f.counters.replays == 0
    assert r.f.next == 21


def test_a_gap_when_the_replay_socket_holds_nothing_is_a_snapshot():
    """Holding nothing, the replay socket says its oldest is its next sequence: beyond the
    gap, so no replay is asked for."""
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(14, stored("d")))
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=15))  # oldest_sequence 15: nothing held
    assert r.sent() == [SNAPSHOT] and r.f.counters.replays == 0
    assert any("holds from 15 only" in note for note in r.notes), r.notes
    r.reply(snapshot(stored("a"), stored("b")), snapshot_end(14, 2))
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "abd"] and r.f.next == 15


def test_a_gap_of_numbers_never_sent_is_a_snapshot():
    """Events dropped before encoding reserve numbers that no replay can give back."""
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(14, stored("e")))
    r.sent()
    r.reply(info(next_sequence=15, oldest=0))
    assert r.sent() == [replay_from(11)]
    r.reply(replayed(11, stored("b")), replayed(14, stored("e")), end_of_replay())
    assert r.sent() == [SNAPSHOT]
    assert r.f.next == 12  # what the replay did give is applied meanwhile
    assert r.f.counters.replays == 0 and r.f.counters.replayed_messages == 1
    r.reply(snapshot(stored("a"), stored("b"), stored("lost-one")), snapshot_end(15, 3))
    assert plain(r.f) == [("t", k, ["cpu"]) for k in ("a", "b", "lost-one")]
    assert r.f.complete and r.f.phase is Phase.LIVE and r.f.next == 15


def test_a_lost_end_of_burst_is_found_when_quiet_and_replayed():
    r = Run()
    r.live_before(11, stored("a"))
    r.later(CHECK_EVERY)
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=13, oldest=0))
    # 11 and 12 may be on their way: nothing is done until the next check.
    assert r.sent() == [] and r.f.phase is Phase.LIVE and r.f.counters.gaps == 0
    r.later(CHECK_EVERY)
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=13, oldest=0))
    assert r.sent() == [replay_from(11)]
    r.reply(replayed(11, stored("b")), replayed(12, stored("c")), end_of_replay())
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "abc"] and r.f.next == 13
    assert r.f.counters.gaps == 1 and r.f.counters.missed == 2


def test_a_quiet_stream_that_missed_nothing_asks_no_replay():
    """info's next_sequence equal to the index's: every message sent was applied."""
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(11, stored("b")))
    for _ in range(3):
        r.later(CHECK_EVERY)
        assert r.sent() == [INFO]
        r.reply(info(next_sequence=12, oldest=0))
        assert r.sent() == [] and r.f.phase is Phase.LIVE and r.f.in_sync()
    assert r.f.counters.gaps == 0 and r.f.next == 12


def test_a_snapshot_sequence_above_the_last_message_is_no_restart():
    """A snapshot's next_sequence counts events dropped after the last message: info's
    next_sequence may stay below it until the next message takes those numbers."""
    r = Run()
    r.live_before(13, stored("a"))
    for _ in range(3):
        r.later(CHECK_EVERY)
        assert r.sent() == [INFO]
        r.reply(info(next_sequence=11, oldest=0))
        assert r.sent() == [] and r.f.phase is Phase.LIVE
    r.stream(message(13, stored("b")))
    assert r.f.next == 14 and r.f.counters.snapshots == 1 and r.f.counters.gaps == 0


def test_a_message_between_two_checks_clears_the_suspicion():
    r = Run()
    r.live_before(11, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.reply(info(next_sequence=12, oldest=0))
    r.stream(message(11, stored("b")))
    r.later(CHECK_EVERY)
    r.sent()
    r.reply(info(next_sequence=12, oldest=0))
    assert r.sent() == [] and r.f.counters.gaps == 0


# Restarts.


def test_a_sequence_going_back_is_a_restart_and_a_snapshot():
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(11, stored("b")), message(0, stored("new-life")))  # a new life's first
    assert r.f.counters.incarnations == 1 and r.sent() == [INFO]
    r.reply(info(incarnation=8, next_sequence=1, oldest=0))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("new-life")), snapshot_end(1, 1, incarnation=8))
    assert plain(r.f) == [("t", "new-life", ["cpu"])] and r.f.incarnation == 8
    assert r.f.next == 1 and r.f.complete and r.f.counters.incarnations == 1


def test_a_new_incarnation_seen_by_a_check_is_a_snapshot():
    r = Run()
    r.live_before(11, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    # A restart whose stream is above ours.
    r.reply(info(incarnation=9, next_sequence=31, oldest=0))
    assert r.sent() == [SNAPSHOT] and r.f.counters.incarnations == 1
    r.reply(snapshot_end(31, 0, incarnation=9))
    assert objects(r.f) == [] and r.f.incarnation == 9 and r.f.next == 31
    assert any(note.startswith("recovered in") for note in r.notes), r.notes


def test_a_restart_during_a_snapshot_abandons_it():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=51, oldest=0))
    r.sent()
    r.stream(message(51, stored("x")), message(0, stored("y")))
    # The old snapshot's replies must not be read: the socket is replaced before the next.
    assert r.sent() == [INFO] and r.f.reset_dealer
    r.reply(info(incarnation=8, next_sequence=1, oldest=0))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("y")), snapshot_end(1, 1, incarnation=8))
    assert plain(r.f) == [("t", "y", ["cpu"])] and r.f.next == 1


def test_a_new_life_seen_by_info_before_its_stream_is_one_incarnation_and_one_snapshot():
    """A restart on the same endpoints: the SUB socket connects again and its check's info
    shows the new incarnation before any message of the new life, numbered from 0 again,
    arrives. Those messages are the new life's, not yet another restart."""
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(11, stored("b")), message(12, stored("c")))
    r.f.on_reconnect(r.now)
    assert r.sent() == [INFO]
    r.reply(info(incarnation=8, next_sequence=1, oldest=0))
    assert r.sent() == [SNAPSHOT] and r.f.counters.incarnations == 1
    r.reply(snapshot(stored("new")), snapshot_end(1, 1, incarnation=8))
    r.stream(message(0, stored("new")), message(1, stored("next")))
    assert r.sent() == [] and r.f.phase is Phase.LIVE and r.f.in_sync()
    assert plain(r.f) == [("t", "new", ["cpu"]), ("t", "next", ["cpu"])] and r.f.next == 2
    assert (r.f.counters.incarnations, r.f.counters.snapshots) == (1, 2), r.f.counters
    assert r.f.counters.discarded == 1 and r.f.incarnation == 8


def test_a_new_life_seen_by_the_stream_then_by_info_counts_once():
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(11, stored("b")), message(0, stored("new")))
    assert r.sent() == [INFO] and r.f.counters.incarnations == 1
    r.reply(info(incarnation=8, next_sequence=1, oldest=0))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("new")), snapshot_end(1, 1, incarnation=8))
    r.stream(message(1, stored("next")))
    assert (r.f.counters.incarnations, r.f.counters.snapshots) == (1, 2), r.f.counters
    assert r.f.next == 2 and r.f.in_sync()


def test_what_was_held_when_info_shows_a_new_life_is_forgotten():
    r = Run()
    r.live_before(5001, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.stream(message(5001, stored("old-life")))  # still queued when the old life ended
    r.reply(info(incarnation=8, next_sequence=4, oldest=0))
    assert r.sent() == [SNAPSHOT] and not r.f.held
    r.reply(snapshot(stored("new")), snapshot_end(4, 1, incarnation=8))
    assert plain(r.f) == [("t", "new", ["cpu"])] and r.f.next == 4
    r.stream(message(4, stored("next")))  # below 5001: taken for a new life
    r.reply(info(incarnation=8, next_sequence=5, oldest=0))
    r.reply(snapshot(stored("new"), stored("next")), snapshot_end(5, 2, incarnation=8))
    assert plain(r.f) == [("t", "new", ["cpu"]), ("t", "next", ["cpu"])]
    assert r.f.phase is Phase.LIVE and r.f.complete and r.f.next == 5


def test_a_held_message_beyond_what_the_publisher_sent_is_not_its():
    """An old life's message in flight after the new life's snapshot: no endless asking."""
    r = Run()
    r.live_before(11, stored("a"), incarnation=8)
    r.stream(message(5001, stored("old-life")))
    for _ in range(3):
        if r.sent() != [INFO]:
            break
        r.reply(info(incarnation=8, next_sequence=11, oldest=0))
    assert r.f.phase is Phase.LIVE and r.sent() == [] and plain(r.f) == [("t", "a", ["cpu"])]
    assert r.f.counters.discarded == 1 and r.f.next == 11


def test_a_held_message_the_info_just_missed_is_kept():
    """info may lag a sent message by one: the message numbered next_sequence is this life's,
    and goes on from the index."""
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(message(12, stored("c")))  # 11 lost
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=12, oldest=0))  # read before 12 was taken
    assert r.sent() == [replay_from(11)] and list(r.f.held) != []
    r.reply(replayed(11, stored("b")), end_of_replay())
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "abc"] and r.f.next == 13
    assert r.f.counters.discarded == 0


# Without snapshots.


def test_without_snapshots_a_replay_from_0_rebuilds_everything():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=3, oldest=0, snapshots=False))
    assert r.sent() == [replay_from(0)]
    r.stream(message(3, stored("d")))
    r.reply(
        replayed(0, stored("a")),
        replayed(1, stored("b")),
        replayed(2, removed("a")),
        end_of_replay(),
    )
    assert plain(r.f) == [("t", "b", ["cpu"]), ("t", "d", ["cpu"])]
    assert r.f.complete and r.f.next == 4 and r.f.counters.replays == 1
    assert r.f.counters.replayed_messages == 3


def test_without_snapshots_a_replay_from_0_that_lacks_0_is_incomplete():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=3, oldest=0, snapshots=False))
    assert r.sent() == [replay_from(0)]
    r.reply(replayed(1, stored("b")), replayed(2, stored("c")), end_of_replay())
    assert not r.f.complete and r.f.next is None and r.f.counters.incomplete == 1
    assert any("the replay from 0 misses sequence 0" in note for note in r.notes), r.notes


def test_a_snapshot_refused_as_not_available_falls_back_to_a_replay():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=3, oldest=0, snapshots=True))
    assert r.sent() == [SNAPSHOT]
    r.reply([b"", b"error", b"snapshots are not available from this publisher"])
    assert r.sent() == [replay_from(0)]


def test_without_snapshots_nor_sequence_0_the_index_is_incomplete():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=91, oldest=40, snapshots=False))
    assert r.sent() == [] and r.f.phase is Phase.LIVE and not r.f.complete
    r.stream(message(91, stored("k")), message(92, stored("l")))
    assert plain(r.f) == [("t", "k", ["cpu"]), ("t", "l", ["cpu"])]
    assert r.f.counters.incomplete == 1 and r.f.converged_at is None
    # A later gap is still replayed when held.
    r.stream(message(94, stored("n")))
    r.reply(*[info(next_sequence=95, oldest=40, snapshots=False)])
    assert r.sent() == [INFO, replay_from(93)]


def test_without_snapshots_an_empty_replay_buffer_is_incomplete():
    """A publisher that sent messages and holds none says oldest_sequence == next_sequence:
    not a replay from 0."""
    r = Run()
    r.sent()
    r.reply(info(next_sequence=5, snapshots=False))
    assert r.sent() == [] and r.f.phase is Phase.LIVE and not r.f.complete
    assert r.f.counters.incomplete == 1 and r.f.counters.replays == 0
    assert any("holds from 5 only" in note for note in r.notes), r.notes


# Failures of the replay socket.


def test_no_answer_is_asked_again_on_a_fresh_socket():
    r = Run()
    assert r.sent() == [INFO]
    r.stream(message(0, stored("k")))
    r.later(ASK_TIMEOUT)
    assert r.f.phase is Phase.WAITING and r.f.reset_dealer and r.f.counters.timeouts == 1
    r.later(RETRY_FIRST)
    assert r.sent() == [INFO]
    r.reply(info(next_sequence=1, oldest=0))
    r.sent()
    r.reply(snapshot(stored("k")), snapshot_end(1, 1))
    assert plain(r.f) == [("t", "k", ["cpu"])] and r.f.counters.discarded == 1
    assert r.f.next == 1


def test_busy_is_asked_again_later():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=1, oldest=0))
    r.sent()
    r.reply([b"", b"error", b"busy: a snapshot is under way"])
    assert r.f.phase is Phase.WAITING and r.sent() == []
    r.later(RETRY_FIRST)
    assert r.sent() == [INFO]


def test_a_snapshot_short_of_its_announced_events_is_asked_again():
    r = Run()
    r.sent()
    r.reply(info(next_sequence=1, oldest=0))
    r.sent()
    r.reply(snapshot(stored("a")), snapshot_end(1, 2))
    assert r.f.phase is Phase.WAITING and objects(r.f) == [] and r.f.counters.snapshots == 0
    assert r.f.next is None


def test_a_snapshot_end_in_the_old_form_is_malformed():
    """The snapshot-end of a publisher numbered from 1 (`sequence`, not `next_sequence`) is
    not this protocol's: never taken for a position."""
    r = Run()
    r.sent()
    r.reply(info(next_sequence=1, oldest=0))
    r.sent()
    old = msgpack.packb({"sequence": 1, "objects": 0, "events": 0, "incarnation": 7})
    r.reply([b"", b"snapshot-end", old])
    assert r.f.counters.malformed == 1 and r.f.phase is Phase.WAITING and r.f.next is None


def test_a_failed_check_loses_nothing():
    r = Run()
    r.live_before(11, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.later(ASK_TIMEOUT)
    assert r.f.phase is Phase.LIVE and r.f.counters.timeouts == 1
    r.stream(message(11, stored("b")))
    assert r.f.next == 12


# Malformed input.


def test_malformed_stream_messages_are_counted_and_skipped():
    r = Run()
    r.live_before(11, stored("a"))
    r.stream(
        [b"", (11).to_bytes(8, "big")],  # 2 frames
        [b"garbage"],
        [b"", b"", b"", b""],
        [b"t" * 256, (11).to_bytes(8, "big"), payload([])],  # a topic too long
        [b"", b"\x00\x0b", payload([])],  # a short sequence
        [b"", (11).to_bytes(8, "big"), b"\xc1\xc1 not msgpack"],
        [b"", (11).to_bytes(8, "big"), msgpack.packb({"a": 1})],
        [b"", (11).to_bytes(8, "big"), msgpack.packb([1, 2, 3])],
        [b"", (11).to_bytes(8, "big"), msgpack.packb([1, [], 0]) + b"extra"],
    )
    assert r.f.counters.malformed == 9 and r.f.next == 11 and r.sent() == []
    # Events that are not the format are skipped alone.
    r.stream(
        message(
            11,
            stored("b"),
            5,
            {"event_type": "stored"},
            stored(7),
            event("renamed", "x"),
            {1: 2},
            stored("c", medium=None),
            stored("d"),
        )
    )
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "abd"]
    assert r.f.counters.skipped_events == 6 and r.f.next == 12


def test_anything_at_all_never_crashes_the_follower():
    rng = random.Random(25)
    pieces = [
        b"",
        b"info",
        b"snapshot",
        b"snapshot-end",
        b"error",
        END,
        (3).to_bytes(8, "big"),
        payload([stored("k")]),
        msgpack.packb({"sequence": 2}),
        msgpack.packb({"next_sequence": 2}),
        msgpack.packb(None),
        info()[2],
        snapshot_end(2, 0)[2],
        msgpack.packb([1, [None, {}, []], 0]),
    ]

    def junk():
        if rng.random() < 0.5:
            return rng.choice(pieces)
        return bytes(rng.randrange(256) for _ in range(rng.randrange(12)))

    for _ in range(300):
        r = Run()
        for _ in range(40):
            frames = [junk() for _ in range(rng.randrange(5))]
            [r.stream, r.reply][rng.randrange(2)](frames)
            if rng.random() < 0.2:
                r.later(rng.choice([0.1, 1.0, 6.0]))
            r.sent()
            r.f.summary(), r.f.stats(), freshest([r.f])


def test_any_order_of_well_formed_messages_and_replies_keeps_the_follower_sound():
    """Protocol frames in random order and with random numbers: no exception, an index that
    holds no empty entry, and a follower that is live, asking or waiting."""
    rng = random.Random(2525)
    keys = ["a", "b", b"c\xff"]

    def some_event():
        kind = rng.choice(["stored", "stored", "removed", "cleared"])
        return event(kind, rng.choice(keys), rng.choice(["cpu", "disk"]))

    def stream():
        return message(rng.randrange(0, 30), *[some_event() for _ in range(rng.randrange(3))])

    def reply():
        return rng.choice(
            [
                lambda: info(
                    rng.choice([7, 8]),
                    rng.randrange(30),
                    rng.choice([None, rng.randrange(6)]),
                    rng.random() < 0.7,
                ),
                lambda: snapshot(*[stored(rng.choice(keys)) for _ in range(rng.randrange(3))]),
                lambda: snapshot_end(rng.randrange(30), rng.randrange(4), rng.choice([7, 8])),
                lambda: replayed(rng.randrange(0, 30), some_event()),
                end_of_replay,
                lambda: [
                    b"",
                    b"error",
                    rng.choice([b"busy: again", b"snapshots are not available"]),
                ],
            ]
        )()

    for _ in range(400):
        r = Run(replay=rng.random() < 0.9)
        for _ in range(60):
            (r.stream(stream()) if rng.random() < 0.5 else r.reply(reply()))
            if rng.random() < 0.2:
                r.later(rng.choice([0.1, 1.0, 6.0]))
            r.sent()
            assert isinstance(r.f.phase, Phase), r.f.phase
            assert (r.f.phase is Phase.ASKING) == (r.f.asked is not None), (r.f.phase, r.f.asked)
            assert r.f.index.is_sound(), r.f.index.backends
            # A complete index knows the next message it takes; the last it holds is the one
            # before, none before 0.
            assert r.f.next is not None or not r.f.complete
            assert r.f.last == (r.f.next - 1 if r.f.next else None), (r.f.next, r.f.last)
            r.f.summary(), r.f.stats(), freshest([r.f])


# Without a replay endpoint: what the stream alone allows.


def test_without_a_replay_socket_a_gap_rebuilds_from_the_stream():
    r = Run(replay=False)
    assert r.sent() == []
    r.stream(message(0, stored("a")), message(1, stored("b")))
    assert r.f.complete and r.f.converged_at is not None and r.f.next == 2
    r.stream(message(3, stored("d")))
    assert plain(r.f) == [("t", "d", ["cpu"])] and not r.f.complete
    assert r.f.counters.gaps == 1 and r.f.counters.incomplete == 1 and r.sent() == []
    assert r.f.counters.missed == 1 and r.f.next == 4


def test_without_a_replay_socket_a_late_join_is_incomplete():
    for first in (1, 7):  # 0 is the publisher's first message: anything after it is late
        r = Run(replay=False)
        r.stream(message(first, stored("k")))
        assert plain(r.f) == [("t", "k", ["cpu"])] and not r.f.complete
        assert r.f.converged_at is None and r.f.next == first + 1


def test_without_a_replay_socket_a_restart_from_0_is_complete_again():
    r = Run(replay=False)
    r.stream(message(0, stored("a")), message(1, stored("b")))
    r.stream(message(0, stored("new-life")))  # the sequence going back, to 0: a restart
    assert plain(r.f) == [("t", "new-life", ["cpu"])] and r.f.complete and r.f.next == 1
    assert r.f.counters.incarnations == 1 and r.f.counters.gaps == 0
    # A new life seen from its second message on missed its first.
    r.stream(message(1, stored("c")), message(2, stored("d")), message(1, stored("e")))
    assert plain(r.f) == [("t", "e", ["cpu"])] and not r.f.complete
    assert r.f.counters.incarnations == 2 and r.f.next == 2


# The whole program against a fake publisher.


def indexer_process(scenario, initial=(), snapshots=True):
    """Runs a fake publisher holding `initial` and the indexer against it; stops the indexer
    with SIGTERM once `scenario(fake)` returns; returns (dump lines, stats, stdout, stderr)."""
    with tempfile.TemporaryDirectory() as d:
        fake = fake_publisher.Fake(d, initial, snapshots=snapshots)
        try:
            dump, stats = os.path.join(d, "index.jsonl"), os.path.join(d, "stats.json")
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-B",
                    str(EXAMPLE),
                    "--publisher",
                    f"{fake.pub},{fake.router}",
                    "--dump",
                    dump,
                    "--stats",
                    stats,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                scenario(fake)
            finally:
                process.send_signal(signal.SIGTERM)
                out, err = process.communicate(timeout=30)
            assert process.returncode == 0, (process.returncode, out, err)
            lines = [json.loads(line) for line in open(dump)]
            return lines, json.load(open(stats))["publishers"][0], out.decode(), err.decode()
        finally:
            fake.close()


def row(key, media=("cpu",), tenant="t"):
    return {"tenant": tenant, "key": key, "media": list(media)}


def test_program_skips_malformed_stream_messages_and_converges():
    def scenario(fake):
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the snapshot")
        fake.send_raw([b"", (0).to_bytes(8, "big")])  # 2 frames
        fake.send_raw([b"\xde\xad\xbe\xef"])
        fake.send_raw([b"", (0).to_bytes(8, "big"), b"\xc1garbage"])
        fake.publish(stored("b"))  # 0
        fake.send_raw([b"", (1).to_bytes(8, "big"), msgpack.packb("wrong shape")])
        fake.publish(removed("a"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario, [stored("a"), stored(b"k\xff", "disk")])
    assert lines == [row("b"), row({"hex": "6bff"}, ["disk"])], (lines, err)
    assert stats["malformed"] == 4 and stats["complete"], (stats, err)
    assert stats["gaps"] == 0 and stats["snapshots"] == 1, (stats, err)
    assert stats["next_sequence"] == 2, (stats, err)
    assert "malformed 4," in out and "2 objects indexed" in out, out


def test_program_converges_after_a_loss_before_encoding():
    def scenario(fake):
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the first snapshot")
        fake.publish(stored("a"))
        fake.publish(stored("b"))
        fake.drop(stored("d"), stored("e"), removed("a"))  # numbers 2 to 4, never sent
        fake.publish(stored("c"))
        fake.wait_for(lambda: fake.snapshots_served == 2, "the second snapshot")
        fake.publish(removed("b"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario)
    assert lines == [row(k) for k in "cde"], (lines, err)
    # The replay came back without 2 to 4: not counted as one that filled its gap.
    assert stats["gaps"] == 1 and stats["missed"] == 3 and stats["replays"] == 0, (stats, err)
    assert stats["snapshots"] == 2 and stats["complete"], (stats, err)
    # c took 5, removed b 6.
    assert (stats["last_sequence"], stats["next_sequence"]) == (6, 7), stats


def test_program_joins_late_and_exits_on_sigterm_with_its_dump():
    def scenario(fake):
        for key in "abc":
            fake.publish(stored(key))
        fake.publish(cleared(tenant="t"))
        fake.publish(stored("d", tenant="u"))
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the snapshot")
        fake.publish(stored("e", tenant="u"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario)
    assert lines == [row("d", tenant="u"), row("e", tenant="u")], (lines, err)
    # Messages 0 to 4 before the snapshot, e 5 after it.
    assert (stats["last_sequence"], stats["next_sequence"]) == (5, 6), stats
    assert stats["converged_ms"] is not None, stats
    assert f"stopped by signal {int(signal.SIGTERM)}" in err, err


def test_program_without_snapshots_rebuilds_from_a_replay_from_0():
    def scenario(fake):
        fake.publish(stored("a"))
        fake.publish(stored("b", "disk"))
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.replays_served == 1, "the replay")
        fake.publish(removed("a"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario, snapshots=False)
    assert lines == [row("b", ["disk"])], (lines, err)
    assert stats["complete"] and stats["snapshots"] == 0 and stats["replays"] == 1, (stats, err)
    assert stats["replayed_messages"] == 2 and stats["next_sequence"] == 3, (stats, err)


def test_program_exits_1_when_no_publisher_was_ever_reached():
    with tempfile.TemporaryDirectory() as d:
        stats = os.path.join(d, "stats.json")
        run = subprocess.run(
            [sys.executable, "-B", str(EXAMPLE), "tcp://127.0.0.1:1", "--idle-timeout", "1"]
            + ["--stats", stats],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
        said = "tcp://127.0.0.1:1: not reached yet: nothing accepted a connection there"
        assert said in run.stderr, run.stderr
        assert "indexer: no publisher reached in" in run.stderr, run.stderr
        [publisher] = json.load(open(stats))["publishers"]
    assert not publisher["reached"] and "nothing accepted" in publisher["failing"], publisher
    assert "0 objects indexed" in run.stdout, run.stdout


@pytest.mark.parametrize(
    "argument, says",
    [
        ("127.0.0.1:5557", "names no transport"),
        ("tcp://master-0", "a TCP endpoint is tcp://HOST:PORT"),
        ("tcp://a:1,tcp://a:2,tcp://a:3", "expected PUB_ENDPOINT[,REPLAY_ENDPOINT]"),
        ("tcp://a:1,tcp://a:1", "PUB and replay endpoints are both"),
    ],
)
def test_program_refuses_a_publisher_given_wrong_saying_how(argument, says):
    run = subprocess.run(
        [sys.executable, "-B", str(EXAMPLE), "--publisher", argument],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and says in run.stderr, (run.returncode, run.stderr)


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
