"""The package's version: the workspace version of Cargo.toml (mooncake-kv-events is one
release, its Rust crates and this package together). Written here once, read by
pyproject.toml (`[tool.setuptools.dynamic]`) and by `mooncake_kv_events.__version__`;
tests/python/test_package.py fails when it is not Cargo.toml's."""

__version__ = "0.1.0"
