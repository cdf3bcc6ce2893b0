// The KV event publisher of Mooncake's metadata master: the one header the master includes.
//
// The master calls a Publisher whenever an object becomes readable, or stops being readable,
// on a logical medium (`cpu` or `disk`). The publisher turns those calls into `stored`,
// `removed` and `cleared` events and publishes them, in msgpack batches, on a ZeroMQ PUB
// socket from its own thread, for KV-aware routers and indexers. The wire format and the
// rules are the project's SPEC.md (sections 3 and 5).
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
// std::string (status_json()).

#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

// The library is compiled with hidden visibility; only what carries this macro is exported.
#ifndef MOONCAKE_KV_EVENTS_API
#define MOONCAKE_KV_EVENTS_API __attribute__((visibility("default")))
#endif

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
  static constexpr uint8_t kCpuBit = 1;
  static constexpr uint8_t kDiskBit = 2;

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

  friend constexpr bool operator==(MediumSet a, MediumSet b) noexcept {
    return a.bits_ == b.bits_;
  }
  friend constexpr bool operator!=(MediumSet a, MediumSet b) noexcept { return !(a == b); }

 private:
  static constexpr uint8_t bit_of(Medium medium) noexcept {
    return medium == Medium::kCpu ? kCpuBit : kDiskBit;
  }

  uint8_t bits_ = 0;
};

// One publisher's fixed context, one field per master flag (`kv_events_<field>`, except
// `enable_kv_events`). Empty strings and block_size 0 go on the wire as nil.
struct Config {
  // false: a disabled publisher, every call a no-op.
  bool enable_kv_events = false;
  // Required when enabled: the endpoint the PUB socket binds, e.g. "tcp://*:5557" or
  // "ipc:///run/kv.sock".
  std::string bind_endpoint;
  // Required when enabled: names this store in every event.
  std::string backend_id;
  std::string model_name;
  // In tokens; 0 is nil.
  uint32_t block_size = 0;
  std::string additional_salt;
  std::string lora_name;
  // In every event and in every batch trailer.
  uint32_t dp_rank = 0;
  // false suppresses every `stored` and `removed` (counted in skipped_keyless_events);
  // `cleared` still goes out.
  bool emit_object_key = true;
  // Adds the legacy fields `type`, `block_hashes` and `parent_block_hash`.
  bool emit_legacy_compat = true;
  // How many calls' events wait for the publishing thread before the oldest are dropped.
  // 0 is refused.
  uint32_t queue_capacity = 65536;
  // Who may read the stream (README "Flags", docs/security.md). All empty: a plain PUB that
  // anyone who reaches the port reads.
  // The path of the publisher's secret key file as `kv-events keygen NAME` writes it
  // (NAME.key): the socket speaks CURVE, and only subscribers with NAME.pub can read it.
  std::string curve_secret_key_file;
  // A subscriber's .pub file, or a directory of them: only those keys are admitted. Needs
  // curve_secret_key_file.
  std::string curve_allow;
  // Comma-separated IP addresses that may connect (tcp:// endpoints); others are refused.
  std::string null_allow_addresses;
  // The octal mode of an ipc:// socket file; the default lets the owner and group connect.
  std::string ipc_mode = "0660";
};

// A snapshot of the publisher's counters; all zero and `enabled == false` when disabled.
// Each counter is read on its own: a snapshot is a set of recent values, not one instant.
struct Stats {
  bool enabled = false;               // whether events are published at all
  uint64_t published_batches = 0;     // messages handed to the PUB socket
  uint64_t published_events = 0;      // events in those messages
  uint64_t dropped_events = 0;        // lost before encoding (full queue, after shutdown);
                                      // each shows as a sequence gap
  uint64_t skipped_keyless_events = 0;  // stored/removed suppressed: empty key or
                                        // emit_object_key false
  uint64_t cleared_suppressed = 0;    // RemoveAll results that emitted no `cleared`
  uint64_t send_failures = 0;         // messages the socket refused (sequence still used)
  uint64_t queue_depth = 0;           // calls whose events wait in the queue now
  uint64_t queue_capacity = 0;        // calls the queue holds before dropping the oldest
  uint64_t last_sequence = 0;         // transport sequence of the last message, 0 before any
  uint64_t refused_handshakes = 0;    // subscriber handshakes refused or failed (CURVE,
                                      // allow-lists), one per attempt
};

// How much a log line matters.
enum class LogLevel : uint8_t { kDebug, kInfo, kWarning, kError };

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
MOONCAKE_KV_EVENTS_API void set_log_sink(std::function<void(LogLevel, std::string_view)> sink);

class Publisher;

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
  friend constexpr bool operator!=(RemoveAllScan a, RemoveAllScan b) noexcept {
    return !(a == b);
  }

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
class MOONCAKE_KV_EVENTS_API Publisher {
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
  static std::unique_ptr<Publisher> create(const Config& config);

  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Sends what is queued within a bounded linger (about a second) and joins the thread.
  ~Publisher();

  // Whether this publisher was created enabled: false for a disabled config and in the stub
  // build. It stays true after shutdown(), when calls are dropped and counted instead.
  bool enabled() const noexcept;

  // A Put, BatchPut or Upsert committed: `stored` for every medium in `media`, cpu first,
  // even one already announced (the value may have been replaced). Empty `media`: nothing.
  void on_put_commit(std::string_view tenant_id, std::string_view object_key,
                     std::string_view group_id, MediumSet media) noexcept;

  // Any other mutation of an object's replicas. `before` is the media set captured before
  // the mutation, `after` the set after it. Emits `removed` for each medium in
  // before - after, then `stored` for each medium in after - before (cpu before disk within
  // each). Equal sets: nothing. A full removal is `after == {}`.
  void on_medium_delta(std::string_view tenant_id, std::string_view object_key,
                       std::string_view group_id, MediumSet before, MediumSet after) noexcept;

  // Takes the token of a RemoveAll that is about to start its loop. Emits nothing.
  RemoveAllScan begin_remove_all() noexcept;

  // The RemoveAll loop of `scan` finished for `tenant_id` (a global RemoveAll calls this once
  // per tenant it saw). Emits one `cleared` for (backend_id, tenant_id) only when
  // objects_removed > 0, objects_skipped == 0, and no call that adds a medium to that tenant
  // (on_put_commit with media, on_medium_delta whose `after` has a medium `before` lacks)
  // reached the publisher since `scan` was taken. Otherwise nothing, counted in
  // stats().cleared_suppressed. Per-object `removed` events come from on_medium_delta.
  void on_remove_all(const RemoveAllScan& scan, std::string_view tenant_id,
                     uint64_t objects_removed, uint64_t objects_skipped) noexcept;

  // The counters so far.
  Stats stats() const noexcept;

  // stats() as one JSON object, plus "built_with_kv_events" (false in the stub build), for
  // the master's `GET /kv_events/status`.
  std::string status_json() const;

  // stats() in the Prometheus text exposition format (0.0.4), every metric named
  // `mooncake_kv_events_*` with its HELP and TYPE lines, for the master to append to its
  // `/metrics` page. Counters end in `_total`.
  std::string metrics_text() const;

  // Waits until everything queued before the call is handed to the socket: true if so within
  // `timeout`; false if the time ran out, queued events were dropped, or the publisher is
  // shut down. A disabled publisher has nothing to flush: true at once.
  bool flush(std::chrono::milliseconds timeout) noexcept;

  // Stops accepting calls, sends what is queued within the bounded linger and joins the
  // publishing thread. Calls made afterwards do nothing and are counted as dropped.
  // Idempotent; the destructor does the same.
  void shutdown() noexcept;

 private:
  struct Impl;
  explicit Publisher(std::unique_ptr<Impl> impl) noexcept;

  std::unique_ptr<Impl> impl_;  // null when disabled
};

}  // namespace mooncake::kv_events
