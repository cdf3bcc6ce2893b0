"""Tests of the `mooncake_kv_events` package's Follower with real sockets, against a fake
publisher (tests/python/fake_publisher.py) on ipc: run(seconds), poll step by step, objects(),
counters, the event and recovery callbacks through a join, a gap and restarts, a follower on
a thread of its own, what it says of publishers it cannot reach, and what it refuses to be
given. Run by pytest: by cli/tests/python_indexer.rs on this checkout's python/src, and by
scripts/python_package.sh on the wheel installed in a fresh venv
(MOONCAKE_KV_EVENTS_INSTALLED=1: the installed package, never the checkout's)."""

import logging
import pathlib
import sys
import threading
import time

import pytest
import zmq
import zmq.asyncio

import conftest  # the package under test on sys.path, as a script too
import fake_publisher
import mooncake_kv_events
from mooncake_kv_events import (
    Counters,
    Event,
    EventKind,
    Follower,
    Recovery,
    RecoveryKind,
    Status,
    Unreachable,
)


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

    def __init__(self, directory, initial=(), replay=True, on_event=None, **options):
        self.fake = fake_publisher.Fake(directory, initial)
        self.events, self.recoveries, self.notes = [], [], []
        publisher = (self.fake.pub, self.fake.router) if replay else self.fake.pub
        self.follower = Follower(
            [publisher],
            note=self.notes.append,
            on_event=on_event or (lambda *args: self.events.append(args)),
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


@pytest.fixture
def setup(tmp_path):
    """Makes a Setup (once per test), closed when the test ends."""
    made = []

    def make(initial=(), **options):
        made.append(Setup(tmp_path, initial, **options))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_the_package_is_the_one_meant_and_typed():
    where = pathlib.Path(mooncake_kv_events.__file__).resolve().parent
    assert (where.parent == conftest.SOURCE) != conftest.INSTALLED, where
    assert (where / "py.typed").is_file(), where
    assert mooncake_kv_events.__version__


def test_a_join_by_snapshot_then_events_objects_and_counters(setup):
    s = setup([stored("a"), stored("a", "disk"), stored(b"k\xff", "disk")])
    s.fake.wait_for_subscriber()
    s.in_sync()
    assert s.kinds() == ["snapshot", "in_sync"], s.recoveries
    assert s.kinds() == [RecoveryKind.SNAPSHOT, RecoveryKind.IN_SYNC]
    # Before the publisher sent anything: the snapshot holds no message, and the stream goes
    # on from the first, 0.
    snapshot = s.recoveries[0]
    assert snapshot == Recovery(s.fake.pub, "snapshot", "2 objects, next sequence 0", None, True)
    [status] = s.follower.statuses()
    assert status.next_sequence == 0 and status.in_sync and status.reached and status.connected
    assert status.failing is None and status.last_heard is not None
    assert s.recoveries[1].seconds is not None and s.events == []
    assert list(s.follower.objects()) == [
        (b"t", b"a", frozenset({"cpu", "disk"})),
        (b"t", b"k\xff", frozenset({"disk"})),
    ]
    s.fake.publish(stored("b"), removed("a"))
    s.fake.publish(stored("c", tenant=b"\xfeu"))
    until(s.follower, lambda: len(s.events) == 3, "the events")
    assert s.events == [
        (s.fake.pub, 0, Event("stored", "b", b"t", b"b", "cpu")),
        (s.fake.pub, 0, Event("removed", "b", b"t", b"a", "cpu")),
        (s.fake.pub, 1, Event("stored", "b", b"\xfeu", b"c", "cpu")),
    ]
    assert s.events[0][2].kind is EventKind.STORED
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
    assert (counters.snapshots, counters.snapshot_events) == (1, 3), counters
    assert (counters.messages, counters.events, counters.gaps) == (2, 3, 0), counters
    # A copy: the follower's own counters go on without it.
    counters.events = 99
    assert s.follower.counters().events == 3
    [stats] = s.follower.stats()
    assert stats["objects"] == 4 and stats["in_sync"] and stats["reached"], stats
    assert (stats["last_sequence"], stats["next_sequence"]) == (1, 2), stats
    assert s.follower.freshest() == s.fake.pub == s.follower.publishers[0]


def test_every_field_of_an_event_reaches_the_callback(setup):
    s = setup()
    s.fake.wait_for_subscriber()
    s.in_sync()
    wire = dict(
        stored("k"),
        event_id=41,
        timestamp=1764694800123,
        type="BlockStored",
        model_name="llama-3-8b",
        block_size=16,
        additional_salt=None,
        lora_name="adapter",
        dp_rank=3,
        group_id=b"g\xff",
        seq_hashes=[],
        block_hashes=[],
        base_block_idx=None,
        token_ids=None,
        parent_hash=None,
        parent_block_hash=None,
    )
    s.fake.publish(wire)
    until(s.follower, lambda: s.events, "the event")
    [(_, _, event)] = s.events
    assert (event.event_id, event.timestamp, event.model_name, event.block_size) == (
        41,
        1764694800123,
        "llama-3-8b",
        16,
    )
    assert (event.lora_name, event.dp_rank, event.group_id, event.seq_hashes) == (
        "adapter",
        3,
        b"g\xff",
        (),
    )


def test_run_processes_for_that_long(setup):
    s = setup()
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
    # With every publisher silent that long, run returns early: it was reached.
    started = time.monotonic()
    s.follower.run(30, idle_timeout=0.5)
    assert time.monotonic() - started < 10


def test_a_gap_is_told_and_replayed(setup):
    s = setup()
    s.fake.wait_for_subscriber()
    s.in_sync()
    s.fake.publish(stored("a"))
    s.fake.lose(stored("lost"), removed("a"))
    s.fake.publish(stored("b"))
    until(s.follower, lambda: s.kinds()[-1:] == ["in_sync"] and len(s.kinds()) > 2, "the recovery")
    assert s.kinds() == ["snapshot", "in_sync", "gap", "replay", "in_sync"], s.recoveries
    gap, replay, back = s.recoveries[2:]
    # a took 0, the lost message 1, b 2.
    assert (gap.detail, gap.sequence, gap.replaced) == ("sequences 1..1 missing", 0, False)
    assert (replay.detail, replay.sequence, replay.replaced) == (
        "sequences 1..2 replayed",
        2,
        False,
    )
    assert back.seconds is not None and back.seconds < 10, back
    # Every event, the lost one included, in the order of the stream.
    assert [(sequence, e.kind, e.key) for _, sequence, e in s.events] == [
        (0, "stored", b"a"),
        (1, "stored", b"lost"),
        (1, "removed", b"a"),
        (2, "stored", b"b"),
    ]
    assert [key for _, key, _ in s.follower.objects()] == [b"b", b"lost"]
    counters = s.follower.counters()
    assert (counters.gaps, counters.missed, counters.replays) == (1, 1, 1), counters
    assert counters.discarded == 1, counters  # 2, received live, came in the replay too


def test_a_restart_is_a_new_incarnation_and_a_snapshot(setup):
    s = setup([stored("a")])
    s.fake.wait_for_subscriber()
    s.in_sync()
    s.fake.publish(stored("b"))
    s.fake.publish(stored("c"))
    until(s.follower, lambda: len(s.events) == 2, "the events")
    s.fake.restart(0x2626, stored("new"))
    s.fake.publish(stored("next"))
    until(s.follower, lambda: s.kinds().count("in_sync") == 2, "the recovery")
    assert s.kinds() == ["snapshot", "in_sync", "incarnation", "snapshot", "in_sync"], s.recoveries
    assert "the publisher restarted" in s.recoveries[2].detail
    # Its snapshot came after its message 0, whose object it holds.
    assert s.recoveries[3].replaced and s.recoveries[3].sequence == 0
    assert s.recoveries[3].detail == "2 objects, next sequence 1"
    assert [key for _, key, _ in s.follower.objects()] == [b"new", b"next"]
    assert s.follower.statuses()[0].incarnation == 0x2626
    assert (s.follower.counters().incarnations, s.follower.counters().snapshots) == (1, 2)


def test_a_restart_on_new_sockets_is_one_incarnation_and_one_snapshot(setup):
    """A publisher restarted on the same endpoints: the follower connects again and asks info
    at once, which shows the new incarnation before the new life's first message (numbered 0
    again) arrives. One new incarnation, one snapshot: that message is no second restart."""
    s = setup([stored("a")])
    s.fake.wait_for_subscriber()
    s.in_sync()
    s.fake.publish(stored("b"))
    s.fake.publish(stored("c"))
    until(s.follower, lambda: len(s.events) == 2, "the events")
    s.fake.restart(0x2727, stored("new"))
    served = s.fake.infos_served
    s.fake.rebind()
    until(s.follower, lambda: s.fake.infos_served > served, "the check of the new connection")
    until(s.follower, lambda: s.kinds().count("in_sync") == 2, "the new life's snapshot")
    s.fake.wait_for_subscriber()
    s.fake.publish(stored("next"))
    until(s.follower, lambda: len(s.events) == 3, "the new life's first event")
    s.follower.run(1.5)  # a check or two more: nothing else happens
    assert s.kinds() == ["snapshot", "in_sync", "incarnation", "snapshot", "in_sync"], s.recoveries
    assert [key for _, key, _ in s.follower.objects()] == [b"new", b"next"]
    counters = s.follower.counters()
    assert (counters.incarnations, counters.snapshots, counters.gaps) == (1, 2, 0), counters
    [status] = s.follower.statuses()
    assert status.incarnation == 0x2727 and status.next_sequence == 1 and status.in_sync


def test_without_a_replay_socket_it_follows_the_stream_alone(setup):
    s = setup(replay=False)
    s.fake.wait_for_subscriber()
    s.fake.publish(stored("a"))
    until(s.follower, lambda: s.events, "the event")
    # Its first message is the publisher's first, 0: nothing came before it.
    assert s.follower.in_sync() and s.kinds() == ["in_sync"], s.recoveries
    assert s.events[0][1] == 0 and s.follower.statuses()[0].next_sequence == 1
    s.fake.lose(stored("lost"))
    s.fake.publish(stored("b"))
    until(s.follower, lambda: len(s.events) == 2, "the event after the gap")
    assert s.kinds() == ["in_sync", "gap", "incomplete"], s.recoveries
    assert s.recoveries[2].replaced and not s.follower.in_sync()
    assert list(s.follower.objects()) == [(b"t", b"b", frozenset({"cpu"}))]


def test_a_follower_on_its_own_thread_is_read_from_another(setup):
    s = setup()
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
            s.follower.statuses()
        while s.follower.counters().events < 200:
            assert time.monotonic() < deadline, s.follower.counters()
            time.sleep(0.01)
    finally:
        s.follower.stop()
        thread.join(10)
    assert not thread.is_alive(), "stop did not end run"
    assert [key for _, key, _ in s.follower.objects()] == [f"k{i:03}".encode() for i in range(200)]


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def records():
    """What the package logs (logger mooncake_kv_events), kept from the root's handlers."""
    logger = logging.getLogger("mooncake_kv_events")
    handler = Records()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def test_a_failing_callback_is_logged_and_the_follower_goes_on(setup, records):
    def failing(*_):
        raise RuntimeError("the callback's own bug")

    s = setup(on_event=failing)
    s.fake.wait_for_subscriber()
    s.in_sync()
    s.fake.publish(stored("a"))
    s.fake.publish(stored("b"))
    until(s.follower, lambda: s.follower.counters().events == 2, "the events")
    assert [key for _, key, _ in s.follower.objects()] == [b"a", b"b"]
    failures = [r for r in records if r.levelno == logging.ERROR]
    assert len(failures) == 2 and "the event callback failed" in failures[0].getMessage()
    assert failures[0].exc_info[0] is RuntimeError


# Publishers that cannot be reached, or stay silent.


def test_an_unreachable_publisher_makes_run_raise_at_its_idle_timeout(records):
    follower = Follower([("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")])
    try:
        started = time.monotonic()
        with pytest.raises(Unreachable) as raised:
            follower.run(idle_timeout=2)
        assert 2 <= time.monotonic() - started < 10
        [status] = raised.value.statuses
        assert status.publisher == follower.statuses()[0].publisher
        assert (status.publisher, status.replay) == ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
        assert not status.reached and not status.connected and status.last_heard is None
        assert "nothing accepted a connection there" in status.failing, status
        assert not status.in_sync and status.next_sequence is None
        assert "tcp://127.0.0.1:1: nothing accepted a connection" in str(raised.value)
        assert isinstance(raised.value, mooncake_kv_events.KvEventsError)
    finally:
        follower.close()
    # Said as soon as an attempt failed, at WARNING, without waiting for the end.
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert any(w == "tcp://127.0.0.1:1: " + w.split(": ", 1)[1] for w in warnings), warnings
    assert any("not reached yet: nothing accepted" in w for w in warnings), warnings


def test_one_unreachable_publisher_of_two_is_said_and_shown(setup):
    s = setup()
    s.fake.wait_for_subscriber()
    s.in_sync()
    follower = Follower(
        [(s.fake.pub, s.fake.router), "ipc:///nonexistent/kv-events-test.sock"],
        note=s.notes.append,
    )
    try:
        follower.run(idle_timeout=1.5)  # one was reached: no exception
        reached, unreached = follower.statuses()
        assert reached.reached and reached.in_sync and reached.failing is None
        assert not unreached.reached and unreached.replay is None
        assert "nothing accepted a connection there" in unreached.failing, unreached
        said = [n for n in s.notes if "not reached yet" in n]
        assert said and said[0].startswith("ipc:///nonexistent/kv-events-test.sock: "), s.notes
    finally:
        follower.close()


def test_a_silent_replay_socket_is_shown_failing(setup, monkeypatch):
    """A publisher whose stream is reached but whose replay socket never answers."""
    monkeypatch.setattr("mooncake_kv_events._state.ASK_TIMEOUT", 0.3)
    s = setup()
    context = zmq.Context.instance()
    mute = context.socket(zmq.ROUTER)  # takes requests, answers none
    mute.setsockopt(zmq.LINGER, 0)
    mute.bind(s.fake.router + "-mute")
    follower = Follower([(s.fake.pub, s.fake.router + "-mute")])
    try:
        s.fake.wait_for_subscriber()
        until(follower, lambda: follower.counters().timeouts, "a request timed out")
        [status] = follower.statuses()
        assert status.reached and not status.in_sync and status.last_heard is None
        assert status.failing == "no answer to info in 0.3 s", status
        assert follower.counters().timeouts >= 1
    finally:
        follower.close()
        mute.close()


# What a Follower refuses to be given.


@pytest.mark.parametrize(
    "publishers, error, says",
    [
        ("tcp://127.0.0.1:5557", TypeError, "a list of publishers, not one str"),
        (b"tcp://127.0.0.1:5557", TypeError, "a list of publishers"),
        (5557, TypeError, "not a list"),
        ([("tcp://127.0.0.1:5557",)], ValueError, "1 item: a publisher is its PUB endpoint"),
        (
            [("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", "x")],
            ValueError,
            "3 items",
        ),
        ([5557], TypeError, "publisher 0 is a int"),
        ([], ValueError, "no publisher to follow"),
        (["127.0.0.1:5557"], ValueError, "names no transport: transport://address"),
        (["tcp://master-0"], ValueError, "a TCP endpoint is tcp://HOST:PORT"),
        (["tcp://master-0:99999"], ValueError, "tcp://HOST:PORT"),
        (["http://master-0:5557"], ValueError, "'http' is not a ZeroMQ transport"),
        (["ipc://"], ValueError, "has no address"),
        ([("tcp://a:1", b"tcp://a:2")], TypeError, "replay endpoint is a bytes"),
        ([("tcp://a:1", "tcp://a:1")], ValueError, "PUB and replay endpoints are both"),
        (["tcp://a:1", ("tcp://a:1", None)], ValueError, "a publisher given twice"),
    ],
)
def test_publishers_given_wrong_are_refused_saying_how(publishers, error, says):
    with pytest.raises(error) as raised:
        Follower(publishers)
    assert says in str(raised.value), raised.value


def test_other_arguments_given_wrong_are_refused():
    with pytest.raises(TypeError, match="AsyncFollower"):
        Follower(["tcp://127.0.0.1:5557"], context=zmq.asyncio.Context.instance())
    with pytest.raises(TypeError, match="not a zmq.Context"):
        Follower(["tcp://127.0.0.1:5557"], context="context")
    with pytest.raises(ValueError, match="receive_hwm"):
        Follower(["tcp://127.0.0.1:5557"], receive_hwm=-1)
    with pytest.raises(TypeError, match="on_event is a str"):
        Follower(["tcp://127.0.0.1:5557"], on_event="print")
    with pytest.raises(ValueError, match="go together"):
        Follower(["tcp://127.0.0.1:5557"], curve_server_key="server.pub")
    with (
        pytest.raises(TypeError, match="tenant and key are bytes"),
        Follower(["tcp://127.0.0.1:5557"]) as follower,
    ):
        follower.get("t", "k")


def test_a_wildcard_host_is_this_machine_and_publishers_are_named_by_endpoint():
    with Follower([("tcp://*:5557", "tcp://0.0.0.0:5558"), "ipc:///tmp/x.sock"]) as follower:
        assert follower.publishers == ["tcp://127.0.0.1:5557", "ipc:///tmp/x.sock"]
        statuses = follower.statuses()
        assert [type(s) for s in statuses] == [Status, Status]
        assert statuses[0].replay == "tcp://127.0.0.1:5558" and statuses[1].replay is None
        assert isinstance(follower.counters(), Counters)
        with pytest.raises(KeyError, match="no publisher 'tcp://elsewhere:1'"):
            follower.counters("tcp://elsewhere:1")
    # Closed, it can still be read, not polled.
    assert list(follower.objects()) == [] and not follower.in_sync()
    with pytest.raises(mooncake_kv_events.KvEventsError, match="closed"):
        follower.poll(0)


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
