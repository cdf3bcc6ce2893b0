// The header's value types and a disabled publisher: the same in the ON and the OFF build.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "mooncake/kv_events.h"

namespace kv = mooncake::kv_events;
using kv::Medium;
using kv::MediumSet;
using kv::ReplicaKind;

namespace {

// medium_of, section 2: memory is cpu, every other replica kind disk.
static_assert(kv::medium_of(ReplicaKind::kMemory) == Medium::kCpu);
static_assert(kv::medium_of(ReplicaKind::kDisk) == Medium::kDisk);
static_assert(kv::medium_of(ReplicaKind::kLocalDisk) == Medium::kDisk);
static_assert(kv::medium_of(ReplicaKind::kNofSsd) == Medium::kDisk);
static_assert(kv::medium_of(ReplicaKind::kDfs) == Medium::kDisk);

// MediumSet is a constexpr value.
static_assert(MediumSet().empty());
static_assert(MediumSet{Medium::kCpu}.contains(Medium::kCpu));
static_assert(!MediumSet{Medium::kCpu}.contains(Medium::kDisk));
static_assert(MediumSet{Medium::kCpu, Medium::kDisk} == MediumSet{Medium::kDisk, Medium::kCpu});
static_assert(MediumSet{Medium::kCpu} != MediumSet{Medium::kDisk});
static_assert(MediumSet{Medium::kDisk, Medium::kDisk}.bits() == 2);
static_assert(MediumSet{Medium::kCpu}.bits() == 1);
static_assert(MediumSet{Medium::kCpu, Medium::kDisk}.bits() == 3);
static_assert(MediumSet().add(ReplicaKind::kNofSsd) == MediumSet{Medium::kDisk});
static_assert(MediumSet::from_bits(0xff) == MediumSet{Medium::kCpu, Medium::kDisk});
static_assert(std::is_trivially_copyable_v<MediumSet>);
static_assert(std::is_trivially_copyable_v<kv::RemoveAllScan>);
static_assert(kv::RemoveAllScan().id() == 0);
static_assert(!std::is_copy_constructible_v<kv::Publisher>);

TEST(MediumSet, AddCollapsesReplicaKindsOntoTwoMedia) {
  MediumSet set;
  set.add(ReplicaKind::kDisk).add(ReplicaKind::kLocalDisk).add(ReplicaKind::kDfs);
  EXPECT_EQ(set, MediumSet{Medium::kDisk});
  set.add(ReplicaKind::kMemory);
  EXPECT_EQ(set, (MediumSet{Medium::kCpu, Medium::kDisk}));
  EXPECT_TRUE(set.contains(Medium::kCpu));
  EXPECT_FALSE(set.empty());
}

TEST(MediumSet, CopiesAreIndependentValues) {
  MediumSet a{Medium::kCpu};
  MediumSet b = a;
  b.add(Medium::kDisk);
  EXPECT_EQ(a, MediumSet{Medium::kCpu});
  EXPECT_NE(a, b);
}

TEST(Config, DefaultsAreTheMasterFlagDefaults) {
  const kv::Config c;
  EXPECT_FALSE(c.enable_kv_events);
  EXPECT_EQ(c.bind_endpoint, "");
  EXPECT_EQ(c.backend_id, "");
  EXPECT_EQ(c.model_name, "");
  EXPECT_EQ(c.block_size, 0u);
  EXPECT_EQ(c.additional_salt, "");
  EXPECT_EQ(c.lora_name, "");
  EXPECT_EQ(c.dp_rank, 0u);
  EXPECT_TRUE(c.emit_object_key);
  EXPECT_TRUE(c.emit_legacy_compat);
  EXPECT_EQ(c.queue_capacity, 65536u);
  EXPECT_FALSE(c.reannounce_remaining);
  EXPECT_EQ(c.non_utf8, "skip");
}

// The header's Config is expanded from the C API's list: kv_events_config_init's defaults and
// the list's kinds, strings as std::string.
TEST(Config, HasTheDefaultsAndKindsOfTheCApiList) {
  const kv::Config config;
  kv_events_config c;
  kv_events_config_init(&c, sizeof c);
#define KV_EVENTS_TEST_(type, name)                                                                \
  static_assert(std::is_same_v<decltype(kv::Config::name), type>);                                 \
  EXPECT_EQ(config.name, c.name) << #name;
#define KV_EVENTS_TEST_BOOL_(name, default_value) KV_EVENTS_TEST_(bool, name)
#define KV_EVENTS_TEST_U32_(name, default_value) KV_EVENTS_TEST_(uint32_t, name)
#define KV_EVENTS_TEST_U64_(name, default_value) KV_EVENTS_TEST_(uint64_t, name)
#define KV_EVENTS_TEST_STRING_(name, default_value)                                                \
  static_assert(std::is_same_v<decltype(kv::Config::name), std::string>);                          \
  EXPECT_EQ(config.name, c.name == nullptr ? "" : c.name) << #name;
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_TEST_BOOL_, KV_EVENTS_TEST_U32_, KV_EVENTS_TEST_U64_,
                          KV_EVENTS_TEST_STRING_)
}

// The header's Stats has the C struct's members, of its types, at zero.
TEST(Stats, HasTheMembersOfTheCApiListAtZero) {
  const kv::Stats stats;
#define KV_EVENTS_TEST_STAT_(name, kind, help)                                                     \
  static_assert(std::is_same_v<decltype(kv::Stats::name), decltype(kv_events_stats::name)>);       \
  EXPECT_EQ(stats.name, decltype(stats.name){}) << #name;
  KV_EVENTS_STATS_FIELDS(KV_EVENTS_TEST_STAT_)
}

void expect_zero(const kv::Stats& s) {
  EXPECT_FALSE(s.enabled);
  EXPECT_EQ(s.published_batches, 0u);
  EXPECT_EQ(s.published_events, 0u);
  EXPECT_EQ(s.dropped_events, 0u);
  EXPECT_EQ(s.skipped_keyless_events, 0u);
  EXPECT_EQ(s.cleared_suppressed, 0u);
  EXPECT_EQ(s.send_failures, 0u);
  EXPECT_EQ(s.queue_depth, 0u);
  EXPECT_EQ(s.queue_capacity, 0u);
  EXPECT_EQ(s.next_sequence, 0u);
  EXPECT_EQ(s.refused_handshakes, 0u);
  EXPECT_EQ(s.skipped_non_utf8_events, 0u);
}

TEST(Stats, DefaultIsDisabledAndZero) { expect_zero(kv::Stats{}); }

TEST(Config, WhoMayReadTheStreamDefaultsToTodaysPlainStream) {
  const kv::Config config;
  EXPECT_TRUE(config.curve_secret_key_file.empty());
  EXPECT_TRUE(config.curve_allow.empty());
  EXPECT_TRUE(config.null_allow_addresses.empty());
  EXPECT_EQ(config.ipc_mode, "0660");
}

TEST(DisabledPublisher, EveryCallReturnsAtOnceAndDoesNothing) {
  kv::Config config;          // enable_kv_events = false
  config.queue_capacity = 0;  // a disabled config is valid whatever it holds
  const auto publisher = kv::Publisher::create(config);
  ASSERT_NE(publisher, nullptr);
  EXPECT_FALSE(publisher->enabled());

  publisher->on_put_commit("t", "k", "g", {Medium::kCpu, Medium::kDisk});
  publisher->on_medium_delta("t", "k", "g", {Medium::kCpu}, {});
  publisher->on_put_commit("", "", "", {});
  const kv::RemoveAllScan scan = publisher->begin_remove_all();
  EXPECT_EQ(scan.id(), 0u);
  publisher->on_remove_all(scan, "t", 5, 0);

  expect_zero(publisher->stats());
  EXPECT_TRUE(publisher->flush(std::chrono::milliseconds(0)));
  EXPECT_NE(publisher->status_json().find("\"enabled\":false"), std::string::npos)
      << publisher->status_json();
  publisher->shutdown();
  publisher->shutdown();
  publisher->on_put_commit("t", "k", "g", {Medium::kCpu});
  expect_zero(publisher->stats());
}

TEST(DisabledPublisher, DropsAnObjectSourceAtOnce) {
  const auto publisher = kv::Publisher::create({});
  const auto held = std::make_shared<int>(0);
  publisher->set_object_source([held](std::optional<std::string_view>, kv::Snapshot&) {});
  EXPECT_EQ(held.use_count(), 1) << "a disabled publisher keeps no object source";
  publisher->set_object_source(nullptr);  // unregistering what is not there
}

TEST(DisabledPublisher, StatusJsonIsOneObjectWithEveryStatsField) {
  const std::string json = kv::Publisher::create({})->status_json();
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  for (const char* key : {"built_with_kv_events", "enabled", "published_batches",
                          "published_events", "dropped_events", "skipped_keyless_events",
                          "cleared_suppressed", "send_failures", "queue_depth", "queue_capacity",
                          "next_sequence", "refused_handshakes", "skipped_non_utf8_events"}) {
    EXPECT_NE(json.find(std::string("\"") + key + "\":"), std::string::npos) << key << json;
  }
}

}  // namespace
