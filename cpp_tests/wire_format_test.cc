// docs/spec.md section 5, the wire format, read from the real socket by an independent decoder.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "test_support.h"

namespace {

using namespace kv_events_test;
using kv::Medium;
using Type = Value::Type;

const kv::MediumSet kCpu{Medium::kCpu};
const kv::MediumSet kDisk{Medium::kDisk};
const kv::MediumSet kBoth{Medium::kCpu, Medium::kDisk};

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::set<std::string> key_set(const Value& event) {
  const std::vector<std::string> keys = event.keys();
  return {keys.begin(), keys.end()};
}

const std::set<std::string> kCommonKeys = {"event_id",   "timestamp",  "event_type",
                                           "model_name", "block_size", "additional_salt",
                                           "lora_name",  "tenant_id",  "backend_id",
                                           "medium",     "dp_rank"};
const std::set<std::string> kObjectKeys = {"group_id", "object_key", "seq_hashes",
                                           "base_block_idx"};
const std::set<std::string> kStoredOnlyKeys = {"token_ids", "parent_hash"};

std::set<std::string> expected_keys(const std::string& type, bool legacy) {
  std::set<std::string> keys = kCommonKeys;
  if (legacy) keys.insert("type");
  if (type == "cleared") return keys;
  keys.insert(kObjectKeys.begin(), kObjectKeys.end());
  if (legacy) keys.insert("block_hashes");
  if (type == "stored") {
    keys.insert(kStoredOnlyKeys.begin(), kStoredOnlyKeys.end());
    if (legacy) keys.insert("parent_block_hash");
  }
  return keys;
}

// One stored, one removed and one cleared event from a publisher with `config`.
std::vector<Value> one_of_each(const kv::Config& config) {
  Session session(config);
  kv::Publisher& p = session.publisher();
  p.on_put_commit("tenant-a", "key-1", "group-1", kCpu);
  p.on_medium_delta("tenant-a", "key-1", "group-1", kCpu, {});
  p.on_remove_all(p.begin_remove_all(), "tenant-a", 1, 0);
  std::vector<Value> events = session.collect_events();
  if (summaries(events) !=
      std::vector<std::string>{"stored cpu key-1", "removed cpu key-1", "cleared tenant-a"}) {
    ADD_FAILURE() << "unexpected stream";
  }
  return events;
}

TEST(WireFormat, EveryMessageIsThreeFramesEmptyTopicAndSequenceFromZero) {
  Session session;
  for (int i = 0; i < 5; ++i) {
    session.publisher().on_put_commit("t", "key-" + std::to_string(i), "", kCpu);
    ASSERT_TRUE(session.publisher().flush(std::chrono::seconds(10)));  // one message each
  }
  const std::vector<Batch> batches = session.collect();
  ASSERT_EQ(batches.size(), 5u);
  for (size_t i = 0; i < batches.size(); ++i) {
    const Batch& b = batches[i];
    ASSERT_EQ(b.frames.size(), 3u);
    EXPECT_TRUE(b.frames[0].empty());
    ASSERT_EQ(b.frames[1].size(), 8u);
    EXPECT_EQ(b.sequence, i) << "big-endian u64, first message 0, then +1";
    EXPECT_EQ(static_cast<unsigned char>(b.frames[1][7]), i);
  }
  // Messages 0 to 4 taken: the next is 5.
  EXPECT_EQ(session.publisher().stats().next_sequence, 5u);
}

TEST(WireFormat, PayloadIsTimestampEventsAndDpRank) {
  kv::Config config = enabled_config();
  config.dp_rank = 3;
  Session session(config);
  const uint64_t before = now_ms();
  session.publisher().on_put_commit("t", "k", "", kBoth);
  const std::vector<Batch> batches = session.collect();
  const uint64_t after = now_ms();
  ASSERT_EQ(batches.size(), 1u);
  const std::vector<Value>& payload = batches[0].payload.as_array();
  ASSERT_EQ(payload.size(), 3u);
  EXPECT_EQ(payload[0].type(), Type::kUint);
  EXPECT_GE(payload[0].as_uint(), before);
  EXPECT_LE(payload[0].as_uint(), after);
  EXPECT_EQ(payload[1].type(), Type::kArray);
  EXPECT_EQ(payload[1].as_array().size(), 2u);
  EXPECT_EQ(payload[2].type(), Type::kUint);
  EXPECT_EQ(payload[2].as_uint(), 3u);
}

TEST(WireFormat, BatchesHoldOneTo64EventsAndEventIdsCountFromOneWithoutGaps) {
  Session session;
  for (int i = 0; i < 300; ++i) {
    session.publisher().on_put_commit("t", "key-" + std::to_string(i), "", kCpu);
  }
  const std::vector<Batch> batches = session.collect();
  uint64_t next_id = 1;
  uint64_t next_sequence = 0;  // the first message's
  for (const Batch& b : batches) {
    EXPECT_GE(b.events.size(), 1u);
    EXPECT_LE(b.events.size(), 64u);
    EXPECT_EQ(b.sequence, next_sequence++);
    for (const Value& event : b.events) {
      EXPECT_EQ(event.at("event_id").type(), Type::kUint);
      EXPECT_EQ(event.at("event_id").as_uint(), next_id++);
      EXPECT_EQ(event.at("timestamp").type(), Type::kUint);
      EXPECT_EQ(event.at("timestamp").as_uint(), b.timestamp_ms);
    }
  }
  EXPECT_EQ(next_id, 301u);
  const kv::Stats stats = session.publisher().stats();
  EXPECT_EQ(stats.published_events, 300u);
  EXPECT_EQ(stats.published_batches, batches.size());
  EXPECT_EQ(stats.dropped_events, 0u);
}

TEST(WireFormat, DpRankIsInEveryEventAndInTheTrailer) {
  kv::Config config = enabled_config();
  config.dp_rank = 7;
  Session session(config);
  kv::Publisher& p = session.publisher();
  p.on_put_commit("t", "k", "g", kBoth);
  p.on_medium_delta("t", "k", "g", kBoth, {});
  p.on_remove_all(p.begin_remove_all(), "t", 1, 0);
  const std::vector<Batch> batches = session.collect();
  ASSERT_FALSE(batches.empty());
  size_t events = 0;
  for (const Batch& b : batches) {
    EXPECT_EQ(b.dp_rank, 7u);
    for (const Value& event : b.events) {
      EXPECT_EQ(event.at("dp_rank").as_uint(), 7u);
      ++events;
    }
  }
  EXPECT_EQ(events, 5u);
}

TEST(WireFormat, LegacyEventsHaveExactly20_17_12Keys) {
  const std::vector<Value> events = one_of_each(enabled_config());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(key_set(events[0]), expected_keys("stored", true));
  EXPECT_EQ(key_set(events[1]), expected_keys("removed", true));
  EXPECT_EQ(key_set(events[2]), expected_keys("cleared", true));
  EXPECT_EQ(events[0].as_map().size(), 20u);
  EXPECT_EQ(events[1].as_map().size(), 17u);
  EXPECT_EQ(events[2].as_map().size(), 12u);
  EXPECT_EQ(events[0].at("type").as_str(), "BlockStored");
  EXPECT_EQ(events[1].at("type").as_str(), "BlockRemoved");
  EXPECT_EQ(events[2].at("type").as_str(), "AllBlocksCleared");
}

TEST(WireFormat, EventsWithoutLegacyHaveExactly17_15_11Keys) {
  kv::Config config = enabled_config();
  config.emit_legacy_compat = false;
  const std::vector<Value> events = one_of_each(config);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(key_set(events[0]), expected_keys("stored", false));
  EXPECT_EQ(key_set(events[1]), expected_keys("removed", false));
  EXPECT_EQ(key_set(events[2]), expected_keys("cleared", false));
  EXPECT_EQ(events[0].as_map().size(), 17u);
  EXPECT_EQ(events[1].as_map().size(), 15u);
  EXPECT_EQ(events[2].as_map().size(), 11u);
}

TEST(WireFormat, MapKeysAreStrAndValuesHaveTheirTypes) {
  const std::vector<Value> events = one_of_each(enabled_config());
  ASSERT_EQ(events.size(), 3u);
  for (const Value& event : events) {
    for (const auto& [key, value] : event.as_map()) EXPECT_EQ(key.type(), Type::kStr);
    EXPECT_EQ(event.at("event_id").type(), Type::kUint);
    EXPECT_EQ(event.at("timestamp").type(), Type::kUint);
    EXPECT_EQ(event.at("dp_rank").type(), Type::kUint);
    EXPECT_EQ(event.at("backend_id").as_str(), "store-a");
    EXPECT_EQ(event.at("tenant_id").as_str(), "tenant-a");
  }
  const Value& stored = events[0];
  EXPECT_EQ(stored.at("event_type").as_str(), "stored");
  EXPECT_EQ(stored.at("medium").as_str(), "cpu");
  EXPECT_EQ(stored.at("object_key").as_str(), "key-1");
  EXPECT_EQ(stored.at("group_id").as_str(), "group-1");
  EXPECT_TRUE(stored.at("seq_hashes").as_array().empty());
  EXPECT_TRUE(stored.at("block_hashes").as_array().empty());
  EXPECT_TRUE(stored.at("base_block_idx").is_nil());
  EXPECT_TRUE(stored.at("token_ids").is_nil());
  EXPECT_TRUE(stored.at("parent_hash").is_nil());
  EXPECT_TRUE(stored.at("parent_block_hash").is_nil());

  const Value& removed = events[1];
  EXPECT_EQ(removed.at("event_type").as_str(), "removed");
  EXPECT_EQ(removed.at("medium").as_str(), "cpu");
  EXPECT_TRUE(removed.at("seq_hashes").as_array().empty());
  EXPECT_TRUE(removed.at("block_hashes").as_array().empty());
  EXPECT_TRUE(removed.at("base_block_idx").is_nil());
  EXPECT_EQ(removed.find("token_ids"), nullptr) << "absent, not nil";
  EXPECT_EQ(removed.find("parent_hash"), nullptr);

  const Value& cleared = events[2];
  EXPECT_EQ(cleared.at("event_type").as_str(), "cleared");
  EXPECT_TRUE(cleared.at("medium").is_nil());
  EXPECT_EQ(cleared.find("object_key"), nullptr) << "absent, not nil";
  EXPECT_EQ(cleared.find("group_id"), nullptr);
}

TEST(WireFormat, EmptyContextFieldsAreNil) {
  const std::vector<Value> events = one_of_each(enabled_config());
  for (const Value& event : events) {
    EXPECT_TRUE(event.at("model_name").is_nil()) << event.debug_string();
    EXPECT_TRUE(event.at("block_size").is_nil()) << "block_size 0 is nil";
    EXPECT_TRUE(event.at("additional_salt").is_nil());
    EXPECT_TRUE(event.at("lora_name").is_nil());
  }
}

TEST(WireFormat, SetContextFieldsArePresentInEveryEvent) {
  kv::Config config = enabled_config();
  config.model_name = "llama-3-8b";
  config.block_size = 16;
  config.additional_salt = "salt";
  config.lora_name = "adapter";
  for (const Value& event : one_of_each(config)) {
    EXPECT_EQ(event.at("model_name").as_str(), "llama-3-8b");
    EXPECT_EQ(event.at("block_size").as_uint(), 16u);
    EXPECT_EQ(event.at("additional_salt").as_str(), "salt");
    EXPECT_EQ(event.at("lora_name").as_str(), "adapter");
  }
}

TEST(WireFormat, IntegersAndHeadersUseTheSmallestEncoding) {
  for (uint32_t dp_rank : {0u, 127u, 128u, 255u, 256u, 65535u, 65536u, 4294967295u}) {
    kv::Config config = enabled_config();
    config.dp_rank = dp_rank;
    config.block_size = dp_rank;
    config.model_name = std::string(40, 'm');  // str8
    Session session(config);
    kv::Publisher& p = session.publisher();
    p.on_put_commit("t", std::string(300, 'k'), "", kBoth);  // str16
    p.on_remove_all(p.begin_remove_all(), "t", 1, 0);
    for (const Batch& b : session.collect()) {
      EXPECT_TRUE(b.payload.all_minimal()) << "dp_rank " << dp_rank;
      EXPECT_EQ(b.dp_rank, dp_rank);
      for (const Value& event : b.events) EXPECT_EQ(event.at("dp_rank").as_uint(), dp_rank);
    }
  }
}

TEST(WireFormat, EmitObjectKeyFalseSuppressesStoredAndRemovedButNotCleared) {
  kv::Config config = enabled_config();
  config.emit_object_key = false;
  Session session(config);
  kv::Publisher& p = session.publisher();
  p.on_put_commit("t", "k", "g", kBoth);
  p.on_medium_delta("t", "k", "g", kBoth, kDisk);
  p.on_remove_all(p.begin_remove_all(), "t", 1, 0);
  const std::vector<Value> events = session.collect_events();
  EXPECT_EQ(summaries(events), std::vector<std::string>{"cleared t"});
  EXPECT_EQ(p.stats().skipped_keyless_events, 3u);
  EXPECT_EQ(p.stats().published_events, 1u);
}

TEST(WireFormat, EmptyObjectKeySuppressesStoredAndRemoved) {
  Session session;
  kv::Publisher& p = session.publisher();
  p.on_put_commit("t", "", "g", kBoth);
  p.on_medium_delta("t", "", "g", kCpu, kDisk);
  p.on_put_commit("t", "k", "g", kCpu);
  EXPECT_EQ(summaries(session.collect_events()), std::vector<std::string>{"stored cpu k"});
  EXPECT_EQ(p.stats().skipped_keyless_events, 4u);
}

TEST(WireFormat, KeysThatAreNotUtf8ArriveAsBinByteForByte) {
  kv::Config config = enabled_config();
  config.non_utf8 = "bin";
  Session session(config);
  const std::string key("\xff\xfe\x00obj\xc3(", 8);
  const std::string tenant("ten\x80", 4);
  const std::string group("\xe2\x82", 2);
  session.publisher().on_put_commit(tenant, key, group, kCpu);
  const std::vector<Value> events = session.collect_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].at("object_key").as_bin(), key);
  EXPECT_EQ(events[0].at("tenant_id").as_bin(), tenant);
  EXPECT_EQ(events[0].at("group_id").as_bin(), group);
}

TEST(WireFormat, KeysThatAreNotUtf8AreSkippedByDefaultCountedPerEventAndTakeNoSequence) {
  Session session;  // non_utf8 = "skip", the default
  kv::Publisher& p = session.publisher();
  // Each call flushed on its own: one that were published would be a message of its own.
  p.on_put_commit("t", "a", "g", kCpu);
  ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
  p.on_put_commit("t", std::string("k\xff", 2), "g", kBoth);  // a key: 2 events
  ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
  p.on_medium_delta(std::string("t\xc3", 2), "k", "g", kCpu, kDisk);  // a tenant: 2
  ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
  p.on_put_commit("t", "k", std::string("\x80", 1), kDisk);  // a group: 1
  ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
  p.on_remove_all(p.begin_remove_all(), std::string("u\xfe", 2), 1, 0);  // its cleared: 1
  ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
  p.on_put_commit("t", "b", "g", kCpu);
  const std::vector<Batch> batches = session.collect();
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].sequence, 0u);
  EXPECT_EQ(batches[1].sequence, 1u) << "the skipped calls took no sequence number";
  EXPECT_EQ(summaries(events_of(batches)),
            (std::vector<std::string>{"stored cpu a", "stored cpu b"}));
  const kv::Stats stats = p.stats();
  EXPECT_EQ(stats.skipped_non_utf8_events, 6u);
  EXPECT_EQ(stats.published_events, 2u);
  EXPECT_EQ(stats.next_sequence, 2u);
  EXPECT_EQ(stats.cleared_suppressed, 0u) << "skipped, not suppressed";
  EXPECT_EQ(stats.dropped_events, 0u);
}

TEST(WireFormat, KeysThatAreNotUtf8ArriveAsStrOfTheirRawBytesAloneInTheirMessage) {
  kv::Config config = enabled_config();
  config.non_utf8 = "str";
  Session session(config);
  kv::Publisher& p = session.publisher();
  const std::string key("\xff\xfe\x00obj\xc3(", 8);
  const std::string tenant("ten\x80", 4);
  const std::string group("\xe2\x82", 2);
  // As fast as they come: the publishing thread would batch them together.
  p.on_put_commit("t", "a", "g", kCpu);
  p.on_put_commit(tenant, key, group, kBoth);
  p.on_put_commit("t", "b", "g", kCpu);
  const std::vector<Batch> batches = session.collect();
  int alone = 0;
  for (const Batch& b : batches) {
    for (const Value& event : b.events) {
      if (event.at("object_key").bytes() != key) continue;
      ++alone;
      EXPECT_EQ(b.events.size(), 2u) << "the call's two events, alone";
      EXPECT_EQ(event.at("object_key").type(), Type::kStr);
      EXPECT_EQ(event.at("object_key").as_str(), key);
      EXPECT_EQ(event.at("tenant_id").as_str(), tenant);
      EXPECT_EQ(event.at("group_id").as_str(), group);
      EXPECT_TRUE(event.at("object_key").minimal());
    }
  }
  EXPECT_EQ(alone, 2);
  EXPECT_EQ(summaries(events_of(batches)),
            (std::vector<std::string>{"stored cpu a", "stored cpu " + printable(key),
                                      "stored disk " + printable(key), "stored cpu b"}));
  EXPECT_EQ(p.stats().skipped_non_utf8_events, 0u);
}

TEST(WireFormat, ReannounceRemainingStoresTheMediaLeftAfterARemovalInTheSameMessage) {
  for (const bool reannounce : {false, true}) {
    SCOPED_TRACE(reannounce ? "reannounce_remaining" : "default");
    kv::Config config = enabled_config();
    config.reannounce_remaining = reannounce;
    Session session(config);
    kv::Publisher& p = session.publisher();
    p.on_medium_delta("t", "k", "g", kBoth, kDisk);
    ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
    p.on_medium_delta("t", "k", "g", kDisk, {});  // the last medium: nothing left to store
    ASSERT_TRUE(p.flush(std::chrono::seconds(10)));
    p.on_medium_delta("t", "k", "g", kCpu, kBoth);  // nothing removed: disk alone
    const std::vector<Batch> batches = session.collect();
    ASSERT_EQ(batches.size(), 3u);
    const std::vector<std::string> first = summaries(batches[0].events);
    if (reannounce) {
      EXPECT_EQ(first, (std::vector<std::string>{"removed cpu k", "stored disk k"}));
    } else {
      EXPECT_EQ(first, std::vector<std::string>{"removed cpu k"});
    }
    EXPECT_EQ(summaries(batches[1].events), std::vector<std::string>{"removed disk k"});
    EXPECT_EQ(summaries(batches[2].events), std::vector<std::string>{"stored disk k"});
  }
}

TEST(WireFormat, EmbeddedNulsArriveUnchanged) {
  Session session;
  const std::string key("a\0b\0", 4);
  const std::string tenant("t\0", 2);
  session.publisher().on_put_commit(tenant, key, "", kDisk);
  session.publisher().on_remove_all(session.publisher().begin_remove_all(), tenant, 1, 0);
  const std::vector<Value> events = session.collect_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].at("object_key").as_str(), key) << "NUL is valid UTF-8: str";
  EXPECT_EQ(events[0].at("tenant_id").as_str(), tenant);
  EXPECT_EQ(events[1].at("tenant_id").as_str(), tenant);
}

TEST(WireFormat, EmptyTenantIsDefaultAndEmptyGroupIsNil) {
  Session session;
  kv::Publisher& p = session.publisher();
  p.on_put_commit("", "k", "", kCpu);
  p.on_medium_delta("", "k", "", kCpu, {});
  p.on_remove_all(p.begin_remove_all(), "", 1, 0);
  const std::vector<Value> events = session.collect_events();
  ASSERT_EQ(events.size(), 3u);
  for (const Value& event : events) EXPECT_EQ(event.at("tenant_id").as_str(), "default");
  EXPECT_TRUE(events[0].at("group_id").is_nil());
  EXPECT_TRUE(events[1].at("group_id").is_nil());
}

TEST(WireFormat, SequenceGapsAccountForEveryDroppedEvent) {
  kv::Config config = enabled_config();
  config.queue_capacity = 1;  // drops whenever the thread is behind; how many is not fixed
  Session session(config);
  constexpr int kCalls = 2000;
  for (int i = 0; i < kCalls; ++i) {
    session.publisher().on_put_commit("t", "key-" + std::to_string(i), "", kCpu);
  }
  // A drop is counted just after it happens, so the message that shows it as a gap is the
  // next one: once everything is sent, one more call makes every drop visible.
  ASSERT_TRUE(session.publisher().flush(std::chrono::seconds(10)));
  session.publisher().on_put_commit("t", "last", "", kCpu);
  const std::vector<Batch> batches = session.collect();
  const kv::Stats stats = session.publisher().stats();
  uint64_t next = 0;  // the sequence a message takes when nothing was dropped before it
  uint64_t gaps = 0;
  uint64_t received = 0;
  for (const Batch& b : batches) {
    ASSERT_GE(b.sequence, next);
    gaps += b.sequence - next;
    next = b.sequence + 1;
    received += b.events.size();
  }
  EXPECT_EQ(received + stats.dropped_events, static_cast<uint64_t>(kCalls) + 1);
  EXPECT_EQ(gaps, stats.dropped_events);
  EXPECT_EQ(stats.next_sequence, next);
}

}  // namespace
