#include "bench_clock.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

namespace kv_events_bench {
namespace {

// Whether /proc/cpuinfo announces a TSC that ticks at one rate whatever the P- and C-state.
bool invariant_tsc() {
#if defined(__x86_64__)
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" constant_tsc") != std::string::npos &&
             line.find(" nonstop_tsc") != std::string::npos;
    }
  }
#endif
  return false;
}

}  // namespace

CallClock CallClock::create(bool want_tsc) {
  CallClock clock;
  clock.tsc = want_tsc && invariant_tsc();
  if (clock.tsc) {
    // Two short calibrations; keep the one whose steady_clock reads bracket the TSC reads
    // most tightly (least disturbed by preemption).
    double best_ns_per_tick = 0;
    uint64_t best_bracket = UINT64_MAX;
    for (int round = 0; round < 2; ++round) {
      const uint64_t s0 = steady_ns();
      const uint64_t t0 = tsc_begin();
      const uint64_t s0b = steady_ns();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const uint64_t s1 = steady_ns();
      const uint64_t t1 = tsc_end();
      const uint64_t s1b = steady_ns();
      const uint64_t bracket = (s0b - s0) + (s1b - s1);
      if (bracket < best_bracket) {
        best_bracket = bracket;
        const double ns = (static_cast<double>(s1 + s1b) - static_cast<double>(s0 + s0b)) / 2;
        best_ns_per_tick = ns / static_cast<double>(t1 - t0);
      }
    }
    clock.ns_per_tick = best_ns_per_tick;
  }
  constexpr int kPairs = 20000;
  std::vector<uint64_t> pairs(kPairs);
  for (int i = 0; i < kPairs; ++i) {
    const uint64_t a = clock.begin();
    const uint64_t b = clock.end();
    pairs[i] = b - a;
  }
  std::sort(pairs.begin(), pairs.end());
  clock.overhead_min_ns = clock.to_ns(pairs.front());
  clock.overhead_p50_ns = clock.to_ns(pairs[kPairs / 2]);
  return clock;
}

std::string CallClock::describe() const {
  if (!tsc) return "steady_clock (clock_gettime via vDSO)";
  char text[128];
  std::snprintf(text, sizeof text,
                "rdtsc/rdtscp, lfenced (invariant TSC, %.1f MHz calibrated against steady_clock)",
                1000.0 / ns_per_tick);
  return text;
}

}  // namespace kv_events_bench
