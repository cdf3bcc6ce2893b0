// Several master threads make random operations of the calls' table (docs/spec.md section 3) on
// overlapping keys, through the reference model. A subscriber that applies the decoded stream to an
// index keyed by (tenant, key, medium) must end with exactly the media the model holds; so must
// each subscriber that joins mid-run with a snapshot (the model as the object source) and
// then applies the stream from the snapshot's next sequence on. With `non_utf8 = skip` (the
// default) that is the media the model holds for its objects whose strings are UTF-8: the one
// key that is not is neither published nor in snapshots. With `bin` it is all of them; with
// `reannounce_remaining` too, since a `stored` of a medium already held changes no index.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "master_model/master_model.h"
#include "test_support.h"

namespace {

using namespace kv_events_test;
using master_model::Durability;
using master_model::Holding;
using master_model::Master;
using master_model::OplogFault;
using master_model::Placement;
using RK = kv::ReplicaKind;

constexpr master_model::Status kOk = master_model::Status::kOk;

constexpr int kThreads = 4;
constexpr int kRounds = 40;
constexpr int kOpsPerRound = 250;  // per thread

// The threads stop after each round until the main thread has compared the index with the
// model: a divergence is caught where it happens, even if later operations would hide it.
class Checkpoints {
 public:
  // A worker finished `round`: waits until the main thread releases it.
  void worker_done(int round) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++arrived_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_ >= round; });
  }
  // The main thread: waits until every worker finished `round`.
  void wait_for_workers(int round) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return arrived_ == kThreads * (round + 1); });
  }
  void release(int round) {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = round;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  int released_ = -1;
};

const std::vector<std::string> kTenants{"", "tenant-a", "tenant-b"};

std::vector<std::string> keys() {
  std::vector<std::string> out;
  for (int i = 0; i < 12; ++i) out.push_back("obj-" + std::to_string(i));
  out.push_back(std::string("bin-\xff\xfe", 6));  // not UTF-8: skipped, or as bin on the wire
  return out;
}

// The index a subscriber builds: stored adds, removed drops, cleared drops the tenant.
class Index {
 public:
  void apply(const Value& event) {
    const std::string& type = event.at("event_type").as_str();
    const std::string& tenant = event.at("tenant_id").bytes();
    if (type == "cleared") {
      ++cleared_;
      for (auto it = holdings_.begin(); it != holdings_.end();) {
        it = std::get<0>(*it) == tenant ? holdings_.erase(it) : std::next(it);
      }
      return;
    }
    const Holding holding{tenant, event.at("object_key").bytes(),
                          event.at("medium").as_str() == "cpu" ? kv::Medium::kCpu
                                                               : kv::Medium::kDisk};
    if (type == "stored") {
      ++stored_;
      holdings_.insert(holding);
    } else {
      ++removed_;
      holdings_.erase(holding);
    }
  }
  const std::set<Holding>& holdings() const { return holdings_; }
  uint64_t stored_ = 0, removed_ = 0, cleared_ = 0;

 private:
  std::set<Holding> holdings_;
};

// What the publisher's config changes in what a subscriber should hold.
struct Policy {
  std::string non_utf8 = "skip";
  bool reannounce_remaining = false;
};

// The model's holdings as the wire names tenants, less those the publisher skips.
std::set<Holding> on_the_wire(const std::set<Holding>& holdings, const Policy& policy) {
  std::set<Holding> out;
  for (const auto& [tenant, key, medium] : holdings) {
    if (policy.non_utf8 == "skip" && !(valid_utf8(tenant) && valid_utf8(key))) continue;
    out.emplace(tenant.empty() ? "default" : tenant, key, medium);
  }
  return out;
}

std::string describe(const Holding& h) {
  return std::get<0>(h) + "/" + std::get<1>(h) +
         (std::get<2>(h) == kv::Medium::kCpu ? " cpu" : " disk");
}

// One master thread: kRounds rounds of kOpsPerRound random operations from a generator
// seeded with `seed`.
void run_thread(Master& master, Checkpoints& checkpoints, int thread, uint64_t seed, bool ha) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> all_keys = keys();
  auto pick = [&rng](size_t n) { return static_cast<size_t>(rng() % n); };
  auto chance = [&rng](int percent) { return static_cast<int>(rng() % 100) < percent; };
  int memory_generation = 0;
  int ssd_generation = 0;
  auto own_memory = [&] {
    return "mem-t" + std::to_string(thread) + "-g" + std::to_string(memory_generation);
  };
  auto own_ssd = [&] {
    return "ssd-t" + std::to_string(thread) + "-g" + std::to_string(ssd_generation);
  };
  auto placement = [&]() -> Placement {
    switch (pick(7)) {
      case 0: return {RK::kMemory, own_memory()};
      case 1: return {RK::kMemory, "mem-shared"};
      case 2: return {RK::kNofSsd, own_ssd()};
      case 3: return {RK::kLocalDisk, "local"};
      case 4: return {RK::kDfs, "dfs"};
      case 5: return {RK::kDisk, "disk"};
      default: return {RK::kMemory, own_memory()};
    }
  };
  auto placements = [&] {
    std::vector<Placement> out;
    const size_t n = 1 + pick(3);
    for (size_t i = 0; i < n; ++i) out.push_back(placement());
    return out;
  };
  auto segment_of_kind = [&](RK kind) -> std::string {
    switch (kind) {
      case RK::kMemory: return chance(50) ? own_memory() : "mem-shared";
      case RK::kNofSsd: return own_ssd();
      case RK::kLocalDisk: return "local";
      case RK::kDfs: return "dfs";
      case RK::kDisk: return "disk";
    }
    return "disk";
  };
  const RK kinds[] = {RK::kMemory, RK::kDisk, RK::kLocalDisk, RK::kNofSsd, RK::kDfs};

  for (int i = 0; i < kRounds * kOpsPerRound; ++i) {
    if (i > 0 && i % kOpsPerRound == 0) checkpoints.worker_done(i / kOpsPerRound - 1);
    const std::string& tenant = kTenants[pick(kTenants.size())];
    const std::string& key = all_keys[pick(all_keys.size())];
    const std::string group = "g" + std::to_string(pick(3));
    switch (pick(24)) {
      case 0:
      case 1:
      case 2:
        if (master.put_start(tenant, key, group, placements()) == kOk) {
          if (chance(85)) {
            master.put_end(tenant, key);
          } else if (chance(50)) {  // else it stays PROCESSING for a later put_end or revoke
            master.put_end(tenant, key, chance(50) ? kv::Medium::kCpu : kv::Medium::kDisk);
          }
        }
        break;
      case 3: master.put_end(tenant, key); break;
      case 4: master.put_revoke(tenant, key); break;
      case 5: {
        std::vector<master_model::PutRequest> batch;
        std::vector<std::string> batch_keys;
        for (int n = 0; n < 3; ++n) {
          batch_keys.push_back(all_keys[pick(all_keys.size())]);
          batch.push_back({batch_keys.back(), group, placements()});
        }
        master.batch_put_start(tenant, batch);
        master.batch_put_end(tenant, batch_keys);
        break;
      }
      case 6:
        if (master.upsert_start(tenant, key, group, placements()) == kOk && chance(80)) {
          master.put_end(tenant, key);
        }
        break;
      case 7:
        if (master.copy_start(tenant, key, placement()) == kOk && chance(70)) {
          master.copy_end(tenant, key);
        }
        break;
      case 8: master.copy_end(tenant, key); break;
      case 9: {
        const RK source = kinds[pick(5)];
        if (master.move_start(tenant, key, segment_of_kind(source), placement()) == kOk &&
            chance(70)) {
          master.move_end(tenant, key);
        }
        break;
      }
      case 10: master.move_end(tenant, key); break;
      case 11:
        if (master.offload_start(tenant, key) == kOk && chance(70)) {
          master.offload_end(tenant, key, {RK::kLocalDisk, "local"});
        }
        break;
      case 12:
        master.offload_end(tenant, key, {kinds[1 + pick(4)], chance(50) ? "local" : own_ssd()});
        break;
      case 13:
        if (master.promote_start(tenant, key, own_memory()) == kOk && chance(70)) {
          master.promote_end(tenant, key);
        }
        break;
      case 14: master.promote_end(tenant, key); break;
      case 15:
      case 16: master.evict_replica(tenant, key, kinds[pick(5)]); break;
      case 17:
        master.get_replica_list(tenant, key, pick(3));
        master.advance_time(1);
        break;
      case 18: master.cleanup_stale_handles(tenant, key); break;
      case 19: master.remove(tenant, key); break;
      case 20: master.batch_remove(tenant, {key, all_keys[pick(all_keys.size())]}); break;
      case 21:
        if (chance(50)) {
          master.remove_by_regex(tenant, "^obj-1");
        } else if (chance(80)) {
          master.remove_all(tenant);
        } else {
          master.remove_all();
        }
        break;
      case 22:
        if (chance(50)) {
          master.remove_client_segment(own_memory());  // the client died: cleaned at once
          ++memory_generation;
        } else {
          master.unmount_segment(own_ssd());  // stale handles, cleaned when met
          ++ssd_generation;
        }
        break;
      case 23:
        if (ha) master.sync_oplog();
        master.advance_time(1);
        break;
    }
  }
}

// Compares the index with the model's holdings; returns whether they agree.
bool agrees(const Index& index, const Master& master, int round, const Policy& policy) {
  const std::set<Holding> expected = on_the_wire(master.holdings(), policy);
  if (index.holdings() == expected) return true;
  int shown = 0;
  for (const Holding& h : expected) {
    if (index.holdings().count(h) == 0 && shown++ < 10) {
      ADD_FAILURE() << "after round " << round << " the index lacks " << describe(h);
    }
  }
  for (const Holding& h : index.holdings()) {
    if (expected.count(h) == 0 && shown++ < 10) {
      ADD_FAILURE() << "after round " << round << " the index still holds " << describe(h);
    }
  }
  return false;
}

// A subscriber that joins mid-run: the index of a snapshot, and the snapshot's next sequence
// N, from which on it applies the stream.
struct LateJoiner {
  Index index;
  uint64_t next_sequence = 0;
  bool complete = false;
};

// Takes a snapshot on the replay socket at `endpoint`, as an indexer that joins does.
LateJoiner take_snapshot(const std::string& endpoint) {
  LateJoiner joiner;
  ReplayClient client(endpoint);
  client.send({"", "snapshot"});
  while (auto reply = client.receive(std::chrono::seconds(20))) {
    if (reply->size() != 3 || !(*reply)[0].empty()) break;
    const Value body = decode((*reply)[2]);
    if ((*reply)[1] == "snapshot") {
      for (const Value& event : body.as_array().at(1).as_array()) joiner.index.apply(event);
    } else if ((*reply)[1] == "snapshot-end") {
      joiner.next_sequence = body.at("next_sequence").as_uint();
      joiner.complete = true;
      break;
    } else {
      break;
    }
  }
  return joiner;
}

// The rounds after which a subscriber joins, while the master threads go on.
constexpr int kJoinRounds[] = {3, 11, 20, 33};

void run_workload(const master_model::Options& options, uint64_t seed,
                  const Policy& policy = Policy{}) {
  kv::Config config = enabled_config();
  config.queue_capacity = 1 << 20;  // no drops: the index must see every event
  config.replay_endpoint = unique_endpoint();
  config.non_utf8 = policy.non_utf8;
  config.reannounce_remaining = policy.reannounce_remaining;
  Session session(config);
  Master master(session.publisher(), options);
  session.publisher().set_object_source(
      [&master](std::optional<std::string_view> tenant, kv::Snapshot& snapshot) {
        master.add_objects(tenant, snapshot);
      });
  // Subscribers that joined mid-run, each with the sequence of the next stream message it
  // applies (0 before it applied any).
  std::vector<std::pair<LateJoiner, uint64_t>> joiners;
  Checkpoints checkpoints;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      run_thread(master, checkpoints, t, seed + static_cast<uint64_t>(t), options.ha);
    });
  }

  Index index;
  uint64_t next_sequence = 0;  // the first message's
  uint64_t events = 0;
  bool diverged = false;
  for (int round = 0; round < kRounds; ++round) {
    if (round < kRounds - 1) {
      checkpoints.wait_for_workers(round);
    } else {
      for (std::thread& thread : threads) thread.join();
    }
    // Every thread is between operations: the model is still. Under HA, the erases the log
    // accepted become durable first (erase-pending objects may already be cleared).
    if (options.ha) master.sync_oplog();
    for (const Batch& batch : session.collect()) {
      EXPECT_EQ(batch.sequence, next_sequence++) << "a gap in the stream";
      for (const Value& event : batch.events) index.apply(event);
      events += batch.events.size();
      for (auto& [joiner, next] : joiners) {
        if (batch.sequence >= joiner.next_sequence) {
          EXPECT_EQ(batch.sequence, std::max(next, joiner.next_sequence));
          for (const Value& event : batch.events) joiner.index.apply(event);
          next = batch.sequence + 1;
        }
      }
    }
    if (!diverged && !agrees(index, master, round, policy)) diverged = true;
    // Each late joiner, at every checkpoint after it joined: later operations would hide
    // what it got wrong.
    for (size_t j = 0; j < joiners.size() && !diverged; ++j) {
      if (!agrees(joiners[j].first.index, master, round, policy)) {
        ADD_FAILURE() << "the subscriber that joined after round " << kJoinRounds[j] << " (N "
                      << joiners[j].first.next_sequence << ")";
        diverged = true;
      }
    }
    if (round < kRounds - 1) checkpoints.release(round);
    // Joins while the threads go on with the next round.
    if (std::find(std::begin(kJoinRounds), std::end(kJoinRounds), round) != std::end(kJoinRounds)) {
      LateJoiner joiner = take_snapshot(config.replay_endpoint);
      EXPECT_TRUE(joiner.complete) << "the snapshot after round " << round;
      if (joiner.complete) joiners.emplace_back(std::move(joiner), 0);
    }
  }
  EXPECT_EQ(joiners.size(), std::size(kJoinRounds));
  EXPECT_EQ(session.publisher().stats().snapshots_served, std::size(kJoinRounds));

  const kv::Stats stats = session.publisher().stats();
  EXPECT_EQ(stats.dropped_events, 0u);
  EXPECT_EQ(stats.send_failures, 0u);
  EXPECT_EQ(events, stats.published_events);
  EXPECT_EQ(master.pending_erases(), 0u);
  EXPECT_GT(index.stored_, 0u);
  EXPECT_GT(index.removed_, 0u);
  EXPECT_GT(index.cleared_, 0u);
  if (policy.non_utf8 == "skip") {
    EXPECT_GT(stats.skipped_non_utf8_events, 0u) << "the key that is not UTF-8 was never used";
  } else {
    EXPECT_EQ(stats.skipped_non_utf8_events, 0u);
  }
  std::cout << "events: " << index.stored_ << " stored, " << index.removed_ << " removed, "
            << index.cleared_ << " cleared (" << stats.cleared_suppressed << " suppressed), "
            << stats.skipped_non_utf8_events << " not UTF-8 skipped; final holdings "
            << index.holdings().size() << " in " << master.object_count() << " objects\n";
}

// The default config: the key that is not UTF-8 is skipped, from every thread.
TEST(MasterConcurrency, RandomOperationsReplayToTheModelsMedia) {
  run_workload(master_model::Options{}, 20240601);
}

TEST(MasterConcurrency, RandomOperationsWithReannounceRemainingReplayToTheModelsMedia) {
  Policy policy;
  policy.reannounce_remaining = true;
  run_workload(master_model::Options{}, 20250101, policy);
}

TEST(MasterConcurrency, RandomOperationsUnderHaWithLogFailuresReplayToTheModelsMedia) {
  master_model::Options options;
  options.ha = true;
  options.durability = Durability::kDeferred;
  auto calls = std::make_shared<std::atomic<uint64_t>>(0);
  options.oplog_fault = [calls](const std::string&, const std::string&) {
    const uint64_t n = ++*calls;
    return n % 23 == 0   ? OplogFault::kReserve
           : n % 29 == 0 ? OplogFault::kAppend
                         : OplogFault::kNone;
  };
  // The key that is not UTF-8 published as bin.
  Policy policy;
  policy.non_utf8 = "bin";
  run_workload(options, 77, policy);
}

}  // namespace
