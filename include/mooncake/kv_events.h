// The KV event publisher of Mooncake's metadata master: the one header the master includes.
//
// The master calls a Publisher whenever an object becomes readable, or stops being readable,
// on a logical medium (`cpu` or `disk`). The publisher turns those calls into `stored`,
// `removed` and `cleared` events and publishes them, in msgpack batches, on a ZeroMQ PUB
// socket from its own thread, for KV-aware routers and indexers. The wire format and the
// rules are docs/spec.md (sections 3 and 5).
//
// This header is inline and header-only: a thin C++ face over the C API of
// mooncake/kv_events_c.h, which is all the library exports. The master's C++ types (std::string,
// std::function, exceptions) never cross into the library, so a master built with any C++
// standard library or string ABI (-D_GLIBCXX_USE_CXX11_ABI=0 included) links it.
//
// Build variants (CMake option ENABLE_KV_EVENTS, see cmake/MooncakeKvEvents.cmake):
//   ON   the calls reach the Rust publisher inside libmooncake_kv_events.so;
//   OFF  a stub with the same API: every call does nothing, enabled() is false.
// This header names no Rust, cxx or ZeroMQ type, so either variant builds against it alone.
//
// Threading: the four event calls, stats(), status_json(), flush() and enabled() may be
// called from any number of threads at once. shutdown() and the destructor may race with
// any of them except the destructor itself (destroying an object another thread still uses
// is undefined, as for any C++ object).
//
// Exceptions: only create() reports errors (std::invalid_argument, std::runtime_error).
// Every other call is noexcept, or can throw only std::bad_alloc when it returns a
// std::string (status_json(), metrics_text()) or installs a sink (set_log_sink()).

#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "mooncake/kv_events_c.h"

namespace mooncake::kv_events {

// A logical storage tier as subscribers see it: the wire knows only these two.
enum class Medium : uint8_t {
  kCpu,   // memory replicas
  kDisk,  // every persistent replica: disk, local disk, NVMe-oF SSD, DFS
};

// The kind of a replica in the master's metadata.
enum class ReplicaKind : uint8_t { kMemory, kDisk, kLocalDisk, kNofSsd, kDfs };

// The medium a kind of replica is announced on: kMemory is kCpu, every other kind kDisk.
constexpr Medium medium_of(ReplicaKind kind) noexcept {
  return kind == ReplicaKind::kMemory ? Medium::kCpu : Medium::kDisk;
}

// A set of media: a value with at most two members, copyable and comparable.
// Stored as a bitmask (kCpu = 1, kDisk = 2), the form it crosses into the library in.
class MediumSet {
 public:
  static constexpr uint8_t kCpuBit = KV_EVENTS_MEDIUM_CPU;
  static constexpr uint8_t kDiskBit = KV_EVENTS_MEDIUM_DISK;

  constexpr MediumSet() noexcept = default;  // {}
  constexpr MediumSet(std::initializer_list<Medium> media) noexcept {
    for (Medium medium : media) add(medium);
  }

  // The set whose bitmask is `bits`; unknown bits are ignored.
  static constexpr MediumSet from_bits(uint8_t bits) noexcept {
    MediumSet set;
    set.bits_ = static_cast<uint8_t>(bits & (kCpuBit | kDiskBit));
    return set;
  }

  constexpr MediumSet& add(Medium medium) noexcept {
    bits_ = static_cast<uint8_t>(bits_ | bit_of(medium));
    return *this;
  }
  constexpr MediumSet& add(ReplicaKind kind) noexcept { return add(medium_of(kind)); }

  constexpr bool contains(Medium medium) const noexcept { return (bits_ & bit_of(medium)) != 0; }
  constexpr bool empty() const noexcept { return bits_ == 0; }
  constexpr uint8_t bits() const noexcept { return bits_; }

  friend constexpr bool operator==(MediumSet a, MediumSet b) noexcept { return a.bits_ == b.bits_; }
  friend constexpr bool operator!=(MediumSet a, MediumSet b) noexcept { return !(a == b); }

 private:
  static constexpr uint8_t bit_of(Medium medium) noexcept {
    return medium == Medium::kCpu ? kCpuBit : kDiskBit;
  }

  uint8_t bits_ = 0;
};

namespace detail {
// A string default of KV_EVENTS_CONFIG_FIELDS as the std::string's: NULL is "".
constexpr const char* string_or_empty(const char* value) noexcept {
  return value == nullptr ? "" : value;
}
}  // namespace detail

// One publisher's fixed context, one field per master flag (`kv_events_<field>`, except
// `enable_kv_events`): a member per line of KV_EVENTS_CONFIG_FIELDS in mooncake/kv_events_c.h,
// which says what each does, with its default and of its kind (bool, uint32_t, uint64_t,
// std::string):
//   bool enable_kv_events = false; std::string bind_endpoint; std::string backend_id;
//   std::string model_name; uint32_t block_size = 0; ...; std::string ipc_mode = "0660"; ...
// Empty strings and block_size 0 go on the wire as nil.
struct Config {
#define KV_EVENTS_CPP_BOOL_(name, default_value) bool name = default_value;
#define KV_EVENTS_CPP_U32_(name, default_value) uint32_t name = default_value;
#define KV_EVENTS_CPP_U64_(name, default_value) uint64_t name = default_value;
#define KV_EVENTS_CPP_STRING_(name, default_value)                                                 \
  std::string name = detail::string_or_empty(default_value);
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_CPP_BOOL_, KV_EVENTS_CPP_U32_, KV_EVENTS_CPP_U64_,
                          KV_EVENTS_CPP_STRING_)
#undef KV_EVENTS_CPP_BOOL_
#undef KV_EVENTS_CPP_U32_
#undef KV_EVENTS_CPP_U64_
#undef KV_EVENTS_CPP_STRING_
};

// A snapshot of the publisher's counters: a member per line of KV_EVENTS_STATS_FIELDS in
// mooncake/kv_events_c.h, which says what each counts, at zero (bool enabled = false;
// uint64_t published_batches = 0; ...); all zero and `enabled == false` when disabled. Each
// counter is read on its own: a snapshot is a set of recent values, not one instant.
struct Stats {
#define KV_EVENTS_CPP_STAT_(name, kind, help) KV_EVENTS_STAT_TYPE_##kind name{};
  KV_EVENTS_STATS_FIELDS(KV_EVENTS_CPP_STAT_)
#undef KV_EVENTS_CPP_STAT_
};

// How much a log line matters.
enum class LogLevel : uint8_t {
  kDebug = KV_EVENTS_LOG_DEBUG,
  kInfo = KV_EVENTS_LOG_INFO,
  kWarning = KV_EVENTS_LOG_WARNING,
  kError = KV_EVENTS_LOG_ERROR,
};

// Where the library's log lines go: the effective configuration at start (info), the warning
// that emit_object_key=false suppresses every stored/removed, send failures (at most one line
// per 10 s, with the count of the others), refused subscriber handshakes with the peer's
// address and the reason (warning, as rate-limited) and events dropped at shutdown (warning).
//
// Installs `sink` for every publisher in the process, replacing any earlier one. It is called
// from the master's threads and from the publishing thread, so it must be thread-safe; it
// should not block, and what it throws is swallowed. An empty function restores the default:
// warnings and errors on stderr, nothing else. The stub build logs one line: a warning from
// create() when given an enabled config, since that build publishes nothing.
// Mooncake's master forwards to glog:
//   set_log_sink([](LogLevel level, std::string_view line) {
//     LOG_IF(INFO, level <= LogLevel::kInfo) << line;
//     LOG_IF(WARNING, level == LogLevel::kWarning) << line;
//     LOG_IF(ERROR, level == LogLevel::kError) << line; });
inline void set_log_sink(std::function<void(LogLevel, std::string_view)> sink) {
  using Sink = std::function<void(LogLevel, std::string_view)>;
  if (!sink) {
    kv_events_set_log_sink(nullptr, nullptr, nullptr);
    return;
  }
  // The library owns the copy from here on and releases it once it can no longer call it.
  auto* owned = new Sink(std::move(sink));
  kv_events_set_log_sink(
      [](void* context, int level, const char* line, size_t line_len) {
        // Nothing the master's sink throws may unwind into the library.
        try {
          (*static_cast<Sink*>(context))(static_cast<LogLevel>(level),
                                         std::string_view(line, line_len));
        } catch (...) {
        }
      },
      owned, [](void* context) { delete static_cast<Sink*>(context); });
}

class Publisher;

// A snapshot under way (on the replay socket): the master's object source adds to it every
// object readable now.
class Snapshot {
 public:
  // Adds one readable object: a `stored` event for each medium of `media`; an empty
  // `object_key` is left out, as on the stream. False once the snapshot was given up (its
  // requester left or stopped reading, or the publisher is stopping): return from the source.
  bool add(std::string_view tenant_id, std::string_view object_key, std::string_view group_id,
           MediumSet media) noexcept {
    return kv_events_snapshot_add(snapshot_, tenant_id.data(), tenant_id.size(), object_key.data(),
                                  object_key.size(), group_id.data(), group_id.size(),
                                  media.bits()) == KV_EVENTS_OK;
  }

 private:
  friend class Publisher;
  explicit Snapshot(kv_events_snapshot* snapshot) noexcept : snapshot_(snapshot) {}
  kv_events_snapshot* snapshot_;
};

// Where snapshots get their objects: called with the tenant asked for (as on the wire, where
// the master's empty tenant is "default"), or with no tenant for every tenant, on the library's
// thread kv-events-snapshot, one snapshot at a time, never on a master thread. Copy one shard's
// entries under its lock, release it, then add them (add may wait for the requester). A source
// that throws fails that snapshot: its requester gets an error.
using ObjectSource =
    std::function<void(std::optional<std::string_view> tenant_id, Snapshot& snapshot)>;

// The token of one RemoveAll: taken by begin_remove_all() before the master's loop starts,
// passed to every on_remove_all() of that loop. A default-constructed token belongs to no
// scan: on_remove_all() with it never emits `cleared`.
class RemoveAllScan {
 public:
  constexpr RemoveAllScan() noexcept = default;
  // The scan's number, for logs; 0 for a token of no scan.
  constexpr uint64_t id() const noexcept { return id_; }

  friend constexpr bool operator==(RemoveAllScan a, RemoveAllScan b) noexcept {
    return a.id_ == b.id_;
  }
  friend constexpr bool operator!=(RemoveAllScan a, RemoveAllScan b) noexcept { return !(a == b); }

 private:
  friend class Publisher;
  constexpr explicit RemoveAllScan(uint64_t id) noexcept : id_(id) {}

  uint64_t id_ = 0;
};

// Announces object availability per medium to the subscribers of one ZeroMQ PUB socket.
//
// The event calls never block on I/O or on the publishing thread, never throw and never
// abort, whatever the input: they may be made while holding the master's metadata locks.
// Each call's events are contiguous in the stream, and the calls of one thread keep that
// thread's order. When the queue is full the oldest call's events are dropped, counted in
// stats().dropped_events, and seen by subscribers as a sequence gap.
//
// String arguments are bytes: `object_key`, `tenant_id` and `group_id` are forwarded
// verbatim (msgpack `str`, or `bin` when not valid UTF-8; embedded NULs kept). An empty
// `tenant_id` means "default"; an empty `group_id` is nil; an empty `object_key` suppresses
// the call's `stored`/`removed` (counted in skipped_keyless_events).
class Publisher {
 public:
  // Disabled config (enable_kv_events false) or stub build: a publisher whose calls do
  // nothing and return at once; the stub never throws here.
  // Enabled config: binds the PUB socket and starts the publishing thread. Throws
  // std::invalid_argument naming the flag when bind_endpoint or backend_id is empty,
  // queue_capacity is 0 or a string is not valid UTF-8, a key file cannot be read or holds
  // no valid key, curve_allow is set without curve_secret_key_file, CURVE is asked of a libzmq
  // without it, an address or ipc_mode is malformed (never quoting a key); and
  // std::runtime_error naming the endpoint and the reason when it cannot be bound
  // (unparsable, address in use, ...).
  [[nodiscard]] static std::unique_ptr<Publisher> create(const Config& config);

  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Sends what is queued within a bounded linger (about a second) and joins the thread.
  ~Publisher() { kv_events_destroy(handle_); }

  // Whether this publisher was created enabled: false for a disabled config and in the stub
  // build. It stays true after shutdown(), when calls are dropped and counted instead.
  bool enabled() const noexcept { return kv_events_enabled(handle_); }

  // A Put, BatchPut or Upsert committed: `stored` for every medium in `media`, cpu first,
  // even one already announced (the value may have been replaced). Empty `media`: nothing.
  void on_put_commit(std::string_view tenant_id, std::string_view object_key,
                     std::string_view group_id, MediumSet media) noexcept {
    kv_events_on_put_commit(handle_, tenant_id.data(), tenant_id.size(), object_key.data(),
                            object_key.size(), group_id.data(), group_id.size(), media.bits());
  }

  // Any other mutation of an object's replicas. `before` is the media set captured before
  // the mutation, `after` the set after it. Emits `removed` for each medium in
  // before - after, then `stored` for each medium in after - before (cpu before disk within
  // each). Equal sets: nothing. A full removal is `after == {}`.
  void on_medium_delta(std::string_view tenant_id, std::string_view object_key,
                       std::string_view group_id, MediumSet before, MediumSet after) noexcept {
    kv_events_on_medium_delta(handle_, tenant_id.data(), tenant_id.size(), object_key.data(),
                              object_key.size(), group_id.data(), group_id.size(), before.bits(),
                              after.bits());
  }

  // Takes the token of a RemoveAll that is about to start its loop. Emits nothing.
  [[nodiscard]] RemoveAllScan begin_remove_all() noexcept {
    return RemoveAllScan(kv_events_begin_remove_all(handle_));
  }

  // The RemoveAll loop of `scan` finished for `tenant_id` (a global RemoveAll calls this once
  // per tenant it saw). Emits one `cleared` for (backend_id, tenant_id) only when
  // objects_removed > 0, objects_skipped == 0, and no call that adds a medium to that tenant
  // (on_put_commit with media, on_medium_delta whose `after` has a medium `before` lacks)
  // reached the publisher since `scan` was taken. Otherwise nothing, counted in
  // stats().cleared_suppressed. Per-object `removed` events come from on_medium_delta.
  void on_remove_all(const RemoveAllScan& scan, std::string_view tenant_id,
                     uint64_t objects_removed, uint64_t objects_skipped) noexcept {
    kv_events_on_remove_all(handle_, scan.id(), tenant_id.data(), tenant_id.size(), objects_removed,
                            objects_skipped);
  }

  // The counters so far.
  Stats stats() const noexcept {
    kv_events_stats s{};
    kv_events_get_stats(handle_, &s, sizeof s);
    Stats stats;
#define KV_EVENTS_CPP_COPY_(name, kind, help) stats.name = s.name;
    KV_EVENTS_STATS_FIELDS(KV_EVENTS_CPP_COPY_)
#undef KV_EVENTS_CPP_COPY_
    return stats;
  }

  // stats() as one JSON object, plus "built_with_kv_events" (false in the stub build), for
  // the master's `GET /kv_events/status`.
  std::string status_json() const { return take(kv_events_status_json(handle_)); }

  // stats() in the Prometheus text exposition format (0.0.4), every metric named
  // `mooncake_kv_events_*` with its HELP and TYPE lines, for the master to append to its
  // `/metrics` page. Counters end in `_total`.
  std::string metrics_text() const { return take(kv_events_metrics_text(handle_)); }

  // Waits until everything queued before the call is handed to the socket: true if so within
  // `timeout`; false if the time ran out, queued events were dropped, or the publisher is
  // shut down. A disabled publisher has nothing to flush: true at once.
  [[nodiscard]] bool flush(std::chrono::milliseconds timeout) noexcept {
    const auto ms = std::max<std::chrono::milliseconds::rep>(timeout.count(), 0);
    return kv_events_flush(handle_, static_cast<uint64_t>(ms)) == KV_EVENTS_OK;
  }

  // Registers where snapshots get their objects (served on the replay socket,
  // kv_events_replay_endpoint), replacing any earlier source; an empty function unregisters.
  // The library owns its copy and destroys it once no snapshot can call it; a disabled
  // publisher (and the stub) destroys it at once. The master must announce each change (the
  // event calls) under the lock its source copies that object under, and shut the publisher
  // down before destroying what the source reads: shutdown() abandons a running snapshot and
  // waits for the source to return. Throws only std::bad_alloc.
  void set_object_source(ObjectSource source) {
    if (!source) {
      kv_events_set_object_source(handle_, nullptr, nullptr, nullptr);
      return;
    }
    // The library hands the source to its snapshot thread through its own locks, which a
    // race detector in the master's build cannot see; this release and the acquire before
    // each call show it that everything the master did before registering comes first.
    struct Owned {
      ObjectSource function;
      std::atomic<bool> registered{false};
    };
    auto* owned = new Owned{std::move(source)};
    owned->registered.store(true, std::memory_order_release);
    const int status = kv_events_set_object_source(
        handle_,
        [](void* context, const char* tenant_id, size_t tenant_id_len,
           kv_events_snapshot* snapshot) -> int {
          auto* source = static_cast<Owned*>(context);
          static_cast<void>(source->registered.load(std::memory_order_acquire));
          std::optional<std::string_view> tenant;
          if (tenant_id != nullptr) tenant.emplace(tenant_id, tenant_id_len);
          Snapshot objects(snapshot);
          // Nothing the master's source throws may unwind into the library.
          try {
            source->function(tenant, objects);
            return 0;
          } catch (...) {
            return -1;
          }
        },
        owned, [](void* context) { delete static_cast<Owned*>(context); });
    if (status == KV_EVENTS_ERR_NO_MEMORY) throw std::bad_alloc();
  }

  // Stops accepting calls, sends what is queued within the bounded linger and joins the
  // publishing thread. Calls made afterwards do nothing and are counted as dropped.
  // Idempotent; the destructor does the same.
  void shutdown() noexcept { kv_events_shutdown(handle_); }

 private:
  explicit Publisher(kv_events_publisher* handle) noexcept : handle_(handle) {}

  // A string of kv_events_status_json() or kv_events_metrics_text(), freed; NULL means memory
  // ran out (the handle is never NULL here).
  static std::string take(char* text) {
    if (text == nullptr) throw std::bad_alloc();
    const std::unique_ptr<char, void (*)(char*)> owned(text, kv_events_string_free);
    return std::string(text);
  }

  kv_events_publisher* handle_;  // never null: a disabled publisher has a handle too
};

inline std::unique_ptr<Publisher> Publisher::create(const Config& config) {
  // The C config's strings are NUL-terminated: a NUL inside one would silently cut it short.
  if (config.enable_kv_events) {
#define KV_EVENTS_CPP_NONE_(name, default_value)
#define KV_EVENTS_CPP_NUL_(name, default_value)                                                    \
  if (config.name.find('\0') != std::string::npos) {                                               \
    throw std::invalid_argument("kv_events_" #name " contains a NUL byte");                        \
  }
    KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_CPP_NONE_, KV_EVENTS_CPP_NONE_, KV_EVENTS_CPP_NONE_,
                            KV_EVENTS_CPP_NUL_)
#undef KV_EVENTS_CPP_NONE_
#undef KV_EVENTS_CPP_NUL_
  }
  kv_events_config c;
  kv_events_config_init(&c, sizeof c);
#define KV_EVENTS_CPP_VALUE_(name, default_value) c.name = config.name;
#define KV_EVENTS_CPP_STRING_(name, default_value) c.name = config.name.c_str();
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_CPP_VALUE_, KV_EVENTS_CPP_VALUE_, KV_EVENTS_CPP_VALUE_,
                          KV_EVENTS_CPP_STRING_)
#undef KV_EVENTS_CPP_VALUE_
#undef KV_EVENTS_CPP_STRING_

  kv_events_publisher* handle = nullptr;
  char error[4096] = "";
  switch (kv_events_create(&c, sizeof c, &handle, error, sizeof error)) {
    case KV_EVENTS_OK: break;
    case KV_EVENTS_ERR_INVALID_CONFIG: throw std::invalid_argument(error);
    case KV_EVENTS_ERR_NO_MEMORY: throw std::bad_alloc();
    default:  // KV_EVENTS_ERR_BIND, or what the library could not foresee
      throw std::runtime_error(error);
  }
  std::unique_ptr<kv_events_publisher, void (*)(kv_events_publisher*)> guard(handle,
                                                                             kv_events_destroy);
  std::unique_ptr<Publisher> publisher(new Publisher(handle));
  guard.release();
  return publisher;
}

}  // namespace mooncake::kv_events
