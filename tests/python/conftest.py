"""What every test of tests/python shares: the package under test on sys.path, this
checkout's python/src with its native module built and linked in (python/develop.py), or
with MOONCAKE_KV_EVENTS_INSTALLED=1 the installed one (scripts/python_package.sh, in a fresh
venv); the helpers of this directory (fake_publisher) are importable as pytest puts the
directory on sys.path."""

import os
import pathlib
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "python" / "src"
INSTALLED = os.environ.get("MOONCAKE_KV_EVENTS_INSTALLED") == "1"
if not INSTALLED:
    runpy.run_path(str(ROOT / "python" / "develop.py"))["build"]()
    if str(SOURCE) not in sys.path:
        sys.path.insert(0, str(SOURCE))
