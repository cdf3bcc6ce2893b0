"""A self-healing follower of Mooncake's KV event stream (docs/spec.md of mooncake-kv-events).

`Follower` subscribes to one or more publishers (a master's PUB socket and, optionally, its
replay socket), joins by a snapshot, heals every gap by a replay or a snapshot, follows
restarts, and keeps for each publisher the media each object is readable on:

    from mooncake_kv_events import Follower

    with Follower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
        follower.run(5)                                 # or follower.poll(0.1) in a loop
        for tenant, key, media in follower.objects():   # bytes, bytes, frozenset of str
            print(tenant, key, sorted(media))
        print(follower.counters(), follower.statuses())

`AsyncFollower` is the same for asyncio (`await follower.run(5)`). What this module exports
is the package's API; the modules whose names start with `_` are its inside (the state
machine without sockets, `_state`; the sockets, `_links`; decoding, `_wire`; the index,
`_index`), and `cli` is the `mooncake-kv-indexer` command (also `python3 -m
mooncake_kv_events`).
"""

from ._errors import KvEventsError, ProtocolError, Refused, Unreachable
from ._follower import AsyncFollower, Follower
from ._index import Object, dump_lines, write_dump
from ._links import CurveKeys, PublisherSpec, Status, load_curve_keys
from ._state import Counters, EventCallback, Recovery, RecoveryCallback, RecoveryKind
from ._version import __version__
from ._wire import Event, EventKind

__all__ = [
    "AsyncFollower",
    "Counters",
    "CurveKeys",
    "Event",
    "EventCallback",
    "EventKind",
    "Follower",
    "KvEventsError",
    "Object",
    "ProtocolError",
    "PublisherSpec",
    "Recovery",
    "RecoveryCallback",
    "RecoveryKind",
    "Refused",
    "Status",
    "Unreachable",
    "__version__",
    "dump_lines",
    "load_curve_keys",
    "write_dump",
]
