#!/usr/bin/env python3
"""Plays a hostile peer against a running publisher and measures what it costs the publisher.

    scripts/attack.py --endpoint tcp://127.0.0.1:5557 --pid PID MODE [--count N] ...

The target is any process that runs a publisher on ENDPOINT (`kv-events demo --wait SECS`,
a master); PID is that process, whose descriptors (/proc/PID/fd), resident memory
(/proc/PID/status) and CPU time (/proc/PID/stat) are sampled while the attack runs. Every
attack is bounded in connections and time, and every connection goes to ENDPOINT only (use
loopback). One JSON object on stdout says what was done and measured: each attack also says
how far each of its peers got as the peer saw it (its socket's events), so that a run that
did less than its name says shows in its report.

Modes:
  idle         COUNT connections that connect and send nothing, held HOLD seconds
  garbage      COUNT connections that each send 1 KiB of random bytes, then wait for the
               publisher to close them (at most WINDOW at once)
  subscribe    COUNT peers that each subscribe to PREFIXES random 64-byte prefixes, ROUNDS times;
               each waits for its handshake and for the publisher to cut it off
  curve-flood  COUNT CURVE handshakes with keys not on the allow-list (--server-key), each
               carried through to the publisher's answer (at most WINDOW at once)
  nonreaders   COUNT subscribers that subscribe and never read, held HOLD seconds once all
               finished their handshakes
"""

import argparse
import json
import os
import random
import selectors
import socket
import sys
import time

import zmq
from zmq.utils.monitor import recv_monitor_message


def sample(pid):
    """The target's descriptors, resident KiB, peak resident KiB and CPU seconds."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            status[key] = value.split()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    return {
        "fds": fds,
        "rss_kib": int(status["VmRSS"][0]),
        "peak_rss_kib": int(status["VmHWM"][0]),
        "cpu_s": round(cpu, 3),
    }


class Watch:
    """Samples the target every 50 ms while the attack runs: the largest values seen."""

    def __init__(self, pid):
        self.pid = pid
        self.before = sample(pid)
        self.last = self.before
        self.peak = dict(self.before)

    def tick(self):
        try:
            now = sample(self.pid)
        except (FileNotFoundError, KeyError, ProcessLookupError):
            # The target ended (its workload done): what it was last is what counts.
            return self.last
        self.last = now
        for key in ("fds", "rss_kib"):
            self.peak[key] = max(self.peak[key], now[key])
        return now


def host_port(endpoint):
    rest = endpoint.split("://", 1)[1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def wait(watch, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.tick()
        time.sleep(0.05)


def closed_by_peer(sock):
    """Whether the publisher closed this raw connection (EOF or reset), without waiting."""
    sock.setblocking(False)
    try:
        # The publisher's greeting may come first; the end, if any, after it.
        while sock.recv(4096):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def idle(args, watch):
    host, port = host_port(args.endpoint)
    conns = []
    for _ in range(args.count):
        try:
            conns.append(socket.create_connection((host, port), timeout=2))
        except OSError:
            pass
        watch.tick()
    wait(watch, 0.5)
    refused_at_once = sum(closed_by_peer(c) for c in conns)
    held = watch.tick()["fds"]
    wait(watch, args.hold)
    closed_in_time = sum(closed_by_peer(c) for c in conns)
    for c in conns:
        c.close()
    return {
        "connected": len(conns),
        "closed_within_0_5_s": refused_at_once,
        "fds_after_0_5_s": held,
        f"closed_within_{args.hold}_s": closed_in_time,
    }


def garbage(args, watch):
    host, port = host_port(args.endpoint)
    rng = random.Random(args.seed)
    selector = selectors.DefaultSelector()
    sent = closed = unanswered = 0
    started = 0
    # At most WINDOW connections at once, each sent its bytes, then read until the publisher
    # closes it: the publisher read them and refused them, which is the attack.
    while started < args.count or selector.get_map():
        while started < args.count and len(selector.get_map()) < args.window:
            started += 1
            try:
                c = socket.create_connection((host, port), timeout=2)
                c.sendall(rng.randbytes(1024))
            except OSError:
                continue
            sent += 1
            c.setblocking(False)
            selector.register(c, selectors.EVENT_READ, time.monotonic())
        for key, _ in selector.select(timeout=0.05):
            if closed_by_peer(key.fileobj):
                closed += 1
                selector.unregister(key.fileobj)
                key.fileobj.close()
        now = time.monotonic()
        for key in list(selector.get_map().values()):
            if now - key.data > args.answer_timeout:
                unanswered += 1
                selector.unregister(key.fileobj)
                key.fileobj.close()
        watch.tick()
    selector.close()
    wait(watch, args.hold)
    return {"connections_sent_1_kib": sent, "closed_by_publisher": closed, "unanswered": unanswered}


class Peer:
    """A ZeroMQ socket with its monitor: what its own side sees of the publisher. It
    connects once (no reconnection), so that each peer is one connection to the publisher."""

    def __init__(self, context, kind, endpoint, setup=None):
        self.socket = context.socket(kind)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RECONNECT_IVL, -1)
        if setup:
            setup(self.socket)
        self.monitor = self.socket.get_monitor_socket()
        self.socket.connect(endpoint)
        self.events = set()
        self.started = time.monotonic()

    def read_events(self):
        while True:
            try:
                self.events.add(recv_monitor_message(self.monitor, zmq.NOBLOCK)["event"])
            except zmq.Again:
                return

    def saw(self, *events):
        return any(e in self.events for e in events)

    def close(self):
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close()


HANDSHAKE_ENDS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    zmq.EVENT_DISCONNECTED,
)


def run_peers(watch, count, window, timeout, start, finished):
    """Runs COUNT peers, at most WINDOW at once: start(i) makes one, finished(peer) says
    whether it got as far as it should; one that did not within TIMEOUT seconds is given up.
    Each is closed when done. Returns the peers, closed, and how many were given up."""
    waiting, live, done, given_up = 0, [], [], 0
    while waiting < count or live:
        while waiting < count and len(live) < window:
            live.append(start(waiting))
            waiting += 1
        poller = zmq.Poller()
        for peer in live:
            poller.register(peer.monitor, zmq.POLLIN)
        poller.poll(50)
        still = []
        for peer in live:
            peer.read_events()
            if finished(peer):
                peer.close()
                done.append(peer)
            elif time.monotonic() - peer.started > timeout:
                given_up += 1
                peer.close()
                done.append(peer)
            else:
                still.append(peer)
        live = still
        watch.tick()
    return done, given_up


def subscribe(args, watch):
    context = zmq.Context()
    rng = random.Random(args.seed)
    total = joined = cut_off = given_up = 0

    def start(_):
        def setup(s):
            # Queued now, sent as soon as the handshake is done.
            for _ in range(args.prefixes):
                s.setsockopt(zmq.SUBSCRIBE, rng.randbytes(64))

        return Peer(context, zmq.SUB, args.endpoint, setup)

    for _ in range(args.rounds):
        # Each peer joins, sends its subscriptions, and waits for the publisher to cut it off.
        peers, missed = run_peers(
            watch,
            args.count,
            args.count,
            args.answer_timeout,
            start,
            lambda p: p.saw(zmq.EVENT_DISCONNECTED),
        )
        total += args.count * args.prefixes
        joined += sum(p.saw(zmq.EVENT_HANDSHAKE_SUCCEEDED) for p in peers)
        cut_off += sum(p.saw(zmq.EVENT_DISCONNECTED) for p in peers)
        given_up += missed
        wait(watch, 0.5)
    context.term()
    wait(watch, args.hold)
    return {
        "subscriptions_sent": total,
        "joined": joined,
        "cut_off": cut_off,
        "unanswered": given_up,
    }


def curve_flood(args, watch):
    if not args.server_key:
        sys.exit("attack.py: curve-flood needs --server-key (the publisher's .pub file)")
    # The certificate format kv-events keygen writes: public-key = "Z85".
    with open(args.server_key) as f:
        server_key = next(
            line.split("=", 1)[1].strip().strip('"')
            for line in f
            if line.strip().startswith("public-key")
        ).encode()
    context = zmq.Context()
    started = time.monotonic()

    def start(_):
        def setup(s):
            public, secret = zmq.curve_keypair()
            s.curve_serverkey = server_key
            s.curve_publickey = public
            s.curve_secretkey = secret

        return Peer(context, zmq.SUB, args.endpoint, setup)

    # Each handshake runs until the publisher answers it (its ZAP handler refuses the key).
    peers, given_up = run_peers(
        watch, args.count, args.window, args.answer_timeout, start, lambda p: p.saw(*HANDSHAKE_ENDS)
    )
    context.term()
    elapsed = time.monotonic() - started
    wait(watch, args.hold)
    return {
        "handshakes": args.count,
        "refused": sum(p.saw(zmq.EVENT_HANDSHAKE_FAILED_AUTH) for p in peers),
        "admitted": sum(p.saw(zmq.EVENT_HANDSHAKE_SUCCEEDED) for p in peers),
        "unanswered": given_up,
        "seconds": round(elapsed, 2),
    }


def nonreaders(args, watch):
    context = zmq.Context()

    def setup(s):
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.setsockopt(zmq.SUBSCRIBE, b"")

    peers = [Peer(context, zmq.SUB, args.endpoint, setup) for _ in range(args.count)]
    # Held once every one has joined (or the time to join ran out), never reading.
    deadline = time.monotonic() + args.answer_timeout
    while time.monotonic() < deadline:
        for p in peers:
            p.read_events()
        if all(p.saw(*HANDSHAKE_ENDS) for p in peers):
            break
        watch.tick()
        time.sleep(0.05)
    joined = sum(p.saw(zmq.EVENT_HANDSHAKE_SUCCEEDED) for p in peers)
    wait(watch, args.hold)
    for p in peers:
        p.read_events()
    dropped = sum(p.saw(zmq.EVENT_DISCONNECTED) for p in peers)
    for p in peers:
        p.close()
    context.term()
    return {"subscribers": args.count, "joined": joined, "disconnected": dropped}


MODES = {
    "idle": idle,
    "garbage": garbage,
    "subscribe": subscribe,
    "curve-flood": curve_flood,
    "nonreaders": nonreaders,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--pid", type=int, required=True, help="the publisher's process")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--prefixes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hold", type=float, default=4.0, help="seconds to hold or wait after")
    parser.add_argument("--server-key", help="curve-flood: the publisher's public key file")
    parser.add_argument(
        "--window", type=int, default=20, help="garbage, curve-flood: connections in flight at once"
    )
    parser.add_argument(
        "--answer-timeout",
        type=float,
        default=10.0,
        help="seconds a peer waits for the publisher's answer before giving up",
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    host, _ = host_port(args.endpoint)
    if (
        not (host.startswith("127.") or host in ("localhost", "::1"))
        and "ipc://" not in args.endpoint
    ):
        sys.exit("attack.py: attacks go to loopback endpoints only")
    watch = Watch(args.pid)
    done = MODES[args.mode](args, watch)
    after = watch.tick()
    print(
        json.dumps(
            {
                "mode": args.mode,
                **done,
                "before": watch.before,
                "peak": {"fds": watch.peak["fds"], "rss_kib": watch.peak["rss_kib"]},
                "after": after,
                "cpu_s_spent": round(after["cpu_s"] - watch.before["cpu_s"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
