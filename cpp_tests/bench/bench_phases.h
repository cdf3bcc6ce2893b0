// The phases of kv_events_bench, each a function main() calls when --phases asks for it, in the
// order a run makes them (memory first, on an allocator no other phase has used yet), and
// --syscall-probe. Each prints what it measured; none asserts anything about time.
#pragma once

#include "bench_clock.h"
#include "bench_options.h"

namespace kv_events_bench {

// bench_memory.cc: a full default queue, and RSS over a flood.
void memory_phase(const Options& o);
void flood_phase(const Options& o);

// bench_hot_path.cc: what a call costs its caller, paced (against the baseline) and flat out
// into a full queue; the producer loop alone, for strace.
void latency_phase(const Options& o, const CallClock& clock);
void burst_phase(const Options& o, const CallClock& clock);
int syscall_probe(const Options& o);

// bench_publishing.cc: the publishing thread against plain libzmq, the highest rate sustained
// with no drop, the burst of a RemoveAll.
void throughput_phase(const Options& o);
void sustained_phase(const Options& o);
void removeall_phase(const Options& o);

// bench_fanout.cc: 1 to 64 subscriber processes on tcp and ipc, plain and CURVE, and a slow one.
void fanout_phase(const Options& o, const CallClock& clock);

}  // namespace kv_events_bench
