// A small reference model of Mooncake's metadata master, wired to a kv_events::Publisher the
// way docs/wiring.md ("Which call goes where") says. Test code, not part of the library: the
// suites drive it and compare the stream it makes with the calls' table (docs/spec.md section 3).
//
// What it keeps: objects keyed by (tenant, key), each with a group id and replicas of the
// five kinds, PROCESSING or COMPLETE, on named segments; a lease per object (on a logical
// clock); at most one pending replication task per object (copy, move, offload, promotion);
// 16 shards with a std::mutex each; unmounted segments; and, in HA mode, an operation log
// through which the erases of Remove, BatchRemove, regex remove and RemoveAll must go.
//
// How it calls the publisher: every mutation captures `before` (the media of COMPLETE
// replicas, through MediumSet::add(ReplicaKind)) and calls the publisher in the same
// function, under the object's shard lock. A PROCESSING replica contributes no medium, so
// adding or dropping one changes nothing on the stream. An object left with no COMPLETE
// replica after losing one is erased through the one erase path (erase_locked), which alone
// announces its removal: an eviction that invalidates an object never announces it twice.

#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "mooncake/kv_events.h"

namespace master_model {

namespace kv = mooncake::kv_events;

enum class ReplicaStatus : uint8_t { kProcessing, kComplete };

struct Replica {
  uint64_t id = 0;
  kv::ReplicaKind kind = kv::ReplicaKind::kMemory;
  std::string segment;
  ReplicaStatus status = ReplicaStatus::kProcessing;
};

// Where a new replica goes.
struct Placement {
  kv::ReplicaKind kind;
  std::string segment;
};

// What an operation did. Anything but kOk changed nothing and made no call.
enum class Status {
  kOk,
  kNotFound,     // no such object (or it is being erased through the HA log)
  kExists,       // Put of an object that exists
  kLeased,       // the object's lease has not expired
  kNotReady,     // a replica is still PROCESSING
  kPendingTask,  // a replication task is pending
  kNoTask,       // *_end without the matching *_start
  kInvalid,      // nothing to do: no processing replica to commit, no source replica, ...
  kOplogReserveFailed,
  kOplogAppendFailed,
};
const char* to_string(Status status);
void PrintTo(Status status, std::ostream* os);  // for GoogleTest's messages

enum class OplogFault { kNone, kReserve, kAppend };

// When an erase the HA log accepted is applied to the metadata (and announced).
enum class Durability {
  kImmediate,  // in the same function, as soon as the append succeeded
  kDeferred,   // when sync_oplog() runs (the log's "durable" callback)
};

struct Options {
  size_t shards = 16;
  // HA mode: erases of Remove, BatchRemove, regex remove and RemoveAll reserve a log slot and
  // append an entry first; either step can fail (oplog_fault), and the erase then does not
  // happen. The erase itself runs when the entry is durable (see Durability).
  bool ha = false;
  Durability durability = Durability::kImmediate;
  // Asked once per HA erase, under the object's shard lock; must be thread-safe.
  std::function<OplogFault(const std::string& tenant, const std::string& key)> oplog_fault;
  // Called by RemoveAll before it locks each shard, with no lock held: a test's sync point.
  std::function<void(size_t shard)> remove_all_shard_hook;
};

// One object of a Put or BatchPut.
struct PutRequest {
  std::string key;
  std::string group;
  std::vector<Placement> placements;
};

// A RemoveAll's tally for one tenant: what on_remove_all() received.
struct RemoveAllCounts {
  uint64_t removed = 0;
  uint64_t skipped = 0;
  bool operator==(const RemoveAllCounts& o) const {
    return removed == o.removed && skipped == o.skipped;
  }
};
void PrintTo(const RemoveAllCounts& counts, std::ostream* os);

// (tenant, key, medium): one medium a subscriber's index should hold.
using Holding = std::tuple<std::string, std::string, kv::Medium>;

class Master {
 public:
  Master(kv::Publisher& publisher, Options options = {});
  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  // --- Put, BatchPut, Upsert -------------------------------------------------------------
  // Allocates PROCESSING replicas for a new object. No call: nothing is readable yet.
  Status put_start(const std::string& tenant, const std::string& key, const std::string& group,
                   const std::vector<Placement>& placements);
  // Marks the PROCESSING replicas COMPLETE (only those on `medium`, if given, as Mooncake's
  // PutEnd per replica type does), then on_put_commit(media of all COMPLETE replicas).
  Status put_end(const std::string& tenant, const std::string& key,
                 std::optional<kv::Medium> medium = std::nullopt);
  // A Put that failed before committing: drops its PROCESSING replicas (the object too, when
  // none is left). No call: no COMPLETE replica was added or dropped.
  Status put_revoke(const std::string& tenant, const std::string& key);
  std::vector<Status> batch_put_start(const std::string& tenant,
                                      const std::vector<PutRequest>& requests);
  std::vector<Status> batch_put_end(const std::string& tenant,
                                    const std::vector<std::string>& keys);
  // Upsert: an absent object is a put_start. An existing one (no replica PROCESSING, no task)
  // gets new PROCESSING replicas in place of the old ones, whose value becomes unreadable:
  // on_medium_delta(old media, {}). put_end() commits the new value.
  Status upsert_start(const std::string& tenant, const std::string& key, const std::string& group,
                      const std::vector<Placement>& placements);

  // --- Replication tasks: at most one pending per object ----------------------------------
  // Copy: a PROCESSING replica at `target`; copy_end completes it (on_medium_delta).
  Status copy_start(const std::string& tenant, const std::string& key, const Placement& target);
  Status copy_end(const std::string& tenant, const std::string& key);
  // Move: like a copy, and move_end also drops the COMPLETE source replica on
  // `source_segment` (one on_medium_delta for both).
  Status move_start(const std::string& tenant, const std::string& key,
                    const std::string& source_segment, const Placement& target);
  Status move_end(const std::string& tenant, const std::string& key);
  // Offload cpu -> disk: offload_start queues the task (no replica yet: all replicas stay
  // COMPLETE); offload_end adds the written replica COMPLETE at `target` (on_medium_delta).
  Status offload_start(const std::string& tenant, const std::string& key);
  Status offload_end(const std::string& tenant, const std::string& key, const Placement& target);
  // Promotion disk -> cpu: a PROCESSING memory replica, completed by promote_end.
  Status promote_start(const std::string& tenant, const std::string& key,
                       const std::string& memory_segment);
  Status promote_end(const std::string& tenant, const std::string& key);

  // --- Eviction, stale handles, client cleanup --------------------------------------------
  // Evicts one COMPLETE replica of `kind` from an object whose lease has expired:
  // on_medium_delta(before, after), or, when no COMPLETE replica is left, the erase path.
  Status evict_replica(const std::string& tenant, const std::string& key, kv::ReplicaKind kind);
  // Grants a lease of `ttl` (logical time) after cleaning the object's stale handles.
  Status get_replica_list(const std::string& tenant, const std::string& key, uint64_t ttl);
  void advance_time(uint64_t dt);
  // A segment whose client went away. Its replicas stay in the metadata as stale handles
  // until cleanup_stale_handles() (or get_replica_list()) meets them. No call.
  void unmount_segment(const std::string& segment);
  // Drops the object's replicas on unmounted segments: on_medium_delta(before, after), or the
  // erase path when no COMPLETE replica is left.
  Status cleanup_stale_handles(const std::string& tenant, const std::string& key);
  // Client cleanup: unmounts `segment` and drops its replicas from every object at once, one
  // on_medium_delta (or erase) per object touched. Returns the objects touched.
  size_t remove_client_segment(const std::string& segment);

  // --- Remove, BatchRemove, regex remove, RemoveAll ---------------------------------------
  // Refused when leased, not all COMPLETE, or with a pending task; in HA mode also when the
  // log refuses. Otherwise the erase path: on_medium_delta(before, {}).
  Status remove(const std::string& tenant, const std::string& key);
  std::vector<Status> batch_remove(const std::string& tenant, const std::vector<std::string>& keys);
  // Removes the tenant's objects whose key matches `pattern` (std::regex_search); returns
  // how many were removed and how many matched but were refused.
  RemoveAllCounts remove_by_regex(const std::string& tenant, const std::string& pattern);
  // RemoveAll of `tenant`, or of every tenant when nullopt: begin_remove_all(), then for each
  // shard in order, under its lock, each object as remove() would (an object remove() would
  // refuse is skipped), then on_remove_all(scan, tenant, removed, skipped) for the tenant
  // (tenant-scoped) or for each tenant the loop saw (global), in tenant order. The counts are
  // what the loop accepted, whatever the map holds at the end (in HA with deferred
  // durability, accepted objects are still there). Returns the counts passed.
  std::map<std::string, RemoveAllCounts> remove_all(
      const std::optional<std::string>& tenant = std::nullopt);

  // HA: applies every erase the log accepted and has not applied yet (the "durable"
  // callback of Durability::kDeferred). Returns how many were applied.
  size_t sync_oplog();

  // --- What the model holds -----------------------------------------------------------------
  size_t shard_count() const { return shards_.size(); }
  size_t shard_of(const std::string& tenant, const std::string& key) const;
  // Media of COMPLETE replicas; nullopt when the object does not exist.
  std::optional<kv::MediumSet> media(const std::string& tenant, const std::string& key) const;
  // Objects in the map, erase-pending ones included.
  size_t object_count() const;
  size_t pending_erases() const;
  // Every (tenant, key, medium) of a COMPLETE replica, erase-pending objects included (their
  // `removed` comes when they are erased). Tenant as the master holds it ("" stays "").
  std::set<Holding> holdings() const;
  // The object source of snapshots: adds every object with a COMPLETE replica (of `tenant`,
  // as the wire names it, when given) to `snapshot`, copying one shard at a time under its
  // lock, as a master's source should. Erase-pending objects are included, as in holdings().
  void add_objects(std::optional<std::string_view> tenant, kv::Snapshot& snapshot) const;

 private:
  using ObjectId = std::pair<std::string, std::string>;  // (tenant, key)
  enum class TaskKind { kCopy, kMove, kOffload, kPromote };
  struct Task {
    TaskKind kind;
    uint64_t target = 0;  // replica id, 0 for none
    uint64_t source = 0;  // kMove: replica id, 0 once gone
  };
  struct Object {
    std::string group;
    std::vector<Replica> replicas;
    uint64_t lease_expiry = 0;
    std::optional<Task> task;
    bool erase_pending = false;  // HA, deferred: accepted by the log, not yet applied
  };
  struct Shard {
    mutable std::mutex mutex;
    std::map<ObjectId, Object> objects;
  };
  using Iterator = std::map<ObjectId, Object>::iterator;

  static kv::MediumSet completed_media(const Object& object);
  Shard& shard(const std::string& tenant, const std::string& key) const;
  // The object unless absent or erase-pending; call under the shard lock.
  static Object* live(Shard& shard, const ObjectId& id);
  std::vector<Replica> make_replicas(const std::vector<Placement>& placements);
  Status check_removable(const Object& object) const;
  bool leased(const Object& object) const;
  bool unmounted(const std::string& segment) const;

  // The erase path: erases the object and calls on_medium_delta(before, {}), `before` being
  // the object's media when the mutation that erases it began.
  void erase_locked(Shard& shard, Iterator it, kv::MediumSet before);
  // Drops the replicas `drop` selects, then announces: on_medium_delta(before, after), or the
  // erase path when the object lost its last COMPLETE replica (or has no replica left).
  // Returns whether any replica was dropped.
  bool drop_replicas_locked(Shard& shard, Iterator it,
                            const std::function<bool(const Replica&)>& drop);
  // Remove, BatchRemove, regex remove, RemoveAll: checks, then (HA) the log, then the erase.
  Status remove_locked(Shard& shard, Iterator it);
  Status complete_task_locked(const ObjectId& id, Object& object, TaskKind kind,
                              const std::optional<Placement>& written);
  // Locks the object's shard and completes its pending task of `kind`.
  Status finish_task(const std::string& tenant, const std::string& key, TaskKind kind,
                     const std::optional<Placement>& written);
  Status put_end_locked(const ObjectId& id, Object& object, std::optional<kv::Medium> medium);

  kv::Publisher& publisher_;
  const Options options_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<uint64_t> next_replica_id_{1};
  std::atomic<uint64_t> now_{0};

  mutable std::mutex segments_mutex_;
  std::set<std::string> unmounted_segments_;

  mutable std::mutex oplog_mutex_;  // taken under a shard lock, never the reverse
  uint64_t next_slot_ = 1;
  std::vector<ObjectId> oplog_pending_;
};

}  // namespace master_model
