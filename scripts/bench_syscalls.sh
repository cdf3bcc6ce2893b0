#!/usr/bin/env bash
# Shows that a producer thread makes no system call per call in steady state (issue 5).
#
# Runs `kv_events_bench --syscall-probe` under `strace -f -ff` (one trace file per thread) with
# 1M and then 4M on_put_commit calls per producer thread, and counts, for each producer thread,
# the system calls it made between the two getppid() markers that bound its loop, by name.
# A count that does not grow with the number of calls is a cost per run, not per call.
#
#   paced     2 threads x 125k calls/s in bursts every 200 us: the publisher keeps up (steady
#             state, no drop). The bursts' clock_nanosleep is the benchmark's own pacing and is
#             shown apart.
#   flat-out  2 threads as fast as they can: the publishing thread, slowed by strace, falls
#             behind, so this is the full-queue (drop-oldest) path.
#
# Usage: scripts/bench_syscalls.sh [--quick]   (--quick: 250k and 1M calls)
# Needs strace (Debian: apt-get install strace). Builds build/bench like scripts/bench.sh,
# unless KV_EVENTS_BENCH names a kv_events_bench binary.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v strace >/dev/null; then
  echo "bench_syscalls.sh needs strace: apt-get install strace" >&2
  exit 1
fi
small=1000000
large=4000000
if [[ "${1:-}" == "--quick" ]]; then
  small=250000
  large=1000000
fi

bench="${KV_EVENTS_BENCH:-}"
if [[ -z "$bench" ]]; then
  cmake -S cpp_tests -B build/bench -G Ninja -DENABLE_KV_EVENTS=ON \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build/bench --target kv_events_bench >/dev/null
  bench=build/bench/bench/kv_events_bench
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# count <trace file>: "name=count ..." of the calls between the first and second getppid().
count() {
  awk '/^getppid\(/ { marks++; next }
       marks == 1 && /^[a-z_0-9]+\(/ { sub(/\(.*/, ""); n[$0]++ }
       END { for (k in n) printf "%s=%d\n", k, n[k] }' "$1" | sort
}

printf '%-9s %10s %8s %9s %10s  %s\n' mode calls/thr thread syscalls pacing "by name (the library's, pacing apart)"
for mode in paced flat-out; do
  rate=()
  [[ "$mode" == paced ]] && rate=(--probe-rate 125000)
  for calls in "$small" "$large"; do
    rm -f "$work"/trace.*
    strace -f -ff -qq -o "$work/trace" -- \
      "$bench" --syscall-probe --threads 2 --probe-calls "$calls" "${rate[@]}" >"$work/out"
    read -r -a tids <<<"$(awk '/^producer_tids/ { $1 = ""; print }' "$work/out")"
    dropped="$(awk '/^dropped_events/ { print $2 }' "$work/out")"
    for i in "${!tids[@]}"; do
      names="$(count "$work/trace.${tids[$i]}")"
      pacing="$(awk -F= '$1 == "clock_nanosleep" { print $2 }' <<<"$names")"
      library="$(grep -v '^clock_nanosleep=' <<<"$names" || true)"
      total="$(awk -F= '{ s += $2 } END { print s + 0 }' <<<"$library")"
      printf '%-9s %10s %8s %9s %10s  %s\n' "$mode" "$calls" "#$i" "$total" "${pacing:-0}" \
        "$(tr '\n' ' ' <<<"$library")"
    done
    echo "          (events dropped by the publisher in this run: $dropped)"
  done
done
cat <<'EOF'

syscalls: what a producer thread made inside its loop, besides the pacing's clock_nanosleep.
  mmap/mprotect: glibc creating and growing the thread's malloc arena (the records the calls
  allocate) up to the queue's working set, once; futex: waking the publishing thread (after an
  idle spell, or when the queue is full); sched_yield: crossbeam's backoff on a contended slot.
A count that stays put from the shorter run to the 4x longer one is not paid per call.
EOF
