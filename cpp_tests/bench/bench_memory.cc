// kv_events_bench's memory: phase 4, what a publisher and a full default queue cost, and RSS
// while one producer floods the queue.

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "bench_phases.h"

namespace kv_events_bench {

// ---------------------------------------------------------------------------------------------
// Phase 4: memory

// Runs first, before other phases leave freed memory in the allocator for it to reuse.
void memory_phase(const Options& o) {
  const Workload& w = workload();
  std::printf(
      "\n== Memory: a full default queue (65536 calls), no subscriber (so ZeroMQ "
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
        w.shape->strings == "inline"   ? "ride in its slot"
        : w.shape->strings == "pooled" ? "take a pooled block"
                                       : "take a heap block of their own",
        full - before, per_slot + per_call - static_cast<double>(strings));
  }
}

// Runs after the steady phases: RSS of the process, sampled every second, while one thread
// floods the queue.
void flood_phase(const Options& o) {
  const Workload& w = workload();
  std::printf(
      "\n== RSS under a flood: default queue, one producer flat out, subscriber "
      "attached\n"
      "   shape %s\n\n",
      w.describe().c_str());
  {
    std::string endpoint;
    auto library = create_library(65536, endpoint);
    Target t = library_target(*library);
    auto subscriber = attach(endpoint, t);
    subscriber->sync(t.next_sequence());
    const double idle = rss_mb();
    std::atomic<bool> stop{false};
    uint64_t calls = 0;
    std::thread producer([&] {
      const std::vector<std::string>& k = keys();
      size_t i = 0;
      do {  // one round at least: a thread started after the samples still publishes
        for (int j = 0; j < 1024; ++j, ++i) {
          library->on_put_commit(w.tenant, k[i & (kKeys - 1)], w.group, kCpu);
        }
      } while (!stop.load(std::memory_order_relaxed));
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
    const SubscriberCounts counts = subscriber->report(t.next_sequence());
    std::printf(
        "flood %d s: RSS idle %.1f MB; sampled every second: first %.1f, last %.1f, "
        "max %.1f MB\n"
        "  %" PRIu64 " calls, %" PRIu64 " published, %" PRIu64
        " dropped (queue full); "
        "subscriber received %" PRIu64 " (%s/s), gaps %" PRIu64 "\n",
        seconds, idle, samples.front(), samples.back(),
        *std::max_element(samples.begin(), samples.end()), calls, stats.published_events,
        stats.dropped_events, counts.events, si(counts.delivered_per_second()).c_str(),
        counts.missing);
    expect_events("flood", counts);
  }
}

}  // namespace kv_events_bench
