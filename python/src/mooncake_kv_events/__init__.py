"""A self-healing follower of Mooncake's KV event stream (docs/spec.md of mooncake-kv-events):
the library's Rust follower, bound for Python, so that Python and Rust subscribers share one
state machine and Python follows at the Rust rate.

`Follower` subscribes to one or more upstreams (a master's PUB socket and its replay socket),
joins by a snapshot, heals every gap by a replay or a snapshot, follows restarts, and keeps
for each upstream the media each object is readable on:

    from mooncake_kv_events import Follower

    with Follower([("tcp://master-0:5557", "tcp://master-0:5558")]) as follower:
        follower.run(5)                                 # or follower.poll(0.1) in a loop
        for tenant, key, media in follower.objects():   # bytes, bytes, frozenset of str
            print(tenant, key, sorted(media))
        print(follower.counters(), follower.statuses())

`AsyncFollower` is the same for asyncio (`await follower.run(5)`). What this module exports
is the package's API; the modules whose names start with `_` are its inside (`_native`, the
Rust follower; `_follower`, its Python face; `_wire`, decoding events for `on_event`), and
`cli` is the `mooncake-kv-indexer` command (also `python3 -m mooncake_kv_events`).
"""

from ._errors import KvEventsError, ProtocolError, Refused, Unreachable
from ._follower import (
    AsyncFollower,
    EventCallback,
    Follower,
    FollowerCounters,
    Notice,
    NoticeCallback,
    NoticeKind,
    Object,
    Status,
    Upstream,
)
from ._version import __version__
from ._wire import Event, EventKind

__all__ = [
    "AsyncFollower",
    "Event",
    "EventCallback",
    "EventKind",
    "Follower",
    "FollowerCounters",
    "KvEventsError",
    "Notice",
    "NoticeCallback",
    "NoticeKind",
    "Object",
    "ProtocolError",
    "Refused",
    "Status",
    "Unreachable",
    "Upstream",
    "__version__",
]
