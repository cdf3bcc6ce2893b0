#include "master_model.h"

#include <algorithm>
#include <locale>
#include <ostream>
#include <regex>

namespace master_model {

const char* to_string(Status status) {
  switch (status) {
    case Status::kOk: return "ok";
    case Status::kNotFound: return "not found";
    case Status::kExists: return "exists";
    case Status::kLeased: return "leased";
    case Status::kNotReady: return "not ready";
    case Status::kPendingTask: return "pending task";
    case Status::kNoTask: return "no task";
    case Status::kInvalid: return "invalid";
    case Status::kOplogReserveFailed: return "oplog reserve failed";
    case Status::kOplogAppendFailed: return "oplog append failed";
  }
  return "?";
}

void PrintTo(Status status, std::ostream* os) { *os << to_string(status); }

void PrintTo(const RemoveAllCounts& counts, std::ostream* os) {
  *os << "{removed " << counts.removed << ", skipped " << counts.skipped << "}";
}

namespace {

// std::ctype<char>::narrow and widen fill per-locale caches on first use, with plain stores
// (libstdc++, GCC bug 77704). Two threads compiling a std::regex at once race on them, and
// ThreadSanitizer says so. Filling them before any worker thread exists leaves nothing to race.
void fill_ctype_caches() {
  const auto& ctype = std::use_facet<std::ctype<char>>(std::locale());
  for (int c = 0; c < 256; ++c) ctype.narrow(static_cast<char>(c), '\0');
  ctype.widen('\0');
}

}  // namespace

Master::Master(kv::Publisher& publisher, Options options)
    : publisher_(publisher), options_(std::move(options)) {
  fill_ctype_caches();  // once filled, a cache is only read: calling again is harmless
  const size_t n = std::max<size_t>(options_.shards, 1);
  for (size_t i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
}

// --- helpers -------------------------------------------------------------------------------

kv::MediumSet Master::completed_media(const Object& object) {
  kv::MediumSet media;
  for (const Replica& replica : object.replicas) {
    if (replica.status == ReplicaStatus::kComplete) media.add(replica.kind);
  }
  return media;
}

size_t Master::shard_of(const std::string& tenant, const std::string& key) const {
  std::string joined = tenant;
  joined.push_back('\0');
  joined += key;
  return std::hash<std::string>{}(joined) % shards_.size();
}

Master::Shard& Master::shard(const std::string& tenant, const std::string& key) const {
  return *shards_[shard_of(tenant, key)];
}

Master::Object* Master::live(Shard& shard, const ObjectId& id) {
  auto it = shard.objects.find(id);
  if (it == shard.objects.end() || it->second.erase_pending) return nullptr;
  return &it->second;
}

std::vector<Replica> Master::make_replicas(const std::vector<Placement>& placements) {
  std::vector<Replica> replicas;
  for (const Placement& placement : placements) {
    replicas.push_back(
        {next_replica_id_++, placement.kind, placement.segment, ReplicaStatus::kProcessing});
  }
  return replicas;
}

bool Master::leased(const Object& object) const { return object.lease_expiry > now_.load(); }

bool Master::unmounted(const std::string& segment) const {
  std::lock_guard<std::mutex> lock(segments_mutex_);
  return unmounted_segments_.count(segment) != 0;
}

Status Master::check_removable(const Object& object) const {
  if (leased(object)) return Status::kLeased;
  for (const Replica& replica : object.replicas) {
    if (replica.status != ReplicaStatus::kComplete) return Status::kNotReady;
  }
  if (object.task) return Status::kPendingTask;
  return Status::kOk;
}

void Master::erase_locked(Shard& shard, Iterator it, kv::MediumSet before) {
  const ObjectId id = it->first;
  const std::string group = it->second.group;
  shard.objects.erase(it);
  publisher_.on_medium_delta(id.first, id.second, group, before, {});
}

bool Master::drop_replicas_locked(Shard& shard, Iterator it,
                                  const std::function<bool(const Replica&)>& drop) {
  Object& object = it->second;
  const kv::MediumSet before = completed_media(object);
  bool dropped = false;
  for (auto r = object.replicas.begin(); r != object.replicas.end();) {
    if (!drop(*r)) {
      ++r;
      continue;
    }
    if (object.task && object.task->target == r->id) object.task.reset();  // cancelled
    if (object.task && object.task->source == r->id) object.task->source = 0;
    r = object.replicas.erase(r);
    dropped = true;
  }
  if (!dropped) return false;
  const kv::MediumSet after = completed_media(object);
  if (after.empty() && (!before.empty() || object.replicas.empty())) {
    // The object is no longer readable anywhere: the erase path announces it, once.
    erase_locked(shard, it, before);
  } else {
    publisher_.on_medium_delta(it->first.first, it->first.second, object.group, before, after);
  }
  return true;
}

Status Master::remove_locked(Shard& shard, Iterator it) {
  const Status status = check_removable(it->second);
  if (status != Status::kOk) return status;
  if (!options_.ha) {
    erase_locked(shard, it, completed_media(it->second));
    return Status::kOk;
  }
  const OplogFault fault = options_.oplog_fault
                               ? options_.oplog_fault(it->first.first, it->first.second)
                               : OplogFault::kNone;
  {
    std::lock_guard<std::mutex> lock(oplog_mutex_);
    if (fault == OplogFault::kReserve) return Status::kOplogReserveFailed;
    const uint64_t slot = next_slot_++;
    (void)slot;  // the entry's place in the log; a failed append leaves it unused
    if (fault == OplogFault::kAppend) return Status::kOplogAppendFailed;
    if (options_.durability == Durability::kDeferred) oplog_pending_.push_back(it->first);
  }
  if (options_.durability == Durability::kImmediate) {
    erase_locked(shard, it, completed_media(it->second));  // the durable callback, in line
  } else {
    it->second.erase_pending = true;  // sync_oplog() erases and announces it
  }
  return Status::kOk;
}

// --- Put, BatchPut, Upsert -----------------------------------------------------------------

Status Master::put_start(const std::string& tenant, const std::string& key,
                         const std::string& group, const std::vector<Placement>& placements) {
  if (placements.empty()) return Status::kInvalid;
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  const ObjectId id{tenant, key};
  if (s.objects.count(id) != 0) return Status::kExists;
  Object object;
  object.group = group;
  object.replicas = make_replicas(placements);
  s.objects.emplace(id, std::move(object));
  return Status::kOk;
}

Status Master::put_end_locked(const ObjectId& id, Object& object,
                              std::optional<kv::Medium> medium) {
  bool completed = false;
  for (Replica& replica : object.replicas) {
    if (replica.status != ReplicaStatus::kProcessing) continue;
    if (object.task && object.task->target == replica.id) continue;  // not the Put's
    if (medium && kv::medium_of(replica.kind) != *medium) continue;
    replica.status = ReplicaStatus::kComplete;
    completed = true;
  }
  if (!completed) return Status::kInvalid;
  publisher_.on_put_commit(id.first, id.second, object.group, completed_media(object));
  return Status::kOk;
}

Status Master::put_end(const std::string& tenant, const std::string& key,
                       std::optional<kv::Medium> medium) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  const ObjectId id{tenant, key};
  Object* object = live(s, id);
  if (object == nullptr) return Status::kNotFound;
  return put_end_locked(id, *object, medium);
}

Status Master::put_revoke(const std::string& tenant, const std::string& key) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  const ObjectId id{tenant, key};
  Object* object = live(s, id);
  if (object == nullptr) return Status::kNotFound;
  const auto put_replica = [object](const Replica& r) {
    return r.status == ReplicaStatus::kProcessing &&
           !(object->task && object->task->target == r.id);
  };
  const size_t count = object->replicas.size();
  object->replicas.erase(std::remove_if(object->replicas.begin(), object->replicas.end(),
                                        put_replica),
                         object->replicas.end());
  if (object->replicas.size() == count) return Status::kInvalid;
  // Only PROCESSING replicas went: the media did not change, so no call (the contract: a failed
  // uncommitted Put makes none).
  if (object->replicas.empty()) s.objects.erase(id);
  return Status::kOk;
}

std::vector<Status> Master::batch_put_start(const std::string& tenant,
                                            const std::vector<PutRequest>& requests) {
  std::vector<Status> statuses;
  for (const PutRequest& r : requests) {
    statuses.push_back(put_start(tenant, r.key, r.group, r.placements));
  }
  return statuses;
}

std::vector<Status> Master::batch_put_end(const std::string& tenant,
                                          const std::vector<std::string>& keys) {
  std::vector<Status> statuses;
  for (const std::string& key : keys) statuses.push_back(put_end(tenant, key));
  return statuses;
}

Status Master::upsert_start(const std::string& tenant, const std::string& key,
                            const std::string& group, const std::vector<Placement>& placements) {
  if (placements.empty()) return Status::kInvalid;
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  const ObjectId id{tenant, key};
  auto it = s.objects.find(id);
  if (it == s.objects.end()) {
    Object object;
    object.group = group;
    object.replicas = make_replicas(placements);
    s.objects.emplace(id, std::move(object));
    return Status::kOk;
  }
  Object& object = it->second;
  if (object.erase_pending) return Status::kExists;
  if (leased(object)) return Status::kLeased;
  for (const Replica& replica : object.replicas) {
    if (replica.status != ReplicaStatus::kComplete) return Status::kNotReady;
  }
  if (object.task) return Status::kPendingTask;
  const kv::MediumSet before = completed_media(object);
  const std::string old_group = object.group;
  object.replicas = make_replicas(placements);
  object.group = group;
  // The old value is unreadable from here on; the new one is announced at put_end().
  publisher_.on_medium_delta(tenant, key, old_group, before, {});
  return Status::kOk;
}

// --- Replication tasks ---------------------------------------------------------------------

namespace {

// Common preconditions of starting a task: no task, every replica COMPLETE, at least one.
Status startable(const std::vector<Replica>& replicas, bool has_task) {
  if (has_task) return Status::kPendingTask;
  if (replicas.empty()) return Status::kInvalid;
  for (const Replica& replica : replicas) {
    if (replica.status != ReplicaStatus::kComplete) return Status::kNotReady;
  }
  return Status::kOk;
}

}  // namespace

Status Master::copy_start(const std::string& tenant, const std::string& key,
                          const Placement& target) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  Object* object = live(s, {tenant, key});
  if (object == nullptr) return Status::kNotFound;
  if (Status st = startable(object->replicas, object->task.has_value()); st != Status::kOk) {
    return st;
  }
  const Replica replica = make_replicas({target}).front();
  object->replicas.push_back(replica);
  object->task = Task{TaskKind::kCopy, replica.id, 0};
  return Status::kOk;  // a PROCESSING replica: no medium, no call
}

Status Master::move_start(const std::string& tenant, const std::string& key,
                          const std::string& source_segment, const Placement& target) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  Object* object = live(s, {tenant, key});
  if (object == nullptr) return Status::kNotFound;
  if (Status st = startable(object->replicas, object->task.has_value()); st != Status::kOk) {
    return st;
  }
  auto source = std::find_if(object->replicas.begin(), object->replicas.end(),
                             [&](const Replica& r) { return r.segment == source_segment; });
  if (source == object->replicas.end()) return Status::kInvalid;
  const uint64_t source_id = source->id;
  const Replica replica = make_replicas({target}).front();
  object->replicas.push_back(replica);
  object->task = Task{TaskKind::kMove, replica.id, source_id};
  return Status::kOk;
}

Status Master::offload_start(const std::string& tenant, const std::string& key) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  Object* object = live(s, {tenant, key});
  if (object == nullptr) return Status::kNotFound;
  if (Status st = startable(object->replicas, object->task.has_value()); st != Status::kOk) {
    return st;
  }
  if (!completed_media(*object).contains(kv::Medium::kCpu)) return Status::kInvalid;
  object->task = Task{TaskKind::kOffload, 0, 0};  // queued for a client to write
  return Status::kOk;
}

Status Master::promote_start(const std::string& tenant, const std::string& key,
                             const std::string& memory_segment) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  Object* object = live(s, {tenant, key});
  if (object == nullptr) return Status::kNotFound;
  if (Status st = startable(object->replicas, object->task.has_value()); st != Status::kOk) {
    return st;
  }
  if (!completed_media(*object).contains(kv::Medium::kDisk)) return Status::kInvalid;
  const Replica replica = make_replicas({{kv::ReplicaKind::kMemory, memory_segment}}).front();
  object->replicas.push_back(replica);
  object->task = Task{TaskKind::kPromote, replica.id, 0};
  return Status::kOk;
}

Status Master::complete_task_locked(const ObjectId& id, Object& object, TaskKind kind,
                                    const std::optional<Placement>& written) {
  if (!object.task || object.task->kind != kind) return Status::kNoTask;
  const Task task = *object.task;
  const kv::MediumSet before = completed_media(object);
  if (written) {
    Replica replica = make_replicas({*written}).front();
    replica.status = ReplicaStatus::kComplete;
    object.replicas.push_back(replica);
  } else {
    auto target = std::find_if(object.replicas.begin(), object.replicas.end(),
                               [&](const Replica& r) { return r.id == task.target; });
    if (target == object.replicas.end()) {  // dropped meanwhile (cleanup cancels the task)
      object.task.reset();
      return Status::kInvalid;
    }
    target->status = ReplicaStatus::kComplete;
  }
  if (task.kind == TaskKind::kMove && task.source != 0) {
    object.replicas.erase(std::remove_if(object.replicas.begin(), object.replicas.end(),
                                         [&](const Replica& r) { return r.id == task.source; }),
                          object.replicas.end());
  }
  object.task.reset();
  publisher_.on_medium_delta(id.first, id.second, object.group, before, completed_media(object));
  return Status::kOk;
}

Status Master::finish_task(const std::string& tenant, const std::string& key, TaskKind kind,
                           const std::optional<Placement>& written) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  Object* object = live(s, {tenant, key});
  if (object == nullptr) return Status::kNotFound;
  return complete_task_locked({tenant, key}, *object, kind, written);
}

Status Master::copy_end(const std::string& tenant, const std::string& key) {
  return finish_task(tenant, key, TaskKind::kCopy, std::nullopt);
}

Status Master::move_end(const std::string& tenant, const std::string& key) {
  return finish_task(tenant, key, TaskKind::kMove, std::nullopt);
}

Status Master::offload_end(const std::string& tenant, const std::string& key,
                           const Placement& target) {
  return finish_task(tenant, key, TaskKind::kOffload, target);
}

Status Master::promote_end(const std::string& tenant, const std::string& key) {
  return finish_task(tenant, key, TaskKind::kPromote, std::nullopt);
}

// --- Eviction, stale handles, client cleanup -----------------------------------------------

Status Master::evict_replica(const std::string& tenant, const std::string& key,
                             kv::ReplicaKind kind) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.objects.find({tenant, key});
  if (it == s.objects.end() || it->second.erase_pending) return Status::kNotFound;
  if (leased(it->second)) return Status::kLeased;
  const std::vector<Replica>& replicas = it->second.replicas;
  auto victim = std::find_if(replicas.begin(), replicas.end(), [&](const Replica& r) {
    return r.kind == kind && r.status == ReplicaStatus::kComplete;
  });
  if (victim == replicas.end()) return Status::kInvalid;
  const uint64_t victim_id = victim->id;
  drop_replicas_locked(s, it, [victim_id](const Replica& r) { return r.id == victim_id; });
  return Status::kOk;
}

Status Master::get_replica_list(const std::string& tenant, const std::string& key, uint64_t ttl) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  const ObjectId id{tenant, key};
  auto it = s.objects.find(id);
  if (it == s.objects.end() || it->second.erase_pending) return Status::kNotFound;
  drop_replicas_locked(s, it, [this](const Replica& r) { return unmounted(r.segment); });
  Object* object = live(s, id);
  if (object == nullptr) return Status::kNotFound;  // its last replica was stale
  if (completed_media(*object).empty()) return Status::kNotReady;
  object->lease_expiry = std::max(object->lease_expiry, now_.load() + ttl);
  return Status::kOk;
}

void Master::advance_time(uint64_t dt) { now_ += dt; }

void Master::unmount_segment(const std::string& segment) {
  std::lock_guard<std::mutex> lock(segments_mutex_);
  unmounted_segments_.insert(segment);
}

Status Master::cleanup_stale_handles(const std::string& tenant, const std::string& key) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.objects.find({tenant, key});
  if (it == s.objects.end() || it->second.erase_pending) return Status::kNotFound;
  const bool dropped =
      drop_replicas_locked(s, it, [this](const Replica& r) { return unmounted(r.segment); });
  return dropped ? Status::kOk : Status::kInvalid;
}

size_t Master::remove_client_segment(const std::string& segment) {
  unmount_segment(segment);
  size_t touched = 0;
  for (auto& shard_ptr : shards_) {
    Shard& s = *shard_ptr;
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto it = s.objects.begin(); it != s.objects.end();) {
      auto next = std::next(it);
      if (!it->second.erase_pending &&
          drop_replicas_locked(s, it, [&](const Replica& r) { return r.segment == segment; })) {
        ++touched;
      }
      it = next;
    }
  }
  return touched;
}

// --- Remove, BatchRemove, regex remove, RemoveAll ------------------------------------------

Status Master::remove(const std::string& tenant, const std::string& key) {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.objects.find({tenant, key});
  if (it == s.objects.end() || it->second.erase_pending) return Status::kNotFound;
  return remove_locked(s, it);
}

std::vector<Status> Master::batch_remove(const std::string& tenant,
                                         const std::vector<std::string>& keys) {
  std::vector<Status> statuses;
  for (const std::string& key : keys) statuses.push_back(remove(tenant, key));
  return statuses;
}

RemoveAllCounts Master::remove_by_regex(const std::string& tenant, const std::string& pattern) {
  const std::regex re(pattern);
  RemoveAllCounts counts;
  for (auto& shard_ptr : shards_) {
    Shard& s = *shard_ptr;
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto it = s.objects.begin(); it != s.objects.end();) {
      auto next = std::next(it);
      if (it->first.first == tenant && !it->second.erase_pending &&
          std::regex_search(it->first.second, re)) {
        ++(remove_locked(s, it) == Status::kOk ? counts.removed : counts.skipped);
      }
      it = next;
    }
  }
  return counts;
}

std::map<std::string, RemoveAllCounts> Master::remove_all(
    const std::optional<std::string>& tenant) {
  const kv::RemoveAllScan scan = publisher_.begin_remove_all();
  std::map<std::string, RemoveAllCounts> counts;
  if (tenant) counts[*tenant];  // the tenant asked for is reported, seen or not
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (options_.remove_all_shard_hook) options_.remove_all_shard_hook(i);
    Shard& s = *shards_[i];
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto it = s.objects.begin(); it != s.objects.end();) {
      auto next = std::next(it);
      if ((!tenant || it->first.first == *tenant) && !it->second.erase_pending) {
        RemoveAllCounts& c = counts[it->first.first];
        ++(remove_locked(s, it) == Status::kOk ? c.removed : c.skipped);
      }
      it = next;
    }
  }
  for (const auto& [t, c] : counts) publisher_.on_remove_all(scan, t, c.removed, c.skipped);
  return counts;
}

size_t Master::sync_oplog() {
  std::vector<ObjectId> pending;
  {
    std::lock_guard<std::mutex> lock(oplog_mutex_);
    pending.swap(oplog_pending_);
  }
  size_t applied = 0;
  for (const ObjectId& id : pending) {
    Shard& s = shard(id.first, id.second);
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.objects.find(id);
    if (it == s.objects.end() || !it->second.erase_pending) continue;
    erase_locked(s, it, completed_media(it->second));
    ++applied;
  }
  return applied;
}

// --- What the model holds ------------------------------------------------------------------

std::optional<kv::MediumSet> Master::media(const std::string& tenant,
                                           const std::string& key) const {
  Shard& s = shard(tenant, key);
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.objects.find({tenant, key});
  if (it == s.objects.end()) return std::nullopt;
  return completed_media(it->second);
}

size_t Master::object_count() const {
  size_t n = 0;
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mutex);
    n += s->objects.size();
  }
  return n;
}

size_t Master::pending_erases() const {
  std::lock_guard<std::mutex> lock(oplog_mutex_);
  return oplog_pending_.size();
}

std::set<Holding> Master::holdings() const {
  std::set<Holding> out;
  for (const auto& s : shards_) {
    std::lock_guard<std::mutex> lock(s->mutex);
    for (const auto& [id, object] : s->objects) {
      const kv::MediumSet media = completed_media(object);
      for (kv::Medium m : {kv::Medium::kCpu, kv::Medium::kDisk}) {
        if (media.contains(m)) out.emplace(id.first, id.second, m);
      }
    }
  }
  return out;
}

void Master::add_objects(std::optional<std::string_view> tenant, kv::Snapshot& snapshot) const {
  struct Copied {
    std::string tenant, key, group;
    kv::MediumSet media;
  };
  for (const auto& s : shards_) {
    std::vector<Copied> copied;
    {
      std::lock_guard<std::mutex> lock(s->mutex);
      for (const auto& [id, object] : s->objects) {
        const std::string_view wire = id.first.empty() ? "default" : id.first;
        if (tenant && *tenant != wire) continue;
        copied.push_back({id.first, id.second, object.group, completed_media(object)});
      }
    }
    for (const Copied& c : copied) {
      if (!snapshot.add(c.tenant, c.key, c.group, c.media)) return;
    }
  }
}

}  // namespace master_model
