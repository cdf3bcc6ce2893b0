"""Unit tests of the Index class of examples/python/indexer.py: what it does with gaps,
restarts, repeated events and cleared. Plain asserts; run by tests/python_indexer.rs as
`/usr/bin/python3 tests/python/test_indexer.py`, exit status 0 when every test passes."""

import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "indexer.py"
spec = importlib.util.spec_from_file_location("indexer", EXAMPLE)
indexer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(indexer)


def event(kind, key=None, medium=None, tenant="t", backend="b"):
    """An event map as msgpack.unpackb(raw=False) gives it; only the fields Index reads."""
    e = {"event_type": kind, "backend_id": backend, "tenant_id": tenant, "medium": medium}
    if kind != "cleared":
        e["object_key"] = key
    return e


def stored(key, medium="cpu", **where):
    return event("stored", key, medium, **where)


def removed(key, medium="cpu", **where):
    return event("removed", key, medium, **where)


def objects(index):
    return index.as_json()["objects"]


def test_stored_and_removed_are_idempotent():
    index = indexer.Index()
    assert index.on_message(1, [stored("k"), stored("k"), stored("k", "disk")])
    assert index.on_message(2, [stored("k", "disk"), removed("never-seen")])
    assert objects(index) == [["b", "t", "k", ["cpu", "disk"]]]
    assert index.on_message(3, [removed("k"), removed("k")])
    assert objects(index) == [["b", "t", "k", ["disk"]]]
    assert index.on_message(4, [removed("k", "disk")])
    assert objects(index) == []
    assert index.resyncs == 0


def test_cleared_wipes_only_its_backend_and_tenant():
    index = indexer.Index()
    index.on_message(1, [stored("k1"), stored("k2", "disk"), stored("k1", tenant="u"),
                         stored("k1", backend="c")])
    assert index.on_message(2, [event("cleared")])
    assert objects(index) == [["b", "u", "k1", ["cpu"]], ["c", "t", "k1", ["cpu"]]]
    assert index.resyncs == 0


def test_a_gap_drops_what_the_backend_held():
    index = indexer.Index()
    index.on_message(1, [stored("a"), stored("x", backend="c")])
    index.on_message(2, [stored("b", "disk")])
    # Sequence 3 was lost: whatever it said about backend b is unknown.
    assert not index.on_message(4, [stored("c")])
    assert index.resyncs == 1
    # b's entries before the gap are gone; the message after it counts; c is untouched.
    assert objects(index) == [["b", "t", "c", ["cpu"]], ["c", "t", "x", ["cpu"]]]
    assert index.last_sequence == 4
    assert index.on_message(5, [stored("d")])
    assert index.resyncs == 1


def test_a_restart_drops_what_the_backend_held():
    index = indexer.Index()
    for sequence in (1, 2, 3):
        index.on_message(sequence, [stored(f"k{sequence}")])
    assert not index.on_message(1, [stored("after")])
    assert index.resyncs == 1
    assert objects(index) == [["b", "t", "after", ["cpu"]]]


def test_joining_late_is_a_gap_too():
    index = indexer.Index()
    assert not index.on_message(7, [stored("k")])
    assert index.resyncs == 1
    assert objects(index) == [["b", "t", "k", ["cpu"]]]


def test_bin_keys_and_tenants_render_as_hex():
    index = indexer.Index()
    index.on_message(1, [stored(b"k\xff"), stored("k", tenant=b"\xfet")])
    assert objects(index) == [["b", "hex:fe74", "k", ["cpu"]], ["b", "t", "hex:6bff", ["cpu"]]]
    index.on_message(2, [removed(b"k\xff")])
    assert objects(index) == [["b", "hex:fe74", "k", ["cpu"]]]


if __name__ == "__main__":
    tests = [(name, f) for name, f in sorted(globals().items()) if name.startswith("test_")]
    for name, test in tests:
        test()
        print(f"ok {name}")
    print(f"{len(tests)} tests passed")
