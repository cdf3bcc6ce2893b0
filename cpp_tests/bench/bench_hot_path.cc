// kv_events_bench's hot path: what a call costs the master's thread that makes it. Phase 1,
// calls paced at a rate the publisher sustains, against the baseline; phase 7, calls flat out
// into a queue that fills; and --syscall-probe, the producer loop alone, for
// scripts/bench_syscalls.sh to run under strace.

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
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
// Phase 1: the hot path

namespace {

struct LatencyRun {
  double p50 = 0, p99 = 0, p999 = 0, max = 0;  // ns
  uint64_t calls = 0;
  double offered = 0;  // calls/s achieved by the producers
  uint64_t dropped = 0, missing = 0, delivered = 0;
  double cpu_per_m = 0;             // process CPU-s per million published events
  double publishing_cpu_per_m = 0;  // the same without the producer threads' own CPU
};

// One latency measurement of `library` or `baseline` (the other is null) with `threads`
// producers.
LatencyRun measure_latency(const Options& o, const CallClock& clock, Target& target,
                           SubscriberProcess& subscriber, int threads, kv::Publisher* library,
                           BaselinePublisher* baseline) {
  target.flush();
  subscriber.sync(target.next_sequence());
  const uint64_t dropped0 = target.dropped();
  const double per_thread = o.rate / threads;
  const size_t room = static_cast<size_t>(per_thread * o.phase_seconds * 1.25) + 4096;
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
  const SubscriberCounts counts = subscriber.report(target.next_sequence());

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

}  // namespace

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
      workload().describe().c_str(), si(o.rate).c_str(), o.period_us, o.runs, o.phase_seconds);

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

  std::printf("%-8s %-10s %9s %9s %9s %9s %9s %11s %7s %6s %8s %8s\n", "threads", "publisher",
              "p50", "p99", "p99.9", "max", "calls", "offered/s", "drops", "gaps", "CPU-s/M",
              "pub-side");
  for (int threads : o.threads) {
    std::vector<LatencyRun> ours, base;
    for (int r = 0; r < o.runs; ++r) {
      ours.push_back(
          measure_latency(o, clock, library_t, *library_sub, threads, library.get(), nullptr));
      if (baseline) {
        base.push_back(
            measure_latency(o, clock, baseline_t, *baseline_sub, threads, nullptr, baseline.get()));
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
// Phase 7: a flat-out burst

// Calls as fast as the producers can make them, timed one by one, with no pacing: a RemoveAll
// of a large tenant or any flood. The producers offer several million calls a second, the
// publishing thread takes about two, so a burst of 200,000 calls fills the default queue and
// the later calls meet it full (each pushes out the oldest): what the paced latency phase never
// shows. Each run creates a publisher, attaches a subscriber, makes the burst (first: into
// memory the publisher has not used yet), flushes, and makes the same burst again (second).

namespace {

struct BurstRun {
  double p50 = 0, p99 = 0, p999 = 0, max = 0;  // ns
  uint64_t calls = 0;
  double offered = 0;      // calls/s: calls / the producers' wall time
  uint64_t depth = 0;      // queue depth as the producers finished
  uint64_t slow = 0;       // calls over 5 us
  uint64_t preempted = 0;  // the producers' involuntary context switches
  uint64_t dropped = 0, missing = 0, delivered = 0;
  double rss_before = 0, rss_after = 0;  // MB, before the burst and as it ended
};

// Involuntary context switches of the calling thread so far: the times it was preempted.
uint64_t preemptions() {
  rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return static_cast<uint64_t>(usage.ru_nivcsw);
}

template <bool kTsc, class Call>
void flat_out_producer(Call& call, uint64_t calls, size_t key_offset, Timed& out,
                       uint64_t& preempted) {
  const uint64_t preempted0 = preemptions();
  const std::vector<std::string>& k = keys();
  uint32_t* samples = out.ticks.data();
  size_t key = key_offset;
  for (uint64_t n = 0; n < calls; ++n) {
    const std::string_view object_key = k[key++ & (kKeys - 1)];
    const uint64_t t0 = kTsc ? tsc_begin() : steady_ns();
    call(object_key);
    const uint64_t t1 = kTsc ? tsc_end() : steady_ns();
    const uint64_t d = t1 - t0;
    samples[n] = d > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(d);
  }
  out.calls = calls;
  preempted = preemptions() - preempted0;
}

BurstRun measure_burst(const Options& o, const CallClock& clock, kv::Publisher& library,
                       Target& target, SubscriberProcess& subscriber, int threads) {
  target.flush();
  subscriber.sync(target.next_sequence());
  const uint64_t dropped0 = target.dropped();
  std::vector<Timed> timed(threads);
  for (int i = 0; i < threads; ++i) {
    // Shared out evenly; touched now, not during the burst.
    const uint64_t share =
        o.burst_calls / threads + (static_cast<uint64_t>(i) < o.burst_calls % threads);
    timed[i].ticks.assign(share, 0);
  }
  BurstRun run;
  run.rss_before = rss_mb();
  std::vector<uint64_t> spans(threads), preempted(threads);
  run_threads(threads, [&](int i) {
    const std::string_view tenant = workload().tenant, group = workload().group;
    kv::Publisher* p = &library;
    auto call = [p, tenant, group](std::string_view key) {
      p->on_put_commit(tenant, key, group, kCpu);
    };
    const size_t offset = static_cast<size_t>(i) * 997;
    const uint64_t start = steady_ns();
    if (clock.tsc) {
      flat_out_producer<true>(call, timed[i].ticks.size(), offset, timed[i], preempted[i]);
    } else {
      flat_out_producer<false>(call, timed[i].ticks.size(), offset, timed[i], preempted[i]);
    }
    spans[i] = steady_ns() - start;
  });
  run.depth = library.stats().queue_depth;
  run.rss_after = rss_mb();
  target.flush();
  const SubscriberCounts counts = subscriber.report(target.next_sequence());
  std::vector<uint32_t> all;
  for (const Timed& t : timed) {
    all.insert(all.end(), t.ticks.begin(), t.ticks.end());
    run.calls += t.calls;
  }
  std::sort(all.begin(), all.end());
  run.p50 = clock.to_ns(static_cast<uint64_t>(percentile(all, 0.50)));
  run.p99 = clock.to_ns(static_cast<uint64_t>(percentile(all, 0.99)));
  run.p999 = clock.to_ns(static_cast<uint64_t>(percentile(all, 0.999)));
  run.max = all.empty() ? 0 : clock.to_ns(all.back());
  for (uint32_t ticks : all) run.slow += clock.to_ns(ticks) > 5000;
  for (uint64_t p : preempted) run.preempted += p;
  const uint64_t span = *std::max_element(spans.begin(), spans.end());
  run.offered = span ? static_cast<double>(run.calls) * 1e9 / static_cast<double>(span) : 0;
  run.dropped = target.dropped() - dropped0;
  run.missing = counts.missing;
  run.delivered = counts.events;
  expect_events("burst", counts);
  return run;
}

}  // namespace

void burst_phase(const Options& o, const CallClock& clock) {
  std::printf(
      "\n== Flat-out burst: %s timed on_put_commit calls in all, shared by the producers, no "
      "pacing, into the\n"
      "   default queue (65536 calls), subscriber attached; shape %s;\n"
      "   each of %d run(s): a new publisher, the burst (first), a flush, the burst again "
      "(second); medians of the runs;\n"
      "   latency per call as timed by the clock above (its overhead included); >5us: calls "
      "over 5 us; preempted: the\n"
      "   producers' involuntary context switches (each makes one call slow); depth: the "
      "queue's as the producers finished;\n"
      "   drops: calls pushed out of the full queue; RSS: MB before the burst -> as it ended; "
      "load average %s\n\n",
      si(static_cast<double>(o.burst_calls)).c_str(), workload().describe().c_str(), o.runs,
      loadavg().c_str());
  std::printf("%-8s %-7s %9s %9s %9s %9s %6s %9s %9s %11s %7s %8s %6s  %s\n", "threads", "burst",
              "p50", "p99", "p99.9", "max", ">5us", "preempted", "calls", "offered/s", "depth",
              "drops", "gaps", "RSS MB");
  for (int threads : o.burst_threads) {
    std::vector<BurstRun> first, second;
    for (int r = 0; r < o.runs; ++r) {
      std::string endpoint;
      auto library = create_library(65536, endpoint);
      Target t = library_target(*library);
      auto subscriber = attach(endpoint, t);
      first.push_back(measure_burst(o, clock, *library, t, *subscriber, threads));
      second.push_back(measure_burst(o, clock, *library, t, *subscriber, threads));
    }
    auto row = [&](const char* name, const std::vector<BurstRun>& runs) {
      auto med = [&](double BurstRun::*field) {
        std::vector<double> v;
        for (const BurstRun& r : runs) v.push_back(r.*field);
        return median(v);
      };
      auto med_count = [&](uint64_t BurstRun::*field) {
        std::vector<double> v;
        for (const BurstRun& r : runs) v.push_back(static_cast<double>(r.*field));
        return median(v);
      };
      std::printf(
          "%-8d %-7s %9s %9s %9s %9s %6.0f %9.0f %9.0f %11s %7.0f %8.0f %6.0f  %.1f -> "
          "%.1f\n",
          threads, name, ns_text(med(&BurstRun::p50)).c_str(), ns_text(med(&BurstRun::p99)).c_str(),
          ns_text(med(&BurstRun::p999)).c_str(), ns_text(med(&BurstRun::max)).c_str(),
          med_count(&BurstRun::slow), med_count(&BurstRun::preempted), med_count(&BurstRun::calls),
          si(med(&BurstRun::offered)).c_str(), med_count(&BurstRun::depth),
          med_count(&BurstRun::dropped), med_count(&BurstRun::missing), med(&BurstRun::rss_before),
          med(&BurstRun::rss_after));
    };
    row("first", first);
    row("second", second);
  }
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
    auto call = [&library, tenant = workload().tenant, group = workload().group](
                    std::string_view key) { library->on_put_commit(tenant, key, group, kCpu); };
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
  std::printf("\npublished_events %" PRIu64 "\ndropped_events %" PRIu64 "\ndropped_in_loop %" PRIu64
              "\nsubscriber_pid %d\n",
              s.published_events, s.dropped_events, s.dropped_events - dropped_before,
              static_cast<int>(subscriber->pid()));
  return 0;
}

}  // namespace kv_events_bench
