// What operators see from C++: log lines in the master's sink, and metrics that agree with
// stats().

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test_support.h"

namespace {

using kv_events_test::enabled_config;
namespace kv = mooncake::kv_events;
using kv::Medium;

struct Line {
  kv::LogLevel level;
  std::string text;
};

// Captures every line of the library while alive; restores the default sink after.
class CapturedLog {
 public:
  CapturedLog() {
    kv::set_log_sink([this](kv::LogLevel level, std::string_view text) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back({level, std::string(text)});
    });
  }
  ~CapturedLog() { kv::set_log_sink(nullptr); }

  bool contains(kv::LogLevel level, const std::string& needle) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Line& line : lines_) {
      if (line.level == level && line.text.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  std::mutex mutex_;
  std::vector<Line> lines_;
};

TEST(Logs, TheEffectiveConfigAndTheKeylessWarningReachTheMastersSink) {
  CapturedLog log;
  kv::Config config = enabled_config();
  config.emit_object_key = false;
  config.model_name = "llama";
  auto publisher = kv::Publisher::create(config);
  publisher.reset();
  EXPECT_TRUE(log.contains(kv::LogLevel::kInfo, "bind_endpoint=\"" + config.bind_endpoint + "\""));
  EXPECT_TRUE(log.contains(kv::LogLevel::kInfo, "model_name=\"llama\""));
  EXPECT_TRUE(log.contains(kv::LogLevel::kWarning, "kv_events_emit_object_key=false"));
  EXPECT_TRUE(log.contains(kv::LogLevel::kInfo, "publisher stopped"));
}

TEST(Logs, ASinkThatThrowsDoesNotReachTheCaller) {
  kv::set_log_sink([](kv::LogLevel, std::string_view) { throw std::runtime_error("sink"); });
  EXPECT_NO_THROW(kv::Publisher::create(enabled_config()));
  kv::set_log_sink(nullptr);
}

// name -> value of every sample in a Prometheus text page.
std::map<std::string, uint64_t> samples(const std::string& text) {
  std::map<std::string, uint64_t> values;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.find(' ');
    values[line.substr(0, space)] = std::stoull(line.substr(space + 1));
  }
  return values;
}

TEST(Metrics, EveryCounterAgreesWithStats) {
  kv::Config config = enabled_config();
  config.queue_capacity = 4;
  auto publisher = kv::Publisher::create(config);
  for (int i = 0; i < 10000; ++i) {
    publisher->on_put_commit("t", "key-" + std::to_string(i), "", {Medium::kCpu});
  }
  publisher->on_put_commit("t", "", "", {Medium::kCpu});               // keyless
  publisher->on_remove_all(publisher->begin_remove_all(), "t", 0, 0);  // suppressed
  ASSERT_TRUE(publisher->flush(std::chrono::seconds(10)));
  // Into the emptied queue, so that it is not dropped: skipped, one per event.
  publisher->on_put_commit("t", std::string("k\xff", 2), "", {Medium::kCpu, Medium::kDisk});
  ASSERT_TRUE(publisher->flush(std::chrono::seconds(10)));
  const kv::Stats stats = publisher->stats();
  const std::string text = publisher->metrics_text();
  const auto values = samples(text);
  const std::string p = "mooncake_kv_events_";
  EXPECT_EQ(values.at(p + "enabled"), 1u);
  EXPECT_EQ(values.at(p + "published_batches_total"), stats.published_batches);
  EXPECT_EQ(values.at(p + "published_events_total"), stats.published_events);
  EXPECT_EQ(values.at(p + "dropped_events_total"), stats.dropped_events);
  EXPECT_EQ(values.at(p + "skipped_keyless_events_total"), 1u);
  EXPECT_EQ(values.at(p + "cleared_suppressed_total"), 1u);
  EXPECT_EQ(values.at(p + "queue_capacity"), 4u);
  EXPECT_EQ(values.at(p + "next_sequence"), stats.next_sequence);
  EXPECT_EQ(values.at(p + "refused_handshakes_total"), 0u);
  EXPECT_EQ(values.at(p + "connections_refused_total"), stats.connections_refused);
  EXPECT_EQ(values.at(p + "subscriptions_refused_total"), stats.subscriptions_refused);
  EXPECT_EQ(values.at(p + "replay_buffer_bytes"), 0u);  // no replay socket configured
  // The incarnation rides in a label: a sample's float would round a 64-bit id.
  EXPECT_NE(stats.incarnation, 0u);
  EXPECT_EQ(values.at(p + "incarnation_info{incarnation=\"" + std::to_string(stats.incarnation) +
                      "\"}"),
            1u);
  EXPECT_EQ(values.at(p + "subscribers"), stats.subscribers);
  EXPECT_EQ(values.at(p + "invalid_media_calls_total"), 0u);
  EXPECT_EQ(stats.skipped_non_utf8_events, 2u);
  EXPECT_EQ(values.at(p + "skipped_non_utf8_events_total"), 2u);
  // The build: a sample whose labels name the versions and CURVE.
  const std::string build = p + "build_info{version=\"" +
                            std::to_string(MOONCAKE_KV_EVENTS_VERSION_MAJOR) + "." +
                            std::to_string(MOONCAKE_KV_EVENTS_VERSION_MINOR) + "." +
                            std::to_string(MOONCAKE_KV_EVENTS_VERSION_PATCH) + "\",libzmq=\"";
  const auto build_line = values.lower_bound(build);
  ASSERT_NE(build_line, values.end()) << text;
  EXPECT_EQ(build_line->first.rfind(build, 0), 0u) << text;
  EXPECT_EQ(build_line->second, 1u);
  // One sample per field of the stats list, and build_info.
#define KV_EVENTS_TEST_ONE_(name, kind, help) +1
  constexpr size_t kFields = 0 KV_EVENTS_STATS_FIELDS(KV_EVENTS_TEST_ONE_);
#undef KV_EVENTS_TEST_ONE_
  EXPECT_EQ(values.size(), kFields + 1) << text;
  EXPECT_NE(text.find("# TYPE mooncake_kv_events_dropped_events_total counter\n"),
            std::string::npos);
}

}  // namespace
