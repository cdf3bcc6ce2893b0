"""Tests of the `mooncake_kv_events` package as a package: its one version (Cargo.toml's
workspace version), its public surface (`__all__`, every name documented, the inside in
modules named `_...`, the native module typed by its stub), and no `assert` guarding
anything, so that `python -O` changes nothing: input is refused the same under -O."""

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
    # maturin takes the wheel's version from the native crate, which takes the workspace's.
    pyproject = (ROOT / "python" / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    native = (ROOT / "python" / "native" / "Cargo.toml").read_text()
    assert "version.workspace = true" in native


def test_the_public_surface_is_all_and_documented():
    public = set(mooncake_kv_events.__all__)
    assert {"Follower", "AsyncFollower", "Event", "Notice", "NoticeKind", "Status"} <= public
    assert {"Upstream", "FollowerCounters"} <= public
    assert not public & {"NativeFollower", "PublisherSpec", "Recovery", "Counters"}
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
from mooncake_kv_events import Follower, Upstream

pairs: list[tuple[str, str]] = [("tcp://a:1", "tcp://a:2")]
Follower(pairs)
Follower([("tcp://a:1", "tcp://a:2"), ("tcp://b:1", "tcp://b:2")])
both: list[Upstream] = [Upstream("tcp://a:1", "tcp://a:2"), Upstream("tcp://b:1", "tcp://b:2")]
Follower(both)
notices = Follower(pairs).poll(0.1)
kinds: list[str] = [n.kind for n in notices]
Follower("tcp://a:1")  # line 11: one str is not a list of upstreams
"""


def test_mypy_refuses_one_str_for_the_upstreams(tmp_path):
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
    assert len(errors) == 1 and errors[0].startswith("typed.py:11: error:"), run.stdout
    assert '"str"' in errors[0], errors[0]


def test_no_assert_guards_anything_in_the_package():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        asserts = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        assert not asserts, f"{path.name}: assert at lines {asserts}: raise instead"


SCENARIO = """
from mooncake_kv_events import Follower
for wrong in ("tcp://a:1", [("tcp://a:1",)], [("tcp://a:1", "tcp://a:1")]):
    try:
        Follower(wrong)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
with Follower([("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")]) as follower:
    print(follower.poll(0), follower.count())
"""


def test_input_is_refused_the_same_under_python_dash_o():
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
    lines = outputs[0].splitlines()
    assert len(lines) == 4 and lines[-1] == "[] 0", outputs[0]
    assert [line.split()[0] for line in lines[:3]] == ["TypeError", "ValueError", "ValueError"]
    assert outputs[0] == outputs[1] == outputs[2], outputs


if __name__ == "__main__":
    # `python3 tests/python/THIS_FILE.py [pytest options]` runs this file under pytest.
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
