"""Tests of the indexer, the `mooncake_kv_events` package of python/ (this checkout's) and
its program examples/python/indexer.py: its Index, the recovery of its FollowerState step by
step (fed messages and replies by hand, no sockets), its decoding of anything at all, and the
whole program against a fake publisher (tests/python/fake_publisher.py). Plain asserts; run
by cli/tests/python_indexer.rs as `/usr/bin/python3 tests/python/test_indexer.py`, exit
status 0 when every test passes; `... test_indexer.py NAME` runs the tests whose name holds
NAME. tests/python/test_follower.py tests the package's Follower with sockets."""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import msgpack

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "python" / "indexer.py"
sys.path.insert(0, str(HERE.parents[1] / "python" / "src"))
sys.path.insert(0, str(HERE))
# E402: imported only once the checkout's package and the helpers are on sys.path (above).
import fake_publisher  # noqa: E402
from mooncake_kv_events.follower import freshest  # noqa: E402
from mooncake_kv_events.index import Index, merged, write_dump  # noqa: E402
from mooncake_kv_events.state import (  # noqa: E402
    ASK_TIMEOUT,
    CHECK_EVERY,
    RETRY_FIRST,
    Ask,
    FollowerState,
)
from mooncake_kv_events.wire import parse_event, rendered  # noqa: E402

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


def info(incarnation=7, last=0, oldest=0, snapshots=True):
    return [
        b"",
        b"info",
        msgpack.packb(
            {
                "incarnation": incarnation,
                "backend_id": "b",
                "dp_rank": 0,
                "last_sequence": last,
                "oldest_sequence": oldest,
                "snapshots": snapshots,
            }
        ),
    ]


def snapshot(*events):
    return [b"", b"snapshot", payload(list(events))]


def snapshot_end(sequence, events, incarnation=7):
    return [
        b"",
        b"snapshot-end",
        msgpack.packb(
            {
                "sequence": sequence,
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

    def live_at(self, last, *events, incarnation=7):
        """Brings the follower to live, complete at `last` with `events`, by a snapshot."""
        assert self.sent() == [[b"", b"info"]]
        self.reply(info(incarnation, last, 1))
        assert self.sent() == [[b"", b"snapshot"]]
        self.reply(snapshot(*events), snapshot_end(last, len(events), incarnation))
        assert self.f.state == "live" and self.f.complete, self.notes


INFO = [b"", b"info"]
SNAPSHOT = [b"", b"snapshot"]


def replay_from(sequence):
    return [b"", sequence.to_bytes(8, "big")]


# The index.


def test_stored_and_removed_are_idempotent():
    index = Index()
    for e in [
        stored("k"),
        stored("k"),
        stored("k", "disk"),
        stored("k", "disk"),
        removed("never-seen"),
    ]:
        index.apply(parse_event(e))
    assert list(index.entries()) == [("b", b"t", b"k", ["cpu", "disk"])]
    for e in [removed("k"), removed("k")]:
        index.apply(parse_event(e))
    assert list(index.entries()) == [("b", b"t", b"k", ["disk"])]
    index.apply(parse_event(removed("k", "disk")))
    assert list(index.entries()) == [] and len(index) == 0


def test_cleared_wipes_only_its_backend_and_tenant():
    index = Index()
    for e in [
        stored("k1"),
        stored("k2", "disk"),
        stored("k1", tenant="u"),
        stored("k1", backend="c"),
        cleared(),
    ]:
        index.apply(parse_event(e))
    assert list(index.entries()) == [("b", b"u", b"k1", ["cpu"]), ("c", b"t", b"k1", ["cpu"])]


def test_bin_keys_stay_bytes_and_dump_as_hex():
    index = Index()
    for e in [stored(b"k\xff"), stored("k", tenant=b"\xfet"), stored(b"k")]:
        index.apply(parse_event(e))
    # A str key and a bin key of the same bytes are the same key: the master's bytes.
    assert list(index.entries()) == [
        ("b", b"t", b"k", ["cpu"]),
        ("b", b"t", b"k\xff", ["cpu"]),
        ("b", b"\xfet", b"k", ["cpu"]),
    ]
    assert rendered(b"caf\xc3\xa9") == "caf\u00e9"
    assert rendered(b"k\xff") == {"hex": "6bff"}


def test_the_dump_is_sorted_json_lines_of_one_index_or_the_union():
    def follower(name, *events):
        f = FollowerState(name, False, note=lambda _: None)
        f.apply(f.index, list(events))
        return f

    a = follower("a", stored(b"k\xff", "disk"), stored("z"), stored("caf\u00e9", tenant="u"))
    b = follower("b", stored("z", "disk", backend="c"), stored("b"))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "index.jsonl")
        assert write_dump(path, merged([a.index])) == 3
        text = open(path, encoding="utf-8").read()
        assert write_dump(path, merged([a.index, b.index])) == 4
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
    behind.state, behind.asked = "asking", Ask("snapshot", 12.0)  # recovering
    assert freshest([old, new, behind]) is new
    new.complete = False
    assert freshest([old, new, behind]) is old
    old.complete = False
    behind.state, behind.asked = "live", None
    assert freshest([old, new, behind]) is behind
    # A check under way is no recovery.
    behind.replay = True
    behind.tick(behind.checked_at + CHECK_EVERY)
    assert behind.state == "asking" and behind.in_sync()


# Joining: subscribe, snapshot, then the held messages after it.


def test_a_join_installs_the_snapshot_then_the_held_messages_after_it():
    r = Run()
    assert r.sent() == [INFO]
    r.stream(message(4, stored("old")))  # held while asking
    r.reply(info(last=5, oldest=1))
    assert r.sent() == [SNAPSHOT]
    r.stream(message(5, stored("in-snapshot")), message(6, stored("after")))
    r.reply(snapshot(stored("a"), stored("in-snapshot")), snapshot(stored("a", "disk")))
    assert r.f.state == "asking" and objects(r.f) == []  # nothing before the end
    r.reply(snapshot_end(5, 3))
    # 4 and 5 are in the snapshot; 6 goes on from it.
    assert plain(r.f) == [
        ("t", "a", ["cpu", "disk"]),
        ("t", "after", ["cpu"]),
        ("t", "in-snapshot", ["cpu"]),
    ]
    assert (r.f.last, r.f.incarnation, r.f.complete) == (6, 7, True)
    assert r.f.counters["snapshots"] == 1 and r.f.counters["gaps"] == 0
    assert r.f.converged_at == r.now
    r.stream(message(7, removed("a")))
    assert plain(r.f)[0] == ("t", "a", ["disk"])


def test_a_join_whose_first_held_message_is_not_next_replays_the_rest():
    r = Run()
    r.sent()
    r.reply(info(last=5, oldest=1))
    r.sent()
    r.stream(message(9, stored("nine")))  # 6..8 never reached the socket
    r.reply(snapshot(stored("a")), snapshot_end(5, 1))
    assert r.sent() == [INFO] and r.f.state == "asking"
    r.reply(info(last=9, oldest=1))
    assert r.sent() == [replay_from(6)]
    r.reply(
        replayed(6, stored("six")),
        replayed(7, removed("a")),
        replayed(8, stored("eight")),
        replayed(9, stored("nine")),
        end_of_replay(),
    )
    assert plain(r.f) == [("t", "eight", ["cpu"]), ("t", "nine", ["cpu"]), ("t", "six", ["cpu"])]
    assert (r.f.last, r.f.state, r.f.complete) == (9, "live", True)
    assert r.f.counters["gaps"] == 1 and r.f.counters["missed"] == 3
    assert r.f.counters["replays"] == 1 and r.f.counters["replayed_messages"] == 4


def test_a_publisher_that_sent_nothing_needs_no_snapshot_to_start():
    r = Run()
    r.sent()
    r.reply(info(last=0, oldest=0, snapshots=False))
    assert r.sent() == [] and r.f.complete and r.f.last == 0
    r.stream(message(1, stored("k")))
    assert plain(r.f) == [("t", "k", ["cpu"])]


# Gaps.


def test_a_gap_still_held_is_replayed():
    r = Run()
    r.live_at(10, stored("a"))
    r.stream(message(11, stored("b")), message(14, stored("e")), message(15, stored("f")))
    assert r.sent() == [INFO]
    r.reply(info(last=15, oldest=3))
    assert r.sent() == [replay_from(12)]
    r.reply(
        replayed(12, stored("c")),
        replayed(13, removed("a")),
        replayed(14, stored("e")),
        replayed(15, stored("f")),
        end_of_replay(),
    )
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "bcef"]
    assert r.f.last == 15 and r.f.counters["discarded"] == 2  # 14 and 15, held
    assert r.f.counters["snapshots"] == 1 and r.f.counters["replays"] == 1


def test_replies_with_the_topic_frame_and_topics_on_the_stream_are_read_alike():
    # vLLM 0.26 and after: ["", topic, seq, payload], the end ["", "", -1, ""]; live
    # messages carry the topic too.
    topic = b"kv@pod-1@model-a"
    r = Run()
    r.live_at(10, stored("a"))
    r.stream([topic] + message(11, stored("b"))[1:], [topic] + message(14, stored("e"))[1:])
    assert r.sent() == [INFO]
    r.reply(info(last=14, oldest=3))
    assert r.sent() == [replay_from(12)]
    r.reply(
        *[
            [b"", topic] + replayed(n, *e)[1:]
            for n, e in [(12, [stored("c")]), (13, [removed("a")]), (14, [stored("e")])]
        ],
        [b"", b"", END, b""],
    )
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "bce"]
    assert r.f.last == 14 and r.f.counters["malformed"] == 0, r.notes


def test_a_heartbeat_moves_the_sequence_on_and_shows_a_lost_tail():
    r = Run()
    r.live_at(10, stored("a"))
    r.stream(message(11))  # a heartbeat: no event
    assert r.f.last == 11 and r.sent() == []
    r.stream(message(13))  # 12 was lost before a silence
    assert r.sent() == [INFO]
    r.reply(info(last=13, oldest=3))
    assert r.sent() == [replay_from(12)]
    r.reply(replayed(12, stored("b")), replayed(13), end_of_replay())
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "ab"] and r.f.last == 13


def test_a_gap_no_longer_held_is_a_snapshot():
    r = Run()
    r.live_at(10, stored("a"))
    r.stream(message(20, stored("late")))
    r.sent()
    r.reply(info(last=20, oldest=15))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("truth")), snapshot_end(19, 1))
    assert plain(r.f) == [("t", "late", ["cpu"]), ("t", "truth", ["cpu"])]
    assert r.f.counters["snapshots"] == 2 and r.f.counters["replays"] == 0


def test_a_gap_of_numbers_never_sent_is_a_snapshot():
    """Events dropped before encoding reserve numbers that no replay can give back."""
    r = Run()
    r.live_at(10, stored("a"))
    r.stream(message(14, stored("e")))
    r.sent()
    r.reply(info(last=14, oldest=1))
    assert r.sent() == [replay_from(11)]
    r.reply(replayed(11, stored("b")), replayed(14, stored("e")), end_of_replay())
    assert r.sent() == [SNAPSHOT]
    assert r.f.last == 11  # what the replay did give is applied meanwhile
    assert r.f.counters["replays"] == 0 and r.f.counters["replayed_messages"] == 1
    r.reply(snapshot(stored("a"), stored("b"), stored("lost-one")), snapshot_end(14, 3))
    assert plain(r.f) == [("t", k, ["cpu"]) for k in ("a", "b", "lost-one")]
    assert r.f.complete and r.f.state == "live"


def test_a_lost_end_of_burst_is_found_when_quiet_and_replayed():
    r = Run()
    r.live_at(10, stored("a"))
    r.later(CHECK_EVERY)
    assert r.sent() == [INFO]
    r.reply(info(last=12, oldest=1))
    # 11 and 12 may be on their way: nothing is done until the next check.
    assert r.sent() == [] and r.f.state == "live" and r.f.counters["gaps"] == 0
    r.later(CHECK_EVERY)
    assert r.sent() == [INFO]
    r.reply(info(last=12, oldest=1))
    assert r.sent() == [replay_from(11)]
    r.reply(replayed(11, stored("b")), replayed(12, stored("c")), end_of_replay())
    assert plain(r.f) == [("t", k, ["cpu"]) for k in "abc"]
    assert r.f.counters["gaps"] == 1 and r.f.counters["missed"] == 2


def test_a_snapshot_sequence_above_the_last_message_is_no_restart():
    """S counts events dropped after the last message: info's last_sequence stays below it
    until the next message takes those numbers."""
    r = Run()
    r.live_at(12, stored("a"))
    for _ in range(3):
        r.later(CHECK_EVERY)
        assert r.sent() == [INFO]
        r.reply(info(last=10, oldest=1))
        assert r.sent() == [] and r.f.state == "live"
    r.stream(message(13, stored("b")))
    assert r.f.last == 13 and r.f.counters["snapshots"] == 1 and r.f.counters["gaps"] == 0


def test_a_message_between_two_checks_clears_the_suspicion():
    r = Run()
    r.live_at(10, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.reply(info(last=11, oldest=1))
    r.stream(message(11, stored("b")))
    r.later(CHECK_EVERY)
    r.sent()
    r.reply(info(last=11, oldest=1))
    assert r.sent() == [] and r.f.counters["gaps"] == 0


# Restarts.


def test_a_sequence_going_back_is_a_restart_and_a_snapshot():
    r = Run()
    r.live_at(10, stored("a"))
    r.stream(message(11, stored("b")), message(1, stored("new-life")))
    assert r.f.counters["incarnations"] == 1 and r.sent() == [INFO]
    r.reply(info(incarnation=8, last=1, oldest=1))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("new-life")), snapshot_end(1, 1, incarnation=8))
    assert plain(r.f) == [("t", "new-life", ["cpu"])] and r.f.incarnation == 8


def test_a_new_incarnation_seen_by_a_check_is_a_snapshot():
    r = Run()
    r.live_at(10, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.reply(info(incarnation=9, last=30, oldest=1))  # a restart whose stream is above ours
    assert r.sent() == [SNAPSHOT] and r.f.counters["incarnations"] == 1
    r.reply(snapshot_end(30, 0, incarnation=9))
    assert objects(r.f) == [] and r.f.incarnation == 9 and r.f.last == 30
    assert any(note.startswith("recovered in") for note in r.notes), r.notes


def test_a_restart_during_a_snapshot_abandons_it():
    r = Run()
    r.sent()
    r.reply(info(last=50, oldest=1))
    r.sent()
    r.stream(message(51, stored("x")), message(2, stored("y")))
    # The old snapshot's replies must not be read: the socket is replaced before the next.
    assert r.sent() == [INFO] and r.f.reset_dealer
    r.reply(info(incarnation=8, last=2, oldest=1))
    assert r.sent() == [SNAPSHOT]
    r.reply(snapshot(stored("y")), snapshot_end(2, 1, incarnation=8))
    assert plain(r.f) == [("t", "y", ["cpu"])] and r.f.last == 2


def test_what_was_held_when_info_shows_a_new_life_is_forgotten():
    r = Run()
    r.live_at(5000, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.stream(message(5001, stored("old-life")))  # still queued when the old life ended
    r.reply(info(incarnation=8, last=3, oldest=1))
    assert r.sent() == [SNAPSHOT] and not r.f.held
    r.reply(snapshot(stored("new")), snapshot_end(3, 1, incarnation=8))
    assert plain(r.f) == [("t", "new", ["cpu"])] and r.f.last == 3
    r.stream(message(4, stored("next")))  # below 5001: taken for a new life
    r.reply(info(incarnation=8, last=4, oldest=1))
    r.reply(snapshot(stored("new"), stored("next")), snapshot_end(4, 2, incarnation=8))
    assert plain(r.f) == [("t", "new", ["cpu"]), ("t", "next", ["cpu"])]
    assert r.f.state == "live" and r.f.complete


def test_a_held_message_beyond_what_the_publisher_sent_is_not_its():
    """An old life's message in flight after the new life's snapshot: no endless asking."""
    r = Run()
    r.live_at(10, stored("a"), incarnation=8)
    r.stream(message(5001, stored("old-life")))
    for _ in range(3):
        if r.sent() != [INFO]:
            break
        r.reply(info(incarnation=8, last=10, oldest=1))
    assert r.f.state == "live" and r.sent() == [] and plain(r.f) == [("t", "a", ["cpu"])]
    assert r.f.counters["discarded"] == 1


# Without snapshots.


def test_without_snapshots_a_replay_from_1_rebuilds_everything():
    r = Run()
    r.sent()
    r.reply(info(last=3, oldest=1, snapshots=False))
    assert r.sent() == [replay_from(1)]
    r.stream(message(4, stored("d")))
    r.reply(
        replayed(1, stored("a")),
        replayed(2, stored("b")),
        replayed(3, removed("a")),
        end_of_replay(),
    )
    assert plain(r.f) == [("t", "b", ["cpu"]), ("t", "d", ["cpu"])]
    assert r.f.complete and r.f.last == 4 and r.f.counters["replays"] == 1


def test_a_snapshot_refused_as_not_available_falls_back_to_a_replay():
    r = Run()
    r.sent()
    r.reply(info(last=3, oldest=1, snapshots=True))
    assert r.sent() == [SNAPSHOT]
    r.reply([b"", b"error", b"snapshots are not available from this publisher"])
    assert r.sent() == [replay_from(1)]


def test_without_snapshots_nor_sequence_1_the_index_is_incomplete():
    r = Run()
    r.sent()
    r.reply(info(last=90, oldest=40, snapshots=False))
    assert r.sent() == [] and r.f.state == "live" and not r.f.complete
    r.stream(message(91, stored("k")), message(92, stored("l")))
    assert plain(r.f) == [("t", "k", ["cpu"]), ("t", "l", ["cpu"])]
    assert r.f.counters["incomplete"] == 1 and r.f.converged_at is None
    # A later gap is still replayed when held.
    r.stream(message(94, stored("n")))
    r.reply(*[info(last=94, oldest=40, snapshots=False)])
    assert r.sent() == [INFO, replay_from(93)]


# Failures of the replay socket.


def test_no_answer_is_asked_again_on_a_fresh_socket():
    r = Run()
    assert r.sent() == [INFO]
    r.stream(message(1, stored("k")))
    r.later(ASK_TIMEOUT)
    assert r.f.state == "waiting" and r.f.reset_dealer and r.f.counters["timeouts"] == 1
    r.later(RETRY_FIRST)
    assert r.sent() == [INFO]
    r.reply(info(last=1, oldest=1))
    r.sent()
    r.reply(snapshot(stored("k")), snapshot_end(1, 1))
    assert plain(r.f) == [("t", "k", ["cpu"])] and r.f.counters["discarded"] == 1


def test_busy_is_asked_again_later():
    r = Run()
    r.sent()
    r.reply(info(last=1, oldest=1))
    r.sent()
    r.reply([b"", b"error", b"busy: a snapshot is under way"])
    assert r.f.state == "waiting" and r.sent() == []
    r.later(RETRY_FIRST)
    assert r.sent() == [INFO]


def test_a_snapshot_short_of_its_announced_events_is_asked_again():
    r = Run()
    r.sent()
    r.reply(info(last=1, oldest=1))
    r.sent()
    r.reply(snapshot(stored("a")), snapshot_end(1, 2))
    assert r.f.state == "waiting" and objects(r.f) == [] and r.f.counters["snapshots"] == 0


def test_a_failed_check_loses_nothing():
    r = Run()
    r.live_at(10, stored("a"))
    r.later(CHECK_EVERY)
    r.sent()
    r.later(ASK_TIMEOUT)
    assert r.f.state == "live" and r.f.counters["timeouts"] == 1
    r.stream(message(11, stored("b")))
    assert r.f.last == 11


# Malformed input.


def test_malformed_stream_messages_are_counted_and_skipped():
    r = Run()
    r.live_at(10, stored("a"))
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
    assert r.f.counters["malformed"] == 9 and r.f.last == 10 and r.sent() == []
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
    assert r.f.counters["skipped_events"] == 6 and r.f.last == 11


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
        return message(rng.randrange(1, 30), *[some_event() for _ in range(rng.randrange(3))])

    def reply():
        return rng.choice(
            [
                lambda: info(
                    rng.choice([7, 8]), rng.randrange(30), rng.randrange(6), rng.random() < 0.7
                ),
                lambda: snapshot(*[stored(rng.choice(keys)) for _ in range(rng.randrange(3))]),
                lambda: snapshot_end(rng.randrange(30), rng.randrange(4), rng.choice([7, 8])),
                lambda: replayed(rng.randrange(1, 30), some_event()),
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
            assert r.f.state in ("live", "asking", "waiting"), r.f.state
            assert (r.f.state == "asking") == (r.f.asked is not None), (r.f.state, r.f.asked)
            assert all(
                media for objects in r.f.index.tenants.values() for media in objects.values()
            )
            assert all(r.f.index.tenants.values())
            r.f.summary(), r.f.stats(), freshest([r.f])


# Without a replay endpoint: what the stream alone allows.


def test_without_a_replay_socket_a_gap_rebuilds_from_the_stream():
    r = Run(replay=False)
    assert r.sent() == []
    r.stream(message(1, stored("a")), message(2, stored("b")))
    assert r.f.complete and r.f.converged_at is not None
    r.stream(message(4, stored("d")))
    assert plain(r.f) == [("t", "d", ["cpu"])] and not r.f.complete
    assert r.f.counters["gaps"] == 1 and r.f.counters["incomplete"] == 1 and r.sent() == []


def test_without_a_replay_socket_a_late_join_is_incomplete():
    r = Run(replay=False)
    r.stream(message(7, stored("k")))
    assert plain(r.f) == [("t", "k", ["cpu"])] and not r.f.complete


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
        fake.send_raw([b"", (1).to_bytes(8, "big")])  # 2 frames
        fake.send_raw([b"\xde\xad\xbe\xef"])
        fake.send_raw([b"", (1).to_bytes(8, "big"), b"\xc1garbage"])
        fake.publish(stored("b"))
        fake.send_raw([b"", (2).to_bytes(8, "big"), msgpack.packb("wrong shape")])
        fake.publish(removed("a"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario, [stored("a"), stored(b"k\xff", "disk")])
    assert lines == [row("b"), row({"hex": "6bff"}, ["disk"])], (lines, err)
    assert stats["malformed"] == 4 and stats["complete"], (stats, err)
    assert stats["gaps"] == 0 and stats["snapshots"] == 1, (stats, err)
    assert "malformed 4," in out and "2 objects indexed" in out, out


def test_program_converges_after_a_loss_before_encoding():
    def scenario(fake):
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the first snapshot")
        fake.publish(stored("a"))
        fake.publish(stored("b"))
        fake.drop(stored("d"), stored("e"), removed("a"))  # numbers 3 to 5, never sent
        fake.publish(stored("c"))
        fake.wait_for(lambda: fake.snapshots_served == 2, "the second snapshot")
        fake.publish(removed("b"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario)
    assert lines == [row(k) for k in "cde"], (lines, err)
    # The replay came back without 3 to 5: not counted as one that filled its gap.
    assert stats["gaps"] == 1 and stats["missed"] == 3 and stats["replays"] == 0, (stats, err)
    assert stats["snapshots"] == 2 and stats["complete"], (stats, err)


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
    assert stats["last_sequence"] == 6 and stats["converged_ms"] is not None, stats
    assert f"stopped by signal {int(signal.SIGTERM)}" in err, err


def test_program_without_snapshots_rebuilds_from_a_replay_from_1():
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


if __name__ == "__main__":
    wanted = sys.argv[1:]
    tests = [
        (name, f)
        for name, f in sorted(globals().items())
        if name.startswith("test_") and (not wanted or any(w in name for w in wanted))
    ]
    for name, test in tests:
        started = time.monotonic()
        test()
        print(f"ok {name} ({time.monotonic() - started:.2f} s)", flush=True)
    print(f"{len(tests)} tests passed")
