#!/usr/bin/env python3
"""Times snapshots from the master's replay socket, end to end, as a DEALER requester sees them.

    snapshot_time.py ENDPOINT [--requesters N] [--tenant T] [--timeout S]

N requester processes (default 1), each with its own DEALER, wait at a barrier, then each sends
["", "snapshot"] (or ["", "snapshot", T]) and reads ["", "snapshot", batch] replies until
["", "snapshot-end", map], counting the messages and the events (the batch's event array
header only: [timestamp_ms, [event, ...], dp_rank]; the events are not decoded). Prints one
JSON line per requester and a summary: the time from the common start to the last
snapshot-end, objects/s, and whether every requester got the same snapshot-end map. Its
next_sequence N is the sequence the master's next message was to take when the enumeration
began: on a master whose sequence keeps moving (--kv_events_heartbeat_ms=10, say), requesters
that got the same N shared one enumeration. Needs pyzmq and msgpack (/usr/bin/python3 on
Debian with python3-zmq and python3-msgpack).
"""

import argparse
import json
import multiprocessing as mp
import sys
import time


def requester(index, endpoint, tenant, timeout, barrier, results):
    import msgpack
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.connect(endpoint)
    request = [b"", b"snapshot"] + ([tenant.encode()] if tenant else [])
    time.sleep(0.3)  # let the connection settle before the common start
    barrier.wait()
    start = time.time()
    dealer.send_multipart(request)
    messages = events = 0
    first_at = None
    outcome = {"index": index}
    while True:
        if not dealer.poll(int(timeout * 1000)):
            outcome["error"] = f"no reply within {timeout} s"
            break
        frames = dealer.recv_multipart()
        verb = frames[1]
        if first_at is None:
            first_at = time.time()
        if verb == b"snapshot":
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(frames[2])
            unpacker.read_array_header()
            unpacker.skip()  # timestamp_ms
            events += unpacker.read_array_header()
            messages += 1
        elif verb == b"snapshot-end":
            end = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
            outcome["end"] = end
            break
        else:
            outcome["error"] = [f.decode(errors="replace") for f in frames[1:]]
            break
    done = time.time()
    outcome.update(
        start=start,
        done=done,
        seconds=round(done - start, 3),
        first_reply_s=round((first_at or done) - start, 3),
        messages=messages,
        events=events,
    )
    results.put(outcome)
    dealer.close()
    context.term()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("endpoint")
    p.add_argument("--requesters", type=int, default=1)
    p.add_argument("--tenant")
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    barrier = mp.Barrier(a.requesters)
    results = mp.Queue()
    procs = [
        mp.Process(target=requester, args=(i, a.endpoint, a.tenant, a.timeout, barrier, results))
        for i in range(a.requesters)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=a.timeout * 2 + 30) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    outcomes.sort(key=lambda o: o["index"])
    for o in outcomes:
        print(json.dumps({k: v for k, v in o.items() if k not in ("start", "done")}))
    start = min(o["start"] for o in outcomes)
    last = max(o["done"] for o in outcomes)
    ends = [json.dumps(o.get("end"), sort_keys=True) for o in outcomes]
    ok = all("end" in o for o in outcomes)
    objects = outcomes[0].get("end", {}).get("objects", 0)
    summary = {
        "requesters": a.requesters,
        "all_ended": ok,
        "same_snapshot_end": ok and len(set(ends)) == 1,
        "distinct_snapshot_ends": len(set(ends)),
        "to_last_snapshot_end_s": round(last - start, 3),
        "objects": objects,
        "objects_per_s_each": round(objects / max(last - start, 1e-9)),
        "events_each": sorted({o["events"] for o in outcomes}),
    }
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
