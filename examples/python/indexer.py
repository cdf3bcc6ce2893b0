#!/usr/bin/env python3
"""The example indexer: the `mooncake-kv-indexer` command of the `mooncake_kv_events` package
(python/ in this repository), runnable from a checkout without installing it.

    /usr/bin/python3 examples/python/indexer.py \\
        --publisher tcp://master-0:5557,tcp://master-0:5558 --dump index.jsonl

It imports the package from this checkout's python/src, once `python3 python/develop.py` has
built its native module (the Rust follower) and linked it there (Debian's python3-msgpack,
which scripts/install-deps.sh installs, is all else it needs), or, outside a checkout, the
installed one (`pip install ./python`). `--help` says the rest; the program
and its options are documented in docs/subscribers.md ("A complete indexer").
"""

import pathlib
import sys

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "python" / "src"
if (SOURCE / "mooncake_kv_events").is_dir():
    sys.path.insert(0, str(SOURCE))

# E402: imported only once the checkout's package is on sys.path (above).
from mooncake_kv_events.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
