#!/usr/bin/env bash
# Each attack of scripts/attack.py against the publisher of `kv-events demo`, once per
# binary given, in one run, so that builds compare on the same machine at the same moment:
#
#   scripts/hostile.sh target/release/kv-events [OTHER_KV_EVENTS ...]
#
# Each attack starts when the demo's workload does (its watcher joined during the demo's
# --wait), and the workload is paced to outlast it. Prints one JSON line per attack and binary:
# the attack's report, with the binary, the demo's exit status, what it said of its watcher's
# stream, whether its workload was still running when the attack ended, and the publisher's
# stats at the end. Loopback only; every attack is bounded in connections and time.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run BINARY NAME DEMO_ARGS -- ATTACK_ARGS: starts the demo, attacks it, waits for it.
run() {
  local bin=$1 name=$2
  shift 2
  local demo_args=() attack_args=()
  while [ "$1" != -- ]; do demo_args+=("$1"); shift; done
  shift
  attack_args=("$@")
  local endpoint
  endpoint="tcp://127.0.0.1:$(free_port)"
  # A publisher the attack broke may never finish its workload: it gets a minute past its
  # wait, then its exit status says it was killed (137).
  timeout -s KILL 90 "$bin" demo --endpoint "$endpoint" --show 0 "${demo_args[@]}" \
    >"$work/demo.out" 2>&1 &
  local killer=$! pid=""
  until [ -n "$pid" ]; do pid=$(pgrep -P "$killer" -n || true); done
  for _ in $(seq 100); do
    "$python" -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" \
      "${endpoint##*:}" 2>/dev/null && break
    sleep 0.1
  done
  for _ in $(seq 600); do
    grep -q '^The workload starts' "$work/demo.out" && break
    sleep 0.05
  done
  local report during=false
  report=$("$python" -B "$here/attack.py" "${attack_args[@]}" --endpoint "$endpoint" --pid "$pid")
  grep -q '^The workload is done' "$work/demo.out" || during=true
  local status=0
  wait "$killer" || status=$?
  local verdict stats
  verdict=$(grep -E '^OK:|watcher saw|sequence gaps|kv-events: |^The workload is done' "$work/demo.out" | head -4 | tr '\n' ' ' | sed 's/"/\\"/g')
  # The demo's table of the publisher's stats, "  name  value" under "Publisher stats:".
  stats=$(awk '/^Publisher stats:/ {on = 1; next} on && NF == 2 {printf "%s\"%s\": %s", sep, $1, $2; sep = ", "} on && NF != 2 {on = 0}' "$work/demo.out")
  echo "{\"binary\": \"$bin\", \"attack\": \"$name\", \"demo_exit\": $status, \"demo_said\": \"$verdict\", \"during_workload\": $during, \"report\": $report, \"publisher\": {$stats}}"
}

keys() {
  (cd "$work" && "$1" keygen server >/dev/null && "$1" keygen nobody >/dev/null) 2>/dev/null || true
}

# The workloads are paced (--rate, calls a second) to outlast their attack: 1 object makes
# about 2.4 calls.
for bin in "$@"; do
  rm -f "$work"/server.* "$work"/nobody.*
  keys "$bin"
  run "$bin" idle --objects 30000 --rate 5000 --wait 1 -- idle --count 300 --hold 4.5
  run "$bin" garbage --objects 60000 --rate 5000 --wait 1 -- garbage --count 8000 --hold 3
  run "$bin" subscribe --objects 60000 --rate 5000 --wait 1 -- subscribe --count 50 --prefixes 1000 --rounds 6 --hold 3
  run "$bin" curve-flood --objects 100000 --rate 30000 --wait 2 --curve-secret-key "$work/server.key" \
    --curve-allow "$work/nobody.pub" -- curve-flood --count 1000 --server-key "$work/server.pub" --hold 0.5
  run "$bin" nonreaders --objects 100000 --rate 15000 --wait 3 -- nonreaders --count 60 --hold 10
done
