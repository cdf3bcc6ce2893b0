#!/usr/bin/env python3
"""RemoveAll at scale in the real master: --objects small objects in one tenant (BatchPut),
then one RemoveAll, with KV events on and then off.

    removeall_scale.py --master BIN --client BIN --kv-events BIN --out DIR [--objects N]

With events on: the master publishes on a private endpoint with the replay socket on; a
counting subscriber (a ZeroMQ SUB with a large receive high-water mark) counts what reaches
it, and `kv-events mirror` follows. Measured: the RemoveAll's duration as its client sees it
(one RPC: the master's loop plus a round trip), with events on and off, which is what
publishing costs the master; the share of the RemoveAll's events that reached the counting
subscriber and the gaps it saw; the publisher's drops; and how long the mirror takes to hold
the truth again (the keys the admin endpoint /get_all_keys lists, each on cpu: no disk is
configured; empty when RemoveAll removed everything) once RemoveAll returned, twice: from the
mirror's own summary lines (every 0.25 s: its index in sync and holding as many objects as the
truth) and from its dump file (written by a thread of its own, so a dump of a large index may
still be under way when the index got there), which must then equal the truth exactly.
Results: DIR/removeall.json and stdout.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Counter(threading.Thread):
    """Counts the messages and events of the stream, and the gaps between sequences."""

    def __init__(self, endpoint):
        super().__init__(daemon=True)
        import msgpack
        import zmq

        self.msgpack, self.zmq = msgpack, zmq
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 10_000_000)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.counts = {
            "messages": 0,
            "stored": 0,
            "removed": 0,
            "cleared": 0,
            "gaps": 0,
            "missed_numbers": 0,
        }
        self.last = None
        self.last_at = time.time()
        self.stop = False

    def run(self):
        poller = self.zmq.Poller()
        poller.register(self.sub, self.zmq.POLLIN)
        while not self.stop:
            if not poller.poll(200):
                continue
            frames = self.sub.recv_multipart()
            sequence = int.from_bytes(frames[1], "big")
            if self.last is not None and sequence != self.last + 1:
                self.counts["gaps"] += 1
                self.counts["missed_numbers"] += sequence - self.last - 1
            self.last = sequence
            self.counts["messages"] += 1
            for event in self.msgpack.unpackb(frames[2], raw=False, strict_map_key=False)[1]:
                self.counts[event["event_type"]] += 1
            self.last_at = time.time()


class Run:
    def __init__(self, args, events_on):
        self.args, self.events_on = args, events_on
        self.out = os.path.join(os.path.abspath(args.out), "on" if events_on else "off")
        os.makedirs(self.out, exist_ok=True)
        self.procs = []
        self.rpc_port, self.metrics_port = free_port(), free_port()
        self.events = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"

    def spawn(self, name, argv):
        out = open(os.path.join(self.out, name + ".log"), "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=out)
        self.procs.append(proc)
        return proc

    def http(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=30) as r:
            return r.read().decode()

    def client(self, mode, *extra, wait=True):
        argv = [
            self.args.client,
            f"--mode={mode}",
            f"--master_server_entry=127.0.0.1:{self.rpc_port}",
            f"--host=127.0.0.1:{free_port()}",
            *extra,
        ]
        if not wait:
            return self.spawn(mode, argv)
        result = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=open(os.path.join(self.out, mode + ".log"), "ab")
        )
        if result.returncode != 0:
            raise SystemExit(f"client --mode={mode} failed: see {self.out}/{mode}.log")
        return result.stdout.decode()

    def truth(self):
        # The admin endpoint's key list (the default tenant's, the only one here): a million
        # keys' replica lists would not fit one QueryByRegex reply. No disk is configured, so
        # every readable replica is memory: cpu.
        return {(key, "cpu") for key in self.http("/get_all_keys").splitlines() if key}

    def mirror_in_sync_at(self, objects, after, deadline):
        """The first of the mirror's summaries (seconds since it started) later than `after`
        that says its index is in sync and holds `objects` objects; None by `deadline`."""
        summary = re.compile(
            r"^kv-events: ([0-9.]+)s: .*: in sync before sequence \d+, "
            r"incarnation \w+: (\d+) objects$"
        )
        while time.time() < deadline:
            with open(os.path.join(self.out, "mirror.log"), errors="replace") as f:
                for line in f:
                    m = summary.match(line.strip())
                    if m and float(m.group(1)) > after and int(m.group(2)) == objects:
                        return float(m.group(1))
            time.sleep(0.1)
        return None

    @staticmethod
    def mirror_index(path):
        try:
            with open(path) as f:
                return {(o["key"], m) for o in map(json.loads, f) for m in o["media"]}
        except (FileNotFoundError, ValueError):
            return None

    def run(self):
        """Measures; whatever happens, every process it started is stopped."""
        try:
            return self.measure()
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()

    def measure(self):
        a = self.args
        flags = [
            a.master,
            "--enable_ha=false",
            "--enable_http_metadata_server=false",
            "--rpc_address=127.0.0.1",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_port={self.metrics_port}",
            "--logtostderr",
            f"--enable_kv_events={'true' if self.events_on else 'false'}",
            f"--kv_events_bind_endpoint={self.events}",
            f"--kv_events_replay_endpoint={self.replay}",
            "--kv_events_backend_id=scale",
            # Eviction would remove objects before the RemoveAll does.
            "--eviction_high_watermark_ratio=1.0",
        ]
        self.spawn("master", flags)
        deadline = time.time() + 30
        while True:
            try:
                self.http("/health")
                break
            except OSError as e:
                if time.time() > deadline:
                    raise SystemExit(f"the master did not start: {e}") from e
                time.sleep(0.2)
        result = {"events": self.events_on, "objects_asked": a.objects}
        counter = mirror = None
        mirror_dump = os.path.join(self.out, "mirror.jsonl")
        if self.events_on:
            counter = Counter(self.events)
            counter.start()
            mirror_started = time.time()
            mirror = self.spawn(
                "mirror",
                [
                    a.kv_events,
                    "mirror",
                    self.events,
                    "--replay-endpoint",
                    self.replay,
                    "--every",
                    "0.25",
                    "--dump",
                    mirror_dump,
                ],
            )
            time.sleep(1)
        hold = os.path.join(self.out, "fill.hold")
        filled = os.path.join(self.out, "filled")
        start = time.time()
        filler = self.client(
            "fill",
            f"--count={a.objects}",
            f"--batch={a.batch}",
            f"--value_bytes={a.value_bytes}",
            f"--segment_mb={a.segment_mb}",
            "--buffer_mb=64",
            f"--stats={filled}",
            f"--hold_file={hold}",
            wait=False,
        )
        while not os.path.exists(filled):
            if filler.poll() is not None:
                raise SystemExit("the fill client exited early: see fill.log")
            time.sleep(0.5)
        time.sleep(0.5)
        result["fill_s"] = round(time.time() - start, 1)
        result["objects_written"] = int(open(filled).read())
        truth = self.truth()
        result["truth_before"] = len(truth)
        if self.events_on:
            start = time.time()
            while self.mirror_index(mirror_dump) != truth:
                if time.time() - start > 300:
                    raise SystemExit("the mirror did not hold the filled objects within 300 s")
                time.sleep(1)
            result["mirror_holds_fill_after_s"] = round(time.time() - start, 1)
            before = dict(counter.counts)
        stats_before = json.loads(self.http("/kv_events/status"))
        line = self.client("removeall")
        returned = time.time()
        removed, seconds = line.split()[1], line.split()[3]
        result["removeall_removed"] = int(removed)
        result["removeall_s"] = float(seconds)
        truth = self.truth()
        result["truth_after"] = len(truth)
        if self.events_on:
            at = self.mirror_in_sync_at(len(truth), returned - mirror_started, time.time() + 300)
            result["mirror_in_sync_after_removeall_s"] = (
                None if at is None else round(mirror_started + at - returned, 2)
            )
            while self.mirror_index(mirror_dump) != truth:
                if time.time() - returned > 300:
                    result["mirror_dump_equal_after_removeall_s"] = None
                    break
                time.sleep(0.1)
            else:
                result["mirror_dump_equal_after_removeall_s"] = round(time.time() - returned, 2)
            while time.time() - counter.last_at < 3:  # the stream has gone quiet
                time.sleep(0.5)
            after = counter.counts
            delta = {k: after[k] - before[k] for k in after}
            result["subscriber"] = delta
            result["share_of_removed_events_received"] = round(
                delta["removed"] / max(int(removed), 1), 4
            )
            stats = json.loads(self.http("/kv_events/status"))
            result["publisher"] = {
                k: stats.get(k, 0) - stats_before.get(k, 0)
                for k in (
                    "published_events",
                    "published_batches",
                    "dropped_events",
                    "cleared_suppressed",
                )
            }
            counter.stop = True
            mirror.send_signal(signal.SIGTERM)
            mirror.wait(timeout=60)
            with open(os.path.join(self.out, "mirror.log"), errors="replace") as f:
                result["mirror_log_tail"] = [line.strip() for line in f.readlines()[-12:]]
        open(hold, "w").close()
        filler.wait(timeout=60)
        return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--master", required=True)
    p.add_argument("--client", required=True)
    p.add_argument("--kv-events", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--value-bytes", type=int, default=64)
    p.add_argument("--segment-mb", type=int, default=2048)
    args = p.parse_args()
    results = [Run(args, True).run(), Run(args, False).run()]
    with open(os.path.join(args.out, "removeall.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
