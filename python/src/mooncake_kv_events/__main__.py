"""`python3 -m mooncake_kv_events`: the indexer (cli.py)."""

from .cli import main

main()
