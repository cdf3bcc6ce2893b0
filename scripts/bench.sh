#!/usr/bin/env bash
# Runs the benchmarks of the hot path and the publishing thread:
#   1. kv_events_bench, the C++ benchmark through include/mooncake/kv_events.h, built in Release
#      with ENABLE_KV_EVENTS=ON in build/bench (hot path against an in-run baseline, publishing
#      thread against a plain libzmq PUB, sustained rate, CPU, memory, a RemoveAll's burst,
#      a flat-out burst of 200,000 timed calls into the default queue at 1 and 2 producers,
#      fan-out to 1, 4, 16 and 64 subscriber processes and one slow subscriber among 16),
#      once, or once per key shape with --shapes;
#   2. cargo bench --features bench: the criterion benches (encoding alone, Rust-side hot path).
#
# Usage: scripts/bench.sh [--quick] [--cpp-only] [--shapes[=LIST]] [kv_events_bench options...]
#   --quick          about a minute of C++ benchmark (per shape) and short criterion measurements
#   --cpp-only       skip the criterion benches
#   --shapes[=LIST]  run kv_events_bench once per key shape of LIST (comma-separated; default
#                    every shape of cpp_tests/bench/shapes.tsv), each with the other options;
#                    without it, one run of the shape that --shape names (default the file's
#                    first)
# Other options go to kv_events_bench (build/bench/bench/kv_events_bench --help lists them and
# the shapes).
# The figures are only comparable inside one run: the ratios are what to look at.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
cpp_only=0
shapes=()
args=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1; args+=(--quick) ;;
    --cpp-only) cpp_only=1 ;;
    --shapes) mapfile -t shapes < <(awk -F'\t' '!/^#/ && NF { print $1 }' cpp_tests/bench/shapes.tsv) ;;
    --shapes=*) IFS=, read -r -a shapes <<<"${arg#--shapes=}" ;;
    *) args+=("$arg") ;;
  esac
done

cmake -S cpp_tests -B build/bench -G Ninja -DENABLE_KV_EVENTS=ON -DCMAKE_BUILD_TYPE=Release \
  >/dev/null
cmake --build build/bench --target kv_events_bench
echo "library: $(git log -1 --format='%h %s' -- src cpp 2>/dev/null || echo '?')" \
  "$(git diff --quiet -- src cpp 2>/dev/null || echo '(with uncommitted changes)')"
echo "uptime: $(uptime)"
if ((${#shapes[@]} == 0)); then
  build/bench/bench/kv_events_bench "${args[@]}"
else
  for shape in "${shapes[@]}"; do
    echo
    echo "######## shape $shape ########"
    # --shape last: it wins over one among the other options.
    build/bench/bench/kv_events_bench "${args[@]}" --shape "$shape"
  done
fi

if ((cpp_only)); then
  exit 0
fi
criterion=()
if ((quick)); then
  criterion=(--warm-up-time 1 --measurement-time 2)
fi
cargo bench --locked --features bench --bench encode --bench hot_path -- "${criterion[@]}"
