// docs/spec.md section 3, the three calls, made from C++ and read from the real socket.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

namespace {

using namespace kv_events_test;
using kv::Medium;
using kv::MediumSet;
using Lines = std::vector<std::string>;

const MediumSet kNone{};
const MediumSet kCpu{Medium::kCpu};
const MediumSet kDisk{Medium::kDisk};
const MediumSet kBoth{Medium::kCpu, Medium::kDisk};

TEST(PutCommit, StoresEveryMediumCpuFirst) {
  Session session;
  session.publisher().on_put_commit("t", "k", "g", MediumSet{Medium::kDisk, Medium::kCpu});
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored cpu k", "stored disk k"}));
}

TEST(PutCommit, ReannouncesMediaAlreadyAnnounced) {
  Session session;
  session.publisher().on_put_commit("t", "k", "g", kCpu);
  session.publisher().on_put_commit("t", "k", "g", kBoth);
  EXPECT_EQ(summaries(session.collect_events()),
            (Lines{"stored cpu k", "stored cpu k", "stored disk k"}));
}

TEST(PutCommit, EmptyMediaEmitsNothing) {
  Session session;
  session.publisher().on_put_commit("t", "nothing", "g", kNone);
  session.publisher().on_put_commit("t", "k", "g", kDisk);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored disk k"}));
  EXPECT_EQ(session.publisher().stats().skipped_keyless_events, 0u);
}

TEST(PutCommit, ReplicaKindsCollapseOntoTheirMedium) {
  Session session;
  MediumSet media;
  media.add(kv::ReplicaKind::kDfs).add(kv::ReplicaKind::kLocalDisk);
  session.publisher().on_put_commit("t", "disk-only", "", media);
  media.add(kv::ReplicaKind::kMemory);
  session.publisher().on_put_commit("t", "both", "", media);
  EXPECT_EQ(summaries(session.collect_events()),
            (Lines{"stored disk disk-only", "stored cpu both", "stored disk both"}));
}

// Every (before, after) pair: removed for before - after, then stored for after - before,
// cpu before disk; equal sets emit nothing.
TEST(MediumDelta, EveryShapeRemovesBeforeStoresCpuBeforeDisk) {
  const MediumSet sets[] = {kNone, kCpu, kDisk, kBoth};
  const char* names[] = {"none", "cpu", "disk", "both"};
  Session session;
  Lines expected;
  for (int b = 0; b < 4; ++b) {
    for (int a = 0; a < 4; ++a) {
      const std::string key = std::string(names[b]) + "->" + names[a];
      session.publisher().on_medium_delta("t", key, "g", sets[b], sets[a]);
      for (Medium m : {Medium::kCpu, Medium::kDisk}) {
        if (sets[b].contains(m) && !sets[a].contains(m)) {
          expected.push_back(std::string("removed ") + (m == Medium::kCpu ? "cpu " : "disk ") +
                             key);
        }
      }
      for (Medium m : {Medium::kCpu, Medium::kDisk}) {
        if (sets[a].contains(m) && !sets[b].contains(m)) {
          expected.push_back(std::string("stored ") + (m == Medium::kCpu ? "cpu " : "disk ") + key);
        }
      }
    }
  }
  // Spelled out for the shapes that matter most.
  ASSERT_EQ(expected.size(), 16u);
  EXPECT_EQ(expected[0], "stored cpu none->cpu");
  const std::vector<Value> events = session.collect_events();
  EXPECT_EQ(summaries(events), expected);
}

TEST(MediumDelta, AMoveRemovesTheOldMediumThenStoresTheNew) {
  Session session;
  session.publisher().on_medium_delta("t", "k", "g", kBoth, kNone);  // Remove
  session.publisher().on_medium_delta("t", "m", "g", kCpu, kDisk);   // move to disk
  session.publisher().on_medium_delta("t", "o", "g", kDisk, kBoth);  // promotion
  session.publisher().on_medium_delta("t", "e", "g", kBoth, kBoth);  // no change
  EXPECT_EQ(summaries(session.collect_events()),
            (Lines{"removed cpu k", "removed disk k", "removed cpu m", "stored disk m",
                   "stored cpu o"}));
}

TEST(RemoveAll, ClearedWhenObjectsWereRemovedAndNoneSkipped) {
  Session session;
  kv::Publisher& p = session.publisher();
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_medium_delta("t", "k", "", kCpu, kNone);
  p.on_remove_all(scan, "t", 1, 0);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"removed cpu k", "cleared t"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 0u);
}

TEST(RemoveAll, NothingWhenAnObjectWasSkipped) {
  Session session;
  kv::Publisher& p = session.publisher();
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_remove_all(scan, "t", 3, 1);
  p.on_put_commit("t", "marker", "", kCpu);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored cpu marker"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, NothingForATenantThatHadNoObjects) {
  Session session;
  kv::Publisher& p = session.publisher();
  p.on_remove_all(p.begin_remove_all(), "never-existed", 0, 0);
  p.on_put_commit("t", "marker", "", kCpu);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored cpu marker"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, APutDuringTheLoopSuppressesThatTenantsCleared) {
  Session session;
  kv::Publisher& p = session.publisher();
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_medium_delta("a", "old", "", kCpu, kNone);
  p.on_put_commit("a", "new", "", kCpu);  // committed while the loop ran
  p.on_remove_all(scan, "a", 1, 0);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"removed cpu old", "stored cpu new"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, APutForAnotherTenantDoesNotSuppress) {
  Session session;
  kv::Publisher& p = session.publisher();
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_put_commit("b", "new", "", kCpu);
  p.on_remove_all(scan, "a", 1, 0);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored cpu new", "cleared a"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 0u);
}

TEST(RemoveAll, ADeltaThatAddsAMediumSuppressesOneThatOnlyRemovesDoesNot) {
  Session session;
  kv::Publisher& p = session.publisher();
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_medium_delta("a", "moved", "", kCpu, kDisk);  // adds disk to tenant a
  p.on_medium_delta("b", "gone", "", kBoth, kDisk);  // only removes
  p.on_remove_all(scan, "a", 1, 0);
  p.on_remove_all(scan, "b", 1, 0);
  EXPECT_EQ(summaries(session.collect_events()),
            (Lines{"removed cpu moved", "stored disk moved", "removed cpu gone", "cleared b"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, APutBeforeTheScanBeganDoesNotSuppress) {
  Session session;
  kv::Publisher& p = session.publisher();
  p.on_put_commit("a", "k", "", kCpu);
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_medium_delta("a", "k", "", kCpu, kNone);
  p.on_remove_all(scan, "a", 1, 0);
  EXPECT_EQ(summaries(session.collect_events()),
            (Lines{"stored cpu k", "removed cpu k", "cleared a"}));
}

TEST(RemoveAll, AGlobalRemoveAllClearsEachTenantItSaw) {
  Session session;
  kv::Publisher& p = session.publisher();
  const kv::RemoveAllScan scan = p.begin_remove_all();
  p.on_put_commit("", "new", "", kDisk);  // the empty tenant is "default"
  p.on_remove_all(scan, "default", 2, 0);
  p.on_remove_all(scan, "a", 2, 0);
  p.on_remove_all(scan, "b", 1, 1);
  p.on_remove_all(scan, "c", 0, 0);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored disk new", "cleared a"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 3u);
}

TEST(RemoveAll, ATokenOfNoScanNeverClears) {
  Session session;
  kv::Publisher& p = session.publisher();
  p.on_remove_all(kv::RemoveAllScan(), "a", 1, 0);
  p.on_put_commit("t", "marker", "", kCpu);
  EXPECT_EQ(summaries(session.collect_events()), (Lines{"stored cpu marker"}));
  EXPECT_EQ(p.stats().cleared_suppressed, 1u);
}

TEST(Threads, EachCallIsContiguousAndEachThreadKeepsItsOrder) {
  Session session;
  constexpr int kThreads = 4;
  constexpr int kCalls = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&session, t] {
      for (int i = 0; i < kCalls; ++i) {
        session.publisher().on_put_commit("t", std::to_string(t) + ":" + std::to_string(i), "",
                                          kBoth);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::vector<Value> events = session.collect_events();
  ASSERT_EQ(events.size(), 2u * kThreads * kCalls);
  std::vector<int> next(kThreads, 0);
  for (size_t i = 0; i < events.size(); i += 2) {
    const std::string key = events[i].at("object_key").as_str();
    ASSERT_EQ(summary(events[i]), "stored cpu " + key);
    ASSERT_EQ(summary(events[i + 1]), "stored disk " + key) << "a call's events are contiguous";
    const int t = std::stoi(key.substr(0, key.find(':')));
    ASSERT_EQ(key, std::to_string(t) + ":" + std::to_string(next[t]++)) << "thread order";
  }
}

TEST(Stats, CountWhatWasPublished) {
  kv::Config config = enabled_config();
  config.queue_capacity = 128;
  Session session(config);
  kv::Publisher& p = session.publisher();
  p.on_put_commit("t", "k", "", kBoth);
  p.on_put_commit("t", "", "", kBoth);
  p.on_remove_all(p.begin_remove_all(), "t", 0, 0);
  const std::vector<Batch> batches = session.collect();
  const kv::Stats stats = p.stats();
  EXPECT_TRUE(stats.enabled);
  EXPECT_EQ(stats.published_batches, batches.size());
  EXPECT_EQ(stats.published_events, 2u);
  EXPECT_EQ(stats.skipped_keyless_events, 2u);
  EXPECT_EQ(stats.cleared_suppressed, 1u);
  EXPECT_EQ(stats.dropped_events, 0u);
  EXPECT_EQ(stats.send_failures, 0u);
  EXPECT_EQ(stats.queue_depth, 0u);
  EXPECT_EQ(stats.queue_capacity, 128u);
  EXPECT_EQ(stats.next_sequence, batches.back().sequence + 1);
}

TEST(Status, JsonHasEveryStatsFieldAndSaysEventsAreBuiltIn) {
  Session session;
  session.publisher().on_put_commit("t", "k", "", kCpu);
  session.collect();
  const std::string json = session.publisher().status_json();
  for (const char* field :
       {"\"built_with_kv_events\":true", "\"enabled\":true", "\"published_batches\":1",
        "\"published_events\":1", "\"dropped_events\":0", "\"skipped_keyless_events\":0",
        "\"cleared_suppressed\":0", "\"send_failures\":0", "\"queue_capacity\":65536",
        "\"next_sequence\":1"}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
  EXPECT_NE(json.find("\"queue_depth\":"), std::string::npos) << json;
  // The incarnation as a string of its digits, which a reader of doubles cannot round.
  const std::string incarnation =
      "\"incarnation\":\"" + std::to_string(session.publisher().stats().incarnation) + "\"";
  EXPECT_NE(json.find(incarnation), std::string::npos) << incarnation << " in " << json;
  // The disabled publisher of this build reports the same keys.
  const std::string disabled = kv::Publisher::create(kv::Config{})->status_json();
  EXPECT_NE(disabled.find("\"built_with_kv_events\":true"), std::string::npos) << disabled;
  EXPECT_NE(disabled.find("\"enabled\":false"), std::string::npos) << disabled;
}

TEST(Shutdown, SendsWhatIsQueuedThenCountsLaterCallsAsDropped) {
  Session session;
  kv::Publisher& p = session.publisher();
  p.on_put_commit("t", "before", "", kCpu);
  p.shutdown();
  p.shutdown();  // idempotent
  p.on_put_commit("t", "after", "", kBoth);
  EXPECT_TRUE(p.enabled());
  EXPECT_FALSE(p.flush(std::chrono::seconds(1))) << "nothing can be flushed after shutdown";
  const kv::Stats stats = p.stats();
  EXPECT_EQ(stats.published_events, 1u);
  EXPECT_EQ(stats.dropped_events, 2u);
  const auto message = session.subscriber().receive(std::chrono::seconds(10));
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(summaries(parse(*message).events), (Lines{"stored cpu before"}));
}

TEST(Shutdown, DestroyingThePublisherSendsWhatIsQueued) {
  const kv::Config config = enabled_config();
  auto publisher = kv::Publisher::create(config);
  Subscriber subscriber(config.bind_endpoint);
  subscriber.wait_joined();
  for (int i = 0; i < 100; ++i) publisher->on_put_commit("t", std::to_string(i), "", kCpu);
  publisher.reset();
  uint64_t events = 0;
  uint64_t sequence = 0;  // the first message's
  while (events < 100) {
    const auto message = subscriber.receive(std::chrono::seconds(10));
    ASSERT_TRUE(message.has_value()) << "after " << events << " events";
    const Batch batch = parse(*message);
    EXPECT_EQ(batch.sequence, sequence++);
    events += batch.events.size();
  }
  EXPECT_EQ(events, 100u);
}

}  // namespace
