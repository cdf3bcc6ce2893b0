#!/usr/bin/python3
"""Peak RSS of `kv-events tail` fed hostile and legitimate messages by a raw publisher.

Usage: scripts/subscriber_rss.py path/to/kv-events [tail options...]

Each case binds an XPUB socket on a fresh ipc endpoint, starts the tail, waits for its
subscription, sends the case's messages, and reports the tail's exit status, its peak RSS
(getrusage of the child) and the last lines of its stderr. The tail stops with
--idle-timeout, so a message it never sees costs the case two seconds, no more.
"""

import os
import resource
import subprocess
import sys
import time

import msgpack
import zmq

MIB = 1024 * 1024


def event(i):
    return {
        "event_id": i,
        "timestamp": 1,
        "event_type": "stored",
        "type": "BlockStored",
        "model_name": "m",
        "block_size": 16,
        "additional_salt": None,
        "lora_name": None,
        "tenant_id": "default",
        "backend_id": "b",
        "medium": "cpu",
        "dp_rank": 0,
        "group_id": None,
        "object_key": f"obj-{i:06d}",
        "seq_hashes": [],
        "block_hashes": [],
        "base_block_idx": None,
        "token_ids": None,
        "parent_hash": None,
        "parent_block_hash": None,
    }


def legit():
    # 2000 messages of 64 events, about 33 MB of payload in all.
    return [msgpack.packb([1, [event(b * 64 + i) for i in range(64)], 0]) for b in range(2000)]


CASES = {
    "60 MiB payload of nils": lambda: [
        b"\xdd" + (60 * MIB).to_bytes(4, "big") + b"\xc0" * (60 * MIB)
    ],
    "5-byte payload claiming 4 billion elements": lambda: [b"\xdd\xff\xff\xff\xff"],
    "legit stream (2000 x 64 events)": legit,
}


def run(binary, options, name, make):
    endpoint = f"ipc:///tmp/kv-events-rss-{os.getpid()}.sock"
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(endpoint)
    tail = subprocess.Popen(
        [binary, "tail", endpoint, "--idle-timeout", "2", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # Made only now: memory the child held between fork and exec counts in its peak.
    payloads = make()
    pub.recv()  # the tail's subscription
    for seq, payload in enumerate(payloads):  # numbered from 0, as a publisher does
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
    started = time.monotonic()
    _, stderr = tail.communicate()
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    pub.close(linger=0)
    context.term()
    lines = stderr.decode(errors="replace").strip().splitlines()
    seconds = time.monotonic() - started
    print(
        f"{name:<45} exit {tail.returncode}, peak RSS {peak_kib / 1024:7.1f} MiB ({seconds:.1f}s)"
    )
    for line in lines[-3:]:
        print("    " + line[:200])


def main():
    binary, options = sys.argv[1], sys.argv[2:]
    for name, make in CASES.items():
        # One child per process: RUSAGE_CHILDREN is the peak of all children waited for.
        pid = os.fork()
        if pid == 0:
            run(binary, options, name, make)
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
