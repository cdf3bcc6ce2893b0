#!/usr/bin/env python3
"""The soak: the real mooncake_master with KV events and the replay socket on, real Mooncake
clients of several tenants running a random mix, subscribers that start with it, join late or
lose messages, a master restart in the middle; at the end every subscriber's index must equal
what the master holds, read through Mooncake's own API, key by key and medium by medium.

    soak.py --master BIN --client BIN --kv-events BIN --indexer PY --out DIR [--seconds N]

  --master     mooncake_master (built with ENABLE_KV_EVENTS=ON)
  --client     kv_events_soak_client (the kit's patch adds it to mooncake-store/tests/e2e)
  --kv-events  this project's CLI (`kv-events mirror`)
  --indexer    this project's examples/python/indexer.py (run with /usr/bin/python3, which
               needs python3-zmq and python3-msgpack)

Phase 1 (half of --seconds): master A; four clients (tenants t1, t2, t3, and t1 again, whose
Puts race the other's RemoveAll) each mounting a small segment (so that the master evicts) run
Put, BatchPut, Upsert, Get and Query (which take leases), Remove, RemoveByRegex and RemoveAll;
`mirror-start` and `indexer-lossy` (the example indexer with a receive high-water mark of 16,
which stops reading for 6 s mid-phase and so loses messages; the soak fails if it lost none)
follow from the start, `mirror-late` joins mid-phase. At its end, while the clients hold their
segments, the mirrors are compared with master A's truth. Then master A is killed (SIGKILL) and
master B started on the same ports: a new incarnation holding nothing. Phase 2: fresh clients
run the mix without Upsert (under steady Upsert churn this Mooncake ends with its memory held
and no key left); the lossy indexer stops reading once more, mirror-late is stopped (SIGSTOP)
once. At the end, once the truth is still, every subscriber's index is compared with it: equal,
or the soak fails and says how.

The truth is each tenant's QueryByRegex(".*") through a client of that tenant
(kv_events_soak_client --mode=dump): every object with a readable replica, memory as cpu,
every disk kind as disk. Results: DIR/summary.json, and a report on stdout.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zlib

TENANTS = ["t1", "t2", "t3"]
# One client per tenant, and a second one in t1: its Puts race the first one's RemoveAll.
CLIENT_TENANTS = ["t1", "t2", "t3", "t1"]
MIX_FULL = "put:300,batchput:100,upsert:100,get:150,query:100,remove:150,regex:20,removeall:2"
# How long the lossy indexer stops reading, each time; its SUB socket holds 16 messages.
LOSSY_PAUSE_S = 6
MIX_NO_UPSERT = "put:350,batchput:120,get:150,query:100,remove:150,regex:20,removeall:2"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        os.makedirs(self.out, exist_ok=True)
        self.procs = []
        self.rpc_port = free_port()
        self.metrics_port = free_port()
        self.events = f"tcp://127.0.0.1:{free_port()}"
        self.replay = f"tcp://127.0.0.1:{free_port()}"
        self.summary = {"phases": {}, "subscribers": {}, "mismatches": {}, "convergence_s": {}}
        self.quota = os.path.join(self.out, "tenants.yaml")
        with open(self.quota, "w") as f:
            f.write("version: 1\n\ntenants:\n")
            for t in TENANTS:
                f.write(f'  - name: "{t}"\n    quota: {args.quota_mb << 20}\n')

    def log(self, text):
        print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)

    def spawn(self, name, argv, **kw):
        out = open(os.path.join(self.out, name + ".log"), "ab")
        proc = subprocess.Popen(argv, stdout=kw.pop("stdout", out), stderr=out, **kw)
        proc.name = name
        self.procs.append(proc)
        return proc

    # --- the master
    def start_master(self, name):
        argv = [
            self.args.master,
            "--enable_ha=false",
            "--enable_http_metadata_server=false",
            "--rpc_address=127.0.0.1",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_port={self.metrics_port}",
            "--logtostderr",
            "--enable_multi_tenants=true",
            f"--tenant_quota_connector_uri={self.quota}",
            "--enable_kv_events=true",
            f"--kv_events_bind_endpoint={self.events}",
            f"--kv_events_replay_endpoint={self.replay}",
            "--kv_events_backend_id=soak",
            "--kv_events_model_name=soak-model",
            # At most 100 messages held for a subscriber that is not reading: a stopped
            # subscriber loses messages within a second or two instead of after the
            # kernel's buffers (megabytes) filled.
            "--kv_events_send_hwm=100",
        ]
        proc = self.spawn(name, argv)
        deadline = time.time() + 30
        while time.time() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{name} exited with {proc.returncode}: see {name}.log")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=1)
                return proc
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"{name} did not answer /health within 30 s")

    def http(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=10) as r:
            return r.read().decode()

    # --- clients
    def start_clients(self, phase, mix, seconds):
        hold = os.path.join(self.out, f"{phase}.hold")
        clients = []
        for i, tenant in enumerate(CLIENT_TENANTS):
            stats = os.path.join(self.out, f"{phase}-client-{i}-{tenant}.json")
            argv = [
                self.args.client,
                "--mode=work",
                f"--tenant={tenant}",
                f"--master_server_entry=127.0.0.1:{self.rpc_port}",
                f"--host=127.0.0.1:{free_port()}",
                f"--seconds={seconds}",
                f"--seed={zlib.crc32(f'{phase}/{i}/{self.args.seed}'.encode())}",
                f"--segment_mb={self.args.segment_mb}",
                f"--key_space={self.args.key_space}",
                f"--mix={mix}",
                f"--stats={stats}",
                f"--hold_file={hold}",
            ]
            clients.append((self.spawn(f"{phase}-client-{i}-{tenant}", argv), stats))
        return clients, hold

    def wait_mixes(self, clients, seconds):
        deadline = time.time() + seconds + 60
        while not all(os.path.exists(s) for _, s in clients):
            for proc, _ in clients:
                if proc.poll() is not None:
                    raise SystemExit(
                        f"{proc.name} exited with {proc.returncode} before its mix ended"
                    )
            if time.time() > deadline:
                raise SystemExit("the clients did not finish their mix in time")
            time.sleep(0.2)
        ops = {}
        for _, stats in clients:
            with open(stats) as f:
                for op, counter in json.load(f).items():
                    if op == "tenant":
                        continue
                    total = ops.setdefault(op, {"calls": 0, "ok": 0, "objects": 0})
                    for k in total:
                        total[k] += counter[k]
        return ops

    def release(self, clients, hold):
        open(hold, "w").close()
        for proc, _ in clients:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    # --- the truth
    def truth(self):
        holdings = set()
        for tenant in TENANTS:
            argv = [
                self.args.client,
                "--mode=dump",
                f"--tenant={tenant}",
                f"--master_server_entry=127.0.0.1:{self.rpc_port}",
                f"--host=127.0.0.1:{free_port()}",
            ]
            err = open(os.path.join(self.out, "truth-dumps.log"), "ab")
            result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, timeout=60)
            if result.returncode != 0:
                raise SystemExit(f"the truth dump of {tenant} failed: see truth-dumps.log")
            for line in result.stdout.decode().splitlines():
                holdings.add(tuple(line.split("\t")))
        return holdings

    def still_truth(self):
        """The truth once two reads a second apart agree (eviction may still be at work)."""
        # The leases the mix took (and QueryByRegex takes) hold objects from eviction: let
        # them lapse first (the master's default lease is 5 s).
        time.sleep(6)
        last = self.truth()
        for _ in range(30):
            time.sleep(1)
            now = self.truth()
            if now == last:
                return now
            last = now
        raise SystemExit("the master's truth kept changing for 30 s after the workload")

    # --- subscribers
    def start_mirror(self, name):
        dump = os.path.join(self.out, name + ".jsonl")
        proc = self.spawn(
            name,
            [
                self.args.kv_events,
                "mirror",
                self.events,
                "--replay-endpoint",
                self.replay,
                "--every",
                "1",
                "--dump",
                dump,
            ],
        )
        proc.dump = dump
        return proc

    def start_indexer(self, name):
        dump = os.path.join(self.out, name + ".jsonl")
        stats = os.path.join(self.out, name + "-stats.json")
        here = os.path.dirname(os.path.abspath(__file__))
        proc = self.spawn(
            name,
            [
                "/usr/bin/python3",
                os.path.join(here, "lossy_indexer.py"),
                self.args.indexer,
                "16",
                str(LOSSY_PAUSE_S),
                "--publisher",
                f"{self.events},{self.replay}",
                "--dump",
                dump,
                "--stats",
                stats,
            ],
        )
        proc.dump, proc.stats = dump, stats
        return proc

    @staticmethod
    def read_dump(path):
        holdings = set()
        try:
            with open(path) as f:
                for line in f:
                    o = json.loads(line)
                    for medium in o["media"]:
                        holdings.add((o["tenant"], o["key"], medium))
        except FileNotFoundError:
            return None
        return holdings

    def pause(self, proc, seconds):
        self.log(f"stopping {proc.name} for {seconds} s")
        proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        proc.send_signal(signal.SIGCONT)

    def stop_reading(self, indexer):
        self.log(f"{indexer.name} stops reading for {LOSSY_PAUSE_S} s")
        indexer.send_signal(signal.SIGUSR1)
        time.sleep(LOSSY_PAUSE_S)

    def converge(self, mirrors, truth, since, timeout=60):
        """Seconds from `since` (the truth read) until each mirror's dump, written every
        second, equals `truth`: 0 when it already did."""
        times = {}
        deadline = time.time() + timeout
        while len(times) < len(mirrors) and time.time() < deadline:
            for m in mirrors:
                if m.name not in times and self.read_dump(m.dump) == truth:
                    times[m.name] = round(time.time() - since, 1)
            time.sleep(0.25)
        return times

    @staticmethod
    def differences(index, truth):
        if index is None:
            return {"missing_dump": True}
        lacks, extra = sorted(truth - index), sorted(index - truth)
        return {
            "lacks": len(lacks),
            "extra": len(extra),
            "lacks_first": lacks[:10],
            "extra_first": extra[:10],
        }

    @staticmethod
    def mirror_counters(log):
        last = None
        with open(log, errors="replace") as f:
            for line in f:
                if "gaps " in line and "snapshots " in line:
                    last = line.strip()
        return last

    def run(self):
        args = self.args
        half = max(args.seconds // 2, 1)
        ok = True
        self.log(f"master A: rpc {self.rpc_port}, events {self.events}, replay {self.replay}")
        master = self.start_master("master-a")
        mirror_start = self.start_mirror("mirror-start")
        indexer = self.start_indexer("indexer-lossy")
        time.sleep(1)

        # Phase 1: the full mix, on master A.
        clients, hold = self.start_clients("phase1", MIX_FULL, half)
        t0 = time.time()
        time.sleep(0.3 * half)
        self.stop_reading(indexer)
        time.sleep(max(0.5 * half - (time.time() - t0), 0))
        self.log("mirror-late joins")
        mirror_late = self.start_mirror("mirror-late")
        ops = self.wait_mixes(clients, half)
        truth = self.still_truth()
        times = self.converge([mirror_start, mirror_late], truth, time.time())
        phase1 = {
            "operations": ops,
            "truth_holdings": len(truth),
            "convergence_s": times,
            "status": json.loads(self.http("/kv_events/status")),
        }
        for m in (mirror_start, mirror_late):
            diff = self.differences(self.read_dump(m.dump), truth)
            phase1[m.name] = diff
            if diff.get("lacks") or diff.get("extra") or diff.get("missing_dump"):
                ok = False
                self.log(f"phase 1: {m.name} differs from master A: {diff}")
        self.summary["phases"]["1"] = phase1
        self.log(f"phase 1: {len(truth)} holdings; mirrors equal to it {times} s after it was read")
        self.release(clients, hold)

        # The restart: master A dies, master B starts on the same ports.
        incarnation_a = phase1["status"].get("incarnation")
        master.kill()
        master.wait()
        self.log("master A killed; starting master B")
        time.sleep(1)
        master = self.start_master("master-b")

        # Phase 2: no Upsert, on master B.
        clients, hold = self.start_clients("phase2", MIX_NO_UPSERT, half)
        t0 = time.time()
        time.sleep(0.3 * half)
        self.stop_reading(indexer)
        time.sleep(max(0.6 * half - (time.time() - t0), 0))
        self.pause(mirror_late, 4)
        ops = self.wait_mixes(clients, half)
        truth = self.still_truth()
        times = self.converge([mirror_start, mirror_late], truth, time.time())
        status = json.loads(self.http("/kv_events/status"))
        metrics = self.http("/metrics")
        # The final indexes: each subscriber writes its own on SIGTERM.
        for proc in (mirror_start, mirror_late, indexer):
            proc.send_signal(signal.SIGTERM)
        codes = {}
        for proc in (mirror_start, mirror_late, indexer):
            try:
                codes[proc.name] = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[proc.name] = "killed"
        truth_after = self.truth()
        phase2 = {
            "operations": ops,
            "truth_holdings": len(truth),
            "convergence_s": times,
            "truth_unchanged_after_comparison": truth_after == truth,
            "subscriber_exit_codes": codes,
        }
        if truth_after != truth:
            ok = False
            self.log("the truth changed while the subscribers were compared")
        for proc in (mirror_start, mirror_late, indexer):
            diff = self.differences(self.read_dump(proc.dump), truth)
            self.summary["mismatches"][proc.name] = diff
            if diff.get("lacks") or diff.get("extra") or diff.get("missing_dump"):
                ok = False
                self.log(f"{proc.name} differs from master B: {diff}")
        for name in ("mirror-start", "mirror-late"):
            self.summary["subscribers"][name] = self.mirror_counters(
                os.path.join(self.out, name + ".log")
            )
        try:
            with open(indexer.stats) as f:
                lossy = json.load(f)["publishers"][0]
            self.summary["subscribers"]["indexer-lossy"] = lossy
            # What this subscriber is here for: it lost messages, and healed.
            if not lossy.get("gaps"):
                ok = False
                self.log("indexer-lossy lost no message: the soak did not test a loss")
        except (OSError, ValueError, KeyError, IndexError) as e:
            ok = False
            self.log(f"indexer-lossy wrote no stats: {e}")
        phase2["status"] = status
        # The status and the metrics carry the incarnation and the replay counters.
        for key in (
            "incarnation",
            "replay_requests",
            "replayed_messages",
            "snapshots_served",
            "snapshot_objects",
        ):
            if key not in status:
                ok = False
                self.log(f"/kv_events/status lacks {key}")
        for name in (
            "mooncake_kv_events_incarnation_info",
            "mooncake_kv_events_replay_requests_total",
            "mooncake_kv_events_snapshots_served_total",
        ):
            if name not in metrics:
                ok = False
                self.log(f"/metrics lacks {name}")
        if status.get("incarnation") == incarnation_a:
            ok = False
            self.log("master B has master A's incarnation")
        self.summary["phases"]["2"] = phase2
        self.release(clients, hold)
        master.terminate()
        master.wait(timeout=30)
        self.summary["passed"] = ok
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=1, default=str)
        self.report()
        return ok

    def report(self):
        s = self.summary
        for phase, p in s["phases"].items():
            ops = ", ".join(
                f"{op} {c['calls']} ({c['ok']} ok, {c['objects']} objects)"
                for op, c in sorted(p["operations"].items())
            )
            st = p["status"]
            print(f"phase {phase}: {ops}")
            print(
                f"  published {st.get('published_events')} events in {st.get('published_batches')}"
                f" messages, dropped {st.get('dropped_events')}; replay requests "
                f"{st.get('replay_requests')}, replayed {st.get('replayed_messages')}, snapshots"
                f" {st.get('snapshots_served')} ({st.get('snapshot_objects')} objects); "
                f"truth {p['truth_holdings']} holdings; mirrors equal to it "
                f"{p['convergence_s']} s after it was read (their dumps come every second)"
            )
        for name, counters in s["subscribers"].items():
            print(f"{name}: {counters}")
        for name, diff in s["mismatches"].items():
            print(f"{name} vs master B: lacks {diff.get('lacks')}, extra {diff.get('extra')}")
        print("soak: " + ("PASSED" if s.get("passed") else "FAILED"))

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                except OSError:
                    pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--master", required=True)
    p.add_argument("--client", required=True)
    p.add_argument("--kv-events", required=True)
    p.add_argument("--indexer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--seconds",
        type=int,
        default=int(os.environ.get("SOAK_SECONDS", 70)),
        help="workload time, split between the two phases (default 70)",
    )
    p.add_argument("--segment-mb", type=int, default=32)
    p.add_argument("--quota-mb", type=int, default=48)
    p.add_argument("--key-space", type=int, default=2000)
    p.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", 1)))
    args = p.parse_args()
    soak = Soak(args)
    try:
        ok = soak.run()
    finally:
        soak.stop_all()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
