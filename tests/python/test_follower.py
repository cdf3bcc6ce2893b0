"""Tests of the `mooncake_kv_events` package's Follower with real sockets, against a fake
publisher (tests/python/fake_publisher.py) on ipc: run(seconds), poll step by step, objects(),
counters, the event and recovery callbacks through a join, a gap and a restart, and a
follower running on a thread of its own. Plain asserts, run as test_indexer.py is:
`/usr/bin/python3 tests/python/test_follower.py [NAME]`, by cli/tests/python_indexer.rs on
this checkout's python/src, and by scripts/python_package.sh on the wheel installed in a fresh
venv (MOONCAKE_KV_EVENTS_INSTALLED=1: the installed package, never the checkout's)."""

import logging
import os
import pathlib
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parents[1] / "python" / "src"
INSTALLED = os.environ.get("MOONCAKE_KV_EVENTS_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, str(SOURCE))
sys.path.insert(0, str(HERE))
# E402: imported only once the package under test and the helpers are on sys.path (above).
import fake_publisher  # noqa: E402
import mooncake_kv_events  # noqa: E402
from mooncake_kv_events import Event, Follower, Recovery  # noqa: E402


def stored(key, medium="cpu", tenant="t"):
    return {
        "event_type": "stored",
        "backend_id": "b",
        "tenant_id": tenant,
        "object_key": key,
        "medium": medium,
    }


def removed(key, medium="cpu", tenant="t"):
    return dict(stored(key, medium, tenant), event_type="removed")


def until(follower, condition, what, timeout=20.0):
    """Polls the follower step by step until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        follower.poll(0.05)


class Setup:
    """A fake publisher holding `initial` and a Follower of it that records its callbacks."""

    def __init__(self, directory, initial=(), replay=True, **options):
        self.fake = fake_publisher.Fake(directory, initial)
        self.events, self.recoveries, self.notes = [], [], []
        publisher = (self.fake.pub, self.fake.router) if replay else self.fake.pub
        self.follower = Follower(
            [publisher],
            note=self.notes.append,
            on_event=lambda *args: self.events.append(args),
            on_recovery=self.recoveries.append,
            **options,
        )

    def kinds(self):
        return [r.kind for r in self.recoveries]

    def in_sync(self):
        until(self.follower, self.follower.in_sync, "the follower in sync")

    def close(self):
        self.follower.close()
        self.fake.close()


def with_setup(test, initial=(), **options):
    with tempfile.TemporaryDirectory() as d:
        setup = Setup(d, initial, **options)
        try:
            test(setup)
        finally:
            setup.close()


def test_the_package_is_the_one_meant_and_typed():
    where = pathlib.Path(mooncake_kv_events.__file__).resolve().parent
    assert (where.parent == SOURCE) != INSTALLED, where
    assert (where / "py.typed").is_file(), where
    assert mooncake_kv_events.__version__


def test_a_join_by_snapshot_then_events_objects_and_counters():
    def test(s):
        s.fake.wait_for_subscriber()
        s.in_sync()
        assert s.kinds() == ["snapshot", "in_sync"], s.recoveries
        snapshot = s.recoveries[0]
        assert snapshot == Recovery(s.fake.pub, "snapshot", "2 objects at sequence 0", 0, True)
        assert s.recoveries[1].seconds is not None and s.events == []
        assert list(s.follower.objects()) == [
            (b"t", b"a", frozenset({"cpu", "disk"})),
            (b"t", b"k\xff", frozenset({"disk"})),
        ]
        s.fake.publish(stored("b"), removed("a"))
        s.fake.publish(stored("c", tenant=b"\xfeu"))
        until(s.follower, lambda: len(s.events) == 3, "the events")
        assert s.events == [
            (s.fake.pub, 1, Event("stored", "b", b"t", b"b", "cpu")),
            (s.fake.pub, 1, Event("removed", "b", b"t", b"a", "cpu")),
            (s.fake.pub, 2, Event("stored", "b", b"\xfeu", b"c", "cpu")),
        ]
        assert list(s.follower.objects()) == [
            (b"t", b"a", frozenset({"disk"})),
            (b"t", b"b", frozenset({"cpu"})),
            (b"t", b"k\xff", frozenset({"disk"})),
            (b"\xfeu", b"c", frozenset({"cpu"})),
        ]
        assert s.follower.get(b"t", b"a") == frozenset({"disk"})
        assert s.follower.get(b"t", b"gone") == frozenset()
        counters = s.follower.counters()
        assert counters == s.follower.counters(s.fake.pub), counters
        assert (counters["snapshots"], counters["snapshot_events"]) == (1, 3), counters
        assert (counters["messages"], counters["events"], counters["gaps"]) == (2, 3, 0), counters
        [stats] = s.follower.stats()
        assert stats["objects"] == 4 and stats["last_sequence"] == 2 and stats["in_sync"], stats
        assert s.follower.freshest() == s.fake.pub == s.follower.publishers[0]

    with_setup(test, [stored("a"), stored("a", "disk"), stored(b"k\xff", "disk")])


def test_run_processes_for_that_long():
    def test(s):
        s.fake.wait_for_subscriber()
        started = time.monotonic()
        s.follower.run(1.5)
        took = time.monotonic() - started
        assert 1.5 <= took < 3.0, took
        assert s.follower.in_sync() and s.kinds() == ["snapshot", "in_sync"], s.recoveries
        for key in "xyz":
            s.fake.publish(stored(key))
        s.follower.run(1.0)
        assert [key for _, key, _ in s.follower.objects()] == [b"x", b"y", b"z"]
        # With every publisher silent that long, run returns early.
        started = time.monotonic()
        s.follower.run(30, idle_timeout=0.5)
        assert time.monotonic() - started < 10

    with_setup(test)


def test_a_gap_is_told_and_replayed():
    def test(s):
        s.fake.wait_for_subscriber()
        s.in_sync()
        s.fake.publish(stored("a"))
        s.fake.lose(stored("lost"), removed("a"))
        s.fake.publish(stored("b"))
        until(
            s.follower, lambda: s.kinds()[-1:] == ["in_sync"] and len(s.kinds()) > 2, "the recovery"
        )
        assert s.kinds() == ["snapshot", "in_sync", "gap", "replay", "in_sync"], s.recoveries
        gap, replay, back = s.recoveries[2:]
        assert (gap.detail, gap.sequence, gap.replaced) == ("sequences 2..2 missing", 1, False)
        assert (replay.detail, replay.sequence, replay.replaced) == (
            "sequences 2..3 replayed",
            3,
            False,
        )
        assert back.seconds is not None and back.seconds < 10, back
        # Every event, the lost one included, in the order of the stream.
        assert [(sequence, e.kind, e.key) for _, sequence, e in s.events] == [
            (1, "stored", b"a"),
            (2, "stored", b"lost"),
            (2, "removed", b"a"),
            (3, "stored", b"b"),
        ]
        assert [key for _, key, _ in s.follower.objects()] == [b"b", b"lost"]
        counters = s.follower.counters()
        assert (counters["gaps"], counters["missed"], counters["replays"]) == (1, 1, 1), counters
        assert counters["discarded"] == 1, counters  # 3, received live, came in the replay too

    with_setup(test)


def test_a_restart_is_a_new_incarnation_and_a_snapshot():
    def test(s):
        s.fake.wait_for_subscriber()
        s.in_sync()
        s.fake.publish(stored("b"))
        s.fake.publish(stored("c"))
        until(s.follower, lambda: len(s.events) == 2, "the events")
        s.fake.restart(0x2626, stored("new"))
        s.fake.publish(stored("next"))
        until(s.follower, lambda: s.kinds().count("in_sync") == 2, "the recovery")
        assert s.kinds() == ["snapshot", "in_sync", "incarnation", "snapshot", "in_sync"], (
            s.recoveries
        )
        assert "the publisher restarted" in s.recoveries[2].detail
        assert s.recoveries[3].replaced and s.recoveries[3].sequence == 1
        assert [key for _, key, _ in s.follower.objects()] == [b"new", b"next"]
        assert s.follower.states[0].incarnation == 0x2626
        assert s.follower.counters()["incarnations"] == 1

    with_setup(test, [stored("a")])


def test_without_a_replay_socket_it_follows_the_stream_alone():
    def test(s):
        s.fake.wait_for_subscriber()
        s.fake.publish(stored("a"))
        until(s.follower, lambda: s.events, "the event")
        assert s.follower.in_sync() and s.kinds() == ["in_sync"], s.recoveries
        s.fake.lose(stored("lost"))
        s.fake.publish(stored("b"))
        until(s.follower, lambda: len(s.events) == 2, "the event after the gap")
        assert s.kinds() == ["in_sync", "gap", "incomplete"], s.recoveries
        assert s.recoveries[2].replaced and not s.follower.in_sync()
        assert list(s.follower.objects()) == [(b"t", b"b", frozenset({"cpu"}))]

    with_setup(test, replay=False)


def test_a_follower_on_its_own_thread_is_read_from_another():
    def test(s):
        s.fake.wait_for_subscriber()
        thread = threading.Thread(target=s.follower.run)
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while not s.follower.in_sync():
                assert time.monotonic() < deadline, "never in sync"
                time.sleep(0.01)
            for i in range(200):
                s.fake.publish(stored(f"k{i:03}"))
                # Read while the other thread applies: never a torn or failing read.
                assert len(list(s.follower.objects())) <= i + 1
                s.follower.counters()
            while s.follower.counters()["events"] < 200:
                assert time.monotonic() < deadline, s.follower.counters()
                time.sleep(0.01)
        finally:
            s.follower.stop()
            thread.join(10)
        assert not thread.is_alive(), "stop did not end run"
        assert [key for _, key, _ in s.follower.objects()] == [
            f"k{i:03}".encode() for i in range(200)
        ]

    with_setup(test)


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_failing_callback_is_logged_and_the_follower_goes_on():
    def test(s):
        def failing(*_):
            raise RuntimeError("the callback's own bug")

        s.follower.states[0].on_event = failing
        s.fake.wait_for_subscriber()
        s.in_sync()
        s.fake.publish(stored("a"))
        s.fake.publish(stored("b"))
        until(s.follower, lambda: s.follower.counters()["events"] == 2, "the events")
        assert [key for _, key, _ in s.follower.objects()] == [b"a", b"b"]

    logger = logging.getLogger("mooncake_kv_events")
    records = Records()
    logger.addHandler(records)
    logger.propagate = False
    try:
        with_setup(test)
    finally:
        logger.removeHandler(records)
        logger.propagate = True
    failures = [r for r in records.records if r.levelno == logging.ERROR]
    assert len(failures) == 2 and "the event callback failed" in failures[0].getMessage()
    assert failures[0].exc_info[0] is RuntimeError


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
