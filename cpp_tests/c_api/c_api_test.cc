// The C API as a C program uses it: c_calls.c (compiled as C) creates a publisher and makes
// each call; this driver reads the stream with a real SUB socket and the tests' own msgpack
// reader, and checks it event by event.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "c_api/c_calls.h"
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
  uint64_t expected_sequence = 1;
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

TEST(CApi, CreateRefusesWithCodesAndMessagesAndNullArgumentsAreRefused) {
  char failure[512] = "";
  const std::string endpoint = kv_events_test::unique_endpoint();
  EXPECT_EQ(c_calls_refusals(endpoint.c_str(), failure, sizeof failure), 0) << failure;
}

}  // namespace
