"""A self-healing indexer for the Mooncake KV event stream.

It keeps, per upstream (a publisher: its PUB socket and its replay socket), the media each
object (tenant, key) is readable on, and keeps it right through loss: it joins by a snapshot,
fills a gap by a replay while the publisher still holds it and by a snapshot when it does not,
and answers a restart by a snapshot. It is the library's Rust follower (the same state machine
as `kv-events mirror`), driven from Python. Malformed messages are counted and skipped, never
fatal.

    pip install ./python                        # the mooncake-kv-indexer command
    mooncake-kv-indexer \\
        --publisher tcp://master-0:5557,tcp://master-0:5558 \\
        --publisher tcp://master-1:5557,tcp://master-1:5558 --dump index.jsonl

(`python3 -m mooncake_kv_events` and `examples/python/indexer.py` are the same program.)
A master that publishes with CURVE (docs/security.md) wants the master's public key and a key
pair of this indexer's, both as `kv-events keygen` writes them (one server key for every
upstream given):

    mooncake-kv-indexer --publisher tcp://master-0:5557,tcp://master-0:5558 \\
        --curve-server-key master-0.pub --curve-secret-key indexer-a.key

A publisher that refuses the indexer makes it exit 1 with the reason instead of waiting;
so does --idle-timeout when no upstream was ever heard from (after writing --dump and --stats).
Ctrl-C or SIGTERM stops it cleanly: it writes --dump and --stats, prints its counters and
exits 0.

The dump is JSON lines, one per object, in byte order of tenant then key, as
`kv-events mirror` writes them:
    {"key":"prefix/0001","media":["cpu","disk"],"tenant":"default"}
Tenants and keys are the master's bytes: a JSON string when they are UTF-8, else
{"hex": "<their bytes in hex>"}. With several upstreams it holds the index of the one in
sync heard from last (the leader of an HA deployment), or with --union all of them merged.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from ._errors import KvEventsError, Refused, Unreachable
from ._follower import Follower, Upstream

__all__ = ["main", "parse_upstream"]


def parse_upstream(text: str) -> tuple[str, str]:
    """ENDPOINT,REPLAY_ENDPOINT as (endpoint, replay endpoint), checked."""
    parts = text.split(",")
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected ENDPOINT,REPLAY_ENDPOINT")
    try:
        Upstream(parts[0], parts[1])
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return parts[0], parts[1]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("endpoint", nargs="*", type=parse_upstream, help="the same as --publisher")
    p.add_argument(
        "--publisher",
        action="append",
        default=[],
        type=parse_upstream,
        metavar="ENDPOINT,REPLAY_ENDPOINT",
        help="a publisher to follow: its PUB socket and its replay socket "
        "(kv_events_replay_endpoint); repeat it for several",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="exit after this many seconds without a message (status 1 if no upstream "
        "was ever heard from)",
    )
    p.add_argument(
        "--dump",
        metavar="PATH",
        help="write the final index here, as JSON lines: that of the upstream "
        "in sync heard from last",
    )
    p.add_argument(
        "--union", action="store_true", help="dump every upstream's index merged instead"
    )
    p.add_argument("--stats", metavar="PATH", help="write the final counters here, as JSON")
    p.add_argument(
        "--curve-server-key",
        metavar="FILE",
        help="the publisher's public key file (its NAME.pub): read a CURVE stream",
    )
    p.add_argument(
        "--curve-secret-key",
        metavar="FILE",
        help="this indexer's key file (its NAME.key), whose .pub the publisher admits",
    )
    p.add_argument(
        "--topic",
        default="",
        help="subscribe to this topic (the master's kv_events_topic) or a prefix "
        "of it; default: every message",
    )
    return p


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    """The indexer: follows the publishers until a signal or --idle-timeout, then writes
    --dump and --stats and prints each publisher's counters."""
    p = parser()
    args = p.parse_args(argv)
    pairs = args.endpoint + args.publisher
    if not pairs:
        p.error("give at least one upstream")
    if (args.curve_server_key is None) != (args.curve_secret_key is None):
        p.error("--curve-server-key and --curve-secret-key go together")
    try:
        upstreams = [Upstream(stream, replay, args.topic) for stream, replay in pairs]
        follower = Follower(
            upstreams,
            curve_server_key=args.curve_server_key,
            curve_secret_key=args.curve_secret_key,
            note=note,
        )
    except (TypeError, ValueError) as e:
        p.error(str(e))
    except KvEventsError as e:
        sys.exit(f"indexer: {e}")
    for upstream in upstreams:
        note(f"subscribed to {upstream.endpoint}, replay socket {upstream.replay_endpoint}")
    stopped: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.append(signum)
        follower.stop()

    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, on_signal)
    unreachable: Unreachable | None = None
    try:
        follower.run(idle_timeout=args.idle_timeout)
    except Refused as why:
        follower.close()
        sys.exit(f"indexer: {why.upstream}: the publisher refused this indexer: {why.reason}")
    except Unreachable as why:
        unreachable = why
    if stopped:
        note(f"stopped by signal {stopped[0]}")
    chosen = None if args.union else follower.freshest()
    if args.dump:
        count = follower.dump(args.dump, chosen, union=args.union)
    else:
        count = follower.count(chosen, union=args.union)
    if args.stats:
        with open(args.stats, "w") as out:
            json.dump(
                {
                    "dumped": "union" if args.union else chosen or follower.upstreams[0].endpoint,
                    "upstreams": follower.stats(),
                },
                out,
                indent=1,
            )
    for summary in follower.summaries():
        print(summary)
    if args.union:
        whose = "the union of the upstreams' indexes"
    else:
        whose = f"the index of {chosen or follower.upstreams[0].endpoint}"
    print(f"{count} objects indexed: {whose}", flush=True)
    follower.close()
    if unreachable is not None:
        sys.exit(f"indexer: {unreachable}")
