"""Tests of the indexer, the `mooncake_kv_events` package of python/ and its program
examples/python/indexer.py: the decoding of events for `on_event` (`_wire`: every field,
refusing what an index cannot take), and the whole program against a fake publisher
(tests/python/fake_publisher.py). The state machine is the library's Rust follower, whose
own tests are in Rust (src/subscriber/follow, tests/follow*.rs). Run by pytest
(tests/python/conftest.py puts the package under test on sys.path): cli/tests/python_indexer.rs
runs `/usr/bin/python3 -B -m pytest tests/python/test_indexer.py`."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile

import msgpack
import pytest

import conftest  # noqa: F401  (the package under test on sys.path, as a script too)
import fake_publisher
from mooncake_kv_events import Event, EventKind, ProtocolError
from mooncake_kv_events._wire import event_of, events_of

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "indexer.py"


def event(kind, key=None, medium="cpu", tenant="t", backend="b"):
    """An event map as the publisher sends it; only the fields the indexer reads."""
    e = {"event_type": kind, "backend_id": backend, "tenant_id": tenant}
    if kind != "cleared":
        e["object_key"], e["medium"] = key, medium
    return e


def stored(key, medium="cpu", **where):
    return event("stored", key, medium, **where)


def removed(key, medium="cpu", **where):
    return event("removed", key, medium, **where)


def cleared(**where):
    return event("cleared", **where)


def decoded(*events):
    """Events as a payload's decode: maps with bytes keys, tuples."""
    return msgpack.unpackb(
        msgpack.packb(list(events)), raw=True, use_list=False, strict_map_key=False
    )


def test_events_an_index_cannot_take_are_refused_and_left_out():
    bad = [
        5,
        {"event_type": "stored"},
        stored(7),
        event("renamed", "x"),
        {1: 2},
        stored("c", medium=None),
        stored("c", medium=3),
        stored("c", tenant=None),
        removed(None),
        removed("c", tenant=[1]),
        cleared(tenant=4),
        stored("c", backend=b"\xff"),
        stored("c", medium=b"\xff"),
        stored("c", medium={"a": 1}),
        dict(stored("c"), backend_id=None),
    ]
    for raw in decoded(*bad):
        with pytest.raises(ProtocolError):
            event_of(raw)
    good = [stored("a"), removed("b"), cleared(tenant="u"), stored("d", tenant=b"\xfe")]
    mixed = msgpack.packb([1764694800123, [bad[0], good[0], bad[2], *good[1:]], 0])
    assert [(e.kind, e.tenant, e.key) for e in events_of(mixed)] == [
        ("stored", b"t", b"a"),
        ("removed", b"t", b"b"),
        ("cleared", b"u", None),
        ("stored", b"\xfe", b"d"),
    ]
    for wrong in (b"\xc1", msgpack.packb("wrong shape"), msgpack.packb([1, 2])):
        with pytest.raises(ProtocolError):
            events_of(wrong)


def test_an_event_carries_every_field_of_the_wire():
    wire = {
        "event_id": 1337,
        "timestamp": 1764694800123,
        "event_type": "stored",
        "type": "BlockStored",
        "model_name": "llama-3-8b",
        "block_size": 16,
        "additional_salt": None,
        "lora_name": None,
        "tenant_id": "default",
        "backend_id": "store-a",
        "medium": "cpu",
        "dp_rank": 2,
        "group_id": "g-7",
        "object_key": b"prefix/\xff",
        "seq_hashes": [],
        "block_hashes": [],
        "base_block_idx": None,
        "token_ids": None,
        "parent_hash": None,
        "parent_block_hash": None,
        "a_key_added_later": 1,
    }
    [raw] = decoded(wire)
    assert event_of(raw) == Event(
        EventKind.STORED,
        "store-a",
        b"default",
        b"prefix/\xff",
        "cpu",
        event_id=1337,
        timestamp=1764694800123,
        model_name="llama-3-8b",
        block_size=16,
        lora_name=None,
        additional_salt=None,
        dp_rank=2,
        group_id=b"g-7",
        seq_hashes=(),
        base_block_idx=None,
        token_ids=None,
        parent_hash=None,
    )
    assert event_of(raw).kind == "stored" and f"{event_of(raw).kind}" == "stored"
    # A field an index does not read, of a type it does not expect, is None: never a reason
    # to skip the event.
    [odd] = decoded(dict(wire, event_id="x", model_name=b"\xff", group_id=7))
    event = event_of(odd)
    assert (event.event_id, event.model_name, event.group_id, event.key) == (
        None,
        None,
        None,
        b"prefix/\xff",
    )
    [clear] = decoded({k: wire[k] for k in list(wire)[:12]} | {"event_type": "cleared"})
    assert event_of(clear)[:5] == (EventKind.CLEARED, "store-a", b"default", None, None)


# The whole program against a fake publisher.


def indexer_process(scenario, initial=()):
    """Runs a fake publisher holding `initial` and the indexer against it; stops the indexer
    with SIGTERM once `scenario(fake)` returns; returns (dump lines, stats, stdout, stderr)."""
    with tempfile.TemporaryDirectory() as d:
        fake = fake_publisher.Fake(d, initial)
        try:
            dump, stats = os.path.join(d, "index.jsonl"), os.path.join(d, "stats.json")
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-B",
                    str(EXAMPLE),
                    "--publisher",
                    f"{fake.pub},{fake.router}",
                    "--dump",
                    dump,
                    "--stats",
                    stats,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                scenario(fake)
            finally:
                process.send_signal(signal.SIGTERM)
                out, err = process.communicate(timeout=30)
            assert process.returncode == 0, (process.returncode, out, err)
            lines = [json.loads(line) for line in open(dump)]
            return lines, json.load(open(stats))["upstreams"][0], out.decode(), err.decode()
        finally:
            fake.close()


def row(key, media=("cpu",), tenant="t"):
    return {"tenant": tenant, "key": key, "media": list(media)}


def test_program_skips_malformed_stream_messages_and_converges():
    def scenario(fake):
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the snapshot")
        fake.send_raw([b"", (0).to_bytes(8, "big")])  # 2 frames
        fake.send_raw([b"\xde\xad\xbe\xef"])
        fake.send_raw([b"", (0).to_bytes(8, "big"), b"\xc1garbage"])
        fake.publish(stored("b"))  # 0
        fake.send_raw([b"", (1).to_bytes(8, "big"), msgpack.packb("wrong shape")])
        fake.publish(removed("a"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario, [stored("a"), stored(b"k\xff", "disk")])
    assert lines == [row("b"), row({"hex": "6bff"}, ["disk"])], (lines, err)
    assert stats["malformed"] == 4 and stats["in_sync"], (stats, err)
    assert stats["gaps"] == 0 and stats["snapshots"] == 1, (stats, err)
    assert stats["next_sequence"] == 2, (stats, err)
    assert "4 malformed," in out and "2 objects indexed" in out, out


def test_program_converges_after_a_loss_before_encoding():
    def scenario(fake):
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the first snapshot")
        fake.publish(stored("a"))
        fake.publish(stored("b"))
        fake.drop(stored("d"), stored("e"), removed("a"))  # numbers 2 to 4, never sent
        fake.publish(stored("c"))
        fake.wait_for(lambda: fake.snapshots_served == 2, "the second snapshot")
        fake.publish(removed("b"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario)
    assert lines == [row(k) for k in "cde"], (lines, err)
    # The replay came back without 2 to 4: not counted as one that filled its gap. (The gap
    # may be seen twice: by the stream, and by a quiet check before the first recovery ends.)
    assert stats["gaps"] >= 1 and stats["replays"] == 0, (json.dumps(stats), err)
    assert stats["snapshots"] == 2 and stats["in_sync"], (stats, err)
    # c took 5, removed b 6.
    assert stats["next_sequence"] == 7, stats


def test_program_joins_late_and_exits_on_sigterm_with_its_dump():
    def scenario(fake):
        for key in "abc":
            fake.publish(stored(key))
        fake.publish(cleared(tenant="t"))
        fake.publish(stored("d", tenant="u"))
        fake.wait_for_subscriber()
        fake.wait_for(lambda: fake.snapshots_served == 1, "the snapshot")
        fake.publish(stored("e", tenant="u"))
        fake.settle()

    lines, stats, out, err = indexer_process(scenario)
    assert lines == [row("d", tenant="u"), row("e", tenant="u")], (lines, err)
    # Messages 0 to 4 before the snapshot, e 5 after it.
    assert stats["next_sequence"] == 6, stats
    assert stats["last_convergence"] is not None, stats
    assert f"stopped by signal {int(signal.SIGTERM)}" in err, err


def test_program_exits_1_when_no_upstream_was_ever_heard_from():
    with tempfile.TemporaryDirectory() as d:
        stats = os.path.join(d, "stats.json")
        run = subprocess.run(
            [sys.executable, "-B", str(EXAMPLE), "tcp://127.0.0.1:1,tcp://127.0.0.1:2"]
            + ["--idle-timeout", "1", "--stats", stats],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
        assert "indexer: no upstream reached in" in run.stderr, run.stderr
        assert "tcp://127.0.0.1:1: " in run.stderr, run.stderr
        [upstream] = json.load(open(stats))["upstreams"]
    assert not upstream["reached"] and upstream["silent_for"] is None, upstream
    assert "0 objects indexed" in run.stdout, run.stdout


@pytest.mark.parametrize(
    "argument, says",
    [
        ("127.0.0.1:5557,tcp://a:2", "names no transport"),
        ("tcp://master-0,tcp://a:2", "a TCP endpoint is tcp://HOST:PORT"),
        ("tcp://a:1", "expected ENDPOINT,REPLAY_ENDPOINT"),
        ("tcp://a:1,tcp://a:2,tcp://a:3", "expected ENDPOINT,REPLAY_ENDPOINT"),
        ("tcp://a:1,tcp://a:1", "are both 'tcp://a:1'"),
    ],
)
def test_program_refuses_an_upstream_given_wrong_saying_how(argument, says):
    run = subprocess.run(
        [sys.executable, "-B", str(EXAMPLE), "--publisher", argument],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and says in run.stderr, (run.returncode, run.stderr)


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
