// See bench_options.h.
#include "bench_options.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"  // shapes(), find_shape()

namespace kv_events_bench {

[[noreturn]] void usage(const char* error) {
  if (error) std::fprintf(stderr, "kv_events_bench: %s\n\n", error);
  // The shapes as shapes.tsv defines them: their sizes are computed, never written twice.
  const std::string default_shape(shapes().front().name);
  std::string listed;
  for (const Shape& shape : shapes()) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "    %-12.*s %.*s\n"
                  "                 \"%.*s\" + key + \"%.*s\" = %zu + %zu + %zu = %zu B\n",
                  static_cast<int>(shape.name.size()), shape.name.data(),
                  static_cast<int>(shape.about.size()), shape.about.data(),
                  static_cast<int>(shape.tenant.size()), shape.tenant.data(),
                  static_cast<int>(shape.group.size()), shape.group.data(), shape.tenant.size(),
                  shape.key_bytes(), shape.group.size(),
                  shape.tenant.size() + shape.key_bytes() + shape.group.size());
    listed += line;
  }
  std::fprintf(error ? stderr : stdout, R"(usage: kv_events_bench [options]

Benchmarks mooncake/kv_events.h with a subscriber in a child process, on 127.0.0.1.
Reports only; asserts nothing about time.

  --quick            a run of about two minutes: 0.5 s latency phases, --duration 2, 5 s flood,
                     fan-out to 1, 4 and 16 subscribers for 1 s each
  --smoke            a few seconds: every phase once, tiny; exits 1 if the subscriber missed
                     every event of a phase (for ctest)
  --threads LIST     producer threads of the latency phases (default 1,2,4)
  --runs N           latency measurements per thread count and publisher, medians printed
                     (default 3)
  --phase S          seconds of one latency measurement (default 3)
  --rate R           calls/s offered in the latency phases, all threads (default 250000)
  --period US        producers offer a burst every US microseconds (default 200)
  --throughput S     seconds per sender in the throughput phase (default 3)
  --duration S       seconds of one step of the sustained-rate search (default 10)
  --search-start R   first offered rate of the search, calls/s (default 1000000)
  --flood S          seconds of the RSS flood (default 60)
  --removeall-calls N
                     calls of the removeall burst (default 1000000; --smoke 20000)
  --burst-calls N    timed calls of one flat-out burst, shared by its producers (default 200000)
  --burst-threads LIST
                     producer threads of the flat-out bursts (default 1,2)
  --fanout LIST      subscriber counts of the fan-out phase (default 1,4,16,64)
  --fanout-rate R    calls/s offered in the fan-out phase (default 100000)
  --fanout-seconds S seconds of one fan-out measurement (default 3)
  --slow-rate R      calls/s offered in the fan-out phase's slow-subscriber runs, a rate 16
                     subscribers keep up with, CURVE included (default 5000)
  --slow-pause S     least seconds the slow subscriber stops reading; longer when the send
                     high-water mark needs longer to fill (default 5)
  --phases LIST      any of memory,latency,throughput,sustained,flood,removeall,burst,fanout
                     (default all, run in that order)
  --shape NAME       tenant, key and group of every call in every phase and in the syscall
                     probe (default %s; scripts/bench.sh --shapes runs each in turn):
%s  --clock tsc|steady what times a call (default tsc when invariant, else steady_clock)
  --library-only     measure the library alone: no baseline, no raw senders (for perf)
  --syscall-probe    only the producer loop (see scripts/bench_syscalls.sh):
     --probe-calls N   calls per producer thread (default 1000000)
     --probe-rate R    calls/s per producer thread, paced in bursts; 0 = flat out (default)
     --probe-warmup N  calls per producer thread before the loop, then a flush (default 0)
  --subscriber EP [--rcvhwm N] [--curve SERVER PUBLIC SECRET]
                     (internal) run as a subscriber process on endpoint EP
)",
               default_shape.c_str(), listed.c_str());
  std::exit(error ? 2 : 0);
}

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

double number(const char* flag, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value >= 0)) {
    usage((std::string(flag) + " wants a non-negative number, not '" + text + "'").c_str());
  }
  return value;
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::pair<std::string, std::string>> explicit_values;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((flag + " wants a value").c_str());
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      usage(nullptr);
    } else if (flag == "--quick" || flag == "--smoke") {
      o.mode = flag.substr(2);
    } else if (flag == "--syscall-probe") {
      o.syscall_probe = true;
    } else if (flag == "--library-only") {
      o.library_only = true;
    } else if (flag == "--threads" || flag == "--runs" || flag == "--phase" || flag == "--rate" ||
               flag == "--period" || flag == "--throughput" || flag == "--duration" ||
               flag == "--search-start" || flag == "--flood" || flag == "--phases" ||
               flag == "--clock" || flag == "--probe-calls" || flag == "--probe-rate" ||
               flag == "--probe-warmup" || flag == "--shape" || flag == "--removeall-calls" ||
               flag == "--burst-calls" || flag == "--burst-threads" || flag == "--fanout" ||
               flag == "--fanout-rate" || flag == "--fanout-seconds" || flag == "--slow-rate" ||
               flag == "--slow-pause") {
      explicit_values.emplace_back(flag, value());
    } else {
      usage(("unknown option " + flag).c_str());
    }
  }
  if (o.mode == "quick") {
    o.phase_seconds = 0.5;
    o.throughput_seconds = 1;
    o.duration = 2;
    o.flood_seconds = 5;
    o.fanout = {1, 4, 16};
    o.fanout_seconds = 1;
    o.slow_pause = 2;
  } else if (o.mode == "smoke") {
    o.threads = {1, 2};
    o.runs = 1;
    o.phase_seconds = 0.2;
    o.throughput_seconds = 0.2;
    o.duration = 0.2;
    o.search_steps = 1;
    o.flood_seconds = 1;
    o.removeall_calls = 20000;
    o.fanout = {2};
    o.fanout_rate = 20000;
    o.fanout_seconds = 0.2;
    o.slow_rate = 5000;
    o.slow_pause = 0.2;
    o.slow_pause_max = 0.2;  // the smoke test checks that the runs run, not that it loses
  }
  // Explicit flags win over the mode's values, whatever their order.
  for (const auto& [flag, text] : explicit_values) {
    const char* v = text.c_str();
    if (flag == "--threads" || flag == "--burst-threads" || flag == "--fanout") {
      std::vector<int>& counts = flag == "--threads"         ? o.threads
                                 : flag == "--burst-threads" ? o.burst_threads
                                                             : o.fanout;
      counts.clear();
      for (const std::string& t : split(text)) {
        const int n = static_cast<int>(number(flag.c_str(), t.c_str()));
        // 64: the publisher admits 64 connections from one address (127.0.0.1) by default.
        if (n < 1 || n > 64) usage((flag + " wants counts from 1 to 64").c_str());
        counts.push_back(n);
      }
      if (counts.empty()) usage((flag + " wants at least one count").c_str());
    } else if (flag == "--runs") {
      o.runs = std::max(1, static_cast<int>(number("--runs", v)));
    } else if (flag == "--phase") {
      o.phase_seconds = number("--phase", v);
    } else if (flag == "--rate") {
      o.rate = std::max(1.0, number("--rate", v));
    } else if (flag == "--period") {
      o.period_us = std::max(1.0, number("--period", v));
    } else if (flag == "--throughput") {
      o.throughput_seconds = number("--throughput", v);
    } else if (flag == "--duration") {
      o.duration = number("--duration", v);
    } else if (flag == "--search-start") {
      o.search_start = std::max(1000.0, number("--search-start", v));
    } else if (flag == "--flood") {
      o.flood_seconds = number("--flood", v);
    } else if (flag == "--phases") {
      o.phases = split(text);
      for (const std::string& p : o.phases) {
        if (p != "memory" && p != "latency" && p != "throughput" && p != "sustained" &&
            p != "flood" && p != "removeall" && p != "burst" && p != "fanout") {
          usage(("unknown phase " + p).c_str());
        }
      }
    } else if (flag == "--clock") {
      if (text != "tsc" && text != "steady") usage("--clock is tsc or steady");
      o.tsc = text == "tsc";
    } else if (flag == "--probe-calls") {
      o.probe_calls = static_cast<uint64_t>(number("--probe-calls", v));
    } else if (flag == "--probe-rate") {
      o.probe_rate = number("--probe-rate", v);
    } else if (flag == "--probe-warmup") {
      o.probe_warmup = static_cast<uint64_t>(number("--probe-warmup", v));
    } else if (flag == "--shape") {
      if (find_shape(text) == nullptr) usage(("unknown shape " + text).c_str());
      o.shape = text;
    } else if (flag == "--removeall-calls") {
      o.removeall_calls = std::max<uint64_t>(1, static_cast<uint64_t>(number(flag.c_str(), v)));
    } else if (flag == "--burst-calls") {
      o.burst_calls = std::max<uint64_t>(1, static_cast<uint64_t>(number(flag.c_str(), v)));
    } else if (flag == "--fanout-rate") {
      o.fanout_rate = std::max(1.0, number(flag.c_str(), v));
    } else if (flag == "--fanout-seconds") {
      o.fanout_seconds = std::max(0.1, number(flag.c_str(), v));
    } else if (flag == "--slow-rate") {
      o.slow_rate = std::max(1.0, number(flag.c_str(), v));
    } else if (flag == "--slow-pause") {
      o.slow_pause = std::max(0.1, number(flag.c_str(), v));
    }
  }
  return o;
}

bool wants(const Options& o, const char* phase) {
  return std::find(o.phases.begin(), o.phases.end(), phase) != o.phases.end();
}

}  // namespace kv_events_bench
