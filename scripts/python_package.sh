#!/usr/bin/env bash
# The Python package (python/) as a user gets it: an sdist (which carries the Rust sources of
# its native module: python/native and the library it binds), a wheel built from that sdist
# alone, the wheel installed into a fresh venv, the package's socket tests run there against
# the installed copy, then a follower from that venv follows `kv-events demo` (with a replay
# endpoint) and must end with the demo's --dump-index. Run by scripts/test.sh; needs cargo,
# libzmq-dev, python3-venv, python3-zmq, python3-msgpack and python3-pytest
# (scripts/install-deps.sh), and PyPI for maturin (pinned by python/pyproject.toml).
# KV_EVENTS: the kv-events binary to run (default: target/debug/kv-events, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=/usr/bin/python3
work=$(mktemp -d)
demo_pid=""
cleanup() {
  if [ -n "$demo_pid" ]; then kill "$demo_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# The build backend, as pyproject.toml pins it, in a venv of its own.
maturin=$(sed -n 's/^requires = \["\(maturin==[0-9.]*\)"\]$/\1/p' python/pyproject.toml)
[ -n "$maturin" ] || { echo "python/pyproject.toml pins no maturin" >&2; exit 1; }
"$python" -m venv "$work/build"
"$work/build/bin/python" -m pip install --quiet "$maturin"
export PATH="$work/build/bin:$PATH"
# The sdist from the checkout, then the wheel from the sdist alone (pip unpacks it elsewhere):
# what an sdist lacks, the wheel's build says. Its cargo target directory is one of its own
# under target/, kept between runs: the crates of crates.io are built once, the sdist's own
# (unpacked elsewhere each time) again.
(cd python && maturin sdist --out "$work/dist") >"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; exit 1; }
sdist=$(echo "$work"/dist/mooncake[-_]kv[-_]events-*.tar.gz)
CARGO_TARGET_DIR="$root/target/python-package" "$work/build/bin/python" -m pip wheel --quiet --no-deps \
  --no-build-isolation --wheel-dir "$work/dist" "$sdist" >>"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; exit 1; }
wheel=$(echo "$work"/dist/mooncake_kv_events-*-cp39-abi3-*.whl)
if ! [ -f "$sdist" ] || ! [ -f "$wheel" ]; then
  ls -l "$work/dist" >&2
  exit 1
fi
echo "python package: built $(basename "$sdist") and, from it, $(basename "$wheel")"
in_sdist=$(tar -tzf "$sdist")
in_wheel=$("$python" -m zipfile -l "$wheel")
for file in py.typed __init__.py __main__.py _version.py _errors.py _wire.py _follower.py \
  _native.pyi cli.py; do
  grep -q "/src/mooncake_kv_events/$file\$" <<<"$in_sdist" \
    || { echo "the sdist lacks $file: $in_sdist" >&2; exit 1; }
  grep -q "^mooncake_kv_events/$file " <<<"$in_wheel" \
    || { echo "the wheel lacks $file: $in_wheel" >&2; exit 1; }
done
for file in python/native/src/lib.rs src/subscriber/follow/mod.rs Cargo.lock; do
  grep -q "^mooncake_kv_events-[^/]*/$file\$" <<<"$in_sdist" \
    || { echo "the sdist lacks $file: $in_sdist" >&2; exit 1; }
done
grep -q "^mooncake_kv_events/_native.abi3.so " <<<"$in_wheel" \
  || { echo "the wheel lacks the native module: $in_wheel" >&2; exit 1; }

# A fresh venv that sees Debian's msgpack (and pyzmq and pytest, for the tests), and nothing
# of this checkout: the wheel is installed from the file, no index.
"$python" -m venv --system-site-packages "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install --quiet --no-index "$wheel"
# Its dependencies are declared; its command is there.
shown=$("$venv_python" -m pip show mooncake-kv-events)
grep -qx "Requires: msgpack" <<<"$shown" || { echo "$shown" >&2; exit 1; }
help=$("$work/venv/bin/mooncake-kv-indexer" --help)
grep -q "ENDPOINT,REPLAY_ENDPOINT" <<<"$help" || { echo "mooncake-kv-indexer --help: $help" >&2; exit 1; }
(cd "$work" && "$venv_python" -c "import mooncake_kv_events, sys; print('python package: installed', mooncake_kv_events.__version__, 'at', mooncake_kv_events.__file__, 'for Python', sys.version.split()[0])")
# Its one version is Cargo.toml's workspace version, in the wheel's name and its metadata.
cargo_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
grep -qx "Version: $cargo_version" <<<"$shown" \
  || { echo "the wheel's version is not Cargo.toml's $cargo_version: $shown" >&2; exit 1; }
case "$(basename "$wheel")" in
  "mooncake_kv_events-$cargo_version-"*) ;;
  *) echo "the wheel $(basename "$wheel") is not version $cargo_version" >&2; exit 1 ;;
esac

# The package's tests with sockets, asyncio's and the package's own, by pytest (Debian's,
# seen through --system-site-packages), on the installed copy (they check it is not the
# tree's).
(cd "$work" && MOONCAKE_KV_EVENTS_INSTALLED=1 "$venv_python" -B -m pytest -q \
  "$root/tests/python/test_follower.py" "$root/tests/python/test_async.py" \
  "$root/tests/python/test_package.py")

# A follower from the venv against the demo: it connects first, the demo waits a second for
# it, and it stops once the demo wrote its index and it is in sync before its next sequence.
kv_events=${KV_EVENTS:-target/debug/kv-events}
[ -x "$kv_events" ] || cargo build --locked --bin kv-events
pub="ipc://$work/kv.sock"
replay="ipc://$work/replay.sock"
(cd "$work" && "$venv_python" -B "$root/tests/python/follow_demo.py" "$pub" "$replay" \
  "$work/expected.json" --timeout 120) &
follower_pid=$!
"$kv_events" demo --endpoint "$pub" --replay-endpoint "$replay" --objects 3000 --wait 1 \
  --linger 2 --show 0 --dump-index "$work/expected.json" >"$work/demo.log" 2>&1 &
demo_pid=$!
status=0
wait "$follower_pid" || status=$?
wait "$demo_pid" || { cat "$work/demo.log" >&2; status=1; }
demo_pid=""
if [ "$status" -ne 0 ]; then
  echo "python package: the follower from the venv did not end with the demo's index" >&2
  exit 1
fi
echo "python package: sdist, wheel, fresh venv and a follower of the demo: ok"
