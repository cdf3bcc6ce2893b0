#!/usr/bin/env python3
"""A minimal indexer for the Mooncake KV event stream.

It keeps, per (backend_id, tenant_id, object_key), the set of media the object is readable
on, and shows the only safe reaction to loss: when a sequence gap or a publisher restart
shows up, everything known about that backend is dropped and rebuilt ("resync"). A real
indexer would re-read the backend's current state from the store at that point; this one
starts that backend's index afresh from the stream.

    apt install python3-zmq python3-msgpack     # Debian (scripts/install-deps.sh does it)
    /usr/bin/python3 examples/python/indexer.py tcp://127.0.0.1:5557 --idle-timeout 5 --dump index.json

A master that publishes with CURVE (docs/security.md) wants the master's public key and a key
pair of this indexer's, both as `kv-events keygen` writes them:

    /usr/bin/python3 examples/python/indexer.py tcp://master-0:5557 \
        --curve-server-key master-0.pub --curve-secret-key indexer-a.key

A publisher that refuses the indexer makes it exit 1 with the reason instead of waiting.

tests/python_indexer.rs runs it against `kv-events demo` and checks its final index.
"""

import argparse
import json
import sys
import time

import msgpack
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message


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


class Refused(Exception):
    """The publisher refused this subscriber's handshake, or it cannot succeed."""


class Handshakes:
    """Watches the SUB socket's handshakes, so that a refusal is an error, not silence.
    ZeroMQ says why only as far as the mechanism lets it: a key not on the allow-list is
    an AUTH failure at once; no keys, or the wrong server key, shows as the publisher
    closing the connection mid-handshake, taken for a refusal the second time in a row."""

    EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    def __init__(self, socket, curve):
        self.monitor = socket.get_monitor_socket(self.EVENTS)
        self.curve = curve
        self.closed = 0

    def check(self):
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.closed = 0
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise Refused("this indexer's public key or address is not on its allow-list")
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                raise Refused("its security mechanism is not this indexer's"
                              + ("" if self.curve else " (it requires CURVE: "
                                 "--curve-server-key, --curve-secret-key)"))
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.closed += 1
                if self.closed >= 2:
                    raise Refused("it closed the connection during the handshake twice in a row: "
                                  + ("the server key is not the publisher's" if self.curve
                                     else "it probably requires CURVE"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("endpoint")
    parser.add_argument("--idle-timeout", type=float, default=None, help="exit after this many silent seconds")
    parser.add_argument("--dump", help="write the final index as JSON to this file")
    parser.add_argument("--curve-server-key", metavar="FILE",
                        help="the publisher's public key file (its NAME.pub): read a CURVE stream")
    parser.add_argument("--curve-secret-key", metavar="FILE",
                        help="this indexer's key file (its NAME.key), whose .pub the publisher admits")
    args = parser.parse_args()
    if (args.curve_server_key is None) != (args.curve_secret_key is None):
        parser.error("--curve-server-key and --curve-secret-key go together")

    socket = zmq.Context().socket(zmq.SUB)
    socket.setsockopt(zmq.RCVHWM, 1_000_000)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    curve = args.curve_server_key is not None
    if curve:
        try:
            server_public, _ = zmq.auth.load_certificate(args.curve_server_key)
            public, secret = zmq.auth.load_certificate(args.curve_secret_key)
        except (OSError, ValueError) as e:
            sys.exit(f"indexer: cannot read a key file: {e}")
        if secret is None:
            sys.exit(f"indexer: {args.curve_secret_key} holds no secret-key (a NAME.key is wanted)")
        socket.curve_serverkey = server_public
        socket.curve_publickey = public
        socket.curve_secretkey = secret
    handshakes = Handshakes(socket, curve)
    socket.connect(args.endpoint)
    print(f"subscribed to {args.endpoint}", file=sys.stderr, flush=True)
    index = Index()
    timeout = None if args.idle_timeout is None else args.idle_timeout
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(handshakes.monitor, zmq.POLLIN)
    silent_since = time.monotonic()
    while True:
        try:
            handshakes.check()
        except Refused as why:
            sys.exit(f"indexer: {args.endpoint}: the publisher refused this indexer: {why}")
        left = None if timeout is None else timeout - (time.monotonic() - silent_since)
        if left is not None and left <= 0:
            break
        ready = dict(poller.poll(None if left is None else int(left * 1000) + 1))
        if socket not in ready:
            continue
        silent_since = time.monotonic()
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
