#!/usr/bin/env python3
"""A reader of `kv-events relay`'s key-value bucket: bootstraps from it, then follows it.

    /usr/bin/python3 examples/relay/reader.py --nats nats://127.0.0.1:4222 \\
        --bucket kv-events --backend demo-store --dump index.jsonl

It watches every key of the bucket (or of one backend), as an ordered consumer of the bucket's
stream: NATS first delivers the current value of each key, then every change, so the reader
never asks the master anything and never needs a snapshot. Each value is the JSON object
`kv-events mirror --dump` writes for one object (`{"tenant", "key", "media"}`); a deleted key
is an object no longer present. On exit
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
    from nats.js.api import DeliverPolicy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.duration:
        loop.call_later(args.duration, stop.set)

    client = await nats.connect(args.nats, max_reconnect_attempts=-1)
    # The server finds the last value of each key before it answers: for a bucket of
    # millions of keys that takes longer than nats-py's default of 5 s.
    js = client.jetstream(timeout=120)
    prefix = f"$KV.{args.bucket}."
    keys = f"{token(args.backend.encode())}.>" if args.backend else ">"
    objects, state = {}, {"bootstrapped": None, "changes": 0}

    def bootstrapped():
        state["bootstrapped"] = len(objects)
        print(f"relay reader: bootstrapped {len(objects)} objects", file=sys.stderr)

    async def on_entry(msg):
        key = msg.subject[len(prefix) :]
        if msg.headers and msg.headers.get("KV-Operation") in ("DEL", "PURGE"):
            objects.pop(key, None)
        else:
            objects[key] = msg.data  # JSON, decoded when written out
        if state["bootstrapped"] is not None:
            state["changes"] += 1
        elif msg.metadata.num_pending == 0:  # the current values are all in
            bootstrapped()

    # What a key-value watch is, an ordered consumer of the bucket's stream from the last
    # value of each key, without the watch's bounded queue: nats-py drops entries past it
    # (a slow consumer) when a bucket of a million objects arrives at once.
    sub = await js.subscribe(
        prefix + keys,
        stream=f"KV_{args.bucket}",
        cb=on_entry,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )
    try:
        info = await sub.consumer_info()
        empty = info.num_pending == 0 and info.delivered.stream_seq == 0
    except nats.js.errors.NotFoundError:
        empty = False  # made again under another name, so with messages to deliver
    if state["bootstrapped"] is None and empty:
        bootstrapped()
    await stop.wait()
    await sub.unsubscribe()
    await client.close()
    print(
        f"relay reader: {len(objects)} objects, {state['changes']} changes followed",
        file=sys.stderr,
    )
    return {key: json.loads(value) for key, value in objects.items()}


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
