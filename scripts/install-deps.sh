#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test the publisher.
# The Rust toolchain (cargo, rustc) is expected to be there already (rustup). The Python
# package's tests run under Debian's pytest (python3-pytest), and scripts/lint.sh checks its
# types with Debian's mypy: both from Debian, as its pyzmq and msgpack, for the one
# interpreter they all run on (/usr/bin/python3). The package's native module (python/native)
# builds with cargo and libzmq3-dev, and maturin, which scripts/python_package.sh installs
# from PyPI into a venv of its own (pinned by python/pyproject.toml).
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libzmq3-dev libgtest-dev valgrind shellcheck clang-format
  python3 python3-zmq python3-msgpack python3-prometheus-client python3-venv python3-pip
  python3-build python3-pytest python3-mypy nats-server)
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
# kv-events relay's reader example and its test (relay/tests/python_reader.rs) run on Debian's
# /usr/bin/python3 with nats-py, which Debian does not package: from PyPI, into that interpreter.
if ! /usr/bin/python3 -c "import nats" 2>/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo /usr/bin/python3 -m pip install -q --break-system-packages nats-py
fi
# ruff (scripts/lint.sh: the Python's rules and format, ruff.toml), which Debian 12 does not
# package: from PyPI, pinned, since its formatter's style moves between releases.
ruff_version=0.17.6
if [ "$(ruff --version 2>/dev/null)" != "ruff $ruff_version" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo /usr/bin/python3 -m pip install -q --break-system-packages "ruff==$ruff_version"
fi
