// The calls' table (docs/spec.md section 3), row by row, from a master wired as docs/wiring.md
// says: the reference model in master_model/ makes each master operation, and each test reads the
// real stream and compares it with the exact events the table prescribes.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <future>
#include <map>
#include <limits>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "master_model/master_model.h"
#include "test_support.h"

namespace {

using namespace kv_events_test;
using kv::Medium;
using kv::MediumSet;
using master_model::Durability;
using master_model::Master;
using master_model::OplogFault;
using master_model::Placement;
using master_model::RemoveAllCounts;
using master_model::Status;
using RK = kv::ReplicaKind;
using Lines = std::vector<std::string>;

const Placement kMemA{RK::kMemory, "mem-a"};
const Placement kMemB{RK::kMemory, "mem-b"};
const Placement kMemC{RK::kMemory, "mem-c"};
const Placement kDisk{RK::kDisk, "disk-a"};
const Placement kLocalDisk{RK::kLocalDisk, "local-a"};
const Placement kSsd{RK::kNofSsd, "ssd-a"};
const Placement kSsdB{RK::kNofSsd, "ssd-b"};
const Placement kDfs{RK::kDfs, "dfs"};
const Placement kDfsB{RK::kDfs, "dfs-b"};

const MediumSet kCpu{Medium::kCpu};
const MediumSet kDiskOnly{Medium::kDisk};
const MediumSet kBoth{Medium::kCpu, Medium::kDisk};

// A publisher with a joined subscriber, and a master wired to it.
class MasterSession {
 public:
  explicit MasterSession(master_model::Options options = {})
      : master_(session_.publisher(), std::move(options)) {}

  Master& master() { return master_; }
  kv::Publisher& publisher() { return session_.publisher(); }

  // What was published since the last call, as summary() lines.
  Lines lines() { return summaries(session_.collect_events()); }
  // The same, with the tenant: "t: stored cpu k", "cleared t".
  Lines tenant_lines() {
    Lines out;
    for (const Value& event : session_.collect_events()) {
      const std::string tenant = event.at("tenant_id").bytes();
      out.push_back(event.at("event_type").as_str() == "cleared" ? summary(event)
                                                                 : tenant + ": " + summary(event));
    }
    return out;
  }
  std::vector<Value> events() { return session_.collect_events(); }

  // put_start + put_end of a new object, all its replicas committed.
  void commit(const std::string& tenant, const std::string& key,
              const std::vector<Placement>& placements, const std::string& group = "g") {
    ASSERT_EQ(master_.put_start(tenant, key, group, placements), Status::kOk) << key;
    ASSERT_EQ(master_.put_end(tenant, key), Status::kOk) << key;
  }

 private:
  Session session_;
  Master master_;
};

// `keys` of `tenant` in the order RemoveAll, regex remove and client cleanup visit them:
// shard by shard, in key order within a shard.
std::vector<std::string> loop_order(const Master& master, const std::string& tenant,
                                    std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
    return std::make_pair(master.shard_of(tenant, a), a) <
           std::make_pair(master.shard_of(tenant, b), b);
  });
  return keys;
}

// A key of `tenant` whose shard satisfies `wanted`.
std::string key_in_shard(const Master& master, const std::string& tenant, const std::string& prefix,
                         const std::function<bool(size_t)>& wanted) {
  for (int i = 0;; ++i) {
    const std::string key = prefix + std::to_string(i);
    if (wanted(master.shard_of(tenant, key))) return key;
  }
}

// --- Put / BatchPut commit ---------------------------------------------------------------

TEST(PutCommit, StoresEveryCompletedMediumOnce) {
  MasterSession s;
  ASSERT_EQ(s.master().put_start("t", "k", "g", {kMemA, kMemB, kLocalDisk, kDfs}), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{}) << "nothing is readable before the commit";
  ASSERT_EQ(s.master().put_end("t", "k"), Status::kOk);
  const std::vector<Value> events = s.events();
  EXPECT_EQ(summaries(events), (Lines{"stored cpu k", "stored disk k"}));
  for (const Value& event : events) {
    EXPECT_EQ(event.at("tenant_id").as_str(), "t");
    EXPECT_EQ(event.at("group_id").as_str(), "g");
  }
}

TEST(PutCommit, BatchPutStoresEachCommittedObject) {
  MasterSession s;
  const std::vector<Status> started = s.master().batch_put_start(
      "t", {{"a", "g", {kMemA}}, {"b", "g", {kSsd}}, {"c", "", {kMemA, kDisk}}});
  EXPECT_EQ(started, (std::vector<Status>{Status::kOk, Status::kOk, Status::kOk}));
  EXPECT_EQ(s.lines(), Lines{});
  s.master().batch_put_end("t", {"a", "b", "c"});
  EXPECT_EQ(s.lines(), (Lines{"stored cpu a", "stored disk b", "stored cpu c", "stored disk c"}));
}

TEST(PutCommit, ASecondCommitReannouncesWhatIsAlreadyAnnounced) {
  MasterSession s;
  ASSERT_EQ(s.master().put_start("t", "k", "g", {kMemA, kSsd}), Status::kOk);
  ASSERT_EQ(s.master().put_end("t", "k", Medium::kCpu), Status::kOk);  // memory first
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k"})) << "the PROCESSING ssd replica is not announced";
  ASSERT_EQ(s.master().put_end("t", "k", Medium::kDisk), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k", "stored disk k"}));
  EXPECT_EQ(s.master().put_end("t", "k"), Status::kInvalid);  // nothing left to commit
  EXPECT_EQ(s.lines(), Lines{});
}

// --- Failed uncommitted Put ----------------------------------------------------------------

TEST(FailedPut, AnUncommittedNewPutEmitsNothing) {
  MasterSession s;
  ASSERT_EQ(s.master().put_start("t", "k", "g", {kMemA, kDfs}), Status::kOk);
  ASSERT_EQ(s.master().put_revoke("t", "k"), Status::kOk);
  EXPECT_FALSE(s.master().media("t", "k").has_value());
  EXPECT_EQ(s.lines(), Lines{});
  s.commit("t", "k", {kMemA});  // the key is free again
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k"}));
}

TEST(FailedPut, RevokingTheRestOfAPartlyCommittedPutEmitsNothing) {
  MasterSession s;
  ASSERT_EQ(s.master().put_start("t", "k", "g", {kMemA, kDfs}), Status::kOk);
  ASSERT_EQ(s.master().put_end("t", "k", Medium::kCpu), Status::kOk);
  ASSERT_EQ(s.master().put_revoke("t", "k"), Status::kOk);  // the dfs write failed
  EXPECT_EQ(s.master().media("t", "k"), kCpu);
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k"}));
}

// --- Upsert --------------------------------------------------------------------------------

TEST(Upsert, RetractsTheOldValueThenStoresTheNewOneAtCommit) {
  MasterSession s;
  s.commit("t", "k", {kMemA, kDfs}, "old-group");
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k", "stored disk k"}));
  ASSERT_EQ(s.master().upsert_start("t", "k", "new-group", {kMemB}), Status::kOk);
  std::vector<Value> events = s.events();
  EXPECT_EQ(summaries(events), (Lines{"removed cpu k", "removed disk k"}));
  for (const Value& event : events) EXPECT_EQ(event.at("group_id").as_str(), "old-group");
  ASSERT_EQ(s.master().put_end("t", "k"), Status::kOk);
  events = s.events();
  EXPECT_EQ(summaries(events), (Lines{"stored cpu k"}));
  EXPECT_EQ(events.at(0).at("group_id").as_str(), "new-group");
}

TEST(Upsert, OfAnAbsentObjectIsAPut) {
  MasterSession s;
  ASSERT_EQ(s.master().upsert_start("t", "k", "g", {kSsd}), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  ASSERT_EQ(s.master().put_end("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"stored disk k"}));
}

TEST(Upsert, ThatFailsBeforeCommitRetractsTheOldValueOnlyOnce) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  ASSERT_EQ(s.master().upsert_start("t", "k", "g", {kMemB, kSsd}), Status::kOk);
  ASSERT_EQ(s.master().put_revoke("t", "k"), Status::kOk);
  EXPECT_FALSE(s.master().media("t", "k").has_value());
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k", "removed cpu k"}));
}

// --- Copy / Move completion ------------------------------------------------------------------

TEST(Copy, ToANewMediumStoresItAtCompletion) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  s.lines();
  ASSERT_EQ(s.master().copy_start("t", "k", kDfs), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{}) << "a PROCESSING replica is not announced";
  ASSERT_EQ(s.master().copy_end("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"stored disk k"}));
}

TEST(Copy, OntoAnAlreadyAvailableMediumEmitsNothing) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  s.commit("t", "d", {kSsd});
  s.lines();
  ASSERT_EQ(s.master().copy_start("t", "k", kMemB), Status::kOk);
  ASSERT_EQ(s.master().copy_end("t", "k"), Status::kOk);
  ASSERT_EQ(s.master().copy_start("t", "d", kDfs), Status::kOk);
  ASSERT_EQ(s.master().copy_end("t", "d"), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  EXPECT_EQ(s.master().media("t", "k"), kCpu);
  EXPECT_EQ(s.master().media("t", "d"), kDiskOnly);
}

TEST(Move, ToAnotherMediumRemovesTheOldThenStoresTheNew) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  s.lines();
  ASSERT_EQ(s.master().move_start("t", "k", "mem-a", kLocalDisk), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  ASSERT_EQ(s.master().move_end("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k", "stored disk k"}));
  EXPECT_EQ(s.master().media("t", "k"), kDiskOnly);
}

TEST(Move, WithinAMediumEmitsNothing) {
  MasterSession s;
  s.commit("t", "k", {kMemA, kSsd});
  s.lines();
  ASSERT_EQ(s.master().move_start("t", "k", "mem-a", kMemB), Status::kOk);
  ASSERT_EQ(s.master().move_end("t", "k"), Status::kOk);
  ASSERT_EQ(s.master().move_start("t", "k", "ssd-a", kDfs), Status::kOk);
  ASSERT_EQ(s.master().move_end("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  EXPECT_EQ(s.master().media("t", "k"), kBoth);
}

// --- Offload / promotion completion ----------------------------------------------------------

TEST(Offload, CpuToDiskStoresDiskWhenItFirstAppears) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  s.lines();
  ASSERT_EQ(s.master().offload_start("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  ASSERT_EQ(s.master().offload_end("t", "k", kLocalDisk), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"stored disk k"}));
  ASSERT_EQ(s.master().offload_start("t", "k"), Status::kOk);  // a second disk replica
  ASSERT_EQ(s.master().offload_end("t", "k", kSsd), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  EXPECT_EQ(s.master().media("t", "k"), kBoth);
}

TEST(Promotion, DiskToCpuStoresCpu) {
  MasterSession s;
  s.commit("t", "k", {kSsd});
  s.lines();
  ASSERT_EQ(s.master().promote_start("t", "k", "mem-a"), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{});
  ASSERT_EQ(s.master().promote_end("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k"}));
  EXPECT_EQ(s.master().media("t", "k"), kBoth);
}

// --- Replica clear, eviction -----------------------------------------------------------------

TEST(Eviction, OfTheLastMemoryReplicaWhileADiskReplicaStaysRemovesCpuOnly) {
  MasterSession s;
  s.commit("t", "k", {kMemA, kMemB, kDfs});
  s.lines();
  ASSERT_EQ(s.master().evict_replica("t", "k", RK::kMemory), Status::kOk);
  EXPECT_EQ(s.lines(), Lines{}) << "another memory replica is left";
  ASSERT_EQ(s.master().evict_replica("t", "k", RK::kMemory), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k"}));
  EXPECT_EQ(s.master().media("t", "k"), kDiskOnly);
  EXPECT_EQ(s.master().evict_replica("t", "k", RK::kMemory), Status::kInvalid);
  EXPECT_EQ(s.lines(), Lines{});
}

TEST(Eviction, ThatInvalidatesTheObjectIsAnnouncedOnceByTheErasePath) {
  MasterSession s;
  // k: its only COMPLETE replica is in memory; a copy to dfs is still PROCESSING.
  s.commit("t", "k", {kMemA});
  ASSERT_EQ(s.master().copy_start("t", "k", kDfs), Status::kOk);
  // j: on both media; disk goes first, then memory invalidates it.
  s.commit("t", "j", {kMemA, kSsd});
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k", "stored cpu j", "stored disk j"}));
  ASSERT_EQ(s.master().evict_replica("t", "k", RK::kMemory), Status::kOk);
  ASSERT_EQ(s.master().evict_replica("t", "j", RK::kNofSsd), Status::kOk);
  ASSERT_EQ(s.master().evict_replica("t", "j", RK::kMemory), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k", "removed disk j", "removed cpu j"}))
      << "exactly one removed per medium, none for the never-completed dfs replica";
  EXPECT_FALSE(s.master().media("t", "k").has_value());
  EXPECT_FALSE(s.master().media("t", "j").has_value());
  EXPECT_EQ(s.master().copy_end("t", "k"), Status::kNotFound);
  EXPECT_EQ(s.lines(), Lines{});
}

TEST(Eviction, WaitsForTheLeaseToExpire) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  s.lines();
  ASSERT_EQ(s.master().get_replica_list("t", "k", 10), Status::kOk);
  EXPECT_EQ(s.master().evict_replica("t", "k", RK::kMemory), Status::kLeased);
  EXPECT_EQ(s.lines(), Lines{});
  s.master().advance_time(10);
  ASSERT_EQ(s.master().evict_replica("t", "k", RK::kMemory), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k"}));
}

// --- Stale handle / client cleanup -----------------------------------------------------------

TEST(StaleHandles, CleanupRemovesTheMediaOfUnmountedSegments) {
  MasterSession s;
  s.commit("t", "k", {kMemA, kSsdB});
  s.lines();
  s.master().unmount_segment("mem-a");
  EXPECT_EQ(s.lines(), Lines{}) << "the handle is stale, not yet cleaned";
  ASSERT_EQ(s.master().get_replica_list("t", "k", 0), Status::kOk);  // cleans it
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k"}));
  s.master().unmount_segment("ssd-b");
  ASSERT_EQ(s.master().cleanup_stale_handles("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed disk k"}));
  EXPECT_FALSE(s.master().media("t", "k").has_value());
  EXPECT_EQ(s.master().cleanup_stale_handles("t", "k"), Status::kNotFound);
}

TEST(ClientCleanup, RemovesTheDeadClientsReplicasFromEveryObject) {
  MasterSession s;
  s.commit("t", "x", {kMemA});         // loses its only replica: erased
  s.commit("t", "y", {kMemA, kMemC});  // keeps a memory replica: nothing
  s.commit("t", "z", {kMemA, kSsdB});  // loses cpu, keeps disk
  s.lines();
  EXPECT_EQ(s.master().remove_client_segment("mem-a"), 3u);
  Lines expected;
  for (const std::string& key : loop_order(s.master(), "t", {"x", "z"})) {
    expected.push_back("removed cpu " + key);
  }
  EXPECT_EQ(s.lines(), expected);
  EXPECT_FALSE(s.master().media("t", "x").has_value());
  EXPECT_EQ(s.master().media("t", "y"), kCpu);
  EXPECT_EQ(s.master().media("t", "z"), kDiskOnly);
}

TEST(ClientCleanup, AReplicaStillProcessingContributesNothing) {
  MasterSession s;
  s.commit("t", "k", {kMemC});
  ASSERT_EQ(s.master().copy_start("t", "k", kSsd), Status::kOk);         // on the dead client
  ASSERT_EQ(s.master().put_start("t", "p", "g", {kMemA}), Status::kOk);  // uncommitted
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k"}));
  s.master().remove_client_segment("ssd-a");
  s.master().remove_client_segment("mem-a");
  EXPECT_EQ(s.lines(), Lines{});
  EXPECT_EQ(s.master().media("t", "k"), kCpu);
  EXPECT_FALSE(s.master().media("t", "p").has_value());
  EXPECT_EQ(s.master().copy_end("t", "k"), Status::kNoTask) << "the copy was cancelled";
}

// --- Remove / BatchRemove / regex remove -----------------------------------------------------

TEST(Remove, RetractsEveryMedium) {
  MasterSession s;
  s.commit("t", "k", {kMemA, kMemB, kDfs});
  s.lines();
  ASSERT_EQ(s.master().remove("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k", "removed disk k"}));
  EXPECT_EQ(s.master().remove("t", "k"), Status::kNotFound);
  EXPECT_EQ(s.lines(), Lines{});
}

TEST(Remove, RefusedWhileLeasedOrNotReadyEmitsNothing) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  ASSERT_EQ(s.master().put_start("t", "p", "g", {kMemA, kSsd}), Status::kOk);
  ASSERT_EQ(s.master().put_end("t", "p", Medium::kCpu), Status::kOk);
  s.lines();
  ASSERT_EQ(s.master().get_replica_list("t", "k", 5), Status::kOk);
  EXPECT_EQ(s.master().remove("t", "k"), Status::kLeased);
  EXPECT_EQ(s.master().remove("t", "p"), Status::kNotReady);
  EXPECT_EQ(s.lines(), Lines{});
  s.master().advance_time(5);
  ASSERT_EQ(s.master().remove("t", "k"), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed cpu k"}));
}

TEST(BatchRemove, RetractsEachRemovedObject) {
  MasterSession s;
  s.commit("t", "a", {kMemA});
  s.commit("t", "b", {kSsd});
  s.commit("t", "c", {kMemA, kDfs});
  ASSERT_EQ(s.master().get_replica_list("t", "b", 100), Status::kOk);
  s.lines();
  EXPECT_EQ(s.master().batch_remove("t", {"a", "b", "c", "missing"}),
            (std::vector<Status>{Status::kOk, Status::kLeased, Status::kOk, Status::kNotFound}));
  EXPECT_EQ(s.lines(), (Lines{"removed cpu a", "removed cpu c", "removed disk c"}));
}

TEST(RegexRemove, RetractsTheMatchingKeysOfTheTenantOnly) {
  MasterSession s;
  s.commit("t", "llama/1", {kMemA});
  s.commit("t", "llama/2", {kDfs});
  s.commit("t", "qwen/1", {kMemA});
  s.commit("u", "llama/3", {kMemA});
  s.lines();
  EXPECT_EQ(s.master().remove_by_regex("t", "^llama/"), (RemoveAllCounts{2, 0}));
  const std::vector<std::string> order = loop_order(s.master(), "t", {"llama/1", "llama/2"});
  Lines expected;
  for (const std::string& key : order) {
    expected.push_back((key == "llama/1" ? "t: removed cpu " : "t: removed disk ") + key);
  }
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().media("t", "qwen/1"), kCpu);
  EXPECT_EQ(s.master().media("u", "llama/3"), kCpu);
}

// --- RemoveAll -------------------------------------------------------------------------------

// Commits k0..k<n-1> of `tenant` on memory (odd ones on disk too); returns the loop's
// expected removed lines, in loop order, with the tenant prefix.
Lines commit_objects(MasterSession& s, const std::string& tenant, int n,
                     const std::string& skip_key = "") {
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    const std::string key = "k" + std::to_string(i);
    s.commit(tenant, key, i % 2 ? std::vector<Placement>{kMemA, kSsd} : std::vector{kMemA});
    keys.push_back(key);
  }
  Lines removed;
  for (const std::string& key : loop_order(s.master(), tenant, keys)) {
    if (key == skip_key) continue;
    const int i = std::stoi(key.substr(1));
    removed.push_back(tenant + ": removed cpu " + key);
    if (i % 2) removed.push_back(tenant + ": removed disk " + key);
  }
  return removed;
}

TEST(RemoveAll, RemovesEachObjectThenClears) {
  MasterSession s;
  Lines expected = commit_objects(s, "t", 6);
  s.lines();
  const auto counts = s.master().remove_all("t");
  EXPECT_EQ(counts.at("t"), (RemoveAllCounts{6, 0}));
  expected.push_back("cleared t");
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().object_count(), 0u);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 0u);
}

TEST(RemoveAll, AGlobalRemoveAllClearsEachTenantItSaw) {
  MasterSession s;
  std::vector<std::tuple<size_t, std::string, std::string>> visits;  // shard, tenant, key
  for (const std::string tenant : {"", "a", "b"}) {
    for (const std::string key : {"x", "y"}) {
      s.commit(tenant, key, {kMemA});
      visits.emplace_back(s.master().shard_of(tenant, key), tenant, key);
    }
  }
  s.lines();
  const auto counts = s.master().remove_all();
  EXPECT_EQ(counts.size(), 3u);
  std::sort(visits.begin(), visits.end());
  Lines expected;
  for (const auto& [shard, tenant, key] : visits) {
    expected.push_back((tenant.empty() ? "default" : tenant) + ": removed cpu " + key);
  }
  // One on_remove_all per tenant, in tenant order; the empty tenant is "default".
  expected.insert(expected.end(), {"cleared default", "cleared a", "cleared b"});
  EXPECT_EQ(s.tenant_lines(), expected);
}

TEST(RemoveAll, NoClearedWhileAnObjectIsLeased) {
  MasterSession s;
  Lines expected = commit_objects(s, "t", 4, "k1");
  ASSERT_EQ(s.master().get_replica_list("t", "k1", 100), Status::kOk);
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{3, 1}));
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().media("t", "k1"), kBoth);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, NoClearedWhileAnObjectsReplicasAreNotAllComplete) {
  MasterSession s;
  Lines expected = commit_objects(s, "t", 4);
  // p is readable on cpu, its ssd replica still PROCESSING.
  ASSERT_EQ(s.master().put_start("t", "p", "g", {kMemA, kSsd}), Status::kOk);
  ASSERT_EQ(s.master().put_end("t", "p", Medium::kCpu), Status::kOk);
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{4, 1}));
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().media("t", "p"), kCpu);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, NoClearedWhileAReplicationTaskIsPending) {
  MasterSession s;
  Lines expected = commit_objects(s, "t", 4, "k2");
  ASSERT_EQ(s.master().offload_start("t", "k2"), Status::kOk);  // replicas all COMPLETE
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{3, 1}));
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().media("t", "k2"), kCpu);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);
}

TEST(RemoveAll, NoClearedForATenantThatNeverHeldObjects) {
  MasterSession s;
  s.commit("t", "k", {kMemA});
  s.lines();
  EXPECT_EQ(s.master().remove_all("ghost").at("ghost"), (RemoveAllCounts{0, 0}));
  EXPECT_EQ(s.tenant_lines(), Lines{});
  EXPECT_EQ(s.master().media("t", "k"), kCpu);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);
}

// --- RemoveAll and Remove in HA mode -----------------------------------------------------------

master_model::Options ha(Durability durability, std::string failing_key = "",
                         OplogFault fault = OplogFault::kNone) {
  master_model::Options options;
  options.ha = true;
  options.durability = durability;
  options.oplog_fault = [failing_key, fault](const std::string&, const std::string& key) {
    return key == failing_key ? fault : OplogFault::kNone;
  };
  return options;
}

TEST(RemoveAllHa, ErasesThatTheLogAcceptedAreRemovedThenCleared) {
  MasterSession s(ha(Durability::kImmediate));
  Lines expected = commit_objects(s, "t", 5);
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{5, 0}));
  expected.push_back("cleared t");
  EXPECT_EQ(s.tenant_lines(), expected);
}

TEST(RemoveAllHa, AFailedSlotReservationSkipsTheObjectAndTheCleared) {
  MasterSession s(ha(Durability::kImmediate, "k3", OplogFault::kReserve));
  Lines expected = commit_objects(s, "t", 5, "k3");
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{4, 1}));
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().media("t", "k3"), kBoth);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);
}

TEST(RemoveAllHa, AFailedAppendSkipsTheObjectAndTheCleared) {
  MasterSession s(ha(Durability::kImmediate, "k0", OplogFault::kAppend));
  Lines expected = commit_objects(s, "t", 5, "k0");
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{4, 1}));
  EXPECT_EQ(s.tenant_lines(), expected);
  EXPECT_EQ(s.master().media("t", "k0"), kCpu);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);
}

// With deferred durability the map still holds every object when the loop ends: the master
// reports what the loop accepted, and the erases announce themselves when durable.
TEST(RemoveAllHa, TheDecisionFollowsWhatTheLoopAcceptedNotWhetherTheMapIsEmpty) {
  MasterSession s(ha(Durability::kDeferred));
  const Lines removed = commit_objects(s, "t", 4);
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{4, 0}));
  EXPECT_EQ(s.master().object_count(), 4u) << "the erases wait for the log";
  EXPECT_EQ(s.tenant_lines(), (Lines{"cleared t"}));
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{0, 0}))
      << "erase-pending objects are not seen again";
  EXPECT_EQ(s.master().sync_oplog(), 4u);
  EXPECT_EQ(s.master().object_count(), 0u);
  // The erases go in the order the loop appended them, which is the loop order.
  EXPECT_EQ(s.tenant_lines(), removed);
  EXPECT_EQ(s.publisher().stats().cleared_suppressed, 1u);  // the second, empty, RemoveAll
}

TEST(RemoveAllHa, DeferredWithAFailedAppendDoesNotClear) {
  MasterSession s(ha(Durability::kDeferred, "k1", OplogFault::kAppend));
  const Lines removed = commit_objects(s, "t", 4, "k1");
  s.lines();
  EXPECT_EQ(s.master().remove_all("t").at("t"), (RemoveAllCounts{3, 1}));
  EXPECT_EQ(s.tenant_lines(), Lines{});
  EXPECT_EQ(s.master().sync_oplog(), 3u);
  EXPECT_EQ(s.tenant_lines(), removed);
  EXPECT_EQ(s.master().media("t", "k1"), kBoth);
}

TEST(RemoveHa, ALogFailureRefusesTheRemoveAndEmitsNothing) {
  MasterSession reserve(ha(Durability::kImmediate, "k", OplogFault::kReserve));
  reserve.commit("t", "k", {kMemA});
  EXPECT_EQ(reserve.master().remove("t", "k"), Status::kOplogReserveFailed);
  EXPECT_EQ(reserve.lines(), (Lines{"stored cpu k"}));

  MasterSession append(ha(Durability::kImmediate, "k", OplogFault::kAppend));
  append.commit("t", "k", {kMemA});
  append.commit("t", "j", {kMemA});
  EXPECT_EQ(append.master().batch_remove("t", {"k", "j"}),
            (std::vector<Status>{Status::kOplogAppendFailed, Status::kOk}));
  EXPECT_EQ(append.lines(), (Lines{"stored cpu k", "stored cpu j", "removed cpu j"}));
}

// --- A Put that commits on another thread while RemoveAll scans ------------------------------

// What one RemoveAll returned, and the events published from its scan on.
struct PutDuringScan {
  std::map<std::string, RemoveAllCounts> counts;
  std::vector<Value> events;
};

// Checks the contract's rule on a stream that starts at the scan: no `cleared` of `tenant` after a
// `stored` of `tenant`.
void expect_no_cleared_after_stored(const std::vector<Value>& events, const std::string& tenant) {
  bool stored = false;
  for (const Value& event : events) {
    if (event.at("tenant_id").bytes() != tenant) continue;
    const std::string& type = event.at("event_type").as_str();
    if (type == "stored") stored = true;
    EXPECT_FALSE(type == "cleared" && stored)
        << "a cleared of " << tenant << " after a stored that came after the scan";
  }
}

// The loop pauses before shard `pause_at` until the Put has committed.
master_model::Options pausing(const size_t& pause_at, std::promise<void>& reached,
                              std::promise<void>& committed) {
  master_model::Options options;
  options.remove_all_shard_hook = [&pause_at, &reached, &committed](size_t shard) {
    if (shard != pause_at) return;
    reached.set_value();
    committed.get_future().wait();
  };
  return options;
}

class PutDuringRemoveAll : public ::testing::Test {
 protected:
  // Runs the RemoveAll of tenant "a" with a Put of (tenant, key) committing on another thread
  // while the loop waits before shard `pause_at`.
  PutDuringScan run(const std::string& tenant, const std::string& key) {
    std::thread putter([&] {
      reached_.get_future().wait();
      EXPECT_EQ(s_.master().put_start(tenant, key, "g", {kMemB}), Status::kOk);
      EXPECT_EQ(s_.master().put_end(tenant, key), Status::kOk);
      committed_.set_value();
    });
    PutDuringScan result;
    result.counts = s_.master().remove_all("a");
    putter.join();
    result.events = s_.events();
    return result;
  }

  size_t pause_at_ = std::numeric_limits<size_t>::max();
  std::promise<void> reached_;
  std::promise<void> committed_;
  MasterSession s_{pausing(pause_at_, reached_, committed_)};
};

TEST_F(PutDuringRemoveAll, InAShardAlreadyScannedItSurvivesAndNoClearedFollows) {
  Master& m = s_.master();
  const std::string late = key_in_shard(m, "a", "late", [](size_t shard) { return shard < 12; });
  pause_at_ = m.shard_of("a", late) + 1;
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) {
    keys.push_back("k" + std::to_string(i));
    s_.commit("a", keys.back(), {kMemA});
  }
  s_.events();
  const PutDuringScan r = run("a", late);
  EXPECT_EQ(r.counts.at("a"), (RemoveAllCounts{8, 0}));
  Lines expected;
  bool put_seen = false;
  for (const std::string& key : loop_order(m, "a", keys)) {
    if (!put_seen && m.shard_of("a", key) >= pause_at_) {
      expected.push_back("stored cpu " + late);
      put_seen = true;
    }
    expected.push_back("removed cpu " + key);
  }
  if (!put_seen) expected.push_back("stored cpu " + late);
  EXPECT_EQ(summaries(r.events), expected);
  expect_no_cleared_after_stored(r.events, "a");
  EXPECT_EQ(m.media("a", late), kCpu) << "the loop had passed its shard";
  EXPECT_EQ(s_.publisher().stats().cleared_suppressed, 1u);
}

TEST_F(PutDuringRemoveAll, InAShardNotYetScannedTheLoopRemovesItAndNoClearedFollows) {
  Master& m = s_.master();
  pause_at_ = 0;  // the Put commits after the scan began, before any shard is locked
  std::vector<std::string> keys{"late"};
  for (int i = 0; i < 4; ++i) {
    keys.push_back("k" + std::to_string(i));
    s_.commit("a", keys.back(), {kMemA});
  }
  s_.events();
  const PutDuringScan r = run("a", "late");
  EXPECT_EQ(r.counts.at("a"), (RemoveAllCounts{5, 0}));
  Lines expected{"stored cpu late"};
  for (const std::string& key : loop_order(m, "a", keys)) expected.push_back("removed cpu " + key);
  EXPECT_EQ(summaries(r.events), expected);
  expect_no_cleared_after_stored(r.events, "a");
  EXPECT_EQ(m.object_count(), 0u);
  EXPECT_EQ(s_.publisher().stats().cleared_suppressed, 1u);
}

TEST_F(PutDuringRemoveAll, OfAnotherTenantDoesNotSuppressTheCleared) {
  Master& m = s_.master();
  pause_at_ = 8;
  std::vector<std::string> keys;
  for (int i = 0; i < 4; ++i) {
    keys.push_back("k" + std::to_string(i));
    s_.commit("a", keys.back(), {kMemA});
  }
  s_.events();
  const PutDuringScan r = run("b", "late");
  Lines expected;
  bool put_seen = false;
  for (const std::string& key : loop_order(m, "a", keys)) {
    if (!put_seen && m.shard_of("a", key) >= pause_at_) {
      expected.push_back("b: stored cpu late");
      put_seen = true;
    }
    expected.push_back("a: removed cpu " + key);
  }
  if (!put_seen) expected.push_back("b: stored cpu late");
  expected.push_back("cleared a");
  Lines got;
  for (const Value& event : r.events) {
    got.push_back(event.at("event_type").as_str() == "cleared"
                      ? summary(event)
                      : event.at("tenant_id").bytes() + ": " + summary(event));
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(m.media("b", "late"), kCpu);
}

// --- Replica kinds collapse onto two media ---------------------------------------------------

TEST(ReplicaKinds, DfsLocalDiskAndNvmeofSsdAllAppearAsDiskOneEventPerMedium) {
  MasterSession s;
  s.commit("t", "k", {kDfs, kLocalDisk, kSsd, kDisk, kMemA, kMemB});
  EXPECT_EQ(s.lines(), (Lines{"stored cpu k", "stored disk k"}));
  ASSERT_EQ(s.master().copy_start("t", "k", kDfsB), Status::kOk);
  ASSERT_EQ(s.master().copy_end("t", "k"), Status::kOk);
  for (RK kind : {RK::kDfs, RK::kLocalDisk, RK::kNofSsd, RK::kDfs}) {
    ASSERT_EQ(s.master().evict_replica("t", "k", kind), Status::kOk);
  }
  EXPECT_EQ(s.lines(), Lines{}) << "a disk replica is left";
  ASSERT_EQ(s.master().evict_replica("t", "k", RK::kDisk), Status::kOk);
  EXPECT_EQ(s.lines(), (Lines{"removed disk k"}));
  s.commit("t", "only-disk", {kDfs, kSsd});
  ASSERT_EQ(s.master().remove("t", "k"), Status::kOk);
  ASSERT_EQ(s.master().remove("t", "only-disk"), Status::kOk);
  const std::vector<Value> events = s.events();
  EXPECT_EQ(summaries(events),
            (Lines{"stored disk only-disk", "removed cpu k", "removed disk only-disk"}));
}

}  // namespace
