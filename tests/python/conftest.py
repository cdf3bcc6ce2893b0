"""What every test of tests/python shares: the package under test on sys.path, this
checkout's python/src, or with MOONCAKE_KV_EVENTS_INSTALLED=1 the installed one
(scripts/python_package.sh, in a fresh venv); the helpers of this directory (fake_publisher)
are importable as pytest puts the directory on sys.path."""

import os
import pathlib
import sys

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "python" / "src"
INSTALLED = os.environ.get("MOONCAKE_KV_EVENTS_INSTALLED") == "1"
if not INSTALLED and str(SOURCE) not in sys.path:
    sys.path.insert(0, str(SOURCE))
