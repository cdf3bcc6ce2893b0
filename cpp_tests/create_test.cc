// Publisher::create: what it refuses, with which exception, naming what.

#include <gtest/gtest.h>
#include <zmq.h>

#include <stdexcept>
#include <string>

#include "create_error.h"
#include "test_support.h"

namespace {

using namespace kv_events_test;

TEST(Create, MissingEndpointIsInvalidArgumentNamingTheFlag) {
  kv::Config config = enabled_config();
  config.bind_endpoint.clear();
  EXPECT_NE(create_error<std::invalid_argument>(config).find("kv_events_bind_endpoint"),
            std::string::npos);
}

TEST(Create, MissingBackendIdIsInvalidArgumentNamingTheFlag) {
  kv::Config config = enabled_config();
  config.backend_id.clear();
  EXPECT_NE(create_error<std::invalid_argument>(config).find("kv_events_backend_id"),
            std::string::npos);
}

TEST(Create, ZeroQueueCapacityIsInvalidArgumentNamingTheFlag) {
  kv::Config config = enabled_config();
  config.queue_capacity = 0;
  EXPECT_NE(create_error<std::invalid_argument>(config).find("kv_events_queue_capacity"),
            std::string::npos);
}

TEST(Create, AConfigStringThatIsNotUtf8IsInvalidArgumentNamingTheFlag) {
  kv::Config config = enabled_config();
  config.model_name = "\xff";
  EXPECT_NE(create_error<std::invalid_argument>(config).find("kv_events_model_name"),
            std::string::npos);
}

TEST(Create, ANonUtf8ModeOtherThanSkipBinOrStrIsInvalidArgumentNamingTheFlag) {
  for (const char* mode : {"latin1", "BIN", "skip "}) {
    kv::Config config = enabled_config();
    config.non_utf8 = mode;
    const std::string message = create_error<std::invalid_argument>(config);
    EXPECT_NE(message.find("kv_events_non_utf8"), std::string::npos) << mode << ": " << message;
  }
  for (const char* mode : {"skip", "bin", "str", ""}) {
    kv::Config config = enabled_config();
    config.non_utf8 = mode;
    config.reannounce_remaining = true;
    EXPECT_TRUE(kv::Publisher::create(config)->enabled()) << mode;
  }
}

TEST(Create, AnUnparsableEndpointIsRuntimeErrorNamingIt) {
  kv::Config config = enabled_config();
  config.bind_endpoint = "not-an-endpoint";
  const std::string message = create_error<std::runtime_error>(config);
  EXPECT_NE(message.find("not-an-endpoint"), std::string::npos) << message;
}

TEST(Create, APortAlreadyBoundIsRuntimeErrorNamingTheEndpoint) {
  // Another socket holds a port the system picked.
  void* context = zmq_ctx_new();
  void* holder = zmq_socket(context, ZMQ_PUB);
  ASSERT_EQ(zmq_bind(holder, "tcp://127.0.0.1:*"), 0);
  char endpoint[256];
  size_t size = sizeof endpoint;
  ASSERT_EQ(zmq_getsockopt(holder, ZMQ_LAST_ENDPOINT, endpoint, &size), 0);

  kv::Config config = enabled_config();
  config.bind_endpoint = endpoint;
  const std::string message = create_error<std::runtime_error>(config);
  EXPECT_NE(message.find(endpoint), std::string::npos) << message;

  zmq_close(holder);
  zmq_ctx_term(context);
}

TEST(Create, APublisherHoldsItsPortUntilDestroyed) {
  // Find a free port, then bind the publisher to it explicitly.
  void* context = zmq_ctx_new();
  void* probe = zmq_socket(context, ZMQ_PUB);
  ASSERT_EQ(zmq_bind(probe, "tcp://127.0.0.1:*"), 0);
  char endpoint[256];
  size_t size = sizeof endpoint;
  ASSERT_EQ(zmq_getsockopt(probe, ZMQ_LAST_ENDPOINT, endpoint, &size), 0);
  zmq_close(probe);
  zmq_ctx_term(context);

  kv::Config config = enabled_config();
  config.bind_endpoint = endpoint;
  auto first = kv::Publisher::create(config);
  ASSERT_TRUE(first->enabled());
  EXPECT_THROW(kv::Publisher::create(config), std::runtime_error);
  first.reset();
  EXPECT_NO_THROW(kv::Publisher::create(config)) << "the port is free again";
}

TEST(Create, ADisabledConfigIsNeverRefused) {
  kv::Config config;
  config.queue_capacity = 0;
  config.bind_endpoint = "not-an-endpoint";
  config.model_name = "\xff";
  config.non_utf8 = "latin1";
  std::unique_ptr<kv::Publisher> publisher;
  ASSERT_NO_THROW(publisher = kv::Publisher::create(config));
  EXPECT_FALSE(publisher->enabled());
}

TEST(Create, AnEnabledConfigGivesAnEnabledPublisher) {
  const auto publisher = kv::Publisher::create(enabled_config());
  EXPECT_TRUE(publisher->enabled());
  EXPECT_TRUE(publisher->stats().enabled);
  EXPECT_EQ(publisher->stats().next_sequence, 0u);  // the first message will be 0
}

}  // namespace
