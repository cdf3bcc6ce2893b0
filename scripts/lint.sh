#!/usr/bin/env bash
# What keeps the code clean, as CI runs it: rustfmt, clippy on every package of the workspace
# with every target and feature and warnings as errors, and shellcheck on every shell script.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --locked --all-targets --all-features -- -D warnings
shellcheck scripts/*.sh integrations/mooncake/*.sh .ci/run
