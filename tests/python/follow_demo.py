"""A follower of `kv-events demo`, through the `mooncake_kv_events` package as an indexer
author would use it: it follows PUB_ENDPOINT and REPLAY_ENDPOINT until the demo has written
its --dump-index EXPECTED and the follower is in sync with every message numbered below its
next_sequence, then checks that its objects() are the demo's, and says how fast it applied
what it read. Exit status 0 when they are equal, 1 when not or when that takes over
--timeout seconds.

    python3 tests/python/follow_demo.py PUB_ENDPOINT REPLAY_ENDPOINT EXPECTED [--timeout S]
        [--pause S]

scripts/python_package.sh runs it from a fresh venv where the wheel is installed; the figures
of docs/performance.md ("The Python follower") come from it."""

import argparse
import json
import os
import sys
import time

from mooncake_kv_events import Follower


def rendered(value):
    """A tenant or key as the demo's --dump-index writes it: the text, or "hex:..."."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + value.hex()


def expected_index(path):
    """(objects, next_sequence) of the demo's --dump-index, once it is written whole: every
    message of the workload is numbered below next_sequence."""
    try:
        with open(path) as f:
            expected = json.load(f)
    except (OSError, ValueError):
        return None
    objects = sorted((tenant, key, tuple(media)) for _, tenant, key, media in expected["objects"])
    return objects, expected["next_sequence"]


def snapshot_events(notices):
    """The events of the snapshots taken so far, as their notices say."""
    return sum(n.numbers["events"] for n in notices if n.kind == "snapshot")


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("pub")
    p.add_argument("replay")
    p.add_argument("expected")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument(
        "--pause",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="once in sync, stop reading this long: what the demo sends meanwhile "
        "waits in the socket, and is then applied as fast as it can be",
    )
    args = p.parse_args()
    notices = []
    follower = Follower([(args.pub, args.replay)], on_notice=notices.append)
    started = time.monotonic()
    first = last = None  # when events were first and last seen applied
    applied = base = 0
    expected = None
    try:
        while True:
            now = time.monotonic()
            if now - started > args.timeout:
                sys.exit(
                    f"follow_demo: not in sync with the demo after {args.timeout:.0f} s: "
                    f"{follower.stats()}, notices {notices}"
                )
            before = time.monotonic()
            follower.poll(0.1)
            if args.pause and follower.in_sync():
                time.sleep(args.pause)
                args.pause = 0.0
                # What came before the pause is not timed.
                counters = follower.counters()
                first, base = None, counters.events + snapshot_events(notices)
                continue
            counters = follower.counters()
            events = counters.events + snapshot_events(notices)
            if events != applied:
                first = first or before
                last, applied = time.monotonic(), events
            if expected is None and os.path.exists(args.expected):
                expected = expected_index(args.expected)
            if (
                expected is not None
                and follower.in_sync()
                and follower.statuses()[0].next_sequence >= expected[1]
            ):
                break
        objects = sorted(
            (rendered(t), rendered(k), tuple(sorted(m))) for t, k, m in follower.objects()
        )
        [stats] = follower.stats()
    finally:
        follower.close()
    kinds = [str(n.kind) for n in notices]
    busy = (last - first) if first is not None and last > first else 0.0
    snapshot = next((n for n in notices if n.kind == "snapshot"), None)
    joined = next((n.took for n in notices if n.kind == "in_sync"), None)
    timed = stats["events"] + snapshot_events(notices) - base
    print(
        f"follow_demo: {len(objects)} objects, next sequence {stats['next_sequence']}, "
        f"{stats['events']} events and {snapshot_events(notices)} snapshot events applied, "
        f"{timed} of them in {busy:.2f} s ({timed / max(busy, 1e-9):,.0f} events/s);"
        f" in sync {joined if joined is None else round(joined, 2)} s after the "
        f"start{'' if snapshot is None else ', by a snapshot'}; notices {kinds}; gaps "
        f"{stats['gaps']}, replays {stats['replays']}, malformed {stats['malformed']}"
    )
    if objects != expected[0] or stats["next_sequence"] != expected[1]:
        have, want = set(objects), set(expected[0])
        missing = sorted(want - have)[:5]
        extra = sorted(have - want)[:5]
        sys.exit(
            f"follow_demo: the index is not the demo's: missing {missing}, extra {extra}, "
            f"next sequence {stats['next_sequence']} against {expected[1]}"
        )
    print(f"follow_demo: the index equals the demo's ({len(objects)} objects)")


if __name__ == "__main__":
    main()
