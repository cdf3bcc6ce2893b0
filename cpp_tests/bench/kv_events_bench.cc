// kv_events_bench: the C++ benchmark of the hot path and the publishing thread, through
// include/mooncake/kv_events.h.
//
// Drives the publisher from N producer threads with a subscriber in another process (this
// program re-executed with --subscriber), every call carrying the tenant, key and group of one
// key shape (--shape, a line of shapes.tsv: the synthetic 64-byte key, vLLM's and SGLang's key
// formats, the largest call that never allocates, a 1 KiB key), and prints, in one run:
//   - hot path: on_put_commit latency for 1, 2 and 4 producers at a paced rate
//     the publisher sustains, against an in-run baseline of the mutex + condition variable +
//     deque design (baseline_publisher.h), as ratios;
//   - publishing thread: events/s delivered to the SUB on tcp loopback, against plain libzmq
//     sending pre-encoded batches of the same bytes (a PUB, and an XPUB that never drops),
//     as ratios, with the CPU per event of each thread;
//   - the highest offered rate sustained with no drop and no gap at the default capacity;
//   - CPU-seconds per million published events (this process only);
//   - memory: a full default queue, and RSS over a flood;
//   - the burst of a RemoveAll: a million removals flat out, how much of it arrives and when;
//   - a flat-out burst: 200,000 timed calls as fast as 1 and 2 producers can make them into a
//     fresh publisher's default queue, which fills: the latency of calls at any queue depth;
//   - fan-out: 1, 4, 16 and 64 subscriber processes on tcp and ipc, plain and CURVE, and one
//     slow subscriber among 16: delivered rates, shares, CPU, memory, callers' latency.
// It reports; it asserts nothing about time. `--smoke` (a ctest) checks only that every phase
// runs and the subscriber received events. `--syscall-probe` is the producer loop alone, for
//
// This file holds main(). The phases are in bench_memory.cc, bench_hot_path.cc,
// bench_publishing.cc and bench_fanout.cc (declared in bench_phases.h), what they share (the
// workload, the machine, the publishers under test, the producer loops, the printing) in
// bench_common.h, the command line in bench_options.h.

#include <signal.h>

#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "bench_clock.h"
#include "bench_common.h"
#include "bench_options.h"
#include "bench_phases.h"
#include "bench_subscriber.h"

int main(int argc, char** argv) {
  using namespace kv_events_bench;
  if (argc >= 2 && std::string(argv[1]) == "--subscriber") {
    SubscriberOptions options;
    if (!options.parse(argc - 1, argv + 1)) usage("--subscriber EP [--rcvhwm N] [--curve S P K]");
    return run_subscriber(options);
  }
  signal(SIGPIPE, SIG_IGN);
  const Options o = parse(argc, argv);
  build_workload(o.shape.empty() ? shapes().front() : *find_shape(o.shape));
  try {
    if (o.syscall_probe) return syscall_probe(o);

    const CallClock clock = CallClock::create(o.tsc);
    std::printf("kv_events_bench (%s mode)\n", o.mode.c_str());
    std::printf("machine: %u CPUs, %s; load average %s at start\n",
                std::thread::hardware_concurrency(), cpu_model().c_str(), loadavg().c_str());
    std::printf("clock: %s; one begin/end pair costs %.0f ns (min) / %.0f ns (median)\n",
                clock.describe().c_str(), clock.overhead_min_ns, clock.overhead_p50_ns);
    std::printf(
        "subscribers: one child process per publisher (ZeroMQ SUB, RCVHWM 200000), "
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
    std::fflush(stdout);
    if (wants(o, "burst")) burst_phase(o, clock);
    std::fflush(stdout);
    if (wants(o, "fanout")) fanout_phase(o, clock);
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
