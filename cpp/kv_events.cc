// The ENABLE_KV_EVENTS=ON side of include/mooncake/kv_events_c.h: the C API, forwarded to the
// Rust publisher through the cxx bridge (src/ffi.rs). Strings cross as pointer and length,
// never rust::Str, so keys that are not UTF-8 reach the wire unchanged and nothing throws.
//
// Every function catches whatever the C++ side could throw (std::bad_alloc, rust::Error) and
// turns it into a status code: nothing unwinds into the caller, who may be C.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "c_api_common.h"
#include "log_sink.h"
#include "object_source.h"
#include "mooncake-kv-events/src/ffi.rs.h"
#include "mooncake/kv_events_c.h"
#include "rust/cxx.h"

namespace bridge = mooncake::kv_events::bridge;
using mooncake::kv_events::detail::malloc_copy;
using mooncake::kv_events::detail::readable;

// The bridge's structs are the Rust Config and Stats; tests/c_api.rs checks that their fields
// have the names and order of the C lists, and these that they have the lists' types, and no
// more fields than the lists.
namespace check {
#define KV_EVENTS_TYPE_(type, name, default_value)                                                 \
  static_assert(std::is_same_v<decltype(bridge::Config::name), type>,                              \
                "bridge::Config::" #name " has not the type of KV_EVENTS_CONFIG_FIELDS");
#define KV_EVENTS_BOOL_(name, default_value) KV_EVENTS_TYPE_(bool, name, default_value)
#define KV_EVENTS_U32_(name, default_value) KV_EVENTS_TYPE_(uint32_t, name, default_value)
#define KV_EVENTS_U64_(name, default_value) KV_EVENTS_TYPE_(uint64_t, name, default_value)
#define KV_EVENTS_STRING_(name, default_value) KV_EVENTS_TYPE_(rust::String, name, default_value)
KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_BOOL_, KV_EVENTS_U32_, KV_EVENTS_U64_, KV_EVENTS_STRING_)
#undef KV_EVENTS_TYPE_
#define KV_EVENTS_TYPE_(name, kind, help)                                                          \
  static_assert(std::is_same_v<decltype(bridge::Stats::name), KV_EVENTS_STAT_TYPE_##kind>,         \
                "bridge::Stats::" #name " has not the type of KV_EVENTS_STATS_FIELDS");
KV_EVENTS_STATS_FIELDS(KV_EVENTS_TYPE_)
#undef KV_EVENTS_TYPE_

// The lists' fields with the bridge's types: as large as the bridge's structs unless those
// have a field the lists lack.
struct Config {
#define KV_EVENTS_MEMBER_(name, default_value) rust::String name;
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_MEMBER_BOOL_, KV_EVENTS_MEMBER_U32_, KV_EVENTS_MEMBER_U64_,
                          KV_EVENTS_MEMBER_)
#undef KV_EVENTS_MEMBER_
};
static_assert(sizeof(Config) == sizeof(bridge::Config),
              "bridge::Config has a field KV_EVENTS_CONFIG_FIELDS lacks");
static_assert(sizeof(kv_events_stats) == sizeof(bridge::Stats),
              "bridge::Stats has a field KV_EVENTS_STATS_FIELDS lacks");
#undef KV_EVENTS_BOOL_
#undef KV_EVENTS_U32_
#undef KV_EVENTS_U64_
#undef KV_EVENTS_STRING_
}  // namespace check

struct kv_events_publisher {
  rust::Box<bridge::RustPublisher> rust;  // a disabled Rust publisher when disabled
  bool enabled;
};

namespace {

const uint8_t* bytes(const char* s) noexcept { return reinterpret_cast<const uint8_t*>(s); }

// Copies `message` into the caller's buffer, NUL-terminated and truncated to fit.
void report(char* error, size_t error_size, std::string_view message) noexcept {
  if (error == nullptr || error_size == 0) return;
  const size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// A config string as a Rust String; one that is not UTF-8 is refused, naming its flag.
rust::String utf8(const char* value, const char* flag) {
  try {
    return rust::String(value == nullptr ? "" : value);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(std::string(flag) + " is not valid UTF-8");
  }
}

// The C config as the bridge's (the Rust Config), field by field from KV_EVENTS_CONFIG_FIELDS.
bridge::Config to_bridge(const kv_events_config& c) {
  bridge::Config b{};
#define KV_EVENTS_VALUE_(name, default_value) b.name = c.name;
#define KV_EVENTS_STRING_(name, default_value) b.name = utf8(c.name, "kv_events_" #name);
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_VALUE_, KV_EVENTS_VALUE_, KV_EVENTS_VALUE_, KV_EVENTS_STRING_)
#undef KV_EVENTS_VALUE_
#undef KV_EVENTS_STRING_
  return b;
}

// What `text` reads from the publisher's Rust side, as a string the caller frees with
// kv_events_string_free; NULL for a NULL publisher or when memory ran out.
template <typename Text>
char* text_of(const kv_events_publisher* publisher, Text text) noexcept {
  if (publisher == nullptr) return nullptr;
  try {
    const rust::String value = text(*publisher->rust);
    return malloc_copy(std::string_view(value.data(), value.size()));
  } catch (...) {
    return nullptr;
  }
}

// The rust::Box of a created publisher, or the status code and message of why not.
rust::Box<bridge::RustPublisher> create_rust(const kv_events_config& config, int& status) {
  if (!config.enable_kv_events) return bridge::disabled_publisher();
  const bridge::Config bridge_config = to_bridge(config);
  bool invalid_config = false;
  try {
    return bridge::create_publisher(bridge_config, invalid_config);
  } catch (const rust::Error&) {
    status = invalid_config ? KV_EVENTS_ERR_INVALID_CONFIG : KV_EVENTS_ERR_BIND;
    throw;
  }
}

}  // namespace

extern "C" {

int kv_events_create(const kv_events_config* config, size_t config_size,
                     kv_events_publisher** publisher, char* error, size_t error_size) {
  report(error, error_size, "");
  if (publisher == nullptr) {
    report(error, error_size, "kv_events_create: publisher is NULL");
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  *publisher = nullptr;
  if (config == nullptr) {
    report(error, error_size, "kv_events_create: config is NULL");
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  const kv_events_config c = mooncake::kv_events::detail::config_of(config, config_size);
  int status = KV_EVENTS_ERR_INTERNAL;
  try {
    rust::Box<bridge::RustPublisher> rust = create_rust(c, status);
    status = KV_EVENTS_ERR_NO_MEMORY;
    *publisher = new kv_events_publisher{std::move(rust), c.enable_kv_events};
    return KV_EVENTS_OK;
  } catch (const std::bad_alloc&) {
    report(error, error_size, "out of memory");
    return KV_EVENTS_ERR_NO_MEMORY;
  } catch (const std::invalid_argument& e) {  // a config string that is not UTF-8
    report(error, error_size, e.what());
    return KV_EVENTS_ERR_INVALID_CONFIG;
  } catch (const std::exception& e) {  // rust::Error of create_publisher
    report(error, error_size, e.what());
    return status;
  }
}

void kv_events_destroy(kv_events_publisher* publisher) {
  // Dropping the Rust publisher shuts it down; Rust's drop does not unwind (panics abort).
  delete publisher;
}

bool kv_events_enabled(const kv_events_publisher* publisher) {
  return publisher != nullptr && publisher->enabled;
}

int kv_events_on_put_commit(kv_events_publisher* publisher, const char* tenant_id,
                            size_t tenant_id_len, const char* object_key, size_t object_key_len,
                            const char* group_id, size_t group_id_len, uint8_t media) {
  if (publisher == nullptr || !readable(tenant_id, tenant_id_len) ||
      !readable(object_key, object_key_len) || !readable(group_id, group_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  // Not the delta from no medium: a commit with no medium is the master's mistake, counted.
  publisher->rust->on_put_commit(bytes(tenant_id), tenant_id_len, bytes(object_key), object_key_len,
                                 bytes(group_id), group_id_len, media);
  return KV_EVENTS_OK;
}

int kv_events_on_medium_delta(kv_events_publisher* publisher, const char* tenant_id,
                              size_t tenant_id_len, const char* object_key, size_t object_key_len,
                              const char* group_id, size_t group_id_len, uint8_t before,
                              uint8_t after) {
  if (publisher == nullptr || !readable(tenant_id, tenant_id_len) ||
      !readable(object_key, object_key_len) || !readable(group_id, group_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  // The Rust side catches its own panics; these calls cannot throw.
  publisher->rust->on_medium_delta(bytes(tenant_id), tenant_id_len, bytes(object_key),
                                   object_key_len, bytes(group_id), group_id_len, before, after);
  return KV_EVENTS_OK;
}

uint64_t kv_events_begin_remove_all(kv_events_publisher* publisher) {
  return publisher == nullptr ? 0 : publisher->rust->begin_remove_all();
}

int kv_events_on_remove_all(kv_events_publisher* publisher, uint64_t scan, const char* tenant_id,
                            size_t tenant_id_len, uint64_t objects_removed,
                            uint64_t objects_skipped) {
  if (publisher == nullptr || !readable(tenant_id, tenant_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  publisher->rust->on_remove_all(scan, bytes(tenant_id), tenant_id_len, objects_removed,
                                 objects_skipped);
  return KV_EVENTS_OK;
}

int kv_events_get_stats(const kv_events_publisher* publisher, kv_events_stats* stats,
                        size_t stats_size) {
  if (publisher == nullptr || stats == nullptr) return KV_EVENTS_ERR_INVALID_ARGUMENT;
  const bridge::Stats s = publisher->rust->stats();
  kv_events_stats out{};
#define KV_EVENTS_COPY_(name, kind, help) out.name = s.name;
  KV_EVENTS_STATS_FIELDS(KV_EVENTS_COPY_)
#undef KV_EVENTS_COPY_
  std::memcpy(stats, &out, std::min(stats_size, sizeof out));
  return KV_EVENTS_OK;
}

char* kv_events_status_json(const kv_events_publisher* publisher) {
  // The Rust side writes the whole object, "built_with_kv_events":true first.
  return text_of(publisher, [](const bridge::RustPublisher& rust) { return rust.status_json(); });
}

char* kv_events_metrics_text(const kv_events_publisher* publisher) {
  return text_of(publisher, [](const bridge::RustPublisher& rust) { return rust.metrics_text(); });
}

int kv_events_flush(kv_events_publisher* publisher, uint64_t timeout_ms) {
  if (publisher == nullptr) return KV_EVENTS_ERR_INVALID_ARGUMENT;
  return publisher->rust->flush(timeout_ms) ? KV_EVENTS_OK : KV_EVENTS_ERR_NOT_FLUSHED;
}

void kv_events_shutdown(kv_events_publisher* publisher) {
  if (publisher != nullptr) publisher->rust->shutdown();
}

int kv_events_set_object_source(kv_events_publisher* publisher, kv_events_object_source_fn source,
                                void* context, void (*release)(void* context)) {
  if (publisher == nullptr) {
    if (release != nullptr) release(context);
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  if (source == nullptr) {
    publisher->rust->set_object_source(nullptr);
    if (release != nullptr) release(context);
    return KV_EVENTS_OK;
  }
  try {
    // A disabled publisher drops the source at once, which releases its context.
    publisher->rust->set_object_source(
        std::make_unique<bridge::ObjectSource>(source, context, release));
    return KV_EVENTS_OK;
  } catch (...) {
    if (release != nullptr) release(context);
    return KV_EVENTS_ERR_NO_MEMORY;
  }
}

int kv_events_snapshot_add(kv_events_snapshot* snapshot, const char* tenant_id,
                           size_t tenant_id_len, const char* object_key, size_t object_key_len,
                           const char* group_id, size_t group_id_len, uint8_t media) {
  if (snapshot == nullptr || !readable(tenant_id, tenant_id_len) ||
      !readable(object_key, object_key_len) || !readable(group_id, group_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  // The only kv_events_snapshot is the Rust side's Snapshot (object_source.h).
  auto& rust_snapshot = *reinterpret_cast<bridge::Snapshot*>(snapshot);
  const bool added =
      bridge::snapshot_add(rust_snapshot, bytes(tenant_id), tenant_id_len, bytes(object_key),
                           object_key_len, bytes(group_id), group_id_len, media);
  return added ? KV_EVENTS_OK : KV_EVENTS_ERR_ABANDONED;
}

int kv_events_set_log_sink(kv_events_log_fn sink, void* context, void (*release)(void* context)) {
  if (sink == nullptr) {
    bridge::set_log_sink(nullptr);
    return KV_EVENTS_OK;
  }
  try {
    bridge::set_log_sink(std::make_unique<bridge::LogSink>(sink, context, release));
    return KV_EVENTS_OK;
  } catch (...) {
    // The sink was not installed: its context is the caller's again, released as promised.
    if (release != nullptr) release(context);
    return KV_EVENTS_ERR_NO_MEMORY;
  }
}

}  // extern "C"
