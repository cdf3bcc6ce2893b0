// The clock the benchmark times single calls with, and what reading it costs.
//
// On x86-64 with an invariant TSC (constant_tsc and nonstop_tsc in /proc/cpuinfo) it reads
// the time-stamp counter, fenced so that the call under test cannot move across the reads,
// and converts ticks to nanoseconds with a rate calibrated against std::chrono::steady_clock.
// Elsewhere, or with --clock steady, it reads steady_clock (clock_gettime through the vDSO).
// Nothing is subtracted from a timed call: the cost of one pair of reads is measured and
// printed next to the figures instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace kv_events_bench {

// Reads before the timed code: nothing after it starts before the counter is read.
inline uint64_t tsc_begin() noexcept {
#if defined(__x86_64__)
  _mm_lfence();
  const uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
#else
  return 0;
#endif
}

// Reads after the timed code: rdtscp waits for it to finish, the fence keeps what follows out.
inline uint64_t tsc_end() noexcept {
#if defined(__x86_64__)
  unsigned int aux;
  const uint64_t t = __rdtscp(&aux);
  _mm_lfence();
  return t;
#else
  return 0;
#endif
}

inline uint64_t steady_ns() noexcept {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Which clock times calls, and how to turn its ticks into nanoseconds.
struct CallClock {
  bool tsc = false;            // rdtsc/rdtscp; otherwise steady_clock, whose ticks are ns
  double ns_per_tick = 1.0;    // calibrated for the TSC
  double overhead_min_ns = 0;  // one begin/end pair around nothing: fastest
  double overhead_p50_ns = 0;  // and median of many

  // Picks the TSC when `want_tsc` and the CPU announces an invariant one, calibrates it over
  // about 200 ms and measures the overhead of a pair of reads.
  static CallClock create(bool want_tsc);

  // "rdtsc (invariant TSC, 2596.1 MHz calibrated against steady_clock)" or "steady_clock".
  std::string describe() const;

  uint64_t begin() const noexcept { return tsc ? tsc_begin() : steady_ns(); }
  uint64_t end() const noexcept { return tsc ? tsc_end() : steady_ns(); }
  double to_ns(uint64_t ticks) const noexcept { return static_cast<double>(ticks) * ns_per_tick; }
};

}  // namespace kv_events_bench
