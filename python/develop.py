#!/usr/bin/env python3
"""Builds the package's native module (python/native, the Rust follower) and links it into
python/src/mooncake_kv_events, so that the package runs from this checkout without being
installed: tests/python (conftest.py), cli/tests/python_indexer.rs and
examples/python/indexer.py use it so. Needs cargo and libzmq-dev (scripts/install-deps.sh).

    /usr/bin/python3 python/develop.py        # prints the module's path

An installed package (`pip install ./python`, maturin) carries its own copy instead."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The name the import system looks for: one module for every CPython from 3.9 on (abi3).
LINK = ROOT / "python" / "src" / "mooncake_kv_events" / "_native.abi3.so"


def build() -> pathlib.Path:
    """Builds the module (release: the follower's rate is the point) and links it; its path."""
    cargo = os.environ.get("CARGO", "cargo")
    command = [cargo, "build", "--release", "--locked", "-p", "mooncake-kv-events-python"]
    done = subprocess.run(
        [*command, "--message-format=json-render-diagnostics"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed (status {done.returncode}): see above")
    built = None
    for line in done.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message["target"]["name"] == "_native":
            built = next(f for f in message["filenames"] if f.endswith(".so"))
    if built is None:
        sys.exit(f"{' '.join(command)} built no _native library")
    if LINK.is_symlink() or LINK.exists():
        if LINK.is_symlink() and os.readlink(LINK) == built:
            return LINK
        LINK.unlink()
    LINK.symlink_to(built)
    return LINK


if __name__ == "__main__":
    print(build())
