#!/usr/bin/env python3
"""Compares what `kv-events tail` saw of a live mooncake_master with what check.sh's client did.

    compare_live.py EVENTS_JSONL STATUS_JSON METRICS_TEXT

The client put k1..k4, read k1, removed k2 and ran RemoveAll(force): the stream must be exactly
stored cpu k1..k4, removed cpu k2, removed cpu of k1, k3 and k4 (in the shards' order), then
cleared for the default tenant, in messages numbered from 0 without a gap; /kv_events/status
and /metrics must count those 9 events and nothing dropped. Exits 1 naming the first
difference.
"""

import json
import sys


def fail(what):
    print(f"compare_live.py: {what}", file=sys.stderr)
    sys.exit(1)


def main(events_path, status_path, metrics_path):
    events = [json.loads(line) for line in open(events_path) if line.strip()]
    lines = []
    for event in events:
        if event["event_type"] == "cleared":
            lines.append(f"cleared {event['tenant_id']}")
        else:
            lines.append(f"{event['event_type']} {event['medium']} {event['object_key']}")
    print("\n".join(lines))

    expected_head = [f"stored cpu k{i}" for i in range(1, 5)] + ["removed cpu k2"]
    if lines[:5] != expected_head:
        fail(f"expected {expected_head}, then the RemoveAll; got {lines}")
    if sorted(lines[5:8]) != ["removed cpu k1", "removed cpu k3", "removed cpu k4"]:
        fail(f"expected RemoveAll's removed k1, k3, k4; got {lines[5:]}")
    if lines[8:] != ["cleared default"]:
        fail(f"expected one cleared for tenant default last; got {lines[8:]}")

    for i, event in enumerate(events, start=1):
        if event["event_id"] != i:
            fail(f"event {i} has event_id {event['event_id']}")
        if event["backend_id"] != "live-check" or event["model_name"] != "check-model":
            fail(f"event {i} lacks the master's flags: {event}")
    # The publisher numbers its first message 0, then one more per message.
    sequences = sorted({event["sequence"] for event in events})
    if sequences != list(range(len(sequences))):
        fail(f"sequence numbers with a gap, or not from 0: {sequences}")

    status = json.load(open(status_path))
    if (status["built_with_kv_events"], status["enabled"]) != (True, True):
        fail(f"status says events are off: {status}")
    if status["published_events"] != 9 or status["dropped_events"] != 0:
        fail(
            f"status counts {status['published_events']} published, "
            f"{status['dropped_events']} dropped; expected 9 and 0"
        )
    metrics = open(metrics_path).read()
    if "\nmooncake_kv_events_published_events_total 9\n" not in metrics:
        fail("/metrics lacks mooncake_kv_events_published_events_total 9")
    print(
        f"compare_live.py: {len(events)} events as expected, "
        f"in {len(sequences)} messages, no gap; status and metrics agree"
    )


if __name__ == "__main__":
    if len(sys.argv) != 4:
        fail("usage: compare_live.py EVENTS_JSONL STATUS_JSON METRICS_TEXT")
    main(*sys.argv[1:])
