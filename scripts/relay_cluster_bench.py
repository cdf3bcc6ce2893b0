#!/usr/bin/env python3
"""What three JetStream replicas cost the relay (docs/relay.md, "On a cluster").

Runs the same paced `kv-events demo` workload twice, its relay (release build) writing into
one `nats-server -js` (R1), then into three clustered on loopback with `--replicas 3` (R3),
and prints for each: the log's throughput while the workload runs, how long after the
workload the log is in sync, the last snapshot's size and write time; then, while the demo
lingers, how long a new `examples/relay/reader.py` takes to bootstrap from the relay, beside
a `kv-events mirror` of the same master (its "in sync after").

    cargo build --release --locked -p kv-events-relay -p kv-events
    scripts/relay_cluster_bench.py --objects 300000
"""

import argparse
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
STATUS = re.compile(r"kv-events-relay: ([\d.]+)s: ")
EVENTS = re.compile(r"events in (\d+), events written (\d+)")
SNAPSHOT = re.compile(r"snapshots (\d+) \(last (\d+) objects, (\d+) bytes, (\d+) ms")


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nats_servers(dir: Path, replicas: int):
    """One server, or three clustered; their processes and a client URL."""
    ports = [port() for _ in range(replicas)]
    routes = [f"nats://127.0.0.1:{port()}" for _ in range(replicas)]
    procs = []
    for i in range(replicas):
        args = ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(ports[i])]
        args += ["-sd", str(dir / f"node-{i}")]
        if replicas > 1:
            args += ["--server_name", f"node-{i}", "--cluster_name", "kv"]
            args += ["--cluster", routes[i], "--routes", ",".join(routes)]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(5 if replicas > 1 else 1)
    return procs, f"nats://127.0.0.1:{ports[0]}"


def statuses(log: Path):
    """(seconds since the relay started, events written, the snapshot's match) of each
    status line."""
    out, at = [], None
    for line in log.read_text().splitlines():
        if m := STATUS.match(line):
            at = float(m.group(1))
        elif (e := EVENTS.search(line)) and at is not None:
            out.append((at, int(e.group(2)), SNAPSHOT.search(line)))
    return out


def run(args, replicas: int):
    dir = Path(args.dir) / f"r{replicas}"
    shutil.rmtree(dir, ignore_errors=True)
    dir.mkdir(parents=True)
    servers, url = nats_servers(dir, replicas)
    ep, rep = f"tcp://127.0.0.1:{port()}", f"tcp://127.0.0.1:{port()}"
    procs = []
    try:
        relay_log = open(dir / "relay.log", "w")
        relay_started = time.monotonic()
        relay = subprocess.Popen(
            [
                RELEASE / "kv-events-relay",
                ep,
                "--replay-endpoint",
                rep,
                "--nats",
                url,
                "--every",
                "0.1",
                "--snapshot-every",
                "10",
                "--replicas",
                str(replicas),
            ],
            stdout=subprocess.DEVNULL,
            stderr=relay_log,
        )
        procs.append(relay)
        rate = ["--rate", str(args.rate)] if args.rate else []
        demo = subprocess.Popen(
            [
                RELEASE / "kv-events",
                "demo",
                "--endpoint",
                ep,
                "--replay-endpoint",
                rep,
                "--objects",
                str(args.objects),
                *rate,
                "--linger",
                "60",
                "--wait",
                "10",
                "--show",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(demo)
        for line in demo.stdout:
            if line.startswith("The workload starts"):
                started = time.monotonic()
            if line.startswith("The workload is done"):
                break
        done = time.monotonic()
        # The final state's snapshot, written at most --snapshot-every after the workload.
        time.sleep(12)
        status = statuses(dir / "relay.log")
        final = status[-1][1]
        synced_at = next(at for at, written, _ in status if written == final)
        in_sync = max(0.0, synced_at - (done - relay_started))
        snaps = [s for _, _, s in status if s]
        biggest = max(snaps, key=lambda s: int(s.group(3)))
        snap = snaps[-1]
        written = final
        reader = subprocess.run(
            [
                "/usr/bin/python3",
                "-B",
                ROOT / "examples/relay/reader.py",
                "--nats",
                url,
                "--backend",
                "demo-store",
                "--duration",
                "0.5",
                "--dump",
                dir / "reader.jsonl",
            ],
            capture_output=True,
            text=True,
        )
        boot = re.search(r"bootstrapped (\d+) objects in ([\d.]+) s", reader.stderr)
        mirror = subprocess.run(
            [
                RELEASE / "kv-events",
                "mirror",
                ep,
                "--replay-endpoint",
                rep,
                "--duration",
                "2",
                "--every",
                "100",
                "--dump",
                dir / "mirror.jsonl",
            ],
            capture_output=True,
            text=True,
        )
        synced = re.search(r"in sync after ([\d.]+ m?s)", mirror.stderr)
        print(
            f"R{replicas}: {args.objects} objects at {args.rate} calls/s: workload "
            f"{done - started:.1f} s, {written} events written "
            f"({written / (done - started + (in_sync or 0)):.0f} events/s to in sync); "
            f"log in sync {in_sync:.2f} s after the workload; last snapshot "
            f"{snap.group(2)} objects, {int(snap.group(3)) / 1e6:.1f} MB, {snap.group(4)} ms "
            f"(the largest {biggest.group(2)} objects, {int(biggest.group(3)) / 1e6:.1f} MB, "
            f"{biggest.group(4)} ms); "
            f"reader: {boot.group(0) if boot else reader.stderr.strip()[-300:]}; mirror: "
            f"{synced.group(0) if synced else mirror.stderr.strip()[-300:]}"
        )
        sys.stdout.flush()
    finally:
        for p in procs + servers:
            p.terminate()
            p.wait()


def main():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--objects", type=int, default=300_000)
    p.add_argument("--rate", type=float, help="the demo's calls/s (default: flat out)")
    p.add_argument("--dir", default="/tmp/relay-cluster-bench")
    args = p.parse_args()
    for replicas in (1, 3):
        run(args, replicas)


if __name__ == "__main__":
    main()
