#!/usr/bin/env python3
"""A reader of `kv-events relay`: bootstraps from its snapshot, then follows its log.

    /usr/bin/python3 examples/relay/reader.py --nats nats://127.0.0.1:4222 \\
        --backend demo-store --dump index.jsonl

The relay writes, per backend, a compacted snapshot into the Object Store bucket
`kv-events-snapshots` (an object named as the backend's subject token, whose content is
msgpack batches `[timestamp_ms, [event, ...], dp_rank]` one after another) and the log
into the stream `KV_EVENTS`, subject `kv-events.<token>`, each message one or more such
batches. The snapshot's header `Kv-Events-Stream-Sequence` is the log message it reflects:
the reader applies the snapshot, then every message of the subject after that one, with the
same code. Each log message names the one before it on the subject
(`Kv-Events-Previous`): when the first one it gets does not (the stream's retention removed
what followed the snapshot), it loads the snapshot again; so it does, while it still
catches up on the log, when a newer snapshot is written (after a burst, the log behind an
old snapshot can hold far more than the new one), and when no log message came for 3 s
while the log went on (a consumer lost with a cluster's node). It never asks the master
anything.

On exit (`--duration`, SIGINT, SIGTERM) it writes what it holds as JSON lines, sorted by
tenant then key, as `kv-events mirror --dump` does, and says on stderr how many objects it
bootstrapped, in how long, and how many log messages it followed. Needs nats-py and msgpack
(`pip install nats-py msgpack`, see scripts/install-deps.sh).
"""

import argparse
import asyncio
import base64
import json
import signal
import sys
import time

import msgpack
import nats
from nats.js.api import ConsumerConfig, DeliverPolicy

# Seconds without a log message, while the log goes on, before the reader starts again.
STALLED = 3


def token(data: bytes) -> str:
    """The relay's token of some bytes (docs/relay.md, "Tokens")."""
    if data and all(chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-_") for b in data):
        return data.decode()
    return "=" + base64.urlsafe_b64encode(data).decode().rstrip("=")


MEDIA = {"cpu": 1, "disk": 2}


def text(value) -> str:
    """A `str` or `bin` field of the wire as one kind of key: a `bin` (bytes that are not
    UTF-8) as the same string a `str` holding them decodes to."""
    return value.decode("utf-8", "surrogateescape") if type(value) is bytes else value


def unpacker():
    return msgpack.Unpacker(raw=False, use_list=False, unicode_errors="surrogateescape")


def apply(state: dict, data: bytes, batches=None):
    """Applies the batches of a log message to `state` (tenant -> key -> media, a bit per
    medium), or of a snapshot's chunk, fed to the snapshot's `batches` unpacker (a chunk
    may end inside a batch)."""
    batches = batches or unpacker()
    batches.feed(data)
    for _timestamp, events, _rank in batches:
        for e in events:
            kind, tenant = e["event_type"], text(e["tenant_id"] or "default")
            if kind == "stored":
                keys = state.get(tenant)
                if keys is None:
                    keys = state[tenant] = {}
                key = text(e["object_key"])
                keys[key] = keys.get(key, 0) | MEDIA[e["medium"]]
            elif kind == "removed":
                keys, key = state.get(tenant, {}), text(e["object_key"])
                media = keys.get(key, 0) & ~MEDIA[e["medium"]]
                if media:
                    keys[key] = media
                else:
                    keys.pop(key, None)
            elif kind == "cleared":
                state.pop(tenant, None)


def info_subject(bucket: str, name: str) -> str:
    """The subject on which the Object Store says a snapshot was written or replaced."""
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def stream_sequence(info: dict):
    """The log message a snapshot's info (as the Object Store sends it) reflects, if it says."""
    for field in ("headers", "metadata"):
        value = (info.get(field) or {}).get("Kv-Events-Stream-Sequence")
        if value:
            return int(value[0] if isinstance(value, list) else value)
    return None


async def load_snapshot(client, bucket: str, name: str, state: dict) -> int:
    """Applies the snapshot `name` to `state`; returns the stream sequence it reflects (0
    when there is none)."""
    js = client.jetstream(timeout=30)
    try:
        store = await js.object_store(bucket)
        info = await store.get_info(name)
    except (nats.js.errors.NotFoundError, nats.js.errors.ObjectNotFoundError):
        return 0
    headers = info.headers or {}
    value = headers.get("Kv-Events-Stream-Sequence") or (info.metadata or {}).get(
        "Kv-Events-Stream-Sequence"
    )
    sequence = int(value[0] if isinstance(value, list) else value)
    if info.size:
        # The chunks, applied as they come (ObjectStore.get would first join them whole).
        done, received = asyncio.Event(), [0]
        batches = unpacker()

        async def on_chunk(msg):
            apply(state, msg.data, batches)
            received[0] += len(msg.data)
            if msg.metadata.num_pending == 0:
                done.set()

        # A snapshot replaced meanwhile has its chunks purged: the rest never comes. The
        # next info on the object's subject says so at once (and the info, read whenever
        # the chunks stop for a second, if that message is missed).
        async def on_info(_msg):
            done.set()

        replaced = await client.subscribe(info_subject(bucket, name), cb=on_info)
        if (await store.get_info(name)).nuid != info.nuid:
            done.set()
        sub = await js.subscribe(
            f"$O.{bucket}.C.{info.nuid}",
            stream=f"OBJ_{bucket}",
            cb=on_chunk,
            ordered_consumer=True,
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        while not done.is_set():
            try:
                await asyncio.wait_for(done.wait(), 1)
            except asyncio.TimeoutError:
                if (await store.get_info(name)).nuid != info.nuid:
                    break
        await sub.unsubscribe()
        await replaced.unsubscribe()
        if received[0] != info.size:  # replaced meanwhile: load the newer one
            state.clear()
            return await load_snapshot(client, bucket, name, state)
    return sequence


async def follow(args) -> dict:
    """Bootstraps, then follows until told to stop; returns the state."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.duration:
        loop.call_later(args.duration, stop.set)
    started = time.monotonic()
    client = await nats.connect(args.nats, max_reconnect_attempts=-1)
    js = client.jetstream(timeout=30)
    name = token(args.backend.encode())
    subject = f"kv-events.{name}"
    state = {}
    seen = {"last": 0, "messages": 0, "bootstrapped": False, "snapshot": 0, "heard": started}
    restart = asyncio.Event()

    def bootstrapped():
        seen["bootstrapped"] = True
        objects = sum(len(keys) for keys in state.values())
        took = time.monotonic() - started
        print(
            f"relay reader: bootstrapped {objects} objects in {took:.2f} s (the snapshot at "
            f"stream sequence {seen['snapshot']}, then {seen['messages']} log messages)",
            file=sys.stderr,
        )

    async def on_log(msg):
        previous = int((msg.headers or {}).get("Kv-Events-Previous", -1))
        if previous != seen["last"]:  # what followed the snapshot is gone: load it again
            if not restart.is_set():
                print(
                    f"relay reader: log message {msg.metadata.sequence.stream} follows "
                    f"{previous}, not {seen['last']}; starting again from the snapshot",
                    file=sys.stderr,
                )
            restart.set()
            return
        apply(state, msg.data)
        seen["last"] = msg.metadata.sequence.stream
        seen["messages"] += 1
        seen["heard"] = time.monotonic()
        if not seen["bootstrapped"] and msg.metadata.num_pending == 0:
            bootstrapped()

    async def on_newer_snapshot(msg):
        try:
            sequence = stream_sequence(json.loads(msg.data))
        except (ValueError, TypeError, AttributeError):
            return
        if not seen["bootstrapped"] and sequence and sequence > seen["last"]:
            restart.set()

    async def once():
        """Loads the snapshot, then follows the log until told to stop or to start again."""
        state.clear()
        seen["last"] = seen["snapshot"] = await load_snapshot(client, args.snapshots, name, state)
        seen["heard"] = time.monotonic()
        restart.clear()
        sub = await js.subscribe(
            subject,
            stream=args.stream,
            cb=on_log,
            ordered_consumer=True,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seen["last"] + 1
            ),
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
        )
        try:
            info = await sub.consumer_info()
            if info.num_pending == 0 and not seen["bootstrapped"]:
                bootstrapped()
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, restart)]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        finally:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass  # the server forgets the consumer by itself

    async def watchdog():
        """Starts again from the snapshot when the log holds messages past the last one
        applied and none came for STALLED seconds: a consumer lost with the server that held
        it (a cluster's node killed) is not always noticed by the client."""
        while not stop.is_set():
            await asyncio.sleep(1)
            if time.monotonic() - seen["heard"] < STALLED:
                continue
            try:
                # Not the context's 30 s: a request that went to a killed leader is asked
                # again of the next one.
                last = (await asyncio.wait_for(js.get_last_msg(args.stream, subject), 2)).seq
            # Whatever fails (NATS electing a leader, a reply it does not expect), the
            # watchdog goes on: it is what notices a reader that stopped.
            except Exception as e:  # noqa: BLE001
                if repr(e) != seen.get("unchecked"):
                    print(f"relay reader: cannot read where the log ends: {e!r}", file=sys.stderr)
                seen["unchecked"] = repr(e)
                continue
            seen.pop("unchecked", None)
            if last > seen["last"]:
                print(
                    f"relay reader: no log message for {STALLED} s while the log goes on; "
                    "starting again from the snapshot",
                    file=sys.stderr,
                )
                seen["heard"] = time.monotonic()
                restart.set()

    await client.subscribe(info_subject(args.snapshots, name), cb=on_newer_snapshot)
    watching = asyncio.ensure_future(watchdog())
    while not stop.is_set():
        try:
            await once()
        except nats.errors.Error as e:
            # NATS unreachable or its cluster electing a leader: start again from the
            # snapshot once it answers (the client reconnects by itself).
            print(f"relay reader: {e!r}; starting again from the snapshot", file=sys.stderr)
            await asyncio.sleep(1)
    watching.cancel()
    await client.close()
    print(
        f"relay reader: {sum(len(k) for k in state.values())} objects, "
        f"{seen['messages']} log messages followed (the last at stream sequence {seen['last']})",
        file=sys.stderr,
    )
    return state


def json_name(name: str):
    """A tenant or key as `mirror --dump` writes it: a string, or {"hex": ...} for bytes
    that are not UTF-8."""
    data = name.encode("utf-8", "surrogateescape")
    try:
        return data.decode()
    except UnicodeDecodeError:
        return {"hex": data.hex()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server")
    parser.add_argument("--backend", required=True, help="the master's backend_id")
    parser.add_argument("--stream", default="KV_EVENTS", help="the relay's stream")
    parser.add_argument("--snapshots", default="kv-events-snapshots", help="its snapshots")
    parser.add_argument("--duration", type=float, help="stop after SECS seconds")
    parser.add_argument("--dump", help="write the objects here (default: stdout)")
    args = parser.parse_args()
    state = asyncio.run(follow(args))
    out = open(args.dump, "w") if args.dump else sys.stdout
    as_bytes = lambda name: name.encode("utf-8", "surrogateescape")  # noqa: E731
    for tenant in sorted(state, key=as_bytes):
        for key in sorted(state[tenant], key=as_bytes):
            media = [m for m, bit in MEDIA.items() if state[tenant][key] & bit]
            line = {"key": json_name(key), "media": media, "tenant": json_name(tenant)}
            out.write(json.dumps(line, separators=(",", ":"), sort_keys=True) + "\n")
    if args.dump:
        out.close()


if __name__ == "__main__":
    main()
