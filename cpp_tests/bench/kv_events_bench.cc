// kv_events_bench: the C++ benchmark of issue 5, through include/mooncake/kv_events.h.
//
// Drives the publisher from N producer threads with a subscriber in another process (this
// program re-executed with --subscriber), every call carrying the tenant, key and group of one
// key shape (--shape: the synthetic 64-byte key, vLLM's and SGLang's key formats, the largest
// call that never allocates, a 1 KiB key), and prints, in one run:
//   - hot path: on_put_commit latency for 1, 2 and 4 producers at a paced rate
//     the publisher sustains, against an in-run baseline of the mutex + condition variable +
//     deque design (baseline_publisher.h), as ratios;
//   - publishing thread: events/s delivered to the SUB on tcp loopback, against plain libzmq
//     sending pre-encoded batches of the same bytes (a PUB, and an XPUB that never drops),
//     as ratios, with the CPU per event of each thread;
//   - the highest offered rate sustained with no drop and no gap at the default capacity;
//   - CPU-seconds per million published events (this process only);
//   - memory: a full default queue, and RSS over a flood;
//   - the burst of a RemoveAll: a million removals flat out, how much of it arrives and when.
// It reports; it asserts nothing about time. `--smoke` (a ctest) checks only that every phase
// runs and the subscriber received events. `--syscall-probe` is the producer loop alone, for
// scripts/bench_syscalls.sh to run under strace.

#include <dirent.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "baseline_publisher.h"
#include "bench_clock.h"
#include "bench_subscriber.h"
#include "mooncake/kv_events.h"

namespace kv = mooncake::kv_events;

namespace kv_events_bench {
namespace {

// ---------------------------------------------------------------------------------------------
// The workload: tenant, key and group of every call (--shape), one medium per call

constexpr size_t kKeys = 4096;  // distinct keys, cycled
const kv::MediumSet kCpu{kv::Medium::kCpu};

// What a production master's calls carry besides the key: a tenant and a Store group id of
// realistic length, shared by every shape but the synthetic one.
constexpr std::string_view kProductionTenant = "acme-inference-prod";
constexpr std::string_view kProductionGroup = "tp8-node-0017";

// The most bytes of tenant, key and group that the library's queue carries in a slot
// (INLINE_BYTES in src/event.rs), and in a block of its string pool (BLOCK_BYTES in
// src/pool.rs): max256 sits on the second, key1k beyond it.
constexpr size_t kSlotBytes = 104;
constexpr size_t kBlockBytes = 256;

// A key shape: the tenant, key and group of every call of a run. These are the SHAPES and
// LONGER_SHAPES of testing/src/bench.rs (but key1m, whose 4096 keys would take 4 GiB here),
// built the same way byte for byte, so that the Rust and C++ figures of one shape compare.
struct Shape {
  std::string_view name;
  std::string_view tenant;
  std::string_view group;
  size_t key_bytes;
  std::string_view prefix, suffix;  // around the hex digits
  std::string_view about;

  // Key number `index`: prefix, then the index as 16 lowercase hex digits, repeated (and cut)
  // to fill the key's length, then suffix; every key differs as a content hash would.
  std::string key(size_t index) const {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016zx", index);
    std::string key(prefix);
    const size_t digits = key_bytes - prefix.size() - suffix.size();
    for (size_t i = 0; i < digits; ++i) key += hex[i % 16];
    key += suffix;
    return key;
  }
};

constexpr std::string_view kVllmPrefix =
    "meta-llama/Llama-3.1-8B-Instruct@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@";

constexpr Shape kShapes[] = {
    {"synthetic64", "tenant-a", "group-1", 64, "", "", "64 hex digits (issue 5's size)"},
    {"vllm", kProductionTenant, kProductionGroup, kVllmPrefix.size() + 64, kVllmPrefix, "",
     "vLLM's connector: <model>@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@<64 hex>"},
    {"sglang", kProductionTenant, kProductionGroup, 68, "", "@tp3",
     "SGLang's: <64 hex>@tp3, a hash with its rank suffix"},
    {"max256", kProductionTenant, kProductionGroup,
     kBlockBytes - kProductionTenant.size() - kProductionGroup.size(), "", "",
     "224 hex digits: the largest call that never allocates"},
    {"key1k", kProductionTenant, kProductionGroup, 1024, "", "",
     "1024 hex digits: beyond the string pool's blocks, an allocation per call"},
};

// "tenant 19 B + key 135 B + group 13 B = 167 B"
std::string sizes(const Shape& shape) {
  const size_t key = shape.key_bytes;
  char text[128];
  std::snprintf(text, sizeof text, "tenant %zu B + key %zu B + group %zu B = %zu B",
                shape.tenant.size(), key, shape.group.size(),
                shape.tenant.size() + key + shape.group.size());
  return text;
}

const Shape* find_shape(std::string_view name) {
  for (const Shape& shape : kShapes) {
    if (shape.name == name) return &shape;
  }
  return nullptr;
}

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

Workload g_workload;

void build_workload(const Shape& shape) {
  g_workload.shape = &shape;
  g_workload.tenant = shape.tenant;
  g_workload.group = shape.group;
  g_workload.keys.clear();
  for (size_t i = 0; i < kKeys; ++i) g_workload.keys.push_back(shape.key(i));
}

const Workload& workload() { return g_workload; }
const std::vector<std::string>& keys() { return g_workload.keys; }

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  std::vector<int> threads = {1, 2, 4};
  std::string mode = "full";       // full, quick, smoke
  double phase_seconds = 3;        // one latency measurement
  int runs = 3;                    // latency measurements per (threads, publisher)
  double rate = 250000;            // offered calls/s in latency phases (all threads)
  double period_us = 200;          // producers offer one burst per period
  double throughput_seconds = 3;   // each sender of the throughput phase
  double duration = 10;            // one step of the sustained-rate search
  double search_start = 1e6;       // first offered rate of the search
  int search_steps = 10;           // at most this many steps up
  double flood_seconds = 60;       // RSS flood
  bool tsc = true;
  bool library_only = false;       // skip the baseline and the raw senders (for profiling)
  std::string shape = "synthetic64";  // the tenant, key and group of every call (kShapes)
  uint64_t removeall_calls = 1000000;  // calls of the removeall burst
  std::vector<std::string> phases = {"memory",    "latency", "throughput",
                                     "sustained", "flood",   "removeall"};
  // --syscall-probe
  bool syscall_probe = false;
  uint64_t probe_calls = 1000000;  // per producer thread
  double probe_rate = 0;           // 0: as fast as possible
  uint64_t probe_warmup = 0;       // calls per producer thread before the loop, then a flush
};

[[noreturn]] void usage(const char* error) {
  if (error) std::fprintf(stderr, "kv_events_bench: %s\n\n", error);
  // The shapes as kShapes defines them: their sizes are computed, never written twice.
  std::string shapes;
  for (const Shape& shape : kShapes) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "    %-12.*s %.*s\n"
                  "                 \"%.*s\" + key + \"%.*s\" = %zu + %zu + %zu = %zu B\n",
                  static_cast<int>(shape.name.size()), shape.name.data(),
                  static_cast<int>(shape.about.size()), shape.about.data(),
                  static_cast<int>(shape.tenant.size()), shape.tenant.data(),
                  static_cast<int>(shape.group.size()), shape.group.data(), shape.tenant.size(),
                  shape.key_bytes, shape.group.size(),
                  shape.tenant.size() + shape.key_bytes + shape.group.size());
    shapes += line;
  }
  std::fprintf(error ? stderr : stdout, R"(usage: kv_events_bench [options]

Benchmarks mooncake/kv_events.h (issue 5) with a subscriber in a child process, on
127.0.0.1. Reports only; asserts nothing about time.

  --quick            a run of about a minute: 0.5 s latency phases, --duration 2, 5 s flood
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
  --phases LIST      any of memory,latency,throughput,sustained,flood,removeall (default all,
                     run in that order)
  --shape NAME       tenant, key and group of every call in every phase and in the syscall
                     probe (default synthetic64; scripts/bench.sh --shapes runs each in turn):
%s  --clock tsc|steady what times a call (default tsc when invariant, else steady_clock)
  --library-only     measure the library alone: no baseline, no raw senders (for perf)
  --syscall-probe    only the producer loop (see scripts/bench_syscalls.sh):
     --probe-calls N   calls per producer thread (default 1000000)
     --probe-rate R    calls/s per producer thread, paced in bursts; 0 = flat out (default)
     --probe-warmup N  calls per producer thread before the loop, then a flush (default 0)
  --subscriber EP    (internal) run as the subscriber process on endpoint EP
)",
               shapes.c_str());
  std::exit(error ? 2 : 0);
}

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
    } else if (flag == "--threads" || flag == "--runs" || flag == "--phase" ||
               flag == "--rate" || flag == "--period" || flag == "--throughput" ||
               flag == "--duration" || flag == "--search-start" || flag == "--flood" ||
               flag == "--phases" || flag == "--clock" || flag == "--probe-calls" ||
               flag == "--probe-rate" || flag == "--probe-warmup" || flag == "--shape" ||
               flag == "--removeall-calls") {
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
  } else if (o.mode == "smoke") {
    o.threads = {1, 2};
    o.runs = 1;
    o.phase_seconds = 0.2;
    o.throughput_seconds = 0.2;
    o.duration = 0.2;
    o.search_steps = 1;
    o.flood_seconds = 1;
    o.removeall_calls = 20000;
  }
  // Explicit flags win over the mode's values, whatever their order.
  for (const auto& [flag, text] : explicit_values) {
    const char* v = text.c_str();
    if (flag == "--threads") {
      o.threads.clear();
      for (const std::string& t : split(text)) {
        const int n = static_cast<int>(number("--threads", t.c_str()));
        if (n < 1 || n > 64) usage("--threads wants counts from 1 to 64");
        o.threads.push_back(n);
      }
      if (o.threads.empty()) usage("--threads wants at least one count");
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
            p != "flood" && p != "removeall") {
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
    }
  }
  return o;
}

bool wants(const Options& o, const char* phase) {
  return std::find(o.phases.begin(), o.phases.end(), phase) != o.phases.end();
}

// ---------------------------------------------------------------------------------------------
// The machine and the process

std::string self_exe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(path, static_cast<size_t>(n));
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string loadavg() {
  std::ifstream file("/proc/loadavg");
  std::string a, b, c;
  file >> a >> b >> c;
  return a + " " + b + " " + c;
}

double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

// User + system CPU of the whole process (every thread, live or joined), in seconds.
double process_cpu_seconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double now_seconds() { return static_cast<double>(steady_ns()) / 1e9; }

// CPU seconds of this process's live threads, summed by thread name (/proc/self/task/*/comm;
// the first field of schedstat is the thread's time on a CPU in ns). Joined threads are gone
// from it: producers measure themselves.
std::map<std::string, double> cpu_by_thread_name() {
  std::map<std::string, double> cpu;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return cpu;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + entry->d_name;
    std::ifstream comm(task + "/comm");
    std::ifstream schedstat(task + "/schedstat");
    std::string name;
    uint64_t ns = 0;
    if (std::getline(comm, name) && (schedstat >> ns)) cpu[name] += static_cast<double>(ns) / 1e9;
  }
  closedir(dir);
  return cpu;
}

void sleep_until_ns(uint64_t deadline_ns) {
  // steady_clock is CLOCK_MONOTONIC on Linux.
  timespec ts;
  ts.tv_sec = static_cast<time_t>(deadline_ns / 1000000000u);
  ts.tv_nsec = static_cast<long>(deadline_ns % 1000000000u);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// A free TCP port on 127.0.0.1 (the kernel's pick, released at once).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) close(fd);
  if (port == 0) throw std::runtime_error("no free port on 127.0.0.1");
  return port;
}

// The library's fixed context, shared by the baseline so that both write the same bytes.
kv::Config library_config(const std::string& endpoint, uint32_t capacity) {
  kv::Config c;
  c.enable_kv_events = true;
  c.bind_endpoint = endpoint;
  c.backend_id = "mooncake-store-0";
  c.model_name = "meta-llama/Llama-3.1-8B-Instruct";
  c.block_size = 16;
  c.queue_capacity = capacity;
  return c;
}

BaselineConfig baseline_config(size_t capacity) {
  const kv::Config c = library_config("", 0);
  BaselineConfig b;
  b.backend_id = c.backend_id;
  b.model_name = c.model_name;
  b.block_size = c.block_size;
  b.dp_rank = c.dp_rank;
  b.capacity = capacity;
  return b;
}

// The library's publisher on a free tcp port of 127.0.0.1.
std::unique_ptr<kv::Publisher> create_library(uint32_t capacity, std::string& endpoint) {
  kv::set_log_sink([](kv::LogLevel level, std::string_view line) {
    if (level >= kv::LogLevel::kWarning) {
      std::fprintf(stderr, "  [library] %.*s\n", static_cast<int>(line.size()), line.data());
    }
  });
  for (int attempt = 0;; ++attempt) {
    endpoint = "tcp://127.0.0.1:" + std::to_string(free_port());
    try {
      return kv::Publisher::create(library_config(endpoint, capacity));
    } catch (const std::runtime_error&) {
      if (attempt == 5) throw;  // the port was taken in between, five times
    }
  }
}

// One of the publishers under test, as the phases drive it.
struct Target {
  std::string name;
  // One on_put_commit; the latency phase calls the publishers directly instead, so that no
  // std::function is timed.
  std::function<void(std::string_view key)> call;
  std::function<bool()> flush;
  std::function<uint64_t()> last_sequence;
  std::function<uint64_t()> dropped;
};

Target library_target(kv::Publisher& p) {
  const Workload& w = workload();
  return Target{"kv_events",
                [&p, tenant = w.tenant, group = w.group](std::string_view key) {
                  p.on_put_commit(tenant, key, group, kCpu);
                },
                [&p] { return p.flush(std::chrono::seconds(30)); },
                [&p] { return p.stats().last_sequence; },
                [&p] { return p.stats().dropped_events; }};
}

Target baseline_target(BaselinePublisher& p) {
  const Workload& w = workload();
  return Target{"baseline",
                [&p, tenant = w.tenant, group = w.group](std::string_view key) {
                  p.on_put_commit(tenant, key, group, kCpu);
                },
                [&p] { return p.flush(std::chrono::seconds(30)); },
                [&p] { return p.last_sequence(); }, [&p] { return p.dropped_events(); }};
}

// A subscriber process joined to `target`'s stream.
std::unique_ptr<SubscriberProcess> attach(const std::string& endpoint, const Target& target) {
  auto subscriber = std::make_unique<SubscriberProcess>(self_exe(), endpoint);
  const bool joined = subscriber->wait_joined(
      [&] {
        target.call(keys()[0]);
        target.flush();
      },
      std::chrono::seconds(10));
  if (!joined) throw std::runtime_error("the subscriber did not join " + endpoint);
  return subscriber;
}

// ---------------------------------------------------------------------------------------------
// Producers

// Offers calls in bursts: `burst` calls every `interval_ns`, from `start_ns`. A producer that
// falls behind (a sleep that overslept, a preemption) catches up with back-to-back bursts, at
// most `max_lag` bursts of them; further behind, it starts again from now (calls skipped, so
// the rate achieved is measured, not assumed).
class Pacer {
 public:
  Pacer(double calls_per_second, double period_us, uint64_t start_ns, double max_lag = 4) {
    burst_ = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(
                                       calls_per_second * period_us / 1e6)));
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
void run_threads(int count, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      pthread_setname_np(pthread_self(), "producer");
      prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // sleep_until as asked, not 50 us late
      ready.fetch_add(1);
      while (ready.load() < count) std::this_thread::yield();
      body(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

// One producer's timed calls: per-call latencies in clock ticks.
struct Timed {
  std::vector<uint32_t> ticks;
  uint64_t calls = 0;
  double cpu_seconds = 0;
};

template <bool kTsc, class Call>
void timed_producer(Call& call, double rate, double period_us, uint64_t start_ns,
                    uint64_t end_ns, size_t key_offset, Timed& out) {
  const double cpu0 = thread_cpu_seconds();
  Pacer pacer(rate, period_us, start_ns);
  const std::vector<std::string>& k = keys();
  uint32_t* samples = out.ticks.data();
  const size_t room = out.ticks.size();
  size_t n = 0;
  size_t key = key_offset;
  while (steady_ns() < end_ns && n < room) {
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
// `calls` calls, whichever ends first. A paced producer catches up to 50 ms of lag.
template <class Call>
uint64_t untimed_producer(Call& call, double rate, double period_us, uint64_t start_ns,
                          uint64_t end_ns, uint64_t calls, size_t key_offset) {
  const std::vector<std::string>& k = keys();
  uint64_t n = 0;
  size_t key = key_offset;
  if (rate <= 0) {
    while (n < calls) {
      for (int i = 0; i < 256 && n < calls; ++i, ++n) call(std::string_view(k[key++ & (kKeys - 1)]));
      if (steady_ns() >= end_ns) break;
    }
    return n;
  }
  Pacer pacer(rate, period_us, start_ns, 50000.0 / period_us);
  while (n < calls && steady_ns() < end_ns) {
    const uint64_t burst = std::min<uint64_t>(pacer.next(), calls - n);
    for (uint64_t i = 0; i < burst; ++i) call(std::string_view(k[key++ & (kKeys - 1)]));
    n += burst;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Printing

double percentile(const std::vector<uint32_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()));
  return sorted[i];
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string si(double value) {
  char text[32];
  if (value >= 1e6) {
    std::snprintf(text, sizeof text, "%.2f M", value / 1e6);
  } else if (value >= 1e3) {
    std::snprintf(text, sizeof text, "%.1f k", value / 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.0f", value);
  }
  return text;
}

std::string ns_text(double ns) {
  char text[32];
  if (ns >= 100000) {
    std::snprintf(text, sizeof text, "%.0f us", ns / 1000);
  } else if (ns >= 10000) {
    std::snprintf(text, sizeof text, "%.1f us", ns / 1000);
  } else {
    std::snprintf(text, sizeof text, "%.0f ns", ns);
  }
  return text;
}

// The smoke test's one check: a phase whose subscriber saw nothing.
int g_smoke_failures = 0;

void expect_events(const char* phase, const SubscriberCounts& counts) {
  if (!counts.ok || counts.events == 0) {
    std::printf("  !! %s: the subscriber received no events\n", phase);
    ++g_smoke_failures;
  }
}

// ---------------------------------------------------------------------------------------------
// Phase 1: the hot path

struct LatencyRun {
  double p50 = 0, p99 = 0, p999 = 0, max = 0;  // ns
  uint64_t calls = 0;
  double offered = 0;  // calls/s achieved by the producers
  uint64_t dropped = 0, missing = 0, delivered = 0;
  double cpu_per_m = 0;  // process CPU-s per million published events
  double publishing_cpu_per_m = 0;  // the same without the producer threads' own CPU
};

// One latency measurement of `library` or `baseline` (the other is null) with `threads`
// producers.
LatencyRun measure_latency(const Options& o, const CallClock& clock, Target& target,
                           SubscriberProcess& subscriber, int threads, kv::Publisher* library,
                           BaselinePublisher* baseline) {
  target.flush();
  subscriber.sync(target.last_sequence());
  const uint64_t dropped0 = target.dropped();
  const double per_thread = o.rate / threads;
  const size_t room =
      static_cast<size_t>(per_thread * o.phase_seconds * 1.25) + 4096;
  std::vector<Timed> timed(threads);
  for (Timed& t : timed) t.ticks.assign(room, 0);  // touched now, not during the run
  const double cpu0 = process_cpu_seconds();
  const uint64_t start = steady_ns() + 20000000;  // 20 ms: every thread is up
  const uint64_t end = start + static_cast<uint64_t>(o.phase_seconds * 1e9);
  run_threads(threads, [&](int i) {
    const size_t offset = static_cast<size_t>(i) * 997;
    // Copied into the lambdas: the timed call reads its own captures, as it read constants
    // before shapes existed, not the global workload.
    const std::string_view tenant = workload().tenant, group = workload().group;
    if (library) {
      auto call = [library, tenant, group](std::string_view key) {
        library->on_put_commit(tenant, key, group, kCpu);
      };
      if (clock.tsc) {
        timed_producer<true>(call, per_thread, o.period_us, start, end, offset, timed[i]);
      } else {
        timed_producer<false>(call, per_thread, o.period_us, start, end, offset, timed[i]);
      }
    } else {
      auto call = [baseline, tenant, group](std::string_view key) {
        baseline->on_put_commit(tenant, key, group, kCpu);
      };
      if (clock.tsc) {
        timed_producer<true>(call, per_thread, o.period_us, start, end, offset, timed[i]);
      } else {
        timed_producer<false>(call, per_thread, o.period_us, start, end, offset, timed[i]);
      }
    }
  });
  const double elapsed = static_cast<double>(steady_ns() - start) / 1e9;
  target.flush();
  const double cpu = process_cpu_seconds() - cpu0;
  const SubscriberCounts counts = subscriber.report(target.last_sequence());

  std::vector<uint32_t> all;
  LatencyRun run;
  double producers_cpu = 0;
  for (const Timed& t : timed) {
    all.insert(all.end(), t.ticks.begin(), t.ticks.end());
    run.calls += t.calls;
    producers_cpu += t.cpu_seconds;
  }
  std::sort(all.begin(), all.end());
  run.p50 = clock.to_ns(static_cast<uint64_t>(percentile(all, 0.50)));
  run.p99 = clock.to_ns(static_cast<uint64_t>(percentile(all, 0.99)));
  run.p999 = clock.to_ns(static_cast<uint64_t>(percentile(all, 0.999)));
  run.max = all.empty() ? 0 : clock.to_ns(all.back());
  run.offered = static_cast<double>(run.calls) / std::min(elapsed, o.phase_seconds);
  run.dropped = target.dropped() - dropped0;
  run.missing = counts.missing;
  run.delivered = counts.events;
  const double millions = static_cast<double>(std::max<uint64_t>(1, run.calls)) / 1e6;
  run.cpu_per_m = cpu / millions;
  run.publishing_cpu_per_m = std::max(0.0, cpu - producers_cpu) / millions;
  expect_events("latency", counts);
  return run;
}

void latency_phase(const Options& o, const CallClock& clock) {
  std::printf(
      "\n== Hot path: on_put_commit(tenant, key, group, {cpu}), publishing thread running, "
      "subscriber attached\n"
      "   shape %s;\n"
      "   offered %s calls/s in all, in bursts every %.0f us per thread; %d run(s) of %.1f s "
      "per row, medians of the runs;\n"
      "   latency per call as timed by the clock above (its overhead included, not "
      "subtracted);\n"
      "   CPU-s/M: this process's CPU per million calls; pub-side: the same without the "
      "producer threads' own CPU\n\n",
      workload().describe().c_str(), si(o.rate).c_str(), o.period_us, o.runs,
      o.phase_seconds);

  std::string library_endpoint;
  auto library = create_library(65536, library_endpoint);
  Target library_t = library_target(*library);
  auto library_sub = attach(library_endpoint, library_t);
  std::unique_ptr<BaselinePublisher> baseline;
  std::unique_ptr<SubscriberProcess> baseline_sub;
  Target baseline_t;
  if (!o.library_only) {
    baseline = std::make_unique<BaselinePublisher>(baseline_config(65536));
    baseline_t = baseline_target(*baseline);
    baseline_sub = attach(baseline->endpoint(), baseline_t);
  }

  std::printf("%-8s %-10s %9s %9s %9s %9s %9s %11s %7s %6s %8s %8s\n", "threads",
              "publisher", "p50", "p99", "p99.9", "max", "calls", "offered/s", "drops", "gaps",
              "CPU-s/M", "pub-side");
  for (int threads : o.threads) {
    std::vector<LatencyRun> ours, base;
    for (int r = 0; r < o.runs; ++r) {
      ours.push_back(
          measure_latency(o, clock, library_t, *library_sub, threads, library.get(), nullptr));
      if (baseline) {
        base.push_back(measure_latency(o, clock, baseline_t, *baseline_sub, threads, nullptr,
                                       baseline.get()));
      }
    }
    auto row = [&](const char* name, const std::vector<LatencyRun>& runs) {
      auto med = [&](double LatencyRun::*field) {
        std::vector<double> v;
        for (const LatencyRun& r : runs) v.push_back(r.*field);
        return median(v);
      };
      uint64_t calls = 0, dropped = 0, missing = 0;
      for (const LatencyRun& r : runs) {
        calls += r.calls;
        dropped += r.dropped;
        missing += r.missing;
      }
      std::printf("%-8d %-10s %9s %9s %9s %9s %9" PRIu64 " %11s %7" PRIu64 " %6" PRIu64
                  " %8.2f %8.2f\n",
                  threads, name, ns_text(med(&LatencyRun::p50)).c_str(),
                  ns_text(med(&LatencyRun::p99)).c_str(), ns_text(med(&LatencyRun::p999)).c_str(),
                  ns_text(med(&LatencyRun::max)).c_str(), calls,
                  si(med(&LatencyRun::offered)).c_str(), dropped, missing,
                  med(&LatencyRun::cpu_per_m), med(&LatencyRun::publishing_cpu_per_m));
    };
    row("kv_events", ours);
    if (!baseline) continue;
    row("baseline", base);
    // Ratios inside each run (the two measured back to back), then their median.
    std::vector<double> r50, r99, r999;
    for (int r = 0; r < o.runs; ++r) {
      r50.push_back(base[r].p50 / std::max(1.0, ours[r].p50));
      r99.push_back(base[r].p99 / std::max(1.0, ours[r].p99));
      r999.push_back(base[r].p999 / std::max(1.0, ours[r].p999));
    }
    std::printf("%-8d %-10s %9s %9s %9s   (baseline / kv_events, median of per-run ratios)\n",
                threads, "speedup", (std::to_string(median(r50)).substr(0, 4) + "x").c_str(),
                (std::to_string(median(r99)).substr(0, 4) + "x").c_str(),
                (std::to_string(median(r999)).substr(0, 4) + "x").c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Phase 2: the publishing thread against a plain libzmq PUB

struct ThroughputResult {
  std::string name;
  uint64_t events = 0;       // handed to the socket
  double seconds = 0;        // from the first call until everything was handed over
  uint64_t dropped = 0;      // by the publisher's queue (the producer backs off: expect 0)
  SubscriberCounts counts;   // what the subscriber process received
  double cpu_per_m = 0;      // this process's CPU-s per million events handed over
  std::map<std::string, double> thread_cpu;  // CPU-s by thread name over the run
};

// Where the CPU of a throughput run went, in ns per event handed over, by thread.
void print_thread_cpu(const ThroughputResult& r) {
  const double events = static_cast<double>(std::max<uint64_t>(1, r.events));
  std::printf("  %-16s CPU ns/event:", r.name.c_str());
  for (const auto& [name, seconds] : r.thread_cpu) {
    if (seconds * 1e9 / events < 0.5) continue;
    std::printf(" %s %.0f,", name == "kv_events_bench" ? "main" : name.c_str(),
                seconds * 1e9 / events);
  }
  std::printf(" process %.0f\n", r.cpu_per_m * 1e3);
}

// The CPU of each thread name between two snapshots.
std::map<std::string, double> cpu_delta(const std::map<std::string, double>& before,
                                        const std::map<std::string, double>& after) {
  std::map<std::string, double> delta;
  for (const auto& [name, seconds] : after) {
    auto it = before.find(name);
    delta[name] = seconds - (it == before.end() ? 0 : it->second);
  }
  return delta;
}

void print_throughput(const ThroughputResult& r) {
  const double handed = r.seconds > 0 ? static_cast<double>(r.events) / r.seconds : 0;
  std::printf("%-16s %10" PRIu64 " %11s %13s %10" PRIu64 " %10" PRIu64 " %6" PRIu64
              " %10" PRIu64 " %9.2f\n",
              r.name.c_str(), r.events, si(handed).c_str(),
              si(r.counts.delivered_per_second()).c_str(), r.counts.events,
              r.events > r.counts.events ? r.events - r.counts.events : 0, r.dropped,
              r.counts.max_payload, r.cpu_per_m);
}

// One producer makes calls as fast as it can for `seconds`, napping 50 us at a time while
// the queue holds more than half of `capacity` until it is down to a quarter: the publishing
// thread always has work and the queue never overflows.
ThroughputResult publisher_throughput(double seconds, Target& target,
                                      SubscriberProcess& subscriber,
                                      const std::function<uint64_t()>& published,
                                      const std::function<uint64_t()>& depth,
                                      uint64_t capacity) {
  ThroughputResult r;
  r.name = target.name;
  target.flush();
  subscriber.sync(target.last_sequence());
  const uint64_t published0 = published();
  const uint64_t dropped0 = target.dropped();
  const double cpu0 = process_cpu_seconds();
  const std::map<std::string, double> threads0 = cpu_by_thread_name();
  double producer_cpu = 0;
  const uint64_t t0 = steady_ns();
  const uint64_t end = t0 + static_cast<uint64_t>(seconds * 1e9);
  std::thread producer([&] {
    pthread_setname_np(pthread_self(), "producer");
    const double own0 = thread_cpu_seconds();
    const std::vector<std::string>& k = keys();
    size_t key = 0;
    while (steady_ns() < end) {
      for (int i = 0; i < 256; ++i) target.call(k[key++ & (kKeys - 1)]);
      if (depth() > capacity / 2) {
        while (depth() > capacity / 4 && steady_ns() < end) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
    }
    producer_cpu = thread_cpu_seconds() - own0;
  });
  producer.join();
  target.flush();
  r.thread_cpu = cpu_delta(threads0, cpu_by_thread_name());
  r.thread_cpu["producer"] = producer_cpu;
  r.seconds = static_cast<double>(steady_ns() - t0) / 1e9;
  r.events = published() - published0;
  r.dropped = target.dropped() - dropped0;
  r.cpu_per_m = (process_cpu_seconds() - cpu0) / (static_cast<double>(r.events) / 1e6);
  r.counts = subscriber.report(target.last_sequence());
  return r;
}

// Plain libzmq sending copies of `payload` (three frames, sequenced) as fast as one thread
// can for `seconds`, to a subscriber process. `nodrop`: an XPUB with ZMQ_XPUB_NODROP, whose
// send blocks at the high-water mark instead of dropping, so the sender never outruns the
// subscriber (the lossless limit); otherwise a PUB, which drops at the mark as the library's
// socket does.
ThroughputResult raw_zmq_throughput(double seconds, const std::string& payload,
                                    uint64_t events_per_message, bool nodrop) {
  ThroughputResult r;
  r.name = nodrop ? "raw XPUB nodrop" : "raw libzmq PUB";
  void* context = zmq_ctx_new();
  void* socket = zmq_socket(context, nodrop ? ZMQ_XPUB : ZMQ_PUB);
  const int linger = 1000;
  const int on = 1;
  zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
  if (nodrop) zmq_setsockopt(socket, ZMQ_XPUB_NODROP, &on, sizeof on);
  char endpoint[256] = {};
  size_t endpoint_size = sizeof endpoint;
  if (zmq_bind(socket, "tcp://127.0.0.1:*") != 0 ||
      zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &endpoint_size) != 0) {
    throw std::runtime_error(std::string("raw PUB: ") + zmq_strerror(zmq_errno()));
  }
  uint64_t sequence = 0;
  auto send = [&] {
    ++sequence;
    unsigned char s[8];
    for (int i = 0; i < 8; ++i) s[i] = static_cast<unsigned char>(sequence >> (56 - 8 * i));
    zmq_send(socket, "", 0, ZMQ_SNDMORE);
    zmq_send(socket, s, sizeof s, ZMQ_SNDMORE);
    zmq_send(socket, payload.data(), payload.size(), 0);
  };
  {
    SubscriberProcess subscriber(self_exe(), endpoint);
    if (!subscriber.wait_joined(send, std::chrono::seconds(10))) {
      throw std::runtime_error("the subscriber did not join the raw PUB");
    }
    subscriber.sync(sequence);
    const double cpu0 = process_cpu_seconds();
    const std::map<std::string, double> threads0 = cpu_by_thread_name();
    const uint64_t t0 = steady_ns();
    const uint64_t end = t0 + static_cast<uint64_t>(seconds * 1e9);
    uint64_t messages = 0;
    while (steady_ns() < end) {
      for (int i = 0; i < 16; ++i) send();
      messages += 16;
    }
    r.seconds = static_cast<double>(steady_ns() - t0) / 1e9;
    r.thread_cpu = cpu_delta(threads0, cpu_by_thread_name());
    r.events = messages * events_per_message;
    r.counts = subscriber.report(sequence);
    r.cpu_per_m = (process_cpu_seconds() - cpu0) / (static_cast<double>(r.events) / 1e6);
  }
  zmq_close(socket);
  zmq_ctx_term(context);
  return r;
}

void throughput_phase(const Options& o) {
  std::printf(
      "\n== Publishing thread: %.1f s per sender, each to its own subscriber process on tcp "
      "loopback.\n"
      "   shape %s;\n"
      "   kv_events, baseline: one producer calls as fast as it can, pausing while the queue "
      "is over half full\n"
      "   (the publisher always has work and its queue never drops). raw: one thread sends "
      "pre-encoded 64-event\n"
      "   batches of the same bytes as fast as it can; PUB drops at the high-water mark (as "
      "the library's socket\n"
      "   does), XPUB nodrop blocks there (the lossless limit).\n"
      "   delivered/s: events received per second between the subscriber's first and last "
      "message; lost: handed\n"
      "   to the socket but never received (dropped at the PUB's high-water mark: the "
      "subscriber fell behind)\n\n",
      o.throughput_seconds, workload().describe().c_str());
  std::printf("%-16s %10s %11s %13s %10s %10s %6s %10s %9s\n", "sender", "handed", "handed/s",
              "delivered/s", "received", "lost", "drops", "payload B", "CPU-s/M");
  const uint32_t capacity = 65536;
  ThroughputResult ours;
  {
    std::string endpoint;
    auto library = create_library(capacity, endpoint);
    Target t = library_target(*library);
    auto subscriber = attach(endpoint, t);
    kv::Publisher* p = library.get();
    ours = publisher_throughput(
        o.throughput_seconds, t, *subscriber, [p] { return p->stats().published_events; },
        [p] { return p->stats().queue_depth; }, capacity);
  }
  print_throughput(ours);
  expect_events("throughput kv_events", ours.counts);
  if (o.library_only) {
    print_thread_cpu(ours);
    return;
  }

  // The bytes of the library's full batches at this point of a stream (same event-id width).
  MsgpackWriter writer;
  std::vector<BaselineEvent> events;
  for (size_t i = 0; i < 64; ++i) {
    events.push_back(BaselineEvent{std::string(workload().tenant), keys()[i],
                                   std::string(workload().group), kv::Medium::kCpu});
  }
  uint64_t id = std::max<uint64_t>(1, ours.events);
  const uint64_t timestamp_ms = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  write_baseline_batch(writer, baseline_config(0), timestamp_ms, events.data(), events.size(),
                       id);
  const ThroughputResult raw = raw_zmq_throughput(o.throughput_seconds, writer.out(), 64, false);
  print_throughput(raw);
  expect_events("throughput raw", raw.counts);
  const ThroughputResult nodrop =
      raw_zmq_throughput(o.throughput_seconds, writer.out(), 64, true);
  print_throughput(nodrop);
  expect_events("throughput raw nodrop", nodrop.counts);

  ThroughputResult base;
  {
    BaselinePublisher baseline(baseline_config(capacity));
    Target t = baseline_target(baseline);
    auto subscriber = attach(baseline.endpoint(), t);
    BaselinePublisher* p = &baseline;
    base = publisher_throughput(
        o.throughput_seconds, t, *subscriber, [p] { return p->published_events(); },
        [p] { return p->queue_depth(); }, capacity);
  }
  print_throughput(base);
  expect_events("throughput baseline", base.counts);

  std::printf("\n");
  for (const ThroughputResult* r : std::initializer_list<const ThroughputResult*>{
           &ours, &raw, &nodrop, &base}) {
    print_thread_cpu(*r);
  }
  const double raw_rate = std::max(1.0, raw.counts.delivered_per_second());
  const double nodrop_rate = std::max(1.0, nodrop.counts.delivered_per_second());
  std::printf("\ndelivered/s as a fraction of the raw PUB's / of the raw XPUB nodrop's: "
              "kv_events %.2f / %.2f, baseline %.2f / %.2f\n",
              ours.counts.delivered_per_second() / raw_rate,
              ours.counts.delivered_per_second() / nodrop_rate,
              base.counts.delivered_per_second() / raw_rate,
              base.counts.delivered_per_second() / nodrop_rate);
}

// ---------------------------------------------------------------------------------------------
// Phase 3: the highest offered rate sustained with no drop at the default capacity

void sustained_phase(const Options& o) {
  std::printf(
      "\n== Sustained rate: default queue (65536 calls), one producer thread paced in bursts "
      "every %.0f us, %.1f s per step;\n"
      "   shape %s;\n"
      "   a step holds when the publisher dropped nothing and the subscriber saw no gap\n\n",
      o.period_us, o.duration, workload().describe().c_str());
  std::string endpoint;
  auto library = create_library(65536, endpoint);
  Target t = library_target(*library);
  auto subscriber = attach(endpoint, t);
  std::printf("%12s %12s %8s %8s %10s %9s  %s\n", "asked/s", "offered/s", "drops", "gaps",
              "received", "CPU-s/M", "result");
  double best = 0, best_cpu = 0;
  double rate = o.search_start;
  bool going_down = false;
  for (int step = 0; step < o.search_steps + 8; ++step) {
    t.flush();
    subscriber->sync(t.last_sequence());
    const uint64_t dropped0 = t.dropped();
    const double cpu0 = process_cpu_seconds();
    const uint64_t start = steady_ns() + 5000000;
    const uint64_t end = start + static_cast<uint64_t>(o.duration * 1e9);
    uint64_t calls = 0;
    run_threads(1, [&](int) {
      auto call = [&library, tenant = workload().tenant,
                   group = workload().group](std::string_view key) {
        library->on_put_commit(tenant, key, group, kCpu);
      };
      calls = untimed_producer(call, rate, o.period_us, start, end, UINT64_MAX, 0);
    });
    const double achieved = static_cast<double>(calls) / o.duration;
    t.flush();
    const double cpu = process_cpu_seconds() - cpu0;
    const SubscriberCounts counts = subscriber->report(t.last_sequence());
    const uint64_t dropped = t.dropped() - dropped0;
    const bool held = dropped == 0 && counts.missing == 0;
    // The producer's sleeps overshoot on a busy machine; past 10% short, the rate asked for
    // was not offered and the search stops there.
    const bool producer_short = achieved < 0.9 * rate;
    const double cpu_per_m = cpu / (static_cast<double>(calls) / 1e6);
    std::printf("%12s %12s %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %9.2f  %s%s\n",
                si(rate).c_str(), si(achieved).c_str(), dropped, counts.missing, counts.events,
                cpu_per_m, held ? "held" : "lost events",
                producer_short ? " (the producer could not offer the rate)" : "");
    if (step == 0) expect_events("sustained", counts);
    if (held && achieved > best) {
      best = achieved;
      best_cpu = cpu_per_m;
    }
    if (step + 1 >= o.search_steps && o.mode == "smoke") break;
    if (producer_short && held) break;
    if (held && !going_down) {
      if (step + 1 >= o.search_steps) break;
      rate *= 1.25;
    } else if (!held && best == 0) {
      going_down = true;  // the first rate already failed: step down until one holds
      rate *= 0.8;
      if (rate < 50000) break;
    } else {
      break;
    }
  }
  if (best > 0) {
    std::printf("\nhighest rate offered (as achieved) for %.1f s with zero drops and no gap: "
                "%s calls/s (%.2f CPU-s per million events, this process)\n",
                o.duration, si(best).c_str(), best_cpu);
  } else {
    std::printf("\nno offered rate held in this search\n");
  }
}

// ---------------------------------------------------------------------------------------------
// Phase 4: memory

// Runs first, before other phases leave freed memory in the allocator for it to reuse.
void memory_phase(const Options& o) {
  const Workload& w = workload();
  std::printf("\n== Memory: a full default queue (65536 calls), no subscriber (so ZeroMQ "
              "buffers nothing)\n"
              "   shape %s\n\n",
              w.describe().c_str());
  {
    // A full queue: no subscriber, so ZeroMQ holds nothing; the producer outruns the
    // publishing thread and keeps the queue at capacity.
    const std::vector<std::string>& k = keys();
    // Publishers of capacity 1 first: the second one's cost is what a publisher costs besides
    // its queue's slots (the first also pays for what a process loads once).
    std::string small_endpoint;
    auto warm = create_library(1, small_endpoint);
    const double before_small = rss_mb();
    auto small = create_library(1, small_endpoint);
    const double fixed = rss_mb() - before_small;
    const double before = rss_mb();
    std::string endpoint;
    auto library = create_library(65536, endpoint);
    const double created = rss_mb();
    // Until a look at the queue finds it (nearly) full: the publishing thread drains it
    // meanwhile, and a busy machine may deschedule this thread between pushes and the look.
    // The smoke run, under sanitizers too, only needs the phase to run.
    const int rounds = o.mode == "smoke" ? 20 : 500;
    uint64_t depth = 0;
    double full = created;
    for (int round = 0; round < rounds && depth < 65536 * 99 / 100; ++round) {
      for (size_t i = 0; i < 65536 + 4096; ++i) {
        library->on_put_commit(w.tenant, k[i & (kKeys - 1)], w.group, kCpu);
      }
      depth = std::max<uint64_t>(depth, library->stats().queue_depth);
      full = std::max(full, rss_mb());
    }
    constexpr double kMB = 1048576.0;
    const double per_slot = (created - before - fixed) * kMB / 65536;
    const double per_call = depth ? (full - created) * kMB / static_cast<double>(depth) : 0;
    const size_t strings = w.bytes();
    std::printf(
        "RSS %.1f MB before create, %.1f MB created, %.1f MB with the queue at depth %" PRIu64
        "\n"
        "  created: %.1f MB for the thread, socket and context (a publisher of capacity 1), "
        "%.0f bytes per slot (its share of the string pool included)\n"
        "  filled:  %.0f more bytes per queued call (its %zu bytes of key, tenant and group "
        "%s)\n"
        "  -> a full default queue costs %.1f MB; %.0f bytes per queued call besides its strings\n",
        before, created, full, depth, fixed, per_slot, per_call, strings,
        strings <= kSlotBytes    ? "ride in its slot"
        : strings <= kBlockBytes ? "take a pooled block, or a heap block once all are queued"
                                 : "take a heap block of their own",
        full - before,
        per_slot + per_call - static_cast<double>(strings));
  }
}

// Runs after the steady phases: RSS of the process, sampled every second, while one thread
// floods the queue.
void flood_phase(const Options& o) {
  const Workload& w = workload();
  std::printf("\n== RSS under a flood: default queue, one producer flat out, subscriber "
              "attached\n"
              "   shape %s\n\n",
              w.describe().c_str());
  {
    std::string endpoint;
    auto library = create_library(65536, endpoint);
    Target t = library_target(*library);
    auto subscriber = attach(endpoint, t);
    subscriber->sync(t.last_sequence());
    const double idle = rss_mb();
    std::atomic<bool> stop{false};
    uint64_t calls = 0;
    std::thread producer([&] {
      const std::vector<std::string>& k = keys();
      size_t i = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int j = 0; j < 1024; ++j, ++i) {
          library->on_put_commit(w.tenant, k[i & (kKeys - 1)], w.group, kCpu);
        }
      }
      calls = i;
    });
    std::vector<double> samples;
    const uint64_t start = steady_ns();
    const int seconds = std::max(1, static_cast<int>(std::lround(o.flood_seconds)));
    for (int s = 1; s <= seconds; ++s) {
      sleep_until_ns(start + static_cast<uint64_t>(s) * 1000000000u);
      samples.push_back(rss_mb());
    }
    stop = true;
    producer.join();
    t.flush();
    std::printf("RSS samples (MB, one a second):");
    for (size_t s = 0; s < samples.size(); ++s) {
      std::printf("%s%.1f", s % 20 == 0 ? "\n  " : " ", samples[s]);
    }
    std::printf("\n");
    const kv::Stats stats = library->stats();
    const SubscriberCounts counts = subscriber->report(t.last_sequence());
    std::printf(
        "flood %d s: RSS idle %.1f MB; sampled every second: first %.1f, last %.1f, "
        "max %.1f MB\n"
        "  %" PRIu64 " calls, %" PRIu64 " published, %" PRIu64 " dropped (queue full); "
        "subscriber received %" PRIu64 " (%s/s), gaps %" PRIu64 "\n",
        seconds, idle, samples.front(), samples.back(),
        *std::max_element(samples.begin(), samples.end()), calls, stats.published_events,
        stats.dropped_events, counts.events, si(counts.delivered_per_second()).c_str(),
        counts.missing);
    expect_events("flood", counts);
  }
}

// ---------------------------------------------------------------------------------------------
// Phase 6: the burst of a RemoveAll

// A RemoveAll of a large tenant: the master's loop makes one on_medium_delta(before {cpu},
// after {}) per object, back to back, far faster than any steady workload: the burst of real
// use most likely to overrun the default queue. One producer makes them as fast as it can and
// the subscriber counts what arrives and when. on_remove_all is not called: its one `cleared`
// would follow the burst, and is not the load.
void removeall_phase(const Options& o) {
  const Workload& w = workload();
  std::printf(
      "\n== RemoveAll burst: %s on_medium_delta(tenant, key, group, {cpu}, {}) calls, one "
      "producer flat out,\n"
      "   default queue (65536 calls), subscriber attached; shape %s;\n"
      "   no on_remove_all at the end (a real RemoveAll would follow with one cleared event, "
      "which is not the load).\n"
      "   offered: calls / producer time; delivered: events received / time from the first "
      "call to the last\n"
      "   event received; tail: from the producer's last call to the last event received\n\n",
      si(static_cast<double>(o.removeall_calls)).c_str(), w.describe().c_str());
  std::string endpoint;
  auto library = create_library(65536, endpoint);
  Target t = library_target(*library);
  auto subscriber = attach(endpoint, t);
  t.flush();
  subscriber->sync(t.last_sequence());
  const kv::Stats before = library->stats();
  uint64_t first_ns = 0, last_ns = 0;
  run_threads(1, [&](int) {
    const kv::MediumSet none;
    auto call = [&library, none, tenant = w.tenant, group = w.group](std::string_view key) {
      library->on_medium_delta(tenant, key, group, kCpu, none);
    };
    first_ns = steady_ns();
    untimed_producer(call, 0, o.period_us, 0, UINT64_MAX, o.removeall_calls, 0);
    last_ns = steady_ns();
  });
  t.flush();
  const kv::Stats after = library->stats();
  // The subscriber stamps messages with CLOCK_MONOTONIC, the clock of steady_ns().
  const SubscriberCounts counts = subscriber->report(after.last_sequence);
  // One removed event per call: what was not received was either dropped by the queue (the
  // library's count) or handed to the socket and lost behind it (at a high-water mark).
  const double calls = static_cast<double>(o.removeall_calls);
  const uint64_t dropped = after.dropped_events - before.dropped_events;
  const uint64_t handed = after.published_events - before.published_events;
  const uint64_t lost = handed > counts.events ? handed - counts.events : 0;
  // Rates over nanoseconds of CLOCK_MONOTONIC; an empty span (nothing received) gives 0.
  auto per_second = [](double count, uint64_t from_ns, uint64_t to_ns) {
    return to_ns > from_ns ? count * 1e9 / static_cast<double>(to_ns - from_ns) : 0.0;
  };
  const double offered = per_second(calls, first_ns, last_ns);
  const double delivered =
      per_second(static_cast<double>(counts.events), first_ns, counts.last_ns);
  const double tail_ms =
      counts.last_ns == 0
          ? 0
          : (static_cast<double>(counts.last_ns) - static_cast<double>(last_ns)) / 1e6;
  std::printf(
      "offered %s calls/s (%.1f ms of calls); delivered %s events/s; tail %.1f ms after the "
      "last call\n"
      "  %" PRIu64 " calls: %" PRIu64 " received, %.2f%% not received = %.2f%% dropped by the "
      "queue (%" PRIu64 ") + %.2f%% lost after the socket (%" PRIu64 ")\n"
      "  subscriber gaps: %" PRIu64 " sequence numbers (one per event dropped by the queue, "
      "one per message lost)\n",
      si(offered).c_str(), static_cast<double>(last_ns - first_ns) / 1e6, si(delivered).c_str(),
      tail_ms, o.removeall_calls, counts.events,
      100.0 * (1.0 - static_cast<double>(counts.events) / calls),
      100.0 * static_cast<double>(dropped) / calls, dropped,
      100.0 * static_cast<double>(lost) / calls, lost, counts.missing);
  expect_events("removeall", counts);
}

// ---------------------------------------------------------------------------------------------
// --syscall-probe: the producer loop alone, for strace

int syscall_probe(const Options& o) {
  std::string endpoint;
  auto library = create_library(65536, endpoint);
  Target t = library_target(*library);
  auto subscriber = attach(endpoint, t);
  const int threads = o.threads.front();
  std::vector<long> tids(threads);
  std::vector<uint64_t> calls(threads);
  std::atomic<int> warmed{0};
  std::atomic<bool> go{false};
  uint64_t dropped_before = 0;
  run_threads(threads, [&](int i) {
    tids[i] = syscall(SYS_gettid);
    auto call = [&library, tenant = workload().tenant,
                 group = workload().group](std::string_view key) {
      library->on_put_commit(tenant, key, group, kCpu);
    };
    // A warm-up grows this thread's malloc arena to what a full queue needs; the flush then
    // hands every record back to it, so the loop below starts from a warm allocator.
    untimed_producer(call, 0, o.period_us, 0, UINT64_MAX, o.probe_warmup, 0);
    warmed.fetch_add(1);
    if (i == 0) {
      while (warmed.load() < threads) std::this_thread::yield();
      t.flush();
      dropped_before = t.dropped();
      go = true;
    }
    while (!go.load()) std::this_thread::yield();
    // getppid() marks the loop's bounds in the trace: every system call the thread makes
    // between the two is made by the calls (or by the pacing's clock_nanosleep).
    syscall(SYS_getppid);
    calls[i] = untimed_producer(call, o.probe_rate, o.period_us, steady_ns(), UINT64_MAX,
                                o.probe_calls, static_cast<size_t>(i) * 997);
    syscall(SYS_getppid);
  });
  t.flush();
  const kv::Stats s = library->stats();
  std::printf("shape %s\nproducer_tids", workload().describe().c_str());
  for (long tid : tids) std::printf(" %ld", tid);
  std::printf("\ncalls");
  for (uint64_t c : calls) std::printf(" %" PRIu64, c);
  std::printf("\npublished_events %" PRIu64 "\ndropped_events %" PRIu64
              "\ndropped_in_loop %" PRIu64 "\nsubscriber_pid %d\n",
              s.published_events, s.dropped_events, s.dropped_events - dropped_before,
              static_cast<int>(subscriber->pid()));
  return 0;
}

}  // namespace
}  // namespace kv_events_bench

int main(int argc, char** argv) {
  using namespace kv_events_bench;
  if (argc == 3 && std::string(argv[1]) == "--subscriber") return run_subscriber(argv[2]);
  signal(SIGPIPE, SIG_IGN);
  const Options o = parse(argc, argv);
  build_workload(*find_shape(o.shape));
  try {
    if (o.syscall_probe) return syscall_probe(o);

    const CallClock clock = CallClock::create(o.tsc);
    std::printf("kv_events_bench (%s mode)\n", o.mode.c_str());
    std::printf("machine: %u CPUs, %s; load average %s at start\n",
                std::thread::hardware_concurrency(), cpu_model().c_str(), loadavg().c_str());
    std::printf("clock: %s; one begin/end pair costs %.0f ns (min) / %.0f ns (median)\n",
                clock.describe().c_str(), clock.overhead_min_ns, clock.overhead_p50_ns);
    std::printf("subscribers: one child process per publisher (ZeroMQ SUB, RCVHWM 200000), "
                "on tcp://127.0.0.1\n");
    // The last key as an example (the first is all zeros), cut where a 1 KiB one would flood
    // the header.
    const std::string& last = keys().back();
    std::printf("shape: %s, %zu distinct keys cycled; the last: %.140s%s\n",
                workload().describe().c_str(), kKeys, last.c_str(), last.size() > 140 ? "..." : "");
    std::fflush(stdout);
    const double t0 = now_seconds();
    if (wants(o, "memory")) memory_phase(o);
    std::fflush(stdout);
    if (wants(o, "latency")) latency_phase(o, clock);
    std::fflush(stdout);
    if (wants(o, "throughput")) throughput_phase(o);
    std::fflush(stdout);
    if (wants(o, "sustained")) sustained_phase(o);
    std::fflush(stdout);
    if (wants(o, "flood")) flood_phase(o);
    std::fflush(stdout);
    if (wants(o, "removeall")) removeall_phase(o);
    std::printf("\ndone in %.1f s; load average %s at the end\n", now_seconds() - t0,
                loadavg().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_events_bench: %s\n", e.what());
    return 1;
  }
  if (o.mode == "smoke" && g_smoke_failures > 0) {
    std::fprintf(stderr, "kv_events_bench --smoke: %d phase(s) delivered nothing\n",
                 g_smoke_failures);
    return 1;
  }
  return 0;
}
