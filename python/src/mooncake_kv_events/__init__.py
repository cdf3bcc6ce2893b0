"""A self-healing follower of Mooncake's KV event stream (docs/spec.md of mooncake-kv-events).

`Follower` subscribes to one or more publishers (a master's PUB socket and, optionally, its
replay socket), joins by a snapshot, heals every gap by a replay or a snapshot, follows
restarts, and keeps for each publisher the media each object is readable on:

    from mooncake_kv_events import Follower

    follower = Follower([("tcp://master-0:5557", "tcp://master-0:5558")])
    follower.run(5)                                 # or follower.poll(0.1) in a loop
    for tenant, key, media in follower.objects():   # bytes, bytes, frozenset of str
        print(tenant, key, sorted(media))
    print(follower.counters())
    follower.close()

The modules: `wire` (decoding), `index` (the index and its dump), `state` (the recovery
state machine of one publisher, without sockets), `follower` (the sockets), `cli` (the
`mooncake-kv-indexer` command, also `python3 -m mooncake_kv_events`).
"""

from .follower import CurveKeys, Follower, PublisherSpec, Refused, load_curve_keys
from .index import Index, Object, dump_lines, merged, write_dump
from .state import COUNTERS, EventCallback, FollowerState, Recovery, RecoveryCallback
from .wire import Event, Malformed

__version__ = "0.1.0"

__all__ = [
    "COUNTERS",
    "CurveKeys",
    "Event",
    "EventCallback",
    "Follower",
    "FollowerState",
    "Index",
    "Malformed",
    "Object",
    "PublisherSpec",
    "Recovery",
    "RecoveryCallback",
    "Refused",
    "__version__",
    "dump_lines",
    "load_curve_keys",
    "merged",
    "write_dump",
]
