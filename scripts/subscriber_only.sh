#!/usr/bin/env bash
# The Rust subscriber side as an indexer author gets it: examples/rust-follower, a crate of its
# own outside this checkout, depending on the library by path with `default-features = false,
# features = ["subscriber"]`, built with no C++ compiler on PATH (c++, g++ and clang++ fail, CXX
# unset) and no cargo configuration of ours. Then checks that
#   - it links the system libzmq (zmq-sys finds it with pkg-config), not libstdc++ itself,
#     and the libzmq it runs with has CURVE;
#   - it follows the demo's publisher (snapshot, stream) to the very index the demo dumps.
# Run by scripts/test.sh; SUBSCRIBER_ONLY_DIR keeps its scratch directory (default: a temporary
# one, removed), whose target/ a second run reuses.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

if [[ -n "${SUBSCRIBER_ONLY_DIR:-}" ]]; then
  scratch="$SUBSCRIBER_ONLY_DIR"
  mkdir -p "$scratch"
else
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
fi

# No C++ compiler: what cc-rs and cmake would look for first fails loudly.
mkdir -p "$scratch/bin"
for compiler in c++ g++ clang++; do
  # shellcheck disable=SC2016 # $0 and $* are the stub's, expanded when it runs
  printf '#!/bin/sh\necho "subscriber_only.sh: no C++ compiler ($0 $*)" >&2\nexit 1\n' \
    >"$scratch/bin/$compiler"
  chmod +x "$scratch/bin/$compiler"
done

# The example as a crate elsewhere: its path dependency made absolute, the versions this
# checkout's Cargo.lock pins (--offline: nothing fetched, nothing newer picked).
crate="$scratch/crate"
rm -rf "$crate"
mkdir -p "$crate"
cp -r examples/rust-follower/src "$crate/"
sed "s|path = \"../..\"|path = \"$root\"|" examples/rust-follower/Cargo.toml >"$crate/Cargo.toml"
cp Cargo.lock "$crate/Cargo.lock"
(
  cd "$crate"
  env -u CXX PATH="$scratch/bin:$PATH" CARGO_TARGET_DIR="$scratch/target" \
    cargo build --offline --quiet
)
binary="$scratch/target/debug/kv-events-rust-follower"

# Linked: the system libzmq, and no C++ runtime of its own (libzmq brings its own).
needed="$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
if ! grep -qx 'libzmq.so.5' <<<"$needed" || grep -q 'libstdc++' <<<"$needed"; then
  echo "subscriber_only.sh: $binary needs: $needed" >&2
  exit 1
fi
# Read whole before grep: `grep -q` stops at the first match, and with pipefail the SIGPIPE
# ldd may then get fails the check.
linked="$(ldd "$binary")"
if ! grep -q '^[[:space:]]*libzmq.so.5 => /' <<<"$linked"; then
  echo "subscriber_only.sh: the system libzmq is not what $binary runs with:" >&2
  ldd "$binary" >&2
  exit 1
fi

# It follows the demo's publisher to the index the demo dumps.
cargo build --locked --quiet -p kv-events
suffix="$$-$RANDOM"
pub="ipc:///tmp/kvev-subonly-$suffix.sock"
replay="ipc:///tmp/kvev-subonly-replay-$suffix.sock"
# The workload lasts a few seconds (--rate), so that the follower applies the stream too.
"$binary" 10 "$pub" "$replay" >"$scratch/index.jsonl" 2>"$scratch/follower.log" &
follower=$!
target/debug/kv-events demo --endpoint "$pub" --replay-endpoint "$replay" --objects 300 \
  --rate 1000 --wait 1 --linger 5 --dump-index "$scratch/demo.json" >"$scratch/demo.log"
if ! wait "$follower"; then
  echo "subscriber_only.sh: the follower failed:" >&2
  cat "$scratch/follower.log" >&2
  exit 1
fi
grep -qx 'CURVE available' "$scratch/follower.log" || {
  echo "subscriber_only.sh: the follower's libzmq has no CURVE:" >&2
  cat "$scratch/follower.log" >&2
  exit 1
}
python3 - "$scratch/demo.json" "$scratch/index.jsonl" "$scratch/follower.log" <<'EOF'
import json, re, sys
demo = json.load(open(sys.argv[1]))
expected = sorted((tenant, key, sorted(media)) for _backend, tenant, key, media in demo["objects"])
# The follower writes a key that is not UTF-8 as {"hex": ...}, the demo's dump as "hex:...".
name = lambda b: "hex:" + b["hex"] if isinstance(b, dict) else b
lines = [json.loads(line) for line in open(sys.argv[2])]
got = sorted((name(o["tenant"]), name(o["key"]), sorted(o["media"])) for o in lines)
if not expected or got != expected:
    sys.exit(f"subscriber_only.sh: the follower holds {len(got)} objects, the demo {len(expected)}")
events = int(re.search(r"\bevents: (\d+)", open(sys.argv[3]).read()).group(1))
if events == 0:
    sys.exit("subscriber_only.sh: the follower applied no event of the stream")
print(f"subscriber_only.sh: built with no C++ compiler, linked the system libzmq (CURVE), "
      f"followed the demo to its {len(got)} objects ({events} events from the stream)")
EOF
