"""Tests of the `mooncake_kv_events` package's Follower (the Rust follower through the native
module) with real sockets, against a fake publisher (tests/python/fake_publisher.py) on ipc:
run(seconds), poll step by step, objects(), counters, the event and notice callbacks through
a join, a gap and restarts, a follower on a thread of its own, what it says of upstreams it
cannot reach, and what it refuses to be given (before anything reaches Rust). Run by pytest:
by cli/tests/python_indexer.rs on this checkout's python/src, and by scripts/python_package.sh
on the wheel installed in a fresh venv (MOONCAKE_KV_EVENTS_INSTALLED=1: the installed package,
never the checkout's)."""

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
    Event,
    EventKind,
    Follower,
    FollowerCounters,
    KvEventsError,
    Notice,
    NoticeKind,
    Status,
    Unreachable,
    Upstream,
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

    def __init__(self, directory, initial=(), on_event=None, **options):
        self.fake = fake_publisher.Fake(directory, initial)
        self.events, self.notices, self.notes = [], [], []
        self.follower = Follower(
            [(self.fake.pub, self.fake.router)],
            note=self.notes.append,
            on_event=on_event or (lambda *args: self.events.append(args)),
            on_notice=self.notices.append,
            **options,
        )

    def kinds(self):
        """The notices' kinds, but the disconnections a test's own rebinding causes."""
        return [n.kind for n in self.notices if n.kind != "disconnected"]

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
    assert (where / "_native.pyi").is_file(), where
    assert mooncake_kv_events.__version__
    # The native module: in the package, from this checkout or installed with it.
    native = pathlib.Path(mooncake_kv_events._native.__file__).resolve()
    assert native.name.endswith(".so"), native


def test_a_join_by_snapshot_then_events_objects_and_counters(setup):
    s = setup([stored("a"), stored("a", "disk"), stored(b"k\xff", "disk")])
    s.fake.wait_for_subscriber()
    s.in_sync()
    assert s.kinds() == ["snapshot", "in_sync"], s.notices
    assert s.kinds() == [NoticeKind.SNAPSHOT, NoticeKind.IN_SYNC]
    # Before the publisher sent anything: the snapshot holds no message, and the stream goes
    # on from the first, 0.
    snapshot = s.notices[0]
    assert snapshot.upstream == s.fake.pub and snapshot.took is not None
    assert snapshot.numbers == {
        "objects": 2,
        "events": 3,
        "next_sequence": 0,
        "incarnation": 0x2525,
    }, snapshot
    assert snapshot.text.startswith("snapshot: 2 objects, next sequence 0"), snapshot
    assert any(n.startswith(f"{s.fake.pub}: snapshot: 2 objects") for n in s.notes), s.notes
    [status] = s.follower.statuses()
    assert status.next_sequence == 0 and status.in_sync and status.reached
    assert status.failing is None and status.last_heard is not None
    assert status.silent_for is not None and 0 <= status.silent_for < 60
    assert s.notices[1].took is not None and s.events == []
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
    assert s.follower.count() == 4
    assert s.follower.get(b"t", b"a") == frozenset({"disk"})
    assert s.follower.get(b"t", b"gone") == frozenset()
    counters = s.follower.counters()
    assert counters == s.follower.counters(s.fake.pub), counters
    assert counters.snapshots == 1, counters
    assert (counters.messages, counters.events, counters.gaps) == (2, 3, 0), counters
    assert counters.convergences == 1 and counters.last_convergence is not None, counters
    [stats] = s.follower.stats()
    assert stats["objects"] == 4 and stats["in_sync"] and stats["reached"], stats
    assert stats["next_sequence"] == 2 and stats["events"] == 3, stats
    assert s.follower.freshest() == s.fake.pub == s.follower.upstreams[0].endpoint


def test_the_dump_is_the_mirrors_json_lines(setup, tmp_path):
    s = setup([stored("b"), stored("a", "disk"), stored(b"k\xff"), stored("z", tenant=b"\xfe")])
    s.fake.wait_for_subscriber()
    s.in_sync()
    path = tmp_path / "index.jsonl"
    assert s.follower.dump(path) == 4
    # Sorted by tenant then key bytes; bytes that are not UTF-8 as hex.
    assert path.read_text().splitlines() == [
        '{"key":"a","media":["disk"],"tenant":"t"}',
        '{"key":"b","media":["cpu"],"tenant":"t"}',
        '{"key":{"hex":"6bff"},"media":["cpu"],"tenant":"t"}',
        '{"key":"z","media":["cpu"],"tenant":{"hex":"fe"}}',
    ]
    assert s.follower.dump(path, union=True) == 4
    with pytest.raises(ValueError, match="not both"):
        s.follower.dump(path, s.fake.pub, union=True)


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
    assert s.follower.in_sync() and s.kinds() == ["snapshot", "in_sync"], s.notices
    for key in "xyz":
        s.fake.publish(stored(key))
    s.follower.run(1.0)
    assert [key for _, key, _ in s.follower.objects()] == [b"x", b"y", b"z"]
    # With every upstream silent that long, run returns early: it was reached.
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
    assert s.kinds() == ["snapshot", "in_sync", "replayed", "in_sync"], s.notices
    replayed = s.notices[2]
    # a took 0, the lost message 1, b 2.
    assert replayed.numbers == {"from": 1, "through": 1}, replayed
    assert replayed.took is not None and s.notices[3].took is not None
    # Every event, the lost one included, in the order of the stream.
    assert [(sequence, e.kind, e.key) for _, sequence, e in s.events] == [
        (0, "stored", b"a"),
        (1, "stored", b"lost"),
        (1, "removed", b"a"),
        (2, "stored", b"b"),
    ]
    assert [key for _, key, _ in s.follower.objects()] == [b"b", b"lost"]
    counters = s.follower.counters()
    assert (counters.gaps, counters.replays, counters.replayed_messages) == (1, 1, 1), counters


def test_an_upstream_without_a_replay_endpoint_is_its_stream_from_the_join(tmp_path):
    fake = fake_publisher.Fake(tmp_path, [stored("before")])
    notices = []
    follower = Follower([(fake.pub, None)], on_notice=notices.append)
    try:
        fake.wait_for_subscriber()
        fake.publish(stored("a"))
        until(follower, lambda: follower.count() == 1, "the first message")
        fake.lose(stored("lost"))
        fake.publish(stored("b"))
        until(follower, lambda: follower.count() == 2, "the message after the gap")
        # No snapshot: what came before the join is not there, nor what was lost.
        assert [key for _, key, _ in follower.objects()] == [b"a", b"b"]
        assert [n.kind for n in notices if n.kind == "unrecoverable"] == ["unrecoverable"]
        counters = follower.counters()
        assert (counters.snapshots, counters.gaps, counters.unrecoverable) == (0, 1, 1), counters
        assert follower.statuses()[0].replay_endpoint is None
    finally:
        follower.close()
        fake.close()


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
    kinds = s.kinds()
    # The sequence going back, then info's new incarnation: one restart, one snapshot.
    assert kinds[:2] == ["snapshot", "in_sync"] and kinds[-2:] == ["snapshot", "in_sync"], kinds
    assert set(kinds[2:-2]) <= {"sequence_back", "new_incarnation"} and kinds[2:-2], s.notices
    assert [key for _, key, _ in s.follower.objects()] == [b"new", b"next"]
    assert s.follower.statuses()[0].incarnation == 0x2626
    assert (s.follower.counters().incarnations, s.follower.counters().snapshots) == (1, 2)


def test_a_restart_on_new_sockets_is_one_incarnation_and_one_snapshot(setup):
    """A publisher restarted on the same endpoints: one new incarnation, one snapshot."""
    s = setup([stored("a")])
    s.fake.wait_for_subscriber()
    s.in_sync()
    s.fake.publish(stored("b"))
    s.fake.publish(stored("c"))
    until(s.follower, lambda: len(s.events) == 2, "the events")
    s.fake.restart(0x2727, stored("new"))
    s.fake.rebind()
    until(s.follower, lambda: s.kinds().count("in_sync") == 2, "the new life's snapshot")
    s.fake.wait_for_subscriber()
    s.fake.publish(stored("next"))
    until(s.follower, lambda: len(s.events) == 3, "the new life's first event")
    s.follower.run(1.5)  # a check or two more: nothing else happens
    kinds = s.kinds()
    assert kinds[:2] == ["snapshot", "in_sync"] and kinds[-2:] == ["snapshot", "in_sync"], kinds
    assert set(kinds[2:-2]) <= {"sequence_back", "new_incarnation"} and kinds[2:-2], s.notices
    assert [key for _, key, _ in s.follower.objects()] == [b"new", b"next"]
    counters = s.follower.counters()
    assert (counters.incarnations, counters.snapshots, counters.gaps) == (1, 2, 0), counters
    [status] = s.follower.statuses()
    assert status.incarnation == 0x2727 and status.next_sequence == 1 and status.in_sync


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


def test_poll_lets_other_threads_run_while_it_waits(setup):
    """poll waits in Rust without the GIL: a Python thread counts on meanwhile."""
    s = setup()
    s.fake.wait_for_subscriber()
    s.in_sync()
    counted = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    thread = threading.Thread(target=count)
    thread.start()
    try:
        # The thread's rate while this one sleeps (no GIL held), then while it polls.
        before, started = counted[0], time.monotonic()
        time.sleep(1.0)
        asleep = (counted[0] - before) / (time.monotonic() - started)
        # Polls of a quarter second (one may return early, on a notice) for a second.
        before, started = counted[0], time.monotonic()
        while time.monotonic() - started < 1.0:
            s.follower.poll(0.25)
        polling = (counted[0] - before) / (time.monotonic() - started)
    finally:
        stop.set()
        thread.join(10)
    # Polls that held the GIL would leave the thread a switch interval (5 ms) per poll.
    assert polling > 0.25 * asleep, (polling, asleep)


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
    s.follower.poll(0.2)
    failures = [r for r in records if r.levelno == logging.ERROR]
    assert len(failures) == 2 and "a callback raised" in failures[0].getMessage()
    assert failures[0].exc_info[0] is RuntimeError


# Upstreams that cannot be reached, or stay silent.


def test_an_unreachable_upstream_makes_run_raise_at_its_idle_timeout():
    follower = Follower([("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")], request_timeout=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(Unreachable) as raised:
            follower.run(idle_timeout=2)
        assert 2 <= time.monotonic() - started < 10
        [status] = raised.value.statuses
        assert status == follower.statuses()[0] or status.upstream == "tcp://127.0.0.1:1"
        assert (status.upstream, status.replay_endpoint) == (
            "tcp://127.0.0.1:1",
            "tcp://127.0.0.1:2",
        )
        assert not status.reached and status.last_heard is None and status.silent_for is None
        assert status.failing is not None, status  # its requests had no answer
        assert not status.in_sync and status.next_sequence is None
        assert "tcp://127.0.0.1:1: " in str(raised.value), raised.value
        assert isinstance(raised.value, KvEventsError)
        assert follower.counters().failed_requests >= 1
    finally:
        follower.close()


def test_one_unreachable_upstream_of_two_is_shown(setup):
    s = setup()
    s.fake.wait_for_subscriber()
    s.in_sync()
    follower = Follower(
        [(s.fake.pub, s.fake.router), ("ipc:///nonexistent/kv.sock", "ipc:///nonexistent/r.sock")],
        request_timeout=0.5,
    )
    try:
        follower.run(idle_timeout=1.5)  # one was reached: no exception
        reached, unreached = follower.statuses()
        assert reached.reached and reached.in_sync and reached.failing is None
        assert not unreached.reached and unreached.silent_for is None
        assert unreached.failing is not None, unreached
        assert not follower.in_sync() and follower.in_sync(s.fake.pub)
        assert follower.freshest() == s.fake.pub
    finally:
        follower.close()


def test_a_silent_replay_socket_is_shown_failing(setup):
    """An upstream whose stream is reached but whose replay socket never answers."""
    s = setup()
    context = zmq.Context.instance()
    mute = context.socket(zmq.ROUTER)  # takes requests, answers none
    mute.setsockopt(zmq.LINGER, 0)
    mute.bind(s.fake.router + "-mute")
    follower = Follower([(s.fake.pub, s.fake.router + "-mute")], request_timeout=0.3)
    try:
        s.fake.wait_for_subscriber()
        until(follower, lambda: follower.counters().failed_requests, "a request timed out")
        [status] = follower.statuses()
        assert not status.in_sync and status.last_heard is None
        assert status.failing is not None and "0.3" in status.failing, status
    finally:
        follower.close()
        mute.close()


# What a Follower refuses to be given, before anything reaches Rust.


@pytest.mark.parametrize(
    "upstreams, error, says",
    [
        ("tcp://127.0.0.1:5557", TypeError, "a list of upstreams, not one str"),
        (b"tcp://127.0.0.1:5557", TypeError, "a list of upstreams"),
        (5557, TypeError, "not a list"),
        (("tcp://a:1", "tcp://a:2"), TypeError, "not a list of them"),
        (["tcp://127.0.0.1:5557"], TypeError, "is 'tcp://127.0.0.1:5557' alone"),
        ([("tcp://127.0.0.1:5557",)], ValueError, "1 item: an upstream is (endpoint, replay"),
        ([("tcp://a:1", "tcp://a:2", "x")], ValueError, "3 items"),
        ([5557], TypeError, "upstream 0 is a int"),
        ([], ValueError, "no upstream to follow"),
        ([("127.0.0.1:5557", "tcp://a:2")], ValueError, "names no transport: transport://"),
        ([("tcp://master-0", "tcp://a:2")], ValueError, "a TCP endpoint is tcp://HOST:PORT"),
        ([("tcp://master-0:99999", "tcp://a:2")], ValueError, "tcp://HOST:PORT"),
        ([("http://master-0:5557", "tcp://a:2")], ValueError, "'http' is not a ZeroMQ"),
        ([("ipc://", "tcp://a:2")], ValueError, "has no address"),
        ([("tcp://a:1", b"tcp://a:2")], TypeError, "upstream 0: the replay endpoint is a bytes"),
        ([("tcp://a:1", "tcp://a:1")], ValueError, "are both 'tcp://a:1'"),
        ([("tcp://a:1", "tcp://a:2"), Upstream("tcp://a:1", "tcp://a:3")], ValueError, "twice"),
    ],
)
def test_upstreams_given_wrong_are_refused_saying_how(upstreams, error, says):
    with pytest.raises(error) as raised:
        Follower(upstreams)
    assert says in str(raised.value), raised.value


def test_other_arguments_given_wrong_are_refused():
    one = [("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")]
    for name, value, error in [
        ("receive_hwm", -1, ValueError),
        ("receive_hwm", 2**31, ValueError),
        ("receive_hwm", 1.5, TypeError),
        ("receive_hwm", True, TypeError),
        ("max_held", "10", TypeError),
        ("request_timeout", float("nan"), ValueError),
        ("request_timeout", float("inf"), ValueError),
        ("retry_after", -0.5, ValueError),
        ("quiet_check", "1", TypeError),
    ]:
        with pytest.raises(error, match=name):
            Follower(one, **{name: value})
    with pytest.raises(TypeError, match="on_event is a str"):
        Follower(one, on_event="print")
    with pytest.raises(ValueError, match="go together"):
        Follower(one, curve_server_key="server.pub")
    with pytest.raises(TypeError, match="topic is a int"):
        Upstream("tcp://a:1", "tcp://a:2", 5)
    # What Rust refuses is a KvEventsError naming the file, never a panic.
    with pytest.raises(KvEventsError, match="nonexistent"):
        Follower(one, curve_server_key="/nonexistent.pub", curve_secret_key="/nonexistent.key")
    with Follower(one) as follower:
        with pytest.raises(TypeError, match="tenant and key are bytes"):
            follower.get("t", "k")
        with pytest.raises(TypeError, match="timeout is a str"):
            follower.poll("1")


def test_a_wildcard_host_is_this_machine_and_upstreams_are_named_by_endpoint():
    upstreams = [
        ("tcp://*:5557", "tcp://0.0.0.0:5558"),
        Upstream("ipc:///tmp/x", "ipc:///tmp/y", "t"),
    ]
    with Follower(upstreams) as follower:
        assert [u.endpoint for u in follower.upstreams] == ["tcp://127.0.0.1:5557", "ipc:///tmp/x"]
        assert follower.upstreams[1].topic == b"t"
        statuses = follower.statuses()
        assert [type(s) for s in statuses] == [Status, Status]
        assert statuses[0].replay_endpoint == "tcp://127.0.0.1:5558"
        assert isinstance(follower.counters(), FollowerCounters)
        assert follower.freshest() is None and list(follower.objects()) == []
        with pytest.raises(KeyError, match="no upstream 'tcp://elsewhere:1'"):
            follower.counters("tcp://elsewhere:1")
    # Closed: every call says so.
    for call in (lambda: follower.poll(0), follower.statuses, follower.counters, follower.objects):
        with pytest.raises(KvEventsError, match="closed"):
            call()


def test_a_notice_is_a_plain_value():
    notice = Notice("tcp://a:1", NoticeKind.IN_SYNC, "in sync after 1.0 ms", {}, 0.001)
    assert notice.kind == "in_sync" and f"{notice.kind}" == "in_sync"
    assert NoticeKind("not_held") is NoticeKind.NOT_HELD


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
