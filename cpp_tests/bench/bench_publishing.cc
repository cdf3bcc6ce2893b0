// kv_events_bench's publishing thread: phase 2, events/s delivered against plain libzmq sending
// the same bytes (and the baseline); phase 3, the highest offered rate sustained with no drop
// at the default capacity; phase 6, the burst of a RemoveAll.

#include <pthread.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "bench_phases.h"

namespace kv_events_bench {

// ---------------------------------------------------------------------------------------------
// Phase 2: the publishing thread against a plain libzmq PUB

namespace {

struct ThroughputResult {
  std::string name;
  uint64_t events = 0;      // handed to the socket
  double seconds = 0;       // from the first call until everything was handed over
  uint64_t dropped = 0;     // by the publisher's queue (the producer backs off: expect 0)
  SubscriberCounts counts;  // what the subscriber process received
  double cpu_per_m = 0;     // this process's CPU-s per million events handed over
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

void print_throughput(const ThroughputResult& r) {
  const double handed = r.seconds > 0 ? static_cast<double>(r.events) / r.seconds : 0;
  std::printf("%-16s %10" PRIu64 " %11s %13s %10" PRIu64 " %10" PRIu64 " %6" PRIu64 " %10" PRIu64
              " %9.2f\n",
              r.name.c_str(), r.events, si(handed).c_str(),
              si(r.counts.delivered_per_second()).c_str(), r.counts.events,
              r.events > r.counts.events ? r.events - r.counts.events : 0, r.dropped,
              r.counts.max_payload, r.cpu_per_m);
}

// One producer makes calls as fast as it can for `seconds`, napping 50 us at a time while
// the queue holds more than half of `capacity` until it is down to a quarter: the publishing
// thread always has work and the queue never overflows.
ThroughputResult publisher_throughput(double seconds, Target& target, SubscriberProcess& subscriber,
                                      const std::function<uint64_t()>& published,
                                      const std::function<uint64_t()>& depth, uint64_t capacity) {
  ThroughputResult r;
  r.name = target.name;
  target.flush();
  subscriber.sync(target.next_sequence());
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
    do {  // one round at least: a thread started late still publishes
      for (int i = 0; i < 256; ++i) target.call(k[key++ & (kKeys - 1)]);
      if (depth() > capacity / 2) {
        while (depth() > capacity / 4 && steady_ns() < end) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
    } while (steady_ns() < end);
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
  r.counts = subscriber.report(target.next_sequence());
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
  uint64_t next = 0;  // the sequence of the next message: the first is 0, as the library's
  auto send = [&] {
    const uint64_t sequence = next++;
    unsigned char s[8];
    for (int i = 0; i < 8; ++i) s[i] = static_cast<unsigned char>(sequence >> (56 - 8 * i));
    zmq_send(socket, "", 0, ZMQ_SNDMORE);
    zmq_send(socket, s, sizeof s, ZMQ_SNDMORE);
    zmq_send(socket, payload.data(), payload.size(), 0);
  };
  {
    SubscriberProcess subscriber(self_exe(), SubscriberOptions{endpoint});
    if (!subscriber.wait_joined(send, std::chrono::seconds(10))) {
      throw std::runtime_error("the subscriber did not join the raw PUB");
    }
    subscriber.sync(next);
    const double cpu0 = process_cpu_seconds();
    const std::map<std::string, double> threads0 = cpu_by_thread_name();
    const uint64_t t0 = steady_ns();
    const uint64_t end = t0 + static_cast<uint64_t>(seconds * 1e9);
    uint64_t messages = 0;
    do {  // one round at least, as the library's producer
      for (int i = 0; i < 16; ++i) send();
      messages += 16;
    } while (steady_ns() < end);
    r.seconds = static_cast<double>(steady_ns() - t0) / 1e9;
    r.thread_cpu = cpu_delta(threads0, cpu_by_thread_name());
    r.events = messages * events_per_message;
    r.counts = subscriber.report(next);
    r.cpu_per_m = (process_cpu_seconds() - cpu0) / (static_cast<double>(r.events) / 1e6);
  }
  zmq_close(socket);
  zmq_ctx_term(context);
  return r;
}

}  // namespace

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
  const uint64_t timestamp_ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  write_baseline_batch(writer, baseline_config(0), timestamp_ms, events.data(), events.size(), id);
  const ThroughputResult raw = raw_zmq_throughput(o.throughput_seconds, writer.out(), 64, false);
  print_throughput(raw);
  expect_events("throughput raw", raw.counts);
  const ThroughputResult nodrop = raw_zmq_throughput(o.throughput_seconds, writer.out(), 64, true);
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
  for (const ThroughputResult* r :
       std::initializer_list<const ThroughputResult*>{&ours, &raw, &nodrop, &base}) {
    print_thread_cpu(*r);
  }
  const double raw_rate = std::max(1.0, raw.counts.delivered_per_second());
  const double nodrop_rate = std::max(1.0, nodrop.counts.delivered_per_second());
  std::printf(
      "\ndelivered/s as a fraction of the raw PUB's / of the raw XPUB nodrop's: "
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
    subscriber->sync(t.next_sequence());
    const uint64_t dropped0 = t.dropped();
    const double cpu0 = process_cpu_seconds();
    const uint64_t start = steady_ns() + 5000000;
    const uint64_t end = start + static_cast<uint64_t>(o.duration * 1e9);
    uint64_t calls = 0;
    run_threads(1, [&](int) {
      auto call = [&library, tenant = workload().tenant, group = workload().group](
                      std::string_view key) { library->on_put_commit(tenant, key, group, kCpu); };
      calls = untimed_producer(call, rate, o.period_us, start, end, UINT64_MAX, 0);
    });
    const double achieved = static_cast<double>(calls) / o.duration;
    t.flush();
    const double cpu = process_cpu_seconds() - cpu0;
    const SubscriberCounts counts = subscriber->report(t.next_sequence());
    const uint64_t dropped = t.dropped() - dropped0;
    const bool held = dropped == 0 && counts.missing == 0;
    // The producer's sleeps overshoot on a busy machine; past 10% short, the rate asked for
    // was not offered and the search stops there.
    const bool producer_short = achieved < 0.9 * rate;
    const double cpu_per_m = cpu / (static_cast<double>(calls) / 1e6);
    std::printf("%12s %12s %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %9.2f  %s%s\n", si(rate).c_str(),
                si(achieved).c_str(), dropped, counts.missing, counts.events, cpu_per_m,
                held ? "held" : "lost events",
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
    std::printf(
        "\nhighest rate offered (as achieved) for %.1f s with zero drops and no gap: "
        "%s calls/s (%.2f CPU-s per million events, this process)\n",
        o.duration, si(best).c_str(), best_cpu);
  } else {
    std::printf("\nno offered rate held in this search\n");
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
  subscriber->sync(t.next_sequence());
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
  const SubscriberCounts counts = subscriber->report(after.next_sequence);
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
  const double delivered = per_second(static_cast<double>(counts.events), first_ns, counts.last_ns);
  const double tail_ms =
      counts.last_ns == 0
          ? 0
          : (static_cast<double>(counts.last_ns) - static_cast<double>(last_ns)) / 1e6;
  std::printf(
      "offered %s calls/s (%.1f ms of calls); delivered %s events/s; tail %.1f ms after the "
      "last call\n"
      "  %" PRIu64 " calls: %" PRIu64
      " received, %.2f%% not received = %.2f%% dropped by the "
      "queue (%" PRIu64 ") + %.2f%% lost after the socket (%" PRIu64
      ")\n"
      "  subscriber gaps: %" PRIu64
      " sequence numbers (one per event dropped by the queue, "
      "one per message lost)\n",
      si(offered).c_str(), static_cast<double>(last_ns - first_ns) / 1e6, si(delivered).c_str(),
      tail_ms, o.removeall_calls, counts.events,
      100.0 * (1.0 - static_cast<double>(counts.events) / calls),
      100.0 * static_cast<double>(dropped) / calls, dropped,
      100.0 * static_cast<double>(lost) / calls, lost, counts.missing);
  expect_events("removeall", counts);
}

}  // namespace kv_events_bench
