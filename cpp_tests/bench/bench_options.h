// The command line of kv_events_bench: its options and their defaults, which --quick and
// --smoke change (bench_options.cc parses them and prints the usage).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv_events_bench {

struct Options {
  std::vector<int> threads = {1, 2, 4};
  std::string mode = "full";      // full, quick, smoke
  double phase_seconds = 3;       // one latency measurement
  int runs = 3;                   // latency measurements per (threads, publisher)
  double rate = 250000;           // offered calls/s in latency phases (all threads)
  double period_us = 200;         // producers offer one burst per period
  double throughput_seconds = 3;  // each sender of the throughput phase
  double duration = 10;           // one step of the sustained-rate search
  double search_start = 1e6;      // first offered rate of the search
  int search_steps = 10;          // at most this many steps up
  double flood_seconds = 60;      // RSS flood
  bool tsc = true;
  bool library_only = false;  // skip the baseline and the raw senders (for profiling)
  std::string shape;  // the tenant, key and group of every call; empty: the first of shapes()
  uint64_t removeall_calls = 1000000;  // calls of the removeall burst
  uint64_t burst_calls = 200000;       // timed calls of one flat-out burst, all producers
  std::vector<int> burst_threads = {1, 2};
  std::vector<int> fanout = {1, 4, 16, 64};  // subscriber counts of the fan-out phase
  double fanout_rate = 100000;               // calls/s offered in the fan-out phase
  double fanout_seconds = 3;                 // one fan-out measurement
  double slow_rate = 5000;                   // calls/s offered with the slow subscriber
  double slow_pause = 5;                     // least seconds the slow subscriber stops reading
  double slow_pause_max = 60;                // most seconds it stops reading
  std::vector<std::string> phases = {"memory", "latency",   "throughput", "sustained",
                                     "flood",  "removeall", "burst",      "fanout"};
  // --syscall-probe
  bool syscall_probe = false;
  uint64_t probe_calls = 1000000;  // per producer thread
  double probe_rate = 0;           // 0: as fast as possible
  uint64_t probe_warmup = 0;       // calls per producer thread before the loop, then a flush
};

// Prints the usage (to stderr after `error`, to stdout without one) and exits: 2 after an
// error, 0 for --help.
[[noreturn]] void usage(const char* error);

// The options of the command line: the mode's values (--quick, --smoke), then the flags given,
// which win whatever their order. A bad one ends the program through usage().
Options parse(int argc, char** argv);

// Whether --phases includes `phase`.
bool wants(const Options& o, const char* phase);

}  // namespace kv_events_bench
