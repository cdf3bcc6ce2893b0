#!/usr/bin/env bash
# The C++ suites under sanitizers and valgrind; CI (.ci/run) runs it after scripts/test.sh.
#
#   asan      build/asan (ENABLE_KV_EVENTS=ON) and build/asan-off (OFF): AddressSanitizer
#             (with LeakSanitizer) + UndefinedBehaviorSanitizer, every ctest test.
#   tsan      build/tsan (ON): ThreadSanitizer, every ctest test, cpp_tests/tsan.supp.
#   valgrind  build/on (ON, Release, the directory scripts/test.sh builds): memcheck on every
#             GoogleTest binary, no leak definitely or indirectly lost, no invalid access.
#
# Usage: scripts/sanitize.sh [asan] [tsan] [valgrind]     (no argument: all three)
# The tests and the library's C++ layer are instrumented; the cargo-built Rust archive is not
# (stable toolchain): see docs/testing.md, "Sanitizers and valgrind".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
steps=("$@")
((${#steps[@]})) || steps=(asan tsan valgrind)

timings=()
timed() {  # timed <label> <command>...: runs it and records how long it took
  local label=$1 start=$SECONDS
  shift
  "$@"
  timings+=("$(printf '%-10s %4d s' "$label" $((SECONDS - start)))")
}

# build <dir> <cmake option>...: configures and builds the C++ suites in <dir>.
build() {
  local dir=$1
  shift
  cmake -S cpp_tests -B "$dir" -G Ninja -DKV_EVENTS_CARGO_TARGET_DIR="$PWD/target" "$@"
  cmake --build "$dir"
}

# Sanitized builds keep debug info and optimization, as shipped code has.
sanitized=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)

run_asan() {
  export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  for variant in ON OFF; do
    local dir=build/asan
    [ "$variant" = ON ] || dir=build/asan-off
    build "$dir" -DENABLE_KV_EVENTS="$variant" "${sanitized[@]}" \
      -DKV_EVENTS_SANITIZE="address;undefined"
    ctest --test-dir "$dir" --output-on-failure -j "$jobs"
  done
}

run_tsan() {
  # Reports of every race, then exit status 66; a longer history so both stacks print.
  export TSAN_OPTIONS="suppressions=$root/cpp_tests/tsan.supp:history_size=4:second_deadlock_stack=1"
  build build/tsan -DENABLE_KV_EVENTS=ON "${sanitized[@]}" -DKV_EVENTS_SANITIZE=thread
  ctest --test-dir build/tsan --output-on-failure -j "$jobs"
}

run_valgrind() {
  # The same configuration as scripts/test.sh: nothing rebuilds when it ran first.
  build build/on -DENABLE_KV_EVENTS=ON -DCMAKE_BUILD_TYPE=Release
  local failed=()
  # Memcheck runs everything many times slower: fewer random calls per thread (3000 in
  # the other runs) keep its run short; the model check is the same.
  export KV_EVENTS_RANDOM_CALLS=500
  for test in build/on/kv_events_*_test; do
    echo "valgrind memcheck: $test"
    valgrind --quiet --error-exitcode=1 --leak-check=full \
      --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect \
      "$test" --gtest_brief=1 || failed+=("$test")
  done
  if ((${#failed[@]})); then
    echo "valgrind found errors or leaks in: ${failed[*]}" >&2
    return 1
  fi
}

for step in "${steps[@]}"; do
  case "$step" in
    asan | tsan | valgrind) timed "$step" "run_$step" ;;
    *)
      echo "usage: scripts/sanitize.sh [asan] [tsan] [valgrind]" >&2
      exit 2
      ;;
  esac
done
printf '%s\n' "sanitize.sh: all clean" "${timings[@]}"
