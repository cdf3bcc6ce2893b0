// The C API as a C program uses it: c_calls.c (compiled as C) creates a publisher and makes
// each call; this driver reads the stream with a real SUB socket and the tests' own msgpack
// reader, and checks it event by event.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "from_c/c_calls.h"
#include "test_support.h"

namespace {

using kv_events_test::Batch;
using kv_events_test::Subscriber;
using kv_events_test::Value;

TEST(CApi, EachCallOfACProgramReachesTheStreamEventByEvent) {
  char failure[512] = "";
  const std::string endpoint = kv_events_test::unique_endpoint();
  kv_events_publisher* publisher = nullptr;
  ASSERT_EQ(c_calls_create(endpoint.c_str(), "c-store", &publisher, failure, sizeof failure), 0)
      << failure;
  Subscriber subscriber(endpoint);
  subscriber.wait_joined();
  ASSERT_EQ(c_calls_publish(publisher, failure, sizeof failure), 0) << failure;

  // c_calls_publish flushed: every message is on its way; read until all six events arrived.
  std::vector<Value> events;
  uint64_t expected_sequence = 0;  // the first message's
  while (events.size() < 6) {
    const auto message = subscriber.receive(std::chrono::seconds(10));
    ASSERT_TRUE(message.has_value()) << "only " << events.size() << " events arrived";
    const Batch batch = kv_events_test::parse(*message);
    EXPECT_EQ(batch.sequence, expected_sequence++);
    events.insert(events.end(), batch.events.begin(), batch.events.end());
  }
  EXPECT_FALSE(subscriber.receive(std::chrono::milliseconds(200)).has_value())
      << "a refused call published something";
  EXPECT_EQ(kv_events_test::summaries(events),
            (std::vector<std::string>{"stored cpu key\\x00bin", "stored disk key\\x00bin",
                                      "removed cpu k2", "stored cpu k3", "removed cpu k4",
                                      "cleared tenant-b"}));
  const std::vector<std::string> tenants = {"tenant-a", "tenant-a", "tenant-a",
                                            "default",  "tenant-b", "tenant-b"};
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].at("backend_id").as_str(), "c-store") << i;
    EXPECT_EQ(events[i].at("tenant_id").as_str(), tenants[i]) << i;
  }
  // The key with an embedded NUL is valid UTF-8: a str of all seven bytes.
  EXPECT_EQ(events[0].at("object_key").as_str(), std::string("key\0bin", 7));
  EXPECT_EQ(events[0].at("group_id").as_str(), "group-a");
  EXPECT_TRUE(events[3].at("group_id").is_nil()) << "NULL with length 0 is the empty group";

  ASSERT_EQ(c_calls_finish(publisher, failure, sizeof failure), 0) << failure;
}

// The events of one snapshot on `replay`, and its end map.
std::pair<std::vector<Value>, Value> snapshot(kv_events_test::ReplayClient& replay,
                                              std::vector<std::string> request) {
  replay.send(request);
  std::vector<Value> events;
  while (auto reply = replay.receive(std::chrono::seconds(10))) {
    EXPECT_EQ(reply->size(), 3u);
    const Value body = kv_events_test::decode(reply->at(2));
    if (reply->at(1) == "snapshot-end") return {events, body};
    EXPECT_EQ(reply->at(1), "snapshot");
    for (const Value& event : body.as_array().at(1).as_array()) events.push_back(event);
  }
  ADD_FAILURE() << "no snapshot-end";
  return {events, Value()};
}

TEST(CApi, AnObjectSourceWrittenInCServesSnapshotsAndIsReleasedOnce) {
  char failure[512] = "";
  const std::string endpoint = kv_events_test::unique_endpoint();
  const std::string replay_endpoint = kv_events_test::unique_endpoint();
  kv_events_config config;
  kv_events_config_init(&config, sizeof config);
  config.enable_kv_events = true;
  config.bind_endpoint = endpoint.c_str();
  config.backend_id = "c-store";
  config.replay_endpoint = replay_endpoint.c_str();
  kv_events_publisher* publisher = nullptr;
  ASSERT_EQ(kv_events_create(&config, sizeof config, &publisher, nullptr, 0), KV_EVENTS_OK);
  ASSERT_EQ(c_calls_register_source(publisher, failure, sizeof failure), 0) << failure;

  kv_events_test::ReplayClient replay(replay_endpoint);
  auto [events, end] = snapshot(replay, {"", "snapshot"});
  EXPECT_EQ(kv_events_test::summaries(events),
            (std::vector<std::string>{"stored cpu s1", "stored disk s1", "stored disk s2"}));
  EXPECT_EQ(events[0].at("tenant_id").as_str(), "tenant-a");
  EXPECT_EQ(events[0].at("group_id").as_str(), "g");
  EXPECT_EQ(events[2].at("tenant_id").as_str(), "default");
  EXPECT_TRUE(events[2].at("group_id").is_nil());
  EXPECT_EQ(end.at("objects").as_uint(), 2u);
  EXPECT_EQ(end.at("events").as_uint(), 3u);
  int calls = 0, refusals_ok = 0, released = 0;
  char tenant[64];
  c_calls_source_state(&calls, tenant, sizeof tenant, &refusals_ok, &released);
  EXPECT_EQ(calls, 1);
  EXPECT_STREQ(tenant, "*");
  EXPECT_EQ(refusals_ok, 1);

  // A snapshot of one tenant: the source is asked for it, the library keeps it alone.
  std::tie(events, end) = snapshot(replay, {"", "snapshot", "tenant-a"});
  EXPECT_EQ(events.size(), 2u);
  EXPECT_EQ(end.at("tenant").as_str(), "tenant-a");
  c_calls_source_state(&calls, tenant, sizeof tenant, &refusals_ok, &released);
  EXPECT_STREQ(tenant, "tenant-a");
  EXPECT_EQ(released, 0);

  // A snapshot is counted once its last message is handed to the socket, maybe after the
  // requester read it.
  kv_events_stats stats{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    ASSERT_EQ(kv_events_get_stats(publisher, &stats, sizeof stats), KV_EVENTS_OK);
  } while (stats.snapshots_served < 2 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(stats.snapshots_served, 2u);
  EXPECT_EQ(stats.snapshot_objects, 3u);
  // A snapshot_add outside any snapshot is refused, not a crash.
  EXPECT_EQ(kv_events_snapshot_add(nullptr, "t", 1, "k", 1, "", 0, 1),
            KV_EVENTS_ERR_INVALID_ARGUMENT);
  kv_events_destroy(publisher);
  c_calls_source_state(&calls, tenant, sizeof tenant, &refusals_ok, &released);
  EXPECT_EQ(released, 1) << "destroying the publisher releases its source once";
}

TEST(CApi, CallsWithMediaOutsideCpuAndDiskAreCountedAndPublishOnlyTheirKnownMedia) {
  const std::string endpoint = kv_events_test::unique_endpoint();
  kv_events_config config;
  kv_events_config_init(&config, sizeof config);
  config.enable_kv_events = true;
  config.bind_endpoint = endpoint.c_str();
  config.backend_id = "c-store";
  kv_events_publisher* publisher = nullptr;
  ASSERT_EQ(kv_events_create(&config, sizeof config, &publisher, nullptr, 0), KV_EVENTS_OK);
  Subscriber subscriber(endpoint);
  subscriber.wait_joined();
  const auto put = [&](const char* key, uint8_t media) {
    EXPECT_EQ(kv_events_on_put_commit(publisher, "t", 1, key, std::strlen(key), nullptr, 0, media),
              KV_EVENTS_OK);
  };
  const auto delta = [&](const char* key, uint8_t before, uint8_t after) {
    EXPECT_EQ(kv_events_on_medium_delta(publisher, "t", 1, key, std::strlen(key), nullptr, 0,
                                        before, after),
              KV_EVENTS_OK);
  };
  // Counted, and publish nothing: a commit with no medium, or with only other bits; a delta
  // between other bits.
  put("none", 0);
  put("bit-2", 4);
  delta("bits-2-7", 4, 0x80);
  // Counted, and publish what their cpu and disk bits say.
  put("cpu-and-bit-2", 1 | 4);
  delta("cpu-bit-4-to-disk", 1 | 16, 2);
  // Not counted: valid calls, a delta from nothing to nothing (no change) among them.
  delta("nothing", 0, 0);
  put("both", 3);
  delta("removed", 1, 0);
  ASSERT_EQ(kv_events_flush(publisher, 10000), KV_EVENTS_OK);

  std::vector<Value> events;
  while (events.size() < 6) {
    const auto message = subscriber.receive(std::chrono::seconds(10));
    ASSERT_TRUE(message.has_value()) << "only " << events.size() << " events arrived";
    const Batch batch = kv_events_test::parse(*message);
    events.insert(events.end(), batch.events.begin(), batch.events.end());
  }
  EXPECT_FALSE(subscriber.receive(std::chrono::milliseconds(200)).has_value());
  EXPECT_EQ(kv_events_test::summaries(events),
            (std::vector<std::string>{"stored cpu cpu-and-bit-2", "removed cpu cpu-bit-4-to-disk",
                                      "stored disk cpu-bit-4-to-disk", "stored cpu both",
                                      "stored disk both", "removed cpu removed"}));
  kv_events_stats stats;
  ASSERT_EQ(kv_events_get_stats(publisher, &stats, sizeof stats), KV_EVENTS_OK);
  EXPECT_EQ(stats.invalid_media_calls, 5u);
  EXPECT_EQ(stats.published_events, 6u);
  char* status = kv_events_status_json(publisher);
  ASSERT_NE(status, nullptr);
  EXPECT_NE(std::string(status).find("\"invalid_media_calls\":5"), std::string::npos) << status;
  kv_events_string_free(status);
  char* metrics = kv_events_metrics_text(publisher);
  ASSERT_NE(metrics, nullptr);
  EXPECT_NE(std::string(metrics).find("\nmooncake_kv_events_invalid_media_calls_total 5\n"),
            std::string::npos)
      << metrics;
  kv_events_string_free(metrics);
  kv_events_destroy(publisher);
}

TEST(CApi, CreateRefusesWithCodesAndMessagesAndNullArgumentsAreRefused) {
  char failure[512] = "";
  const std::string endpoint = kv_events_test::unique_endpoint();
  EXPECT_EQ(c_calls_refusals(endpoint.c_str(), failure, sizeof failure), 0) << failure;
}

}  // namespace
