"""A fake publisher for the indexer's tests: an XPUB socket that sends what a test scripts
(the real stream's messages, or anything at all), and a ROUTER that answers info, replay and
snapshot requests as the publisher's replay socket does, from the state the test gives it.
It can also drop events the way a full queue does: their numbers are taken, nothing is sent,
and the state changes all the same. It numbers its messages as the real publisher does: 0 for
the first, then one more per message or dropped event."""

import threading
import time

import msgpack
import zmq

END = (-1).to_bytes(8, "big", signed=True)


class Fake:
    def __init__(self, directory, initial=(), incarnation=0x2525, snapshots=True):
        self.context = zmq.Context()
        self.pub = f"ipc://{directory}/pub.sock"
        self.router = f"ipc://{directory}/replay.sock"
        self.xpub = self.context.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.LINGER, 0)
        self.xpub.bind(self.pub)
        self.incarnation, self.snapshots = incarnation, snapshots
        self.lock = threading.Lock()
        self.truth = {}  # (backend, tenant, key) -> set of media
        self.next_sequence = 0  # the sequence the next message takes; the first is 0
        self.ring = []  # (sequence, payload) of every message sent
        self.infos_served = self.snapshots_served = self.replays_served = 0
        for event in initial:
            self.apply(event)
        self.start_serving()

    def start_serving(self):
        self.stopping = False
        ready = threading.Event()
        self.thread = threading.Thread(target=self.serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait()

    # The stream.

    def apply(self, event):
        tenant = event["tenant_id"]
        if event["event_type"] == "cleared":
            for entry in [e for e in self.truth if e[:2] == (event["backend_id"], tenant)]:
                del self.truth[entry]
            return
        entry = (event["backend_id"], tenant, event["object_key"])
        media = self.truth.setdefault(entry, set())
        if event["event_type"] == "stored":
            media.add(event["medium"])
        else:
            media.discard(event["medium"])
        if not media:
            del self.truth[entry]

    def publish(self, *events):
        with self.lock:
            for event in events:
                self.apply(event)
            sequence = self.next_sequence
            self.next_sequence += 1
            body = msgpack.packb([int(time.time() * 1000), list(events), 0])
            self.ring.append((sequence, body))
            self.xpub.send_multipart([b"", sequence.to_bytes(8, "big"), body])

    def drop(self, *events):
        """Events lost before encoding: each takes a number; the state has them."""
        with self.lock:
            for event in events:
                self.apply(event)
                self.next_sequence += 1

    def lose(self, *events):
        """A message lost on the way: numbered, held for replay, not sent to subscribers."""
        with self.lock:
            for event in events:
                self.apply(event)
            sequence = self.next_sequence
            self.next_sequence += 1
            body = msgpack.packb([int(time.time() * 1000), list(events), 0])
            self.ring.append((sequence, body))

    def restart(self, incarnation, *initial):
        """Another life of the publisher on the same endpoints: a new incarnation, sequences
        from 0 again, nothing held for replay, `initial` its state."""
        with self.lock:
            self.incarnation, self.next_sequence, self.ring, self.truth = incarnation, 0, [], {}
            for event in initial:
                self.apply(event)

    def rebind(self):
        """Closes both sockets and binds new ones on the same endpoints, as a publisher that
        restarted does: its subscribers connect again."""
        self.stopping = True
        self.thread.join()
        self.xpub.close()
        self.xpub = self.context.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.LINGER, 0)
        self.xpub.bind(self.pub)
        self.start_serving()

    def send_raw(self, frames):
        self.xpub.send_multipart(frames)

    def wait_for_subscriber(self):
        assert self.xpub.poll(20_000), "no subscriber came"
        self.xpub.recv()

    def wait_for(self, condition, what="the condition"):
        deadline = time.monotonic() + 20
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    def settle(self):
        """Waits for two more info requests: the indexer's checks of a quiet stream, the
        second a second after the first, by when it has read everything sent before."""
        served = self.infos_served
        self.wait_for(lambda: self.infos_served >= served + 2, "two checks")

    # The replay socket.

    def serve(self, ready):
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.router)
        ready.set()
        while not self.stopping:
            if not router.poll(50):
                continue
            peer, *request = router.recv_multipart()
            for frames in self.answer(request):
                router.send_multipart([peer, b"", *frames])
        router.close()

    def answer(self, request):
        with self.lock:
            if request == [b"", b"info"]:
                self.infos_served += 1
                # Holding nothing, the oldest a replay can send is the next message.
                oldest = self.ring[0][0] if self.ring else self.next_sequence
                return [
                    [
                        b"info",
                        msgpack.packb(
                            {
                                "incarnation": self.incarnation,
                                "backend_id": "b",
                                "dp_rank": 0,
                                "next_sequence": self.next_sequence,
                                "oldest_sequence": oldest,
                                "snapshots": self.snapshots,
                            }
                        ),
                    ]
                ]
            if request[:2] == [b"", b"snapshot"]:
                if not self.snapshots:
                    return [[b"error", b"snapshots are not available from this publisher"]]
                self.snapshots_served += 1
                events = [
                    {
                        "event_type": "stored",
                        "backend_id": b,
                        "tenant_id": t,
                        "object_key": k,
                        "medium": m,
                    }
                    for (b, t, k), media in sorted(self.truth.items(), key=repr)
                    for m in sorted(media)
                ]
                replies = [
                    [b"snapshot", msgpack.packb([0, events[i : i + 64], 0])]
                    for i in range(0, len(events), 64)
                ]
                return replies + [
                    [
                        b"snapshot-end",
                        msgpack.packb(
                            {
                                "next_sequence": self.next_sequence,
                                "objects": len(self.truth),
                                "events": len(events),
                                "incarnation": self.incarnation,
                                "tenant": None,
                            }
                        ),
                    ]
                ]
            if len(request) == 2 and request[0] == b"" and len(request[1]) == 8:
                self.replays_served += 1
                start = int.from_bytes(request[1], "big")
                return [[s.to_bytes(8, "big"), body] for s, body in self.ring if s >= start] + [
                    [END, b""]
                ]
            return [[b"error", b"unknown request"]]

    def close(self):
        self.stopping = True
        self.thread.join()
        self.xpub.close()
        self.context.term()
