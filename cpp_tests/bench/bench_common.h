// What the phases of kv_events_bench share (kv_events_bench.cc says what the benchmark
// measures): the workload of every call (--shape), the machine and the process, the
// publishers under test and their subscriber, the producer loops, and the printing.
// bench_common.cc holds what is not inline here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "baseline_publisher.h"
#include "bench_clock.h"
#include "bench_subscriber.h"
#include "mooncake/kv_events.h"

namespace kv = mooncake::kv_events;

namespace kv_events_bench {

// ---------------------------------------------------------------------------------------------
// The workload: tenant, key and group of every call (--shape), one medium per call

constexpr size_t kKeys = 4096;  // distinct keys, cycled
const kv::MediumSet kCpu{kv::Medium::kCpu};

// A key shape: the tenant, key and group of every call of a run, a line of shapes.tsv (whose
// header says what each field means), the one definition the Rust benches read too, so that
// the Rust and C++ figures of one shape compare. Its fields view kShapesTsv.
struct Shape {
  std::string_view name;
  std::string_view tenant;
  std::string_view group;
  std::string_view prefix;
  size_t digits;  // hex digits between prefix and suffix
  std::string_view suffix;
  std::string_view strings;  // where the queue holds a call's strings: inline, pooled, heap
  std::string_view about;

  size_t key_bytes() const { return prefix.size() + digits + suffix.size(); }

  // Key number `index`: prefix, then the index as 16 lowercase hex digits, repeated (and cut)
  // to `digits`, then suffix; every key differs as a content hash would.
  std::string key(size_t index) const {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016zx", index);
    std::string key(prefix);
    for (size_t i = 0; i < digits; ++i) key += hex[i % 16];
    key += suffix;
    return key;
  }
};

// The shapes of shapes.tsv in its order, parsed once; the first is the default of --shape.
const std::vector<Shape>& shapes();

// "tenant 19 B + key 135 B + group 13 B = 167 B"
std::string sizes(const Shape& shape);

const Shape* find_shape(std::string_view name);

// The run's shape with its key table, built once before any phase so that no key is made
// while calls are timed.
struct Workload {
  const Shape* shape = nullptr;
  std::string_view tenant, group;
  std::vector<std::string> keys;  // kKeys of them, all of one length

  size_t bytes() const { return tenant.size() + keys[0].size() + group.size(); }
  // "vllm (tenant 19 B + key 135 B + group 13 B = 167 B)"
  std::string describe() const { return std::string(shape->name) + " (" + sizes(*shape) + ")"; }
};

void build_workload(const Shape& shape);

const Workload& workload();
const std::vector<std::string>& keys();

// ---------------------------------------------------------------------------------------------
// The machine and the process

std::string self_exe();
std::string cpu_model();
std::string loadavg();
double rss_mb();

// User + system CPU of the whole process (every thread, live or joined), in seconds.
double process_cpu_seconds();

double thread_cpu_seconds();
double now_seconds();

// CPU seconds of this process's live threads, summed by thread name (/proc/self/task/*/comm;
// the first field of schedstat is the thread's time on a CPU in ns). Joined threads are gone
// from it: producers measure themselves.
std::map<std::string, double> cpu_by_thread_name();

// The CPU of each thread name between two snapshots.
std::map<std::string, double> cpu_delta(const std::map<std::string, double>& before,
                                        const std::map<std::string, double>& after);

void sleep_until_ns(uint64_t deadline_ns);

// A free TCP port on 127.0.0.1 (the kernel's pick, released at once).
int free_port();

// The library's fixed context, shared by the baseline so that both write the same bytes.
kv::Config library_config(const std::string& endpoint, uint32_t capacity);

BaselineConfig baseline_config(size_t capacity);

// The library's publisher on a free tcp port of 127.0.0.1.
std::unique_ptr<kv::Publisher> create_library(uint32_t capacity, std::string& endpoint);

// One of the publishers under test, as the phases drive it.
struct Target {
  std::string name;
  // One on_put_commit; the latency phase calls the publishers directly instead, so that no
  // std::function is timed.
  std::function<void(std::string_view key)> call;
  std::function<bool()> flush;
  // The sequence of the next message: every message sent is numbered below it.
  std::function<uint64_t()> next_sequence;
  std::function<uint64_t()> dropped;
};

Target library_target(kv::Publisher& p);
Target baseline_target(BaselinePublisher& p);

// A subscriber process joined to `target`'s stream.
std::unique_ptr<SubscriberProcess> attach(const std::string& endpoint, const Target& target);

// ---------------------------------------------------------------------------------------------
// Producers

// Offers calls in bursts: `burst` calls every `interval_ns`, from `start_ns`. A producer that
// falls behind (a sleep that overslept, a preemption) catches up with back-to-back bursts, at
// most `max_lag` bursts of them; further behind, it starts again from now (calls skipped, so
// the rate achieved is measured, not assumed).
class Pacer {
 public:
  Pacer(double calls_per_second, double period_us, uint64_t start_ns, double max_lag = 4) {
    burst_ =
        std::max<uint64_t>(1,
                           static_cast<uint64_t>(std::llround(calls_per_second * period_us / 1e6)));
    interval_ns_ = static_cast<double>(burst_) * 1e9 / calls_per_second;
    next_ns_ = static_cast<double>(start_ns);
    max_lag_ = max_lag;
  }

  // Sleeps until the next burst is due; returns its size.
  uint64_t next() {
    const uint64_t now = steady_ns();
    if (static_cast<double>(now) > next_ns_ + max_lag_ * interval_ns_) {
      next_ns_ = static_cast<double>(now);
    } else if (static_cast<double>(now) < next_ns_) {
      sleep_until_ns(static_cast<uint64_t>(next_ns_));
    }
    next_ns_ += interval_ns_;
    return burst_;
  }

 private:
  uint64_t burst_;
  double interval_ns_;
  double next_ns_;
  double max_lag_;
};

// Starts `count` threads running `body(index)` at once; joins them.
void run_threads(int count, const std::function<void(int)>& body);

// One producer's timed calls: per-call latencies in clock ticks.
struct Timed {
  std::vector<uint32_t> ticks;
  uint64_t calls = 0;
  double cpu_seconds = 0;
};

template <bool kTsc, class Call>
void timed_producer(Call& call, double rate, double period_us, uint64_t start_ns, uint64_t end_ns,
                    size_t key_offset, Timed& out) {
  const double cpu0 = thread_cpu_seconds();
  Pacer pacer(rate, period_us, start_ns);
  const std::vector<std::string>& k = keys();
  uint32_t* samples = out.ticks.data();
  const size_t room = out.ticks.size();
  size_t n = 0;
  size_t key = key_offset;
  // The first burst whatever the clock says: a thread a busy machine starts after its window
  // still publishes, so the subscriber has something to receive.
  while ((n == 0 || steady_ns() < end_ns) && n < room) {
    const uint64_t burst = std::min<uint64_t>(pacer.next(), room - n);
    for (uint64_t i = 0; i < burst; ++i) {
      const std::string_view object_key = k[key++ & (kKeys - 1)];
      const uint64_t t0 = kTsc ? tsc_begin() : steady_ns();
      call(object_key);
      const uint64_t t1 = kTsc ? tsc_end() : steady_ns();
      const uint64_t d = t1 - t0;
      samples[n++] = d > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(d);
    }
  }
  out.calls = n;
  out.ticks.resize(n);
  out.cpu_seconds = thread_cpu_seconds() - cpu0;
}

// Untimed calls: paced at `rate` per thread (0: as fast as possible) until `end_ns`, or for
// `calls` calls, whichever ends first; the first burst even past `end_ns` (see timed_producer).
// A paced producer catches up to 50 ms of lag.
template <class Call>
uint64_t untimed_producer(Call& call, double rate, double period_us, uint64_t start_ns,
                          uint64_t end_ns, uint64_t calls, size_t key_offset) {
  const std::vector<std::string>& k = keys();
  uint64_t n = 0;
  size_t key = key_offset;
  if (rate <= 0) {
    while (n < calls) {
      for (int i = 0; i < 256 && n < calls; ++i, ++n)
        call(std::string_view(k[key++ & (kKeys - 1)]));
      if (steady_ns() >= end_ns) break;
    }
    return n;
  }
  Pacer pacer(rate, period_us, start_ns, 50000.0 / period_us);
  while (n < calls && (n == 0 || steady_ns() < end_ns)) {
    const uint64_t burst = std::min<uint64_t>(pacer.next(), calls - n);
    for (uint64_t i = 0; i < burst; ++i) call(std::string_view(k[key++ & (kKeys - 1)]));
    n += burst;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Printing

double percentile(const std::vector<uint32_t>& sorted, double q);
double median(std::vector<double> values);
std::string si(double value);
std::string ns_text(double ns);

// The smoke test's one check: a phase whose subscriber saw nothing.
extern int g_smoke_failures;

void expect_events(const char* phase, const SubscriberCounts& counts);

}  // namespace kv_events_bench
