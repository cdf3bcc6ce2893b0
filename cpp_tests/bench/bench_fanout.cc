// kv_events_bench's fan-out: phase 8, one publisher and 1 to 64 subscriber processes, on tcp
// and ipc, plain and CURVE, and one slow subscriber among 16.

#include <sys/stat.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_phases.h"

namespace kv_events_bench {

// ---------------------------------------------------------------------------------------------
// Phase 8: fan-out

// One publisher, N subscriber processes, on loopback tcp or ipc, plain or CURVE: what ZeroMQ's
// copy of every message to every subscriber costs (delivered rates, the share each subscriber
// received, the publisher process's CPU and memory, the callers' latency against the same run
// with one subscriber), and what one subscriber that stops reading does to the others.

namespace {

// A CURVE key pair in Z85, from libzmq.
struct KeyPair {
  std::string public_key, secret_key;
};

KeyPair curve_keypair() {
  char public_key[41], secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0) {
    throw std::runtime_error("zmq_curve_keypair failed: libzmq without CURVE?");
  }
  return {public_key, secret_key};
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  if (chmod(path.c_str(), mode) != 0) throw std::runtime_error("chmod " + path + " failed");
}

// A publisher of the fan-out phase and what its subscribers need to reach it.
struct FanoutPublisher {
  std::unique_ptr<kv::Publisher> publisher;
  SubscriberOptions reach;           // endpoint and the server's key; each subscriber its pair
  std::vector<KeyPair> subscribers;  // CURVE only: the pairs the allow-list holds
  std::string directory;             // key files and the ipc socket, removed on destruction

  ~FanoutPublisher() {
    publisher.reset();
    if (!directory.empty()) std::system(("rm -rf '" + directory + "'").c_str());
  }
};

// A publisher on `transport` (tcp or ipc), CURVE with an allow-list of `count` subscriber keys
// when `curve`, the default queue and send high-water mark.
std::unique_ptr<FanoutPublisher> fanout_publisher(const std::string& transport, bool curve,
                                                  int count) {
  auto f = std::make_unique<FanoutPublisher>();
  char directory[] = "/tmp/kv-events-fanout-XXXXXX";
  if (mkdtemp(directory) == nullptr) throw std::runtime_error("mkdtemp failed");
  f->directory = directory;
  const std::string endpoint = transport == "ipc"
                                   ? "ipc://" + f->directory + "/events.sock"
                                   : "tcp://127.0.0.1:" + std::to_string(free_port());
  kv::Config config = library_config(endpoint, 65536);
  f->reach.endpoint = endpoint;
  // As deep as the publisher's own per-subscriber buffer: the subscriber process holds no
  // more than the publisher would, so a subscriber that falls behind shows as a gap.
  f->reach.rcvhwm = static_cast<int>(config.send_hwm);
  if (curve) {
    const KeyPair server = curve_keypair();
    const std::string allow = f->directory + "/allow";
    mkdir(allow.c_str(), 0700);
    write_file(f->directory + "/server.key",
               "metadata\ncurve\n    public-key = \"" + server.public_key +
                   "\"\n    secret-key = \"" + server.secret_key + "\"\n",
               0600);
    for (int i = 0; i < count; ++i) {
      f->subscribers.push_back(curve_keypair());
      write_file(allow + "/s" + std::to_string(i) + ".pub",
                 "metadata\ncurve\n    public-key = \"" + f->subscribers.back().public_key + "\"\n",
                 0644);
    }
    config.curve_secret_key_file = f->directory + "/server.key";
    config.curve_allow = allow;
    f->reach.server_public = server.public_key;
  }
  f->publisher = kv::Publisher::create(config);
  return f;
}

struct FanoutRun {
  std::string transport, security;
  int subscribers = 0;
  double rate = 0;   // calls/s offered
  double pause = 0;  // seconds subscriber 0 stopped reading; 0: none did
  bool slow() const { return pause > 0; }
  uint64_t published = 0;  // events the phase published
  uint64_t batches = 0;    // messages the phase published
  std::vector<SubscriberCounts> counts;
  double seconds = 0;                    // the producers' time
  double cpu_per_m = 0;                  // the publisher process's CPU-s per million events
  double io_busy = 0, pub_busy = 0;      // CPU-s per second of libzmq's I/O thread, kv-events-pub
  double p50 = 0, p99 = 0, p999 = 0;     // ns
  double rss_before = 0, rss_after = 0;  // MB
  uint64_t connected = 0;                // the publisher's subscribers gauge during the run
  uint64_t send_hwm = 0;
};

// One run: `count` subscribers, `rate` calls/s for o.fanout_seconds; with `pause` > 0,
// subscriber 0 stops reading for the first `pause` seconds, which the run lasts longer.
FanoutRun measure_fanout(const Options& o, const CallClock& clock, const std::string& transport,
                         bool curve, int count, double rate, double pause) {
  FanoutRun run;
  run.transport = transport;
  run.security = curve ? "curve" : "plain";
  run.subscribers = count;
  run.rate = rate;
  run.pause = pause;
  const bool slow = pause > 0;
  auto f = fanout_publisher(transport, curve, count);
  kv::Publisher& library = *f->publisher;
  Target target = library_target(library);
  run.send_hwm = kv::Config().send_hwm;
  std::vector<std::unique_ptr<SubscriberProcess>> subscribers;
  for (int i = 0; i < count; ++i) {
    SubscriberOptions options = f->reach;
    if (curve) {
      options.public_key = f->subscribers[i].public_key;
      options.secret_key = f->subscribers[i].secret_key;
    }
    // The slow one holds a few messages only: stopped, it stops the publisher's sends to it.
    if (slow && i == 0) options.rcvhwm = 100;
    subscribers.push_back(std::make_unique<SubscriberProcess>(self_exe(), options));
  }
  for (auto& subscriber : subscribers) {
    const bool joined = subscriber->wait_joined(
        [&] {
          target.call(keys()[0]);
          target.flush();
        },
        std::chrono::seconds(30));
    if (!joined) throw std::runtime_error("a subscriber did not join " + f->reach.endpoint);
  }
  target.flush();
  const uint64_t first = target.next_sequence();
  for (auto& subscriber : subscribers) subscriber->sync(first);
  const uint64_t published0 = library.stats().published_events;
  const uint64_t batches0 = library.stats().published_batches;
  run.rss_before = rss_mb();

  const double seconds = pause + o.fanout_seconds;
  Timed timed;
  timed.ticks.assign(static_cast<size_t>(rate * seconds * 1.25) + 4096, 0);
  const auto threads0 = cpu_by_thread_name();
  const double cpu0 = process_cpu_seconds();
  const uint64_t start = steady_ns() + 20000000;
  const uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
  if (slow) subscribers[0]->pause(std::chrono::milliseconds(static_cast<int64_t>(pause * 1000)));
  run_threads(1, [&](int) {
    const std::string_view tenant = workload().tenant, group = workload().group;
    kv::Publisher* p = &library;
    auto call = [p, tenant, group](std::string_view key) {
      p->on_put_commit(tenant, key, group, kCpu);
    };
    if (clock.tsc) {
      timed_producer<true>(call, rate, o.period_us, start, end, 0, timed);
    } else {
      timed_producer<false>(call, rate, o.period_us, start, end, 0, timed);
    }
  });
  run.seconds = static_cast<double>(steady_ns() - start) / 1e9;
  run.connected = library.stats().subscribers;
  target.flush();
  const double cpu = process_cpu_seconds() - cpu0;
  const auto threads = cpu_delta(threads0, cpu_by_thread_name());
  run.rss_after = rss_mb();
  run.published = library.stats().published_events - published0;
  run.batches = library.stats().published_batches - batches0;
  // Subscribers far behind (64 of them on a small machine) may take a while between two
  // messages as they catch up: only 10 s of silence ends a report.
  for (auto& subscriber : subscribers) {
    run.counts.push_back(subscriber->report(target.next_sequence(), std::chrono::seconds(10)));
  }

  std::sort(timed.ticks.begin(), timed.ticks.end());
  run.p50 = clock.to_ns(static_cast<uint64_t>(percentile(timed.ticks, 0.50)));
  run.p99 = clock.to_ns(static_cast<uint64_t>(percentile(timed.ticks, 0.99)));
  run.p999 = clock.to_ns(static_cast<uint64_t>(percentile(timed.ticks, 0.999)));
  run.cpu_per_m = cpu / (static_cast<double>(std::max<uint64_t>(1, run.published)) / 1e6);
  for (const auto& [name, busy] : threads) {
    if (name.rfind("ZMQbg/IO", 0) == 0) run.io_busy += busy / run.seconds;
    if (name == "kv-events-pub") run.pub_busy = busy / run.seconds;
  }
  for (const SubscriberCounts& c : run.counts) expect_events("fanout", c);
  return run;
}

void print_fanout(const FanoutRun& r, const FanoutRun* one) {
  // The slow subscriber's figures are its gaps and its share only: its rate, measured over
  // the catching up after its pause, would say nothing.
  std::vector<double> rates, shares;
  uint64_t gaps_others = 0, messages = 0, bytes = 0;
  auto share = [&](const SubscriberCounts& c) {
    return r.published ? 100.0 * static_cast<double>(c.events) / static_cast<double>(r.published)
                       : 0;
  };
  for (size_t i = r.slow() ? 1 : 0; i < r.counts.size(); ++i) {
    const SubscriberCounts& c = r.counts[i];
    rates.push_back(c.delivered_per_second());
    shares.push_back(share(c));
    gaps_others += c.missing;
    messages += c.messages;
    bytes += c.payload_bytes;
  }
  char slow[32] = "-";
  if (r.slow()) {
    std::snprintf(slow, sizeof slow, "%" PRIu64 "/%.0f%%/%.1fs", r.counts[0].missing,
                  share(r.counts[0]), r.pause);
  }
  double total = 0;
  for (double rate : rates) total += rate;
  const double mean_message = messages ? static_cast<double>(bytes) / messages : 0;
  auto ratio = [&](double value, double FanoutRun::*field) {
    char text[16];
    std::snprintf(text, sizeof text, "%.2fx", one && one->*field > 0 ? value / (one->*field) : 1.0);
    return std::string(text);
  };
  char name[32];
  std::snprintf(name, sizeof name, "%s/%s", r.transport.c_str(), r.security.c_str());
  std::printf("%-10s %7s %4d%-5s %4" PRIu64 " %10s %10s %10s %6.1f%% %6.1f%% %6" PRIu64
              " %14s %8.2f"
              " %5.0f%% %5.0f%% %9s %9s %9s %6s %6s %6s %6.1f -> %-6.1f %7.2f\n",
              name, si(r.rate).c_str(), r.subscribers, r.slow() ? "+slow" : "", r.connected,
              si(*std::min_element(rates.begin(), rates.end())).c_str(), si(median(rates)).c_str(),
              si(total).c_str(), *std::min_element(shares.begin(), shares.end()), median(shares),
              gaps_others, slow, r.cpu_per_m, 100 * r.io_busy, 100 * r.pub_busy,
              ns_text(r.p50).c_str(), ns_text(r.p99).c_str(), ns_text(r.p999).c_str(),
              ratio(r.p50, &FanoutRun::p50).c_str(), ratio(r.p99, &FanoutRun::p99).c_str(),
              ratio(r.p999, &FanoutRun::p999).c_str(), r.rss_before, r.rss_after,
              static_cast<double>(r.send_hwm) * mean_message / 1048576.0);
  std::fflush(stdout);
}

void slow_subscriber_runs(const Options& o, const CallClock& clock, const char* transport,
                          bool curve);

}  // namespace

void fanout_phase(const Options& o, const CallClock& clock) {
  std::printf(
      "\n== Fan-out: %s calls/s offered by one producer for %.1f s into a publisher with N "
      "subscriber processes,\n"
      "   on loopback tcp and ipc, plain and CURVE; shape %s; the default queue and send "
      "high-water mark (%u messages);\n"
      "   each subscriber's receive high-water mark is the same; connected: the publisher's "
      "subscribers gauge;\n"
      "   delivered/s: events each subscriber received per second (min, median) and all of "
      "them; share: the\n"
      "   events it received of those published (min, median); gaps: sequence numbers the "
      "subscribers missed;\n"
      "   CPU-s/M: the publisher process's CPU (producer included) per million events; IO, "
      "pub: busy share of\n"
      "   libzmq's I/O thread and of kv-events-pub; latency per call and its ratio to the "
      "1-subscriber row of the\n"
      "   same transport and security; RSS MB before -> after; HWM MB: what the send "
      "high-water mark can hold per\n"
      "   subscriber (messages x their mean size). After each transport and security: a run "
      "at %s calls/s, then\n"
      "   the same with a slow subscriber (+slow): subscriber 0 (receive high-water mark 100) "
      "stops reading for the\n"
      "   first seconds of the run (at least %.1f s, as long as the row above's message rate "
      "needs to overflow the\n"
      "   send high-water mark and 8 MiB of socket buffers); slow: its gaps / share / pause (the "
      "messages dropped\n"
      "   while it drained its backlog at the end of the run show in its share, not as a gap: "
      "no later message came); the "
      "other columns are the\n"
      "   others', the latency ratios to the row above. Load average %s\n\n",
      si(o.fanout_rate).c_str(), o.fanout_seconds, workload().describe().c_str(),
      kv::Config().send_hwm, si(o.slow_rate).c_str(), o.slow_pause, loadavg().c_str());
  std::printf(
      "%-10s %7s %9s %4s %10s %10s %10s %7s %7s %6s %14s %8s %6s %6s %9s %9s %9s %6s %6s "
      "%6s %16s %7s\n",
      "transport", "calls/s", "subs", "conn", "min/s", "median/s", "total/s", "min%", "med%",
      "gaps", "slow", "CPU-s/M", "IO", "pub", "p50", "p99", "p99.9", "x50", "x99", "x99.9",
      "RSS MB", "HWM MB");
  for (const char* transport : {"tcp", "ipc"}) {
    for (const bool curve : {false, true}) {
      std::optional<FanoutRun> one;
      for (const int count : o.fanout) {
        const FanoutRun run = measure_fanout(o, clock, transport, curve, count, o.fanout_rate, 0);
        if (count == 1) one = run;
        print_fanout(run, one ? &*one : nullptr);
      }
      slow_subscriber_runs(o, clock, transport, curve);
    }
  }
}

namespace {

// One subscriber that stops reading among 16 (or the largest count asked), at a rate the
// others keep up with: a run without it, then one with it, stopped long enough to overflow
// the publisher's send high-water mark and the kernel's socket buffers at the message rate
// the first run measured.
void slow_subscriber_runs(const Options& o, const CallClock& clock, const char* transport,
                          bool curve) {
  const bool has16 = std::find(o.fanout.begin(), o.fanout.end(), 16) != o.fanout.end();
  const int count = has16 ? 16 : *std::max_element(o.fanout.begin(), o.fanout.end());
  if (count < 2) return;
  const FanoutRun steady = measure_fanout(o, clock, transport, curve, count, o.slow_rate, 0);
  print_fanout(steady, nullptr);
  const double messages_per_second = static_cast<double>(steady.batches) / steady.seconds;
  uint64_t bytes = 0, messages = 0;
  for (const SubscriberCounts& c : steady.counts) bytes += c.payload_bytes, messages += c.messages;
  const double mean_message = messages ? static_cast<double>(bytes) / messages : 1;
  const double to_overflow =
      static_cast<double>(kv::Config().send_hwm) + 100 + 8.0 * 1048576 / mean_message;
  const double pause =
      std::min(o.slow_pause_max,
               std::max(o.slow_pause, 1.25 * to_overflow / std::max(1.0, messages_per_second)));
  print_fanout(measure_fanout(o, clock, transport, curve, count, o.slow_rate, pause), &steady);
}

}  // namespace

}  // namespace kv_events_bench
