// The OFF build: the stub behind the same header. No Rust and no ZeroMQ are linked; every
// publisher, even from an enabled config, is one whose calls do nothing.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mooncake/kv_events.h"

namespace kv = mooncake::kv_events;
using kv::Medium;

namespace {

kv::Config enabled_config() {
  kv::Config config;
  config.enable_kv_events = true;
  config.bind_endpoint = "tcp://127.0.0.1:5557";
  config.backend_id = "store-a";
  return config;
}

TEST(Stub, AnEnabledConfigGivesAPublisherThatDoesNothing) {
  const auto publisher = kv::Publisher::create(enabled_config());
  ASSERT_NE(publisher, nullptr);
  EXPECT_FALSE(publisher->enabled());
  publisher->on_put_commit("t", "k", "g", {Medium::kCpu, Medium::kDisk});
  publisher->on_medium_delta("t", "k", "g", {Medium::kCpu}, {Medium::kDisk});
  publisher->on_remove_all(publisher->begin_remove_all(), "t", 1, 0);
  const kv::Stats stats = publisher->stats();
  EXPECT_FALSE(stats.enabled);
  EXPECT_EQ(stats.published_events, 0u);
  EXPECT_EQ(stats.skipped_keyless_events, 0u);
  EXPECT_EQ(stats.dropped_events, 0u);
  EXPECT_TRUE(publisher->flush(std::chrono::seconds(1)));
  publisher->shutdown();
}

TEST(Stub, CreateNeverThrowsEvenForAnInvalidConfig) {
  kv::Config config = enabled_config();
  config.bind_endpoint.clear();
  config.backend_id.clear();
  config.queue_capacity = 0;
  config.model_name = "\xff\xfe";
  EXPECT_NO_THROW(kv::Publisher::create(config));
  // Two "publishers" on one endpoint: nothing is bound, nothing conflicts.
  EXPECT_NO_THROW({
    auto a = kv::Publisher::create(enabled_config());
    auto b = kv::Publisher::create(enabled_config());
  });
}

TEST(Stub, StatusJsonSaysEventsWereNotBuiltIn) {
  const std::string json = kv::Publisher::create(enabled_config())->status_json();
  EXPECT_NE(json.find("\"built_with_kv_events\":false"), std::string::npos) << json;
  EXPECT_NE(json.find("\"enabled\":false"), std::string::npos) << json;
}

}  // namespace

namespace {

TEST(Stub, MetricsSayDisabled) {
  const auto publisher = kv::Publisher::create(enabled_config());
  EXPECT_NE(publisher->metrics_text().find("\nmooncake_kv_events_enabled 0\n"), std::string::npos);
}

// An operator who turned events on in a master built without them learns it from the log,
// once per publisher created; a master that did not ask hears nothing.
TEST(Stub, AnEnabledConfigIsReportedOnceAsAWarning) {
  std::vector<std::pair<kv::LogLevel, std::string>> lines;
  kv::set_log_sink([&lines](kv::LogLevel level, std::string_view line) {
    lines.emplace_back(level, std::string(line));
  });
  static_cast<void>(kv::Publisher::create(kv::Config{}));
  EXPECT_TRUE(lines.empty()) << "a disabled config is not worth a line";

  const auto publisher = kv::Publisher::create(enabled_config());
  publisher->on_put_commit("t", "k", "g", {Medium::kCpu});
  publisher->shutdown();
  kv::set_log_sink(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].first, kv::LogLevel::kWarning);
  EXPECT_NE(lines[0].second.find("enable_kv_events"), std::string::npos) << lines[0].second;
  EXPECT_NE(lines[0].second.find("ENABLE_KV_EVENTS=OFF"), std::string::npos) << lines[0].second;
}

// This build serves no snapshot: a master's source is accepted, destroyed at once, and there
// is no snapshot to add to.
TEST(Stub, AnObjectSourceIsAcceptedAndDroppedAtOnce) {
  const auto publisher = kv::Publisher::create(enabled_config());
  const auto held = std::make_shared<int>(0);
  publisher->set_object_source([held](std::optional<std::string_view>, kv::Snapshot&) {});
  EXPECT_EQ(held.use_count(), 1);
  EXPECT_EQ(kv_events_snapshot_add(nullptr, "t", 1, "k", 1, "", 0, KV_EVENTS_MEDIUM_CPU),
            KV_EVENTS_ERR_INVALID_ARGUMENT);
}

}  // namespace
