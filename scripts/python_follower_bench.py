#!/usr/bin/env python3
"""The Python follower against the Rust one, `kv-events mirror`, on the same demo stream.

    cargo build --release --locked --bin kv-events
    /usr/bin/python3 scripts/python_follower_bench.py        # about a minute
    /usr/bin/python3 scripts/python_follower_bench.py --objects 200000 --loops 3 --rounds 3

1. The stream: `kv-events demo --objects N` publishes its workload (200,000 objects: about
   572,000 events in about 10,200 messages of up to 64 events) while this script records
   every message of it (checked whole: sequences 0, 1, 2, ... with no gap).
2. Each round, for each follower in turn (the order alternates), a publisher of this script
   serves that recording: its replay socket answers `info` and an empty snapshot at sequence 0,
   so the follower joins in sync before message 0; then the whole recording (`--loops` times
   over, renumbered from 0 on: events are absolute, so the index ends the same) is sent at
   once into the follower's socket, far faster than either applies it. The follower is a
   process of its own: `kv-events mirror --every 0.1` (the Rust `Follower`), or this script's
   `follow` command (the `mooncake_kv_events.Follower` of python/src, which drives the same
   Rust follower through the package's native module, python/develop.py; a status line every
   0.1 s, as the mirror's summaries). Both say "in sync before sequence N"; the burst is
   applied when N is its last sequence + 1. Its time runs from the first message sent to
   then (the middle of the last 0.1 s interval), its CPU time is the process's
   (/proc/PID/stat, every thread: libzmq's I/O thread too).
3. Both followers' final indexes must equal the demo's --dump-index.

It prints each run, then per follower the median events/s and CPU-seconds per million
events, and the ratio Python / Rust of each. `--require R` exits 1 when the median ratio of
events/s is below R. Every process it starts is stopped when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import zmq

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
# The end of a replay: -1 as 8 signed big-endian bytes.
END = (-1).to_bytes(8, "big", signed=True)
# How often each follower says where it stands.
EVERY = 0.1


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, every thread."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def record(kv_events: str, directory: str, objects: int) -> tuple[list[bytes], dict]:
    """Runs the demo with a recorder subscribed: its payloads, in sequence order, and its
    expected index (--dump-index)."""
    endpoint = f"ipc://{directory}/record.sock"
    expected = os.path.join(directory, "expected.json")
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    demo = subprocess.Popen(
        [kv_events, "demo", "--endpoint", endpoint, "--objects", str(objects)]
        + ["--wait", "1", "--show", "0", "--send-hwm", "100000000", "--dump-index", expected],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    frames: list[list[bytes]] = []
    try:
        while demo.poll() is None or sub.poll(0):
            if sub.poll(200):
                while True:
                    try:
                        frames.append(sub.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
        while sub.poll(1000):  # what is still on its way
            frames.append(sub.recv_multipart())
    finally:
        if demo.poll() is None:
            demo.kill()
        _, err = demo.communicate()
        sub.close(linger=0)
    if demo.returncode != 0:
        sys.exit(f"the demo failed: {err.decode(errors='replace')}")
    sequences = [int.from_bytes(f[1], "big") for f in frames]
    if sequences != list(range(len(frames))):
        sys.exit(f"the recording is not whole: {len(frames)} messages, {sequences[:3]}...")
    with open(expected) as f:
        truth = json.load(f)
    if truth["next_sequence"] != len(frames):
        sys.exit(f"recorded {len(frames)} messages, the demo says {truth['next_sequence']}")
    return [f[2] for f in frames], truth


class Publisher:
    """An XPUB socket that sends the recording `loops` times over, numbered from 0, and a
    ROUTER that answers info and snapshot (empty: the stream starts at 0) and replays."""

    def __init__(self, directory: str, payloads: list[bytes], loops: int) -> None:
        self.context = zmq.Context()
        self.pub = f"ipc://{directory}/pub.sock"
        self.replay = f"ipc://{directory}/replay.sock"
        self.xpub = self.context.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.SNDHWM, 0)
        self.xpub.setsockopt(zmq.LINGER, 0)
        self.xpub.bind(self.pub)
        self.messages = [
            (i * len(payloads) + n).to_bytes(8, "big")
            for i in range(loops)
            for n in range(len(payloads))
        ]
        self.payloads = payloads
        self.sent = 0  # the sequence the next message takes
        self.stopping = False
        ready = threading.Event()
        self.thread = threading.Thread(target=self.serve, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait()

    def send_all(self) -> float:
        """Sends every message; returns when the first went."""
        first = time.monotonic()
        count = len(self.payloads)
        for n, sequence in enumerate(self.messages):
            self.xpub.send_multipart([b"", sequence, self.payloads[n % count]], copy=False)
            self.sent = n + 1
        return first

    def serve(self, ready: threading.Event) -> None:
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(self.replay)
        ready.set()
        while not self.stopping:
            if not router.poll(50):
                continue
            peer, *request = router.recv_multipart()
            for frames in self.answer(request):
                router.send_multipart([peer, b"", *frames])
        router.close()

    def answer(self, request: list[bytes]) -> list[list[bytes]]:
        sent = self.sent
        if request == [b"", b"info"]:
            info = {
                "incarnation": 0x4545,
                "backend_id": "demo-store",
                "dp_rank": 0,
                "next_sequence": sent,
                "oldest_sequence": 0,
                "snapshots": True,
            }
            return [[b"info", msgpack.packb(info)]]
        if request[:2] == [b"", b"snapshot"] and sent == 0:
            end = {"next_sequence": 0, "objects": 0, "events": 0, "incarnation": 0x4545}
            return [[b"snapshot-end", msgpack.packb({**end, "tenant": None})]]
        if len(request) == 2 and request[0] == b"" and len(request[1]) == 8:
            start = int.from_bytes(request[1], "big")
            count = len(self.payloads)
            replayed = [
                [b"", self.messages[n], self.payloads[n % count]] for n in range(start, sent)
            ]
            return replayed + [[b"", END, b""]]
        return [[b"error", b"busy: this bench serves no snapshot after the stream started"]]

    def close(self) -> None:
        self.stopping = True
        self.thread.join()
        self.xpub.close(linger=0)
        self.context.term()


def follow(args: argparse.Namespace) -> None:
    """The `follow` command: the Python follower as the mirror runs, a line every 0.1 s."""
    sys.path.insert(0, str(ROOT / "python" / "src"))
    from mooncake_kv_events import Follower

    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    started = time.monotonic()
    with Follower([(args.pub, args.replay)]) as follower:
        while not stopped:
            follower.run(EVERY)
            [status] = follower.statuses()
            state = "in sync" if status.in_sync else "recovering"
            print(
                f"python: {time.monotonic() - started:.1f}s: {state} before sequence "
                f"{status.next_sequence}, incarnation {status.incarnation}",
                file=sys.stderr,
                flush=True,
            )
        follower.dump(args.dump)


class Follower:
    """A follower process, its status lines read as they come."""

    def __init__(self, kind: str, command: list[str]) -> None:
        self.kind = kind
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines: list[tuple[float, str]] = []
        self.condition = threading.Condition()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            with self.condition:
                self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))
                self.condition.notify_all()

    def wait_for(self, text: str, timeout: float) -> tuple[float, float]:
        """(when the last line before the first that holds `text` came, when that one came)."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.condition:
            while True:
                for i in range(seen, len(self.lines)):
                    if text in self.lines[i][1]:
                        before = self.lines[i - 1][0] if i else self.lines[i][0]
                        return before, self.lines[i][0]
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    said = "\n".join(line for _, line in self.lines[-20:])
                    sys.exit(f"{self.kind} never said {text!r}; it said:\n{said}")
                self.condition.wait(min(left, 0.5))

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(10)


def index_of(path: str) -> set[tuple[str, str, tuple[str, ...]]]:
    def rendered(value: object) -> str:
        return "hex:" + value["hex"] if isinstance(value, dict) else str(value)

    with open(path) as f:
        lines = [json.loads(line) for line in f]
    return {(rendered(o["tenant"]), rendered(o["key"]), tuple(o["media"])) for o in lines}


def one_run(kind: str, kv_events: str, payloads: list[bytes], truth: dict, loops: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="python-follower-bench-") as directory:
        publisher = Publisher(directory, payloads, loops)
        dump = os.path.join(directory, "index.jsonl")
        if kind == "rust":
            command = [kv_events, "mirror", publisher.pub, "--replay-endpoint", publisher.replay]
            command += ["--every", str(EVERY), "--dump", dump]
        else:
            command = [sys.executable, "-B", __file__, "follow", publisher.pub, publisher.replay]
            command += [dump]
        follower = Follower(kind, command)
        try:
            follower.wait_for("in sync before sequence 0,", 60)
            # Its subscription has reached the publisher (the mirror's probe's too, closed once
            # the publisher is reached): what is sent now arrives.
            time.sleep(0.5)
            before = cpu_seconds(follower.process.pid)
            first = publisher.send_all()
            total = len(publisher.messages)
            last_line, done_line = follower.wait_for(f"in sync before sequence {total},", 600)
            after = cpu_seconds(follower.process.pid)
        finally:
            follower.stop()
            publisher.close()
        if follower.process.returncode not in (0, -signal.SIGTERM):
            sys.exit(f"{kind} exited {follower.process.returncode}")
        index = index_of(dump)
    objects = sorted(tuple(o[1:3]) + (tuple(o[3]),) for o in truth["objects"])
    if index != set(objects):
        sys.exit(f"{kind}: its index is not the demo's ({len(index)} against {len(objects)})")
    events = loops * truth["events"]
    seconds = (last_line + done_line) / 2 - first
    return {
        "follower": kind,
        "events": events,
        "seconds": seconds,
        "events_per_s": events / seconds,
        "cpu_s_per_million": 1e6 * (after - before) / events,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = p.add_subparsers(dest="command")
    child = commands.add_parser("follow", help="(internal) the Python follower's process")
    child.add_argument("pub")
    child.add_argument("replay")
    child.add_argument("dump")
    p.add_argument("--objects", type=int, default=200_000, help="the demo's --objects")
    p.add_argument("--loops", type=int, default=3, help="the recording sent this many times")
    p.add_argument("--rounds", type=int, default=3, help="runs of each follower")
    p.add_argument("--kv-events", default=str(ROOT / "target" / "release" / "kv-events"))
    p.add_argument("--require", type=float, metavar="R", help="exit 1 below this ratio")
    p.add_argument("--json", action="store_true", help="the runs and the summary as JSON")
    args = p.parse_args()
    if args.command == "follow":
        follow(args)
        return
    if not os.access(args.kv_events, os.X_OK):
        sys.exit(f"{args.kv_events}: build it: cargo build --release --locked --bin kv-events")
    # The package's native module, built and linked into python/src for the `follow` children.
    subprocess.run([sys.executable, str(ROOT / "python" / "develop.py")], check=True)
    with tempfile.TemporaryDirectory(prefix="python-follower-bench-") as directory:
        payloads, truth = record(args.kv_events, directory, args.objects)
    truth["events"] = sum(len(msgpack.unpackb(p)[1]) for p in payloads)
    load = os.getloadavg()[0]
    print(
        f"the stream: kv-events demo --objects {args.objects}: {len(payloads)} messages, "
        f"{truth['events']} events, sent {args.loops} times: {args.loops * truth['events']} "
        f"events a run; {len(truth['objects'])} objects at the end; load average {load:.1f}",
        flush=True,
    )
    runs = []
    for round_ in range(args.rounds):
        order = ("rust", "python") if round_ % 2 == 0 else ("python", "rust")
        for kind in order:
            run = one_run(kind, args.kv_events, payloads, truth, args.loops)
            runs.append(run)
            print(
                f"  {kind:<6} {run['events']} events in {run['seconds']:.2f} s: "
                f"{run['events_per_s']:,.0f} events/s, {run['cpu_s_per_million']:.2f} "
                f"CPU-s per million events",
                flush=True,
            )
    summary = {}
    for kind in ("rust", "python"):
        mine = [r for r in runs if r["follower"] == kind]
        summary[kind] = {
            "events_per_s": statistics.median(r["events_per_s"] for r in mine),
            "cpu_s_per_million": statistics.median(r["cpu_s_per_million"] for r in mine),
        }
    ratio = summary["python"]["events_per_s"] / summary["rust"]["events_per_s"]
    cpu_ratio = summary["rust"]["cpu_s_per_million"] / summary["python"]["cpu_s_per_million"]
    print(
        f"median: kv-events mirror {summary['rust']['events_per_s']:,.0f} events/s "
        f"({summary['rust']['cpu_s_per_million']:.2f} CPU-s per million), Python follower "
        f"{summary['python']['events_per_s']:,.0f} events/s "
        f"({summary['python']['cpu_s_per_million']:.2f} CPU-s per million); "
        f"Python / Rust: {ratio:.2f} of the rate, {cpu_ratio:.2f} of the CPU efficiency; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if args.json:
        print(json.dumps({"runs": runs, "summary": summary, "ratio": ratio}))
    if args.require is not None and ratio < args.require:
        sys.exit(f"the Python follower's rate is {ratio:.2f} of the mirror's, under {args.require}")


if __name__ == "__main__":
    main()
