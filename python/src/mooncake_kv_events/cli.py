"""A self-healing indexer for the Mooncake KV event stream.

It keeps, per publisher, the media each object (backend_id, tenant_id, object_key) is
readable on, and keeps it right through loss. For each publisher it subscribes to the PUB
socket first, then asks the replay socket for a snapshot, holding the live messages back
meanwhile; it installs the snapshot, drops the held messages it already covers and applies
the rest in order. A gap in the sequence is filled by a replay while the publisher still
holds the range, and by a new snapshot when it does not; a new incarnation, or a sequence
going back, is a restart, answered by a snapshot. A publisher without snapshots is rebuilt
by a replay from sequence 0, its first message, while it holds it, and otherwise followed
from the stream with its index marked incomplete. Without a replay endpoint it does what it
can alone: on a gap it forgets that publisher's index and rebuilds it from the stream
(incomplete).
Malformed messages are counted and skipped, never fatal.

    pip install ./python                        # the mooncake-kv-indexer command
    mooncake-kv-indexer \\
        --publisher tcp://master-0:5557,tcp://master-0:5558 \\
        --publisher tcp://master-1:5557,tcp://master-1:5558 --dump index.jsonl

(`python3 -m mooncake_kv_events` and `examples/python/indexer.py` are the same program.)
A master that publishes with CURVE (docs/security.md) wants the master's public key and a key
pair of this indexer's, both as `kv-events keygen` writes them (one server key for every
publisher given):

    mooncake-kv-indexer --publisher tcp://master-0:5557,tcp://master-0:5558 \\
        --curve-server-key master-0.pub --curve-secret-key indexer-a.key

A publisher that refuses the indexer makes it exit 1 with the reason instead of waiting;
so does --idle-timeout when no publisher was ever reached (after writing --dump and --stats).
Ctrl-C or SIGTERM stops it cleanly: it writes --dump and --stats, prints its counters and
exits 0.

The dump is JSON lines, one per object, in byte order of tenant then key, as
`kv-events mirror` writes them:
    {"key":"prefix/0001","media":["cpu","disk"],"tenant":"default"}
Tenants and keys are the master's bytes: a JSON string when they are UTF-8, else
{"hex": "<their bytes in hex>"}. With several publishers it holds the index of the one in
sync heard from last (the leader of an HA deployment), or with --union all of them merged.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from ._errors import Refused, Unreachable
from ._follower import Follower
from ._index import write_dump
from ._links import CurveKeys, endpoint, load_curve_keys

__all__ = ["main", "parse_publisher"]


def parse_publisher(text: str) -> tuple[str, str | None]:
    """PUB_ENDPOINT[,REPLAY_ENDPOINT] as (PUB endpoint, replay endpoint or None)."""
    parts = text.split(",")
    if len(parts) > 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected PUB_ENDPOINT[,REPLAY_ENDPOINT]")
    try:
        stream = endpoint(parts[0], "the PUB endpoint")
        replay = endpoint(parts[1], "the replay endpoint") if len(parts) == 2 else None
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return stream, replay


def read_curve_keys(args: argparse.Namespace) -> CurveKeys:
    try:
        return load_curve_keys(args.curve_server_key, args.curve_secret_key)
    except (OSError, ValueError) as e:
        sys.exit(f"indexer: cannot read a key file: {e}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("endpoint", nargs="*", type=parse_publisher, help="the same as --publisher")
    p.add_argument(
        "--publisher",
        action="append",
        default=[],
        type=parse_publisher,
        metavar="PUB_ENDPOINT[,REPLAY_ENDPOINT]",
        help="a publisher to follow: its PUB socket and its replay socket "
        "(kv_events_replay_endpoint); repeat it for several",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="exit after this many seconds without a message (status 1 if no publisher "
        "was ever reached)",
    )
    p.add_argument(
        "--dump",
        metavar="PATH",
        help="write the final index here, as JSON lines: that of the publisher "
        "in sync heard from last",
    )
    p.add_argument(
        "--union", action="store_true", help="dump every publisher's index merged instead"
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
    publishers = args.endpoint + args.publisher
    if not publishers:
        p.error("give at least one publisher")
    if (args.curve_server_key is None) != (args.curve_secret_key is None):
        p.error("--curve-server-key and --curve-secret-key go together")
    curve_keys = read_curve_keys(args) if args.curve_server_key is not None else None

    try:
        follower = Follower(publishers, topic=args.topic.encode(), curve_keys=curve_keys, note=note)
    except (TypeError, ValueError) as e:
        p.error(str(e))
    for stream, replay in publishers:
        note(f"subscribed to {stream}" + (f", replay socket {replay}" if replay else ""))
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
        sys.exit(f"indexer: {why.publisher}: the publisher refused this indexer: {why.reason}")
    except Unreachable as why:
        unreachable = why
    if stopped:
        note(f"stopped by signal {stopped[0]}")
    chosen = None if args.union else follower.freshest()
    objects = follower.objects(chosen, union=chosen is None)
    if args.dump:
        count = write_dump(args.dump, objects)
    else:
        count = sum(1 for _ in objects)
    if args.stats:
        with open(args.stats, "w") as out:
            json.dump(
                {"dumped": "union" if chosen is None else chosen, "publishers": follower.stats()},
                out,
                indent=1,
            )
    for summary in follower.summaries():
        print(summary)
    whose = "the union of the publishers' indexes" if chosen is None else f"the index of {chosen}"
    print(f"{count} objects indexed: {whose}", flush=True)
    follower.close()
    if unreachable is not None:
        sys.exit(f"indexer: {unreachable}")
