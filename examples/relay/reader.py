#!/usr/bin/env python3
"""A reader of `kv-events relay`'s key-value bucket: bootstraps from it, then follows it.

    /usr/bin/python3 examples/relay/reader.py --nats nats://127.0.0.1:4222 \\
        --bucket kv-events --backend demo-store --dump index.jsonl

It watches every key of the bucket (or of one backend): NATS first delivers the current value
of each key, then every change, so the reader never asks the master anything and never needs
a snapshot. Each value is the JSON object `kv-events mirror --dump` writes for one object
(`{"tenant", "key", "media"}`); a deleted key is an object no longer present. On exit
(`--duration`, SIGINT, SIGTERM) it writes what it holds as JSON lines, sorted by tenant then
key, as `mirror --dump` does, and says on stderr how many objects it bootstrapped and how many
changes it followed. Needs nats-py (`pip install nats-py`, see scripts/install-deps.sh).
"""

import argparse
import asyncio
import base64
import json
import signal
import sys

import nats


def token(data: bytes) -> str:
    """The relay's key token of some bytes (docs/relay.md, "The bucket's keys")."""
    if data and all(chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-_") for b in data):
        return data.decode()
    return "=" + base64.urlsafe_b64encode(data).decode().rstrip("=")


def name_bytes(value) -> bytes:
    """A tenant or key as `mirror` writes it (a string, or {"hex": ...}) back to bytes."""
    if isinstance(value, str):
        return value.encode()
    return bytes.fromhex(value["hex"])


def sort_key(line: dict):
    return (name_bytes(line["tenant"]), name_bytes(line["key"]))


async def follow(args) -> dict:
    """The bucket's objects, key -> value, bootstrapped then followed until told to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.duration:
        loop.call_later(args.duration, stop.set)

    client = await nats.connect(args.nats, max_reconnect_attempts=-1)
    bucket = await client.jetstream().key_value(args.bucket)
    keys = f"{token(args.backend.encode())}.>" if args.backend else ">"
    watcher = await bucket.watch(keys)
    objects, bootstrapped, changes = {}, None, 0
    while not stop.is_set():
        try:
            entry = await asyncio.wait_for(watcher.updates(), timeout=0.2)
        except asyncio.TimeoutError:
            continue
        if entry is None:  # the current values are all in: from here on, changes
            bootstrapped = len(objects)
            print(f"relay reader: bootstrapped {bootstrapped} objects", file=sys.stderr)
            continue
        if entry.operation in ("DEL", "PURGE"):
            objects.pop(entry.key, None)
        else:
            objects[entry.key] = json.loads(entry.value)
        if bootstrapped is not None:
            changes += 1
    await watcher.stop()
    await client.close()
    print(f"relay reader: {len(objects)} objects, {changes} changes followed", file=sys.stderr)
    return objects


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    parser.add_argument("--bucket", default="kv-events", help="the relay's bucket")
    parser.add_argument("--backend", help="only this backend's objects (default: all)")
    parser.add_argument("--duration", type=float, help="stop after SECS seconds")
    parser.add_argument("--dump", help="write the objects here (default: stdout)")
    args = parser.parse_args()
    objects = asyncio.run(follow(args))
    lines = sorted(objects.values(), key=sort_key)
    out = open(args.dump, "w") if args.dump else sys.stdout
    for line in lines:
        out.write(json.dumps(line, separators=(",", ":"), sort_keys=True) + "\n")
    if args.dump:
        out.close()


if __name__ == "__main__":
    main()
