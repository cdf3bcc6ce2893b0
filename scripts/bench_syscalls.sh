#!/usr/bin/env bash
# Shows that neither a producer thread nor the publishing thread makes a system call per call
# in steady state, whatever the key shape.
#
# Runs `kv_events_bench --syscall-probe` under `strace -f -ff -ttt` (one trace file per thread)
# with 1M and then 4M on_put_commit calls per producer thread, and counts, for each producer
# thread, the system calls it made between the two getppid() markers that bound its loop, by
# name; and for the publishing thread (`kv-events-pub`) those it made in the loops' span.
# A count that does not grow with the number of calls is a cost per run, not per call.
#
#   warm      2 threads x 125k calls/s in bursts every 200 us, after a warm-up of 70k calls
#             per thread and a flush: steady state, the publisher keeps up. The bursts'
#             clock_nanosleep is the benchmark's own pacing and is shown apart.
#   cold      the same without the warm-up.
#   flat-out  2 threads as fast as they can, no warm-up: the publishing thread, slowed by
#             strace, falls behind, so this is mostly the full-queue (drop-oldest) path.
#
# Each call carries the tenant, key and group of one key shape (cpp_tests/bench/shapes.tsv;
# kv_events_bench --help lists them): the file's first unless --shape names another; --shapes
# runs the whole table once per shape of the file, each under a header naming its byte counts.
#
# Usage: scripts/bench_syscalls.sh [--quick] [--shape NAME | --shapes]
#   (--quick: 250k and 1M calls)
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
mapfile -t all_shapes < <(awk -F'\t' '!/^#/ && NF { print $1 }' cpp_tests/bench/shapes.tsv)
shapes=("${all_shapes[0]}")
while (($#)); do
  case "$1" in
    --quick) small=250000; large=1000000 ;;
    --shape)
      [[ $# -ge 2 ]] || { echo "bench_syscalls.sh: --shape wants a name" >&2; exit 2; }
      shapes=("$2")
      shift
      ;;
    --shapes) shapes=("${all_shapes[@]}") ;;
    *) echo "usage: scripts/bench_syscalls.sh [--quick] [--shape NAME | --shapes]" >&2; exit 2 ;;
  esac
  shift
done

bench="${KV_EVENTS_BENCH:-}"
if [[ -z "$bench" ]]; then
  cmake -S cpp_tests -B build/bench -G Ninja -DENABLE_KV_EVENTS=ON \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build/bench --target kv_events_bench >/dev/null
  bench=build/bench/bench/kv_events_bench
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Trace lines start with strace's -ttt timestamp, then the call: "1764850000.123456 write(...".
# window <trace files...>: the first getppid() of any and the last of any: the loops' span.
window() {
  awk '$2 ~ /^getppid\(/ { if (first == "" || $1 < first) first = $1; if ($1 > last) last = $1 }
       END { print first, last }' "$@"
}

# count_between <trace file> <from> <to>: "name=count" lines of the calls in that span.
count_between() {
  awk -v from="$2" -v to="$3" '$1 >= from && $1 <= to && $2 ~ /^[a-z_0-9]+\(/ {
         sub(/\(.*/, "", $2); n[$2]++ }
       END { for (k in n) printf "%s=%d\n", k, n[k] }' "$1" | sort
}

# count <trace file>: "name=count" lines of the calls between its two getppid() markers.
count() {
  local from to
  read -r from to < <(window "$1")
  count_between "$1" "$from" "$to" | grep -v '^getppid=' || true
}

# by_name <"name=count" lines>: one line, and the total.
by_name() { tr '\n' ' ' <<<"$1"; }
total_of() { awk -F= 'NF == 2 { s += $2 } END { print s + 0 }' <<<"$1"; }

# table <shape>: the runs of every mode and call count with that shape's calls, one row per
# producer thread, under a header that names what the calls carry (the first run says).
table() {
  local shape="$1" header=1 mode calls options tids dropped i names pacing library total
  local from to pub
  for mode in warm cold flat-out; do
    case "$mode" in
      warm) options=(--probe-rate 125000 --probe-warmup 70000) ;;
      cold) options=(--probe-rate 125000) ;;
      *) options=() ;;
    esac
    for calls in "$small" "$large"; do
      rm -f "$work"/trace.*
      strace -f -ff -qq -ttt -o "$work/trace" -- \
        "$bench" --syscall-probe --shape "$shape" --threads 2 --probe-calls "$calls" \
        "${options[@]}" >"$work/out"
      if ((header)); then
        echo
        awk '/^shape / { $1 = "shape:"; print }' "$work/out"
        printf '%-9s %10s %7s %9s %9s  %s\n' mode calls/thr thread syscalls pacing \
          "by name (the library's; the pacing's clock_nanosleep apart)"
        header=0
      fi
      read -r -a tids <<<"$(awk '/^producer_tids/ { $1 = ""; print }' "$work/out")"
      dropped="$(awk '/^dropped_in_loop/ { print $2 }' "$work/out")"
      for i in "${!tids[@]}"; do
        names="$(count "$work/trace.${tids[$i]}")"
        pacing="$(awk -F= '$1 == "clock_nanosleep" { print $2 }' <<<"$names")"
        library="$(grep -v '^clock_nanosleep=' <<<"$names" || true)"
        total="$(total_of "$library")"
        printf '%-9s %10s %7s %9s %9s  %s\n' "$mode" "$calls" "#$i" "$total" "${pacing:-0}" \
          "$(by_name "$library")"
      done
      # The publishing thread, over the span of the producers' loops.
      read -r from to < <(window "${tids[@]/#/$work/trace.}")
      pub="$(grep -l 'PR_SET_NAME, "kv-events-pub"' "$work"/trace.* | head -n 1)"
      names="$(count_between "$pub" "$from" "$to")"
      printf '%-9s %10s %7s %9s %9s  %s\n' "$mode" "$calls" "pub" "$(total_of "$names")" "-" \
        "$(by_name "$names")"
      echo "          (events the publisher dropped during the loops: $dropped)"
    done
  done
}

echo "uptime: $(uptime)"
for shape in "${shapes[@]}"; do
  table "$shape"
done
cat <<'EOF'

syscalls: what a producer thread made inside its loop, besides the pacing's clock_nanosleep.
  mmap/mprotect: glibc growing the thread's malloc arena while queued calls pile up; only
    calls whose tenant, key and group exceed 256 bytes allocate (key1k's 1056 bytes; every
    other shape rides in its queue slot or a pooled block), bounded by the queue's capacity;
  futex: waking the publishing thread (after an idle spell of 20 ms, or when the queue is full);
  sched_yield: crossbeam's backoff when a slot is contended.
pub: the publishing thread over the same span: futex is its 200 us nap between looks at the
  queue (a timed park) and its sleep when idle; getpid, poll, read and write are ZeroMQ's, for
  sends of up to 64 events a message; mprotect, cold only, is glibc growing the arena for those
  messages' payloads in the publisher's first seconds. Per nap and per message, none per call.
A count that stays put from the shorter run to the 4x longer one is not paid per call.
EOF
