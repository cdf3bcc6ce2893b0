#!/usr/bin/env bash
# Runs every test: the Rust workspace's (the library, the kv-events command, the helpers they
# share) and its API documentation's, then the C++ suites built with ENABLE_KV_EVENTS ON and OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked --features bench
# The API documentation: every public item documented (missing_docs), no broken link.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --locked --no-deps
# The subscriber side alone, as a crate outside the checkout builds it: no C++ compiler on
# PATH, the system libzmq linked, a follower run against the demo (examples/rust-follower).
scripts/subscriber_only.sh
# The Python package (python/): an sdist and a wheel, installed into a fresh venv, its tests
# there, and a follower from that venv that must end with the demo's index.
KV_EVENTS=target/debug/kv-events scripts/python_package.sh

# The C++ face, as a master consumes it: the same suites against the Rust library (ON) and
# against the stub (OFF). ON's cargo build shares the crate's target/ with the line above
# (KV_EVENTS_CARGO_TARGET_DIR; by default it would go under the build tree).
for variant in ON OFF; do
  dir="build/${variant,,}"
  # KV_EVENTS_CONSUMER_CMAKE=<an older cmake, e.g. 3.16>: the CMake routes are checked with it
  # too (docs/testing.md).
  cmake -S cpp_tests -B "$dir" -G Ninja -DENABLE_KV_EVENTS="$variant" -DCMAKE_BUILD_TYPE=Release \
    -DKV_EVENTS_CARGO_TARGET_DIR="$PWD/target" \
    -DKV_EVENTS_CONSUMER_CMAKE="${KV_EVENTS_CONSUMER_CMAKE:-}"
  cmake --build "$dir"
done
for variant in on off; do
  ctest --test-dir "build/$variant" --output-on-failure
done
