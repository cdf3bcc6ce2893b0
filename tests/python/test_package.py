"""Tests of the `mooncake_kv_events` package as a package: its one version (Cargo.toml's
workspace version), its public surface (`__all__`, every name documented, the inside in
modules named `_...`), and no `assert` guarding anything, so that `python -O` changes
nothing: the state machine runs a join, a gap and a restart the same under -O."""

import ast
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import conftest  # the package under test on sys.path, as a script too
import mooncake_kv_events

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(mooncake_kv_events.__file__).resolve().parent


def cargo_version():
    """The `[workspace.package]` version of Cargo.toml."""
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def test_the_version_is_cargos_workspace_version():
    assert mooncake_kv_events.__version__ == cargo_version(), (
        "python/src/mooncake_kv_events/_version.py and Cargo.toml's [workspace.package] "
        "version differ: write Cargo.toml's there"
    )
    # pyproject.toml reads it from there, and from nowhere else.
    pyproject = (conftest.SOURCE.parent / "pyproject.toml").read_text()
    assert 'version = { attr = "mooncake_kv_events._version.__version__" }' in pyproject
    assert 'dynamic = ["version"]' in pyproject


def test_the_public_surface_is_all_and_documented():
    public = set(mooncake_kv_events.__all__)
    assert {"Follower", "AsyncFollower", "Event", "Recovery", "Status", "Counters"} <= public
    assert not public & {"FollowerState", "COUNTERS", "Index", "Link", "PublisherState"}
    for name in public:
        value = getattr(mooncake_kv_events, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__doc__, f"{name} has no docstring"
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    assert modules - {"__init__", "__main__", "cli"} == {
        m for m in modules if m.startswith("_")
    } - {
        "__init__",
        "__main__",
    }, modules
    errors = [mooncake_kv_events.ProtocolError, mooncake_kv_events.Refused]
    assert all(issubclass(e, mooncake_kv_events.KvEventsError) for e in errors)
    assert issubclass(mooncake_kv_events.Unreachable, mooncake_kv_events.KvEventsError)


TYPED = """
from mooncake_kv_events import Follower, PublisherSpec

pairs: list[tuple[str, str]] = [("tcp://a:1", "tcp://a:2")]
Follower(pairs)
Follower([("tcp://a:1", "tcp://a:2"), ("tcp://b:1", None)])
Follower(["tcp://a:1", "tcp://b:1"])
both: list[PublisherSpec] = ["tcp://a:1", ("tcp://b:1", "tcp://b:2")]
Follower(both)
Follower("tcp://a:1")  # line 10: one str is not a list of publishers
"""


def test_mypy_refuses_one_str_for_the_publishers(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "typed.py").write_text(TYPED)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "typed.py"]
        + ["--cache-dir", str(tmp_path / "cache"), "--follow-imports", "silent"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        # The checkout's package by its path; an installed one as the interpreter finds it.
        env={"PATH": os.environ.get("PATH", "")}
        | ({} if conftest.INSTALLED else {"MYPYPATH": str(PACKAGE.parent)}),
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and errors[0].startswith("typed.py:10: error:"), run.stdout
    assert '"str"' in errors[0], errors[0]


def test_no_assert_guards_anything_in_the_package():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        assert not asserts, f"{path.name}: assert at lines {asserts}: raise instead"


SCENARIO = """
import msgpack
from mooncake_kv_events._state import FollowerState, Phase

def packed(*keys):
    return msgpack.packb([0, [{"event_type": "stored", "backend_id": "b", "tenant_id": "t",
                               "object_key": k, "medium": "cpu"} for k in keys], 0])

def info(incarnation, next_sequence):
    return [b"", b"info", msgpack.packb({"incarnation": incarnation, "next_sequence":
            next_sequence, "oldest_sequence": 0, "snapshots": True})]

def end(next_sequence, events, incarnation):
    return [b"", b"snapshot-end", msgpack.packb({"next_sequence": next_sequence,
            "events": events, "incarnation": incarnation})]

f = FollowerState("p", True, 0.0, note=lambda _: None)
f.start(0.0)
f.on_reply(info(7, 2), 0.0)
f.on_reply([b"", b"snapshot", packed("a", "b")], 0.0)
f.on_reply(end(2, 2, 7), 0.0)
f.on_stream([b"", (3).to_bytes(8, "big"), packed("d")], 0.0)   # 2 missing
f.on_reply(info(7, 4), 0.0)
f.on_reply([b"", b"", (2).to_bytes(8, "big"), packed("c")], 0.0)
f.on_reply([b"", b"", (-1).to_bytes(8, "big", signed=True), b""], 0.0)
f.on_stream([b"", (0).to_bytes(8, "big"), packed("new")], 0.0)   # a restart
f.on_reply(info(8, 1), 0.0)
f.on_reply([b"", b"snapshot", packed("new")], 0.0)
f.on_reply(end(1, 1, 8), 0.0)
c = f.counters
print(f.phase is Phase.LIVE, f.complete, f.next, c.gaps, c.replays, c.snapshots, c.incarnations,
      [key for _, _, key, _ in f.index.entries()], f.outbox.count([b"", b"info"]))
"""


def test_the_state_machine_is_the_same_under_python_dash_o():
    outputs = []
    for flags in ([], ["-O"], ["-OO"]):
        run = subprocess.run(
            [sys.executable, "-B", *flags, "-c", SCENARIO],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(PACKAGE.parent)},
        )
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert outputs[0] == "True True 1 1 1 2 1 [b'new'] 3\n", outputs[0]
    assert outputs[0] == outputs[1] == outputs[2], outputs


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
