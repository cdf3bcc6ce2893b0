#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test the publisher.
# The Rust toolchain (cargo, rustc) is expected to be there already (rustup).
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libzmq3-dev libgtest-dev valgrind shellcheck
  python3 python3-zmq python3-msgpack python3-prometheus-client)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi
