#!/usr/bin/env bash
# What keeps the code clean, as CI runs it: rustfmt, clippy on every package of the workspace
# with every target and feature and warnings as errors (and the library's subscriber side
# alone), and shellcheck on every shell script.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
rustfmt --check --edition 2021 examples/rust-follower/src/main.rs  # a crate of its own
cargo clippy --workspace --locked --all-targets --all-features -- -D warnings
# The library's subscriber side alone (`default-features = false, features = ["subscriber"]`),
# and with no feature at all: what the publisher's cfg gates leave must be warning-free too.
cargo clippy -p mooncake-kv-events --locked --lib --no-default-features --features subscriber \
  -- -D warnings
cargo clippy -p mooncake-kv-events --locked --lib --no-default-features -- -D warnings
shellcheck scripts/*.sh integrations/mooncake/*.sh .ci/run
