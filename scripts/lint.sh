#!/usr/bin/env bash
# What keeps the code clean, as CI runs it: rustfmt, clippy on every package of the workspace
# with every target and feature and warnings as errors (and the library's subscriber side
# alone), clang-format on the C++ sources and headers, ruff on the Python and mypy --strict on
# the Python package, and shellcheck on every shell script.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
rustfmt --check --edition 2021 examples/rust-follower/src/main.rs  # a crate of its own
# Besides clippy's defaults, the rules of Cargo.toml's [workspace.lints], which every package
# takes: missing_docs, undocumented_unsafe_blocks, incompatible_msrv (docs/testing.md).
cargo clippy --workspace --locked --all-targets --all-features -- -D warnings
# The library's subscriber side alone (`default-features = false, features = ["subscriber"]`),
# and with no feature at all: what the publisher's cfg gates leave must be warning-free too.
cargo clippy -p mooncake-kv-events --locked --lib --no-default-features --features subscriber \
  -- -D warnings
cargo clippy -p mooncake-kv-events --locked --lib --no-default-features -- -D warnings
# The C++ side (.clang-format at the root): the library's sources, its headers and the suites',
# every .cc, .h and .hpp git knows of (new files not yet added included, deleted ones skipped).
mapfile -t cxx_sources < <(git ls-files --cached --others --exclude-standard -- \
  'cpp/*.cc' 'cpp/*.h' 'cpp/*.hpp' 'include/*.h' 'include/*.hpp' \
  'cpp_tests/*.cc' 'cpp_tests/*.h' 'cpp_tests/*.hpp' | sort -u | while read -r f; do
  if [ -e "$f" ]; then echo "$f"; fi
done)
clang-format --dry-run --Werror "${cxx_sources[@]}"
# Every Python file of the repository, by ruff.toml at the root: its rules, then its format.
ruff check .
ruff format --check .
# The Python package's types, strictly (python/pyproject.toml's [tool.mypy]), with Debian's
# mypy on Debian's interpreter, which has pyzmq's types; its cache in target/ (ignored).
/usr/bin/python3 -m mypy --strict --config-file python/pyproject.toml \
  --cache-dir target/mypy-cache python/src
shellcheck scripts/*.sh integrations/mooncake/*.sh .ci/run
