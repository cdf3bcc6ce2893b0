#!/usr/bin/env bash
# The Python package (python/) as a user gets it: built as an sdist and a wheel (the wheel from
# the sdist), the wheel installed into a fresh venv, the package's socket tests run there
# against the installed copy, then a follower from that venv follows `kv-events demo` (with a
# replay endpoint) and must end with the demo's --dump-index. Run by scripts/test.sh; needs
# python3-venv, python3-build, python3-zmq, python3-msgpack and python3-pytest
# (scripts/install-deps.sh).
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

# Built from a copy, so that the tree gets no build/ or egg-info; with the system's setuptools
# (--no-isolation), so that building needs no network.
cp -r python "$work/source"
rm -rf "$work/source/build" "$work/source/src/"*.egg-info
"$python" -m build --no-isolation --outdir "$work/dist" "$work/source" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; exit 1; }
sdist=$(echo "$work"/dist/mooncake[-_]kv[-_]events-*.tar.gz)
wheel=$(echo "$work"/dist/mooncake_kv_events-*-py3-none-any.whl)
if ! [ -f "$sdist" ] || ! [ -f "$wheel" ]; then
  ls -l "$work/dist" >&2
  exit 1
fi
echo "python package: built $(basename "$sdist") and $(basename "$wheel")"
in_sdist=$(tar -tzf "$sdist")
in_wheel=$("$python" -m zipfile -l "$wheel")
for file in py.typed __init__.py __main__.py _version.py _errors.py _wire.py _index.py _state.py \
  _links.py _follower.py cli.py; do
  grep -q "/src/mooncake_kv_events/$file\$" <<<"$in_sdist" \
    || { echo "the sdist lacks $file: $in_sdist" >&2; exit 1; }
  grep -q "^mooncake_kv_events/$file " <<<"$in_wheel" \
    || { echo "the wheel lacks $file: $in_wheel" >&2; exit 1; }
done

# A fresh venv that sees Debian's pyzmq and msgpack, and nothing of this checkout: the wheel
# is installed from the file, no index.
"$python" -m venv --system-site-packages "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install --quiet --no-index "$wheel"
# Its dependencies are declared; its command is there.
shown=$("$venv_python" -m pip show mooncake-kv-events)
grep -qx "Requires: msgpack, pyzmq" <<<"$shown" || { echo "$shown" >&2; exit 1; }
help=$("$work/venv/bin/mooncake-kv-indexer" --help)
grep -q "PUB_ENDPOINT" <<<"$help" || { echo "mooncake-kv-indexer --help: $help" >&2; exit 1; }
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
