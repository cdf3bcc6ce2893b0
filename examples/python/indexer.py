#!/usr/bin/env python3
"""A minimal indexer for the Mooncake KV event stream.

It keeps, per (backend_id, tenant_id, object_key), the set of media the object is readable
on, and shows the only safe reaction to loss: when a sequence gap or a publisher restart
shows up, everything known about that backend is dropped and rebuilt ("resync"). A real
indexer would re-read the backend's current state from the store at that point; this one
starts that backend's index afresh from the stream.

    apt install python3-zmq python3-msgpack     # Debian (scripts/install-deps.sh does it)
    /usr/bin/python3 examples/python/indexer.py tcp://127.0.0.1:5557 --idle-timeout 5 --dump index.json

tests/python_indexer.rs runs it against `kv-events demo` and checks its final index.
"""

import argparse
import json
import sys

import msgpack
import zmq


def text(value):
    """Keys, tenants and groups are msgpack str, or bin when not UTF-8: keep them apart."""
    return value if isinstance(value, str) else "hex:" + bytes(value).hex()


class Index:
    def __init__(self):
        self.media = {}          # (backend, tenant, key) -> set of media
        self.last_sequence = None
        self.resyncs = 0

    def on_message(self, sequence, events):
        """Applies one message; returns False when the stream before it was incomplete."""
        complete = (
            sequence == self.last_sequence + 1 if self.last_sequence is not None else sequence == 1
        )
        if not complete:
            # A gap (events dropped by the publisher or messages by the network) or a restart
            # (the sequence went back to 1): what we hold for these backends can be wrong.
            self.resync({event["backend_id"] for event in events})
        self.last_sequence = sequence
        for event in events:
            self.apply(event)
        return complete

    def apply(self, event):
        backend, tenant = event["backend_id"], text(event["tenant_id"])
        kind = event["event_type"]
        if kind == "cleared":
            for entry in [e for e in self.media if e[:2] == (backend, tenant)]:
                del self.media[entry]
            return
        entry = (backend, tenant, text(event["object_key"]))
        media = self.media.setdefault(entry, set())
        # Both are idempotent per (backend, tenant, key, medium): a repeated stored or a
        # removed of something unknown changes nothing.
        if kind == "stored":
            media.add(event["medium"])
        elif kind == "removed":
            media.discard(event["medium"])
        if not media:
            del self.media[entry]

    def resync(self, backends):
        self.resyncs += 1
        for entry in [e for e in self.media if e[0] in backends]:
            del self.media[entry]

    def as_json(self):
        return {
            "objects": sorted(
                [backend, tenant, key, sorted(media)]
                for (backend, tenant, key), media in self.media.items()
            ),
            "last_sequence": self.last_sequence,
            "resyncs": self.resyncs,
        }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("endpoint")
    parser.add_argument("--idle-timeout", type=float, default=None, help="exit after this many silent seconds")
    parser.add_argument("--dump", help="write the final index as JSON to this file")
    args = parser.parse_args()

    socket = zmq.Context().socket(zmq.SUB)
    socket.setsockopt(zmq.RCVHWM, 1_000_000)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(args.endpoint)
    print(f"subscribed to {args.endpoint}", file=sys.stderr, flush=True)
    index = Index()
    timeout = None if args.idle_timeout is None else int(args.idle_timeout * 1000)
    while socket.poll(timeout):
        topic, sequence, payload = socket.recv_multipart()
        sequence = int.from_bytes(sequence, "big")
        # raw=False: str stays str; bin arrives as bytes and is never mistaken for text.
        timestamp_ms, events, dp_rank = msgpack.unpackb(payload, raw=False)
        previous = index.last_sequence
        if not index.on_message(sequence, events):
            print(f"sequence {sequence} after {previous}: resync", file=sys.stderr)
    result = index.as_json()
    if args.dump:
        with open(args.dump, "w") as out:
            json.dump(result, out, indent=1)
    print(f"{len(result['objects'])} objects indexed, last sequence {index.last_sequence}, "
          f"{index.resyncs} resyncs")


if __name__ == "__main__":
    main()
