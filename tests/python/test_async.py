"""Tests of `AsyncFollower`, the package's follower for asyncio, against the fake publisher
(tests/python/fake_publisher.py): a join, events and a gap as `Follower` has them, on a loop
that it never blocks for long (each poll waits in Rust on an executor thread), cancelled
and going on. Run by pytest (each test runs its own loop with asyncio.run)."""

import asyncio
import sys
import time

import pytest

import conftest  # noqa: F401  (the package under test on sys.path, as a script too)
import fake_publisher
from mooncake_kv_events import AsyncFollower, NoticeKind, Unreachable


def stored(key, medium="cpu", tenant="t"):
    return {
        "event_type": "stored",
        "backend_id": "b",
        "tenant_id": tenant,
        "object_key": key,
        "medium": medium,
    }


async def until(follower, condition, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await follower.poll(0.05)


@pytest.fixture
def fake(tmp_path):
    publisher = fake_publisher.Fake(tmp_path, [stored("a")])
    yield publisher
    publisher.close()


def test_an_async_follower_joins_applies_and_replays(fake):
    events, notices = [], []

    async def main():
        async with AsyncFollower(
            [(fake.pub, fake.router)],
            on_event=lambda *args: events.append(args),
            on_notice=notices.append,
        ) as follower:
            await until(follower, follower.in_sync, "in sync")
            fake.publish(stored("b"))
            fake.lose(stored("lost"))
            fake.publish(stored("c"))
            await until(follower, lambda: len(events) == 3, "the events")
            await until(follower, follower.in_sync, "in sync again")
            return list(follower.objects()), follower.counters(), follower.statuses()

    objects, counters, [status] = asyncio.run(main())
    assert [key for _, key, _ in objects] == [b"a", b"b", b"c", b"lost"]
    assert [n.kind for n in notices] == [
        NoticeKind.SNAPSHOT,
        NoticeKind.IN_SYNC,
        NoticeKind.REPLAYED,
        NoticeKind.IN_SYNC,
    ]
    assert (counters.replays, counters.snapshots, counters.events) == (1, 1, 3), counters
    assert status.reached and status.in_sync and status.next_sequence == 3


MESSAGES = 8000


def test_an_async_follower_never_blocks_the_loop_long(fake):
    """A burst of 8,000 messages of 64 events in its socket: while the follower applies them
    (in Rust, on an executor thread, without the GIL), another task of the loop keeps its
    2 ms beat."""
    batch = [stored(f"k{i:02}") for i in range(64)]
    gaps = []

    async def ticker(stop):
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.002)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def main():
        async with AsyncFollower([(fake.pub, fake.router)]) as follower:
            await until(follower, follower.in_sync, "in sync")
            for _ in range(MESSAGES):
                fake.publish(*batch)
            time.sleep(0.5)  # let the burst reach the follower's socket
            stop = asyncio.Event()
            task = asyncio.create_task(ticker(stop))
            started = time.monotonic()
            await until(follower, lambda: follower.counters().events == MESSAGES * 64, "the burst")
            took = time.monotonic() - started
            stop.set()
            await task
            return took

    took = asyncio.run(main())
    # The loop gets its turn all along: at least every 64 messages' worth.
    assert len(gaps) >= MESSAGES // (8 * 64), (took, len(gaps), max(gaps))
    assert max(gaps) < 0.5, (took, len(gaps), max(gaps))


def test_a_waiting_poll_leaves_the_loop_free(fake):
    """Polls that wait for nothing for a second: the loop's other tasks run all along."""
    ticks = []

    async def ticker(stop):
        while not stop.is_set():
            await asyncio.sleep(0.005)
            ticks.append(time.monotonic())

    async def main():
        async with AsyncFollower([(fake.pub, fake.router)]) as follower:
            await until(follower, follower.in_sync, "in sync")
            stop = asyncio.Event()
            task = asyncio.create_task(ticker(stop))
            # Polls of a quarter second (one may return early, on a notice) for a second.
            started = time.monotonic()
            while time.monotonic() - started < 1.0:
                await follower.poll(0.25)
            stop.set()
            await task

    asyncio.run(main())
    # Polls that blocked the loop would leave the ticker a tick or two per poll.
    assert len(ticks) >= 25, len(ticks)


def test_an_async_follower_raises_unreachable():
    async def main():
        upstream = ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
        async with AsyncFollower([upstream], request_timeout=0.3) as follower:
            with pytest.raises(Unreachable, match="tcp://127.0.0.1:1: "):
                await follower.run(idle_timeout=1)
            [status] = follower.statuses()
            assert not status.reached and status.failing is not None

    asyncio.run(main())


def test_a_cancelled_run_leaves_a_follower_that_goes_on(fake):
    async def main():
        async with AsyncFollower([(fake.pub, fake.router)]) as follower:
            task = asyncio.create_task(follower.run())
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(follower, follower.in_sync, "in sync")
            fake.publish(stored("b"))
            await until(follower, lambda: follower.counters().events == 1, "the event")
            # stop() ends a run as it does Follower's.
            later = asyncio.get_running_loop().call_later(0.3, follower.stop)
            started = time.monotonic()
            await follower.run(30)
            later.cancel()
            assert time.monotonic() - started < 5
            return [key for _, key, _ in follower.objects()]

    assert asyncio.run(main()) == [b"a", b"b"]


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
