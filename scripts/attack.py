#!/usr/bin/env python3
"""Plays a hostile peer against a running publisher and measures what it costs the publisher.

    scripts/attack.py --endpoint tcp://127.0.0.1:5557 --pid PID MODE [--count N] ...

The target is any process that runs a publisher on ENDPOINT (`kv-events demo --wait SECS`,
a master); PID is that process, whose descriptors (/proc/PID/fd), resident memory
(/proc/PID/status) and CPU time (/proc/PID/stat) are sampled while the attack runs. Every
attack is bounded in connections and time, and every connection goes to ENDPOINT only (use
loopback). One JSON object on stdout says what was done and measured.

Modes:
  idle         COUNT connections that connect and send nothing, held HOLD seconds
  garbage      COUNT connections that each send 1 KiB of random bytes, then close
  subscribe    COUNT peers that each subscribe to PREFIXES random 64-byte prefixes, ROUNDS times
  curve-flood  COUNT CURVE handshakes with keys not on the allow-list (--server-key)
  nonreaders   COUNT subscribers that subscribe and never read, held HOLD seconds
"""

import argparse
import json
import os
import random
import socket
import sys
import time

import zmq


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
    sent = 0
    rng = random.Random(args.seed)
    for _ in range(args.count):
        try:
            with socket.create_connection((host, port), timeout=2) as c:
                c.sendall(rng.randbytes(1024))
                sent += 1
        except OSError:
            pass
        if sent % 50 == 0:
            watch.tick()
    wait(watch, args.hold)
    return {"connections_sent_1_kib": sent}


def subscribe(args, watch):
    context = zmq.Context()
    rng = random.Random(args.seed)
    total = 0
    for _ in range(args.rounds):
        peers = []
        for _ in range(args.count):
            s = context.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(args.endpoint)
            for _ in range(args.prefixes):
                s.setsockopt(zmq.SUBSCRIBE, rng.randbytes(64))
                total += 1
            peers.append(s)
        wait(watch, 1.0)
        for s in peers:
            s.close()
        wait(watch, 0.5)
    context.term()
    wait(watch, args.hold)
    return {"subscriptions_sent": total}


def curve_flood(args, watch):
    if not args.server_key:
        sys.exit("attack.py: curve-flood needs --server-key (the publisher's .pub file)")
    # The certificate format kv-events keygen writes: public-key = "Z85".
    with open(args.server_key) as f:
        server_key = next(
            l.split("=", 1)[1].strip().strip('"') for l in f if l.strip().startswith("public-key")
        ).encode()
    context = zmq.Context()
    started = time.monotonic()
    for i in range(args.count):
        public, secret = zmq.curve_keypair()
        s = context.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.curve_serverkey = server_key
        s.curve_publickey = public
        s.curve_secretkey = secret
        s.connect(args.endpoint)
        if i % 20 == 19:
            wait(watch, 0.05)
        s.close()
    context.term()
    elapsed = time.monotonic() - started
    wait(watch, args.hold)
    return {"handshakes": args.count, "seconds": round(elapsed, 2)}


def nonreaders(args, watch):
    context = zmq.Context()
    peers = []
    for _ in range(args.count):
        s = context.socket(zmq.SUB)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVHWM, 1)
        s.setsockopt(zmq.RCVBUF, 4096)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(args.endpoint)
        peers.append(s)
    wait(watch, args.hold)
    for s in peers:
        s.close()
    context.term()
    return {"subscribers": args.count}


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
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    host, _ = host_port(args.endpoint)
    if not (host.startswith("127.") or host in ("localhost", "::1")) and "ipc://" not in args.endpoint:
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
