#!/usr/bin/env python3
"""Benchmarks of `kv-events relay` (docs/performance.md, "The relay onto NATS JetStream").

Runs a real `nats-server -js`, the `kv-events demo` publisher and the relay (release builds),
and prints what it measured. Every process it starts is stopped when it ends.

    cargo build --release --locked -p kv-events-relay -p kv-events
    scripts/relay_bench.py big --objects 1250000 --rate 100000 --linger 60  # (a), (c), (d)
    scripts/relay_bench.py cost --mode none --objects 50000 --rate 10000    # (b), baseline
    scripts/relay_bench.py cost --mode relay --objects 50000 --rate 10000   # 1,000 NATS readers
    scripts/relay_bench.py cost --mode direct --objects 50000 --rate 10000  # 64 mirrors

`big`: the demo (paced by --rate, else flat out) with --objects N while the relay writes
into JetStream (from the relay's status line every 0.2 s: when the log is in sync after the
workload ends, how many of the log's events are the master's own, the relay's peak RSS and
CPU); then, while the demo lingers, a new nats-py reader bootstraps from the relay's snapshot
and the log after it (examples/relay/reader.py, its own "bootstrapped ... in S s"); then the
demo exits (its --dump-index is compared with a reader's dump) and a second demo starts on
the same endpoints: the relay's difference (events) and the time from that demo's first
message to the log in sync. `--bucket NAME` runs the relay with the opt-in bucket too.
`cost`: the same paced workload three ways, the demo's CPU time and RSS; the
NATS readers (ordered consumers of the log, `--per-connection` to a connection, in `--procs`
processes) until each has every message of the log, then a reader's dump against the demo's
`--dump-index`; the 64 mirrors each from its own loopback address, each index against it.
Needs nats-py, pyzmq and msgpack (scripts/install-deps.sh).
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

STATUS1 = re.compile(
    r"kv-events-relay: ([\d.]+)s: (?:\S+: (in sync|recovering) before (\d+), incarnation "
    r"([0-9a-f]+)|no publisher in sync yet); (?:log at (\d+)( \(partial\))? \(stream "
    r"sequence (\d+)\)|log empty); (writer|standby)"
)
STATUS2 = re.compile(
    r"events in (\d+), events written (\d+) in (\d+) messages, diffs after resyncs (\d+) "
    r"\((\d+) events\), bucket entries written (\d+), acks pending (\d+), lag (\d+) messages "
    r"/ (\d+) ms, held (\d+)"
)


# The status line of this tree (`log before N`, snapshots).
NEW1 = re.compile(
    r"kv-events-relay: ([\d.]+)s: (?:\S+: (in sync|recovering)(?: before (\d+))?(?:, "
    r"incarnation ([0-9a-f]+))?|no publisher in sync yet); (?:log before (\d+)( \(partial\))? "
    r"\(stream sequence (\d+)\)|log empty); (writer|ready to write|standby)"
)
NEW2 = re.compile(
    r"events in (\d+), events written (\d+) in (\d+) messages \((\d+) of the master's\), "
    r"diffs after resyncs (\d+) \((\d+) events\), snapshots (\d+) \(last (\d+) objects, "
    r"(\d+) bytes, (\d+) ms(?:, writing)?\), lag (\d+) messages / (\d+) ms, held (\d+), "
    r"objects (\d+)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(text: str):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


class Procs:
    """Every process started, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self):
        self.all = []

    def start(self, args, **kw) -> subprocess.Popen:
        p = subprocess.Popen([str(a) for a in args], **kw)
        self.all.append(p)
        return p

    def stop(self, p, wait=20.0):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(wait)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self):
        for p in reversed(self.all):
            self.stop(p, 5.0)


def proc_usage(pid: int):
    """(CPU seconds user+system, VmRSS MB, VmHWM MB) of a live process, else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    mem = {}
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            mem[name] = int(value.split()[0]) / 1024
    return cpu, mem.get("VmRSS", 0.0), mem.get("VmHWM", 0.0)


class Sampler(threading.Thread):
    """Samples a process's usage every 0.2 s while it lives; `last` is the last sample."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.last, self.peak_rss, self.peak_at = pid, None, 0.0, None
        self.history = []  # (time, VmRSS MB)
        self.start()

    def run(self):
        while True:
            u = proc_usage(self.pid)
            if u is None:
                return
            self.last = u
            self.history.append((time.monotonic(), u[1]))
            if u[1] > self.peak_rss:
                self.peak_rss, self.peak_at = u[1], time.monotonic()
            time.sleep(0.2)


class Lines(threading.Thread):
    """Reads a pipe line by line, each with its arrival time, into a log file."""

    def __init__(self, pipe, log_path):
        super().__init__(daemon=True)
        self.pipe, self.lines, self.log = pipe, [], open(log_path, "w")
        self.start()

    def run(self):
        for raw in self.pipe:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append((time.monotonic(), line))
            self.log.write(line + "\n")
            self.log.flush()

    def first(self, text, after=0.0):
        return next((t for t, line in list(self.lines) if t >= after and text in line), None)


class Relay(Lines):
    """The relay's stderr, its status lines parsed."""

    def status(self):
        """[(time, dict)] of every status line so far (this tree's format)."""
        out, head = [], None
        for t, line in list(self.lines):
            m = NEW1.search(line)
            if m:
                head = m
                continue
            m = NEW2.search(line)
            if m and head:
                keys = (
                    "events_in",
                    "written",
                    "messages",
                    "master_messages",
                    "diffs",
                    "diff_events",
                    "snapshots",
                    "snapshot_objects",
                    "snapshot_bytes",
                    "snapshot_ms",
                    "lag",
                    "lag_ms",
                    "held",
                    "objects",
                )
                st = dict(zip(keys, map(int, m.groups())))
                st.update(
                    in_sync=head[2] == "in sync",
                    next_seq=None if head[3] is None else int(head[3]),
                    incarnation=head[4],
                    log_next=None if head[5] is None else int(head[5]),
                    partial=bool(head[6]),
                    stream_seq=None if head[7] is None else int(head[7]),
                    role=head[8],
                )
                out.append((t, st))
                head = None
        return out


def master_next(replay: str) -> int:
    """The master's `next_sequence`, from its replay socket's `info` (docs/spec.md)."""
    import msgpack
    import zmq

    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay)
        dealer.send_multipart([b"", b"info"])
        if not dealer.poll(30_000):
            raise RuntimeError("the master's replay socket did not answer info")
        return msgpack.unpackb(dealer.recv_multipart()[-1])["next_sequence"]
    finally:
        ctx.destroy(0)


def log_synced(s):
    """Whether a status (this tree's) says the log holds the followed master's state."""
    return (
        s["in_sync"]
        and s["log_next"] is not None
        and s["log_next"] == s["next_seq"]
        and not s["partial"]
        and s["held"] == 0
    )


def wait_until(what, limit, check, every=0.2):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"relay_bench: timed out waiting for {what}")


class Bench:
    def __init__(self, args):
        self.args, self.procs = args, Procs()
        self.bin = Path(args.bin)
        self.dir = Path(args.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.nats_url = None

    def nats(self):
        port = free_port()
        store = self.dir / "jetstream"
        subprocess.run(["rm", "-rf", str(store)], check=True)
        self.nats_proc = self.procs.start(
            ["nats-server", "-js", "-a", "127.0.0.1", "-p", port, "-sd", store],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "nats.log", "w"),
        )
        wait_until("nats-server", 10, lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0)
        self.nats_url = f"nats://127.0.0.1:{port}"
        return self.nats_proc

    def demo(self, name, objects, rate, linger, wait):
        args = [
            self.bin / "kv-events",
            "demo",
            "--endpoint",
            self.pub,
            "--replay-endpoint",
            self.replay,
            "--objects",
            objects,
            "--wait",
            wait,
            "--linger",
            linger,
            "--heartbeat-ms",
            "200",
            "--show",
            "0",
            "--dump-index",
            self.dir / f"{name}.json",
        ]
        if rate:
            args += ["--rate", rate]
        p = self.procs.start(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return p, Lines(p.stdout, self.dir / f"{name}.log")

    def relay(self, every="0.2", extra=()):
        p = self.procs.start(
            [
                self.bin / "kv-events",
                "relay",
                self.pub,
                "--replay-endpoint",
                self.replay,
                "--nats",
                self.nats_url,
                "--every",
                every,
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        return p, Relay(p.stderr, self.dir / "relay.log")


def demo_rate(lines):
    """The demo's workload time and its watcher's events/s, from its summary."""
    text = "\n".join(line for _, line in lines.lines)
    took = re.search(r"The workload is done in ([\d.]+)s", text)
    rate = re.search(r"events/s\s+(\d+)\s+\((\d+) events", text)
    left = re.search(r"objects left: (\d+)", text)
    return {
        "workload_s": float(took[1]) if took else None,
        "watcher_events_per_s": int(rate[1]) if rate else None,
        "events": int(rate[2]) if rate else None,
        "objects_left": int(left[1]) if left else None,
    }


def same_as_truth(truth_path, dump_path):
    """Compares `demo --dump-index` with `reader.py --dump`: (equal, truth size, dump size)."""
    truth = json.loads(Path(truth_path).read_text())

    def name(v):
        return bytes.fromhex(v[4:]) if v.startswith("hex:") else v.encode()

    def dumped(v):
        return v.encode() if isinstance(v, str) else bytes.fromhex(v["hex"])

    want = {(name(t), name(k), tuple(sorted(m))) for _, t, k, m in truth["objects"]}
    got = set()
    for line in Path(dump_path).read_text().splitlines():
        o = json.loads(line)
        got.add((dumped(o["tenant"]), dumped(o["key"]), tuple(sorted(o["media"]))))
    return want == got, len(want), len(got)


def reader_bootstrap(bench, path, limit=600):
    """Runs examples/relay/reader.py until it has bootstrapped, then stops it (it writes its
    dump): (seconds from its start to its line, the seconds it says, objects)."""
    reader = bench.procs.start(
        [
            sys.executable,
            ROOT / "examples/relay/reader.py",
            "--nats",
            bench.nats_url,
            "--backend",
            "demo-store",
            "--dump",
            path,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    lines = Lines(reader.stderr, str(path) + ".log")
    started = time.monotonic()
    done = wait_until(
        "reader.py to bootstrap", limit, lambda: lines.first("bootstrapped"), every=0.02
    )
    bench.procs.stop(reader, 600)
    lines.join(5)
    said = next(line for _, line in lines.lines if "bootstrapped" in line)
    m = re.search(r"bootstrapped (\d+) objects in ([\d.]+) s", said)
    return round(done - started, 2), float(m[2]), int(m[1])


def big(args):
    b = Bench(args)
    try:
        nats = b.nats()
        extra = ["--bucket", args.bucket] if args.bucket else []
        relay, log = b.relay(extra=extra)
        nats_cpu = Sampler(nats.pid)
        relay_cpu = Sampler(relay.pid)
        demo, out = b.demo("demo1", args.objects, args.rate, args.linger, 3)
        demo_cpu = Sampler(demo.pid)
        started = wait_until("the workload", 60, lambda: out.first("The workload starts"))
        done = wait_until("the workload's end", 3600, lambda: out.first("The workload is done"))
        say(f"demo 1: workload done in {done - started:.1f} s")

        # The log holds the workload once it is in sync at or past the master's sequence at
        # the workload's end (the relay's follower may be behind what the master sent).
        last_sequence = master_next(b.replay)

        def log_in_sync():
            return next(
                (
                    t
                    for t, x in log.status()
                    if t > done and log_synced(x) and x["log_next"] >= last_sequence
                ),
                None,
            )

        t_log = wait_until("the log in sync", 3600, log_in_sync, 0.05)
        last = next(x for t, x in log.status() if t >= t_log)
        total = last["written"] + last["diff_events"]
        res = {
            "objects": args.objects,
            "rate": args.rate,
            "workload_s": round(done - started, 2),
            "log_in_sync_s_after_workload": round(max(0.0, t_log - done), 2),
            # The machine's load (other processes share it), 1, 5 and 15 minutes.
            "load_average": os.getloadavg(),
            "relay": {
                "events_in": last["events_in"],
                "masters_events_written": last["written"],
                "master_messages": last["master_messages"],
                "log_messages": last["messages"],
                "diffs": last["diffs"],
                "diff_events": last["diff_events"],
                "masters_share_of_log_events": round(last["written"] / total, 4) if total else None,
                "snapshots": last["snapshots"],
            },
        }
        say(json.dumps(res))
        # A new nats-py reader, while the demo lingers: once after the last snapshot
        # was written, so that it reads the snapshot and little log.
        took, said, count = reader_bootstrap(b, b.dir / "reader1.jsonl")
        res["reader_bootstrap"] = {
            "process_s": took,
            "reader_says_s": said,
            "objects": count,
            "load_average": os.getloadavg(),
        }
        say(f"reader.py bootstrapped {count} objects in {said:.2f} s ({took:.2f} s process)")
        res["relay"].update(
            relay_cpu_s=relay_cpu.last[0],
            relay_rss_mb=round(relay_cpu.last[1]),
            relay_peak_rss_mb=round(relay_cpu.last[2]),
            nats_cpu_s=nats_cpu.last[0],
            nats_rss_mb=round(nats_cpu.last[1]),
            demo_cpu_s=demo_cpu.last[0],
        )
        st = log.status()
        # The RSS while the log is in sync at the most objects: what the state costs,
        # which the machine's load moves less than the peak.
        synced = [(x["objects"], t) for t, x in st if log_synced(x) and x["lag"] == 0]
        if synced and relay_cpu.history:
            most, at = max(synced)
            rss = min(relay_cpu.history, key=lambda h: abs(h[0] - at))[1]
            res["relay"]["in_sync_rss_mb_at_most_objects"] = [most, round(rss)]
        res["relay"]["last_snapshot"] = {
            k: st[-1][1][k] for k in ("snapshot_objects", "snapshot_bytes", "snapshot_ms")
        }
        demo.wait()
        res["demo1"] = demo_rate(out)
        res["demo1"]["exit"] = demo.returncode
        time.sleep(2)
        took, said, count = reader_bootstrap(b, b.dir / "reader2.jsonl")
        res["reader_bootstrap_after_demo_exit"] = {
            "process_s": took,
            "reader_says_s": said,
            "objects": count,
        }
        equal, nt, nd = same_as_truth(b.dir / "demo1.json", b.dir / "reader2.jsonl")
        res["demo1_reader_equals_dump_index"] = [equal, nt, nd]
        say(f"demo 1 exited {demo.returncode}: reader == --dump-index: {equal} ({nt}, {nd})")

        # (d) The master restarts: a second demo on the same endpoints.
        import zmq

        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(b.pub)
        before = log.status()[-1][1]
        demo2, out2 = b.demo("demo2", args.restart_objects, args.restart_rate, 5, 1)
        sub.poll(60_000)
        t_first = time.monotonic()
        sub.close(0)
        ctx.term()

        def restarted():
            return next(
                (
                    t
                    for t, x in log.status()
                    if t > t_first
                    and x["incarnation"] != before["incarnation"]
                    and x["diffs"] > before["diffs"]
                    and log_synced(x)
                ),
                None,
            )

        t_restart = wait_until("the log in sync after the restart", 1800, restarted, 0.05)
        after = next(x for t, x in log.status() if t >= t_restart)
        res["restart"] = {
            "objects_before": res["demo1"]["objects_left"],
            "diff_events": after["diff_events"] - before["diff_events"],
            "first_message_to_log_in_sync_s": round(t_restart - t_first, 2),
            "load_average": os.getloadavg(),
        }
        say(json.dumps(res["restart"]))
        demo2.wait()
        time.sleep(2)
        took, said, count = reader_bootstrap(b, b.dir / "reader3.jsonl")
        equal, nt, nd = same_as_truth(b.dir / "demo2.json", b.dir / "reader3.jsonl")
        res["demo2"] = demo_rate(out2)
        res["demo2_reader_equals_dump_index"] = [equal, nt, nd]
        res["relay"]["relay_peak_rss_mb"] = round(max(relay_cpu.peak_rss, relay_cpu.last[2]))
        res["relay"]["relay_peak_rss_s_after_workload_start"] = round(
            relay_cpu.peak_at - started, 1
        )
        b.procs.stop(relay)
        log.join(5)
        res["relay_exit"] = relay.returncode
        print(json.dumps(res, indent=1))
    finally:
        b.procs.stop_all()


async def _fast(url, bucket):
    import asyncio

    import nats
    from nats.js.api import DeliverPolicy

    client = await nats.connect(url)
    js = client.jetstream(timeout=120)
    info = await js.stream_info(f"KV_{bucket}")
    start = time.monotonic()
    state = {"n": 0, "live": 0, "pending": None}
    objects = {}
    done = asyncio.Event()

    async def on_message(msg):
        state["n"] += 1
        if msg.headers and msg.headers.get("KV-Operation") in ("DEL", "PURGE"):
            objects.pop(msg.subject, None)
        else:
            objects[msg.subject] = msg.data
        if msg.metadata.num_pending == 0:
            done.set()

    await js.subscribe(
        f"$KV.{bucket}.>",
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )
    await done.wait()
    took = time.monotonic() - start
    await client.close()
    return {
        "seconds": round(took, 2),
        "messages": state["n"],
        "objects": len(objects),
        "stream_messages": info.state.messages,
    }


def fast_bootstrap(args):
    """The bucket read as one ordered consumer of its stream, values kept undecoded."""
    import asyncio

    print(json.dumps(asyncio.run(_fast(args.nats, args.bucket))))


async def _readers(args):
    """`--count` ordered consumers of the log's subjects, `--per-connection` of them on each
    connection (one connection's outbound buffer in nats-server is bounded: past it the server
    cuts the connection off as a slow consumer). Every 0.5 s, and at SIGTERM, writes to
    `--status` the lowest and highest stream sequence a reader has received, the messages the
    fewest and most received, and the stream's last sequence."""
    import asyncio

    import nats

    clients = [
        await nats.connect(args.nats, pending_size=1 << 30)
        for _ in range(-(-args.count // args.per_connection))
    ]
    seqs, counts = [0] * args.count, [0] * args.count
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    def reader(i):
        async def cb(msg):
            seqs[i] = msg.metadata.sequence.stream
            counts[i] += 1

        return cb

    for i in range(args.count):
        await (
            clients[i // args.per_connection]
            .jetstream()
            .subscribe(
                "kv-events.>",
                stream="KV_EVENTS",
                cb=reader(i),
                ordered_consumer=True,
                pending_msgs_limit=-1,
                pending_bytes_limit=-1,
            )
        )
    js = clients[0].jetstream()
    status, tmp = Path(args.status), Path(str(args.status) + ".tmp")
    while True:
        last = (await js.stream_info("KV_EVENTS")).state.last_seq
        tmp.write_text(
            json.dumps(
                {
                    "readers": args.count,
                    "connections": len(clients),
                    "min_seq": min(seqs),
                    "max_seq": max(seqs),
                    "min_messages": min(counts),
                    "max_messages": max(counts),
                    "stream_last_seq": last,
                }
            )
        )
        tmp.replace(status)
        if stop.is_set():
            break
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except asyncio.TimeoutError:
            pass
    for c in clients:
        await c.close()


def readers(args):
    import asyncio

    asyncio.run(_readers(args))


def cost(args):
    b = Bench(args)
    res = {"mode": args.mode, "objects": args.objects, "rate": args.rate}
    try:
        extra = []
        if args.mode == "relay":
            nats = b.nats()
            relay, log = b.relay(every="1")
        demo, out = b.demo("demo", args.objects, args.rate, args.linger, args.wait)
        sampler = Sampler(demo.pid)
        if args.mode == "relay":
            extra += [("nats-server", Sampler(nats.pid)), ("relay", Sampler(relay.pid))]
            wait_until("the stream", 30, lambda: any(s for _, s in log.status()))
            procs = []
            for i in range(args.procs):
                status = b.dir / f"readers-{i}.json"
                status.unlink(missing_ok=True)
                p = b.procs.start(
                    [
                        sys.executable,
                        __file__,
                        "readers",
                        "--nats",
                        b.nats_url,
                        "--count",
                        args.readers // args.procs,
                        "--per-connection",
                        args.per_connection,
                        "--status",
                        status,
                    ]
                )
                procs.append((p, status))
                extra.append((f"readers {i}", Sampler(p.pid)))
            wait_until("the NATS readers", 300, lambda: all(s.exists() for _, s in procs))
            say(f"{args.readers} NATS readers subscribed")
        elif args.mode == "direct":
            mirrors = []
            for i in range(args.direct):
                # Each from its own loopback address, as readers on their own hosts: the
                # publisher takes at most 64 connections from one address, and a mirror
                # makes two.
                source = f"tcp://127.0.0.{2 + i}:0;"
                m = b.procs.start(
                    [
                        b.bin / "kv-events",
                        "mirror",
                        b.pub.replace("tcp://", source),
                        "--replay-endpoint",
                        b.replay.replace("tcp://", source),
                        "--every",
                        "1000",
                        "--dump",
                        b.dir / f"mirror-{i}.jsonl",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                mirrors.append(m)
            extra += [(f"mirror {i}", Sampler(m.pid)) for i, m in enumerate(mirrors)]
        ready_at = time.monotonic()
        started = wait_until("the workload", 120, lambda: out.first("The workload starts"))
        res["readers_ready_before_workload"] = ready_at < started
        demo.wait()
        last = sampler.last
        res["demo"] = {
            "cpu_s": last[0],
            "rss_mb_at_end": round(last[1], 1),
            "hwm_mb": round(last[2], 1),
            "exit": demo.returncode,
        }
        res["demo"].update(demo_rate(out))
        for name, s in extra:
            if s.last and not name.startswith("mirror"):
                res[name] = {"cpu_s": s.last[0], "rss_mb": round(s.last[1], 1)}
        if args.mode == "direct":
            cpus = [s.last[0] for n, s in extra if s.last]
            res["mirrors"] = {"n": len(cpus), "cpu_s_total": round(sum(cpus), 1)}
            for m in mirrors:
                b.procs.stop(m)
            equal = [
                same_as_truth(b.dir / "demo.json", b.dir / f"mirror-{i}.jsonl")[0]
                for i in range(len(mirrors))
            ]
            res["mirrors"]["equal_to_dump_index"] = sum(equal)
        if args.mode == "relay":
            done = out.first("The workload is done")
            wait_until("the relay's log", 600, lambda: log_synced(log.status()[-1][1]))

            def everyone():
                st = [json.loads(s.read_text()) for _, s in procs]
                return all(x["min_seq"] == x["stream_last_seq"] > 0 for x in st) and st

            st = wait_until("every NATS reader to have the whole log", 1800, everyone, 0.1)
            res["readers_have_the_whole_log_s_after_workload"] = round(time.monotonic() - done, 1)
            res["readers_received"] = {
                "readers": sum(x["readers"] for x in st),
                "connections": sum(x["connections"] for x in st),
                "messages_min": min(x["min_messages"] for x in st),
                "messages_max": max(x["max_messages"] for x in st),
                "stream_last_seq": st[0]["stream_last_seq"],
            }
            cpu, rss, hwm = proc_usage(nats.pid)
            res["nats-server"] = {"cpu_s": cpu, "rss_mb": round(rss, 1), "hwm_mb": round(hwm, 1)}
            readers_cpu = [proc_usage(p.pid) for p, _ in procs]
            res["readers_cpu_s"] = round(sum(u[0] for u in readers_cpu if u), 1)
            for p, _ in procs:
                b.procs.stop(p)
            st = log.status()
            res["relay_status"] = st[-1][1] if st else None
            reader_bootstrap(b, b.dir / "reader.jsonl")
            res["reader_equals_dump_index"] = same_as_truth(
                b.dir / "demo.json", b.dir / "reader.jsonl"
            )
        print(json.dumps(res, indent=1))
    finally:
        b.procs.stop_all()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--bin",
        default=os.environ.get("KV_EVENTS_BIN", ROOT / "target/release"),
        help="where kv-events and kv-events-relay are (default target/release)",
    )
    p.add_argument("--dir", default="/tmp/relay-bench", help="scratch directory")
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("big", help="(a) throughput, (c) bootstrap, (d) restart")
    g.add_argument("--objects", type=int, default=4_300_000)
    g.add_argument("--rate", type=float, help="demo 1's calls/s (default: flat out)")
    g.add_argument(
        "--linger", type=float, default=600, help="demo 1 stays up this long after its workload"
    )
    g.add_argument("--restart-objects", type=int, default=10_000)
    g.add_argument("--restart-rate", type=float, default=2_000)
    g.add_argument("--bucket", help="run the relay with --bucket NAME too")
    g.set_defaults(run=big)
    c = sub.add_parser("cost", help="(b) the master's cost")
    c.add_argument("--mode", choices=["none", "relay", "direct"], required=True)
    c.add_argument("--objects", type=int, default=100_000)
    c.add_argument("--rate", type=float, default=10_000)
    c.add_argument("--linger", type=float, default=10)
    c.add_argument(
        "--wait",
        type=float,
        default=10,
        help="seconds the demo waits for its readers before the workload",
    )
    c.add_argument("--readers", type=int, default=1000)
    c.add_argument("--procs", type=int, default=2, help="processes the NATS readers run in")
    c.add_argument("--per-connection", type=int, default=25, help="NATS readers a connection")
    c.add_argument("--direct", type=int, default=64)
    c.set_defaults(run=cost)
    f = sub.add_parser("fast-bootstrap", help=argparse.SUPPRESS)
    f.add_argument("--nats", required=True)
    f.add_argument("--bucket", default="kv-events")
    f.set_defaults(run=fast_bootstrap)
    r = sub.add_parser("readers", help=argparse.SUPPRESS)
    r.add_argument("--nats", required=True)
    r.add_argument("--count", type=int, default=1000)
    r.add_argument("--per-connection", type=int, default=25)
    r.add_argument("--status", required=True)
    r.set_defaults(run=readers)
    args = p.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
