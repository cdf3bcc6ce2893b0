// The ENABLE_KV_EVENTS=OFF side of include/mooncake/kv_events_c.h: the same C API with no Rust
// and no ZeroMQ behind it. Every publisher is disabled: every call does nothing, enabled is
// false, the stats are zeros, the status says events were not built in and the metrics are the
// real library's, at zero, so that dashboards and alerts read 0 rather than "no data".
// kv_events_create accepts any config, an enabled one included, so a master built without
// events starts as usual; an enabled one makes it say so once, as a warning, so the operator who
// asked for events learns that this build has none.
//
// Written without the C++ runtime (no exceptions, no standard library beyond the C one), so
// that a C program or a Python ctypes caller links the stub archive as it is; the symbol check
// (cpp_tests/check_symbols.cmake) holds it to that.

#include <pthread.h>
#include <stdio.h>

#include <cstdlib>
#include <cstring>

#include "c_api_common.h"
#include "mooncake/kv_events_c.h"

using mooncake::kv_events::detail::malloc_copy;
using mooncake::kv_events::detail::readable;

struct kv_events_publisher {
  bool unused;  // a handle must be a distinct allocation; the stub keeps nothing in it
};

namespace {

// What a disabled Rust publisher reports, as the ON build gives it, but built_with_kv_events:
// string literals the preprocessor puts together from KV_EVENTS_STATS_FIELDS, so the stub
// needs no edit for a new counter. tests/c_api.rs compiles this file and checks that they are
// exactly the real library's.

// "enabled":false, then every other field at 0; an id as a string of its digits, "0".
#define KV_EVENTS_JSON_flag(name) ",\"" #name "\":false"
#define KV_EVENTS_JSON_counter(name) ",\"" #name "\":0"
#define KV_EVENTS_JSON_gauge(name) ",\"" #name "\":0"
#define KV_EVENTS_JSON_info(name) ",\"" #name "\":\"0\""
#define KV_EVENTS_JSON_(name, kind, help) KV_EVENTS_JSON_##kind(name)
constexpr char kStatusJson[] =
    "{\"built_with_kv_events\":false" KV_EVENTS_STATS_FIELDS(KV_EVENTS_JSON_) "}";

// One metric at 0: its help, its type, its sample.
#define KV_EVENTS_METRIC_(metric, type, help)                                                      \
  "# HELP " metric " " help "\n# TYPE " metric " " type "\n" metric " 0\n"
#define KV_EVENTS_SAMPLE_flag(name, help)                                                          \
  KV_EVENTS_METRIC_("mooncake_kv_events_" #name, "gauge", help)
#define KV_EVENTS_SAMPLE_counter(name, help)                                                       \
  KV_EVENTS_METRIC_("mooncake_kv_events_" #name "_total", "counter", help)
#define KV_EVENTS_SAMPLE_gauge(name, help)                                                         \
  KV_EVENTS_METRIC_("mooncake_kv_events_" #name, "gauge", help)
#define KV_EVENTS_SAMPLE_info(name, help)
#define KV_EVENTS_SAMPLE_(name, kind, help) KV_EVENTS_SAMPLE_##kind(name, help)
// An id rides in a label, after every sample: NAME_info{NAME="0"} 1.
#define KV_EVENTS_INFO_flag(name, help)
#define KV_EVENTS_INFO_counter(name, help)
#define KV_EVENTS_INFO_gauge(name, help)
#define KV_EVENTS_INFO_info(name, help)                                                            \
  "# HELP mooncake_kv_events_" #name "_info " help "\n# TYPE mooncake_kv_events_" #name            \
  "_info gauge\nmooncake_kv_events_" #name "_info{" #name "=\"0\"} 1\n"
#define KV_EVENTS_INFO_(name, kind, help) KV_EVENTS_INFO_##kind(name, help)
// Then the build: this library's version, and no libzmq (so no CURVE) behind it.
#define KV_EVENTS_TEXT_(x) #x
#define KV_EVENTS_NUMBER_(x) KV_EVENTS_TEXT_(x)
#define KV_EVENTS_VERSION_TEXT_                                                                    \
  KV_EVENTS_NUMBER_(MOONCAKE_KV_EVENTS_VERSION_MAJOR)                                              \
  "." KV_EVENTS_NUMBER_(MOONCAKE_KV_EVENTS_VERSION_MINOR) "." KV_EVENTS_NUMBER_(                   \
      MOONCAKE_KV_EVENTS_VERSION_PATCH)
#define KV_EVENTS_BUILD_INFO_ "mooncake_kv_events_build_info"
constexpr char kMetricsText[] = KV_EVENTS_STATS_FIELDS(KV_EVENTS_SAMPLE_)
    KV_EVENTS_STATS_FIELDS(KV_EVENTS_INFO_) "# HELP " KV_EVENTS_BUILD_INFO_
                                            " The library's version, its libzmq's (empty in a "
                                            "build without events) and whether that "
                                            "has CURVE, as labels.\n# TYPE " KV_EVENTS_BUILD_INFO_
                                            " gauge\n" KV_EVENTS_BUILD_INFO_
                                            "{version=\"" KV_EVENTS_VERSION_TEXT_
                                            "\",libzmq=\"\",curve=\"false\"} 1\n";

// The installed sink, guarded by sink_mutex; a NULL write is stderr.
pthread_mutex_t sink_mutex = PTHREAD_MUTEX_INITIALIZER;
kv_events_log_fn sink_write = nullptr;
void* sink_context = nullptr;
void (*sink_release)(void*) = nullptr;

void warn(const char* line) {
  pthread_mutex_lock(&sink_mutex);
  if (sink_write != nullptr) {
    sink_write(sink_context, KV_EVENTS_LOG_WARNING, line, std::strlen(line));
  } else {
    fprintf(stderr, "%s\n", line);
  }
  pthread_mutex_unlock(&sink_mutex);
}

}  // namespace

extern "C" {

int kv_events_create(const kv_events_config* config, size_t config_size,
                     kv_events_publisher** publisher, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) error[0] = '\0';
  if (publisher == nullptr || config == nullptr) return KV_EVENTS_ERR_INVALID_ARGUMENT;
  *publisher = static_cast<kv_events_publisher*>(std::calloc(1, sizeof(kv_events_publisher)));
  if (*publisher == nullptr) return KV_EVENTS_ERR_NO_MEMORY;
  if (mooncake::kv_events::detail::config_of(config, config_size).enable_kv_events) {
    warn(
        "kv events: enable_kv_events is true, but this master was built with "
        "ENABLE_KV_EVENTS=OFF: no events will be published (rebuild with "
        "-DENABLE_KV_EVENTS=ON to publish them)");
  }
  return KV_EVENTS_OK;
}

void kv_events_destroy(kv_events_publisher* publisher) { std::free(publisher); }

bool kv_events_enabled(const kv_events_publisher*) { return false; }

int kv_events_on_put_commit(kv_events_publisher* publisher, const char* tenant_id,
                            size_t tenant_id_len, const char* object_key, size_t object_key_len,
                            const char* group_id, size_t group_id_len, uint8_t) {
  // The same answers as the real library, so that a caller's error handling is tested here too.
  if (publisher == nullptr || !readable(tenant_id, tenant_id_len) ||
      !readable(object_key, object_key_len) || !readable(group_id, group_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  return KV_EVENTS_OK;
}

int kv_events_on_medium_delta(kv_events_publisher* publisher, const char* tenant_id,
                              size_t tenant_id_len, const char* object_key, size_t object_key_len,
                              const char* group_id, size_t group_id_len, uint8_t, uint8_t) {
  // The same answers as the real library, so that a caller's error handling is tested here too.
  if (publisher == nullptr || !readable(tenant_id, tenant_id_len) ||
      !readable(object_key, object_key_len) || !readable(group_id, group_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  return KV_EVENTS_OK;
}

uint64_t kv_events_begin_remove_all(kv_events_publisher*) { return 0; }

int kv_events_on_remove_all(kv_events_publisher* publisher, uint64_t, const char* tenant_id,
                            size_t tenant_id_len, uint64_t, uint64_t) {
  if (publisher == nullptr || !readable(tenant_id, tenant_id_len)) {
    return KV_EVENTS_ERR_INVALID_ARGUMENT;
  }
  return KV_EVENTS_OK;
}

int kv_events_get_stats(const kv_events_publisher* publisher, kv_events_stats* stats,
                        size_t stats_size) {
  if (publisher == nullptr || stats == nullptr) return KV_EVENTS_ERR_INVALID_ARGUMENT;
  const kv_events_stats zeros{};
  std::memcpy(stats, &zeros, stats_size < sizeof zeros ? stats_size : sizeof zeros);
  return KV_EVENTS_OK;
}

char* kv_events_status_json(const kv_events_publisher* publisher) {
  return publisher == nullptr ? nullptr : malloc_copy(kStatusJson);
}

char* kv_events_metrics_text(const kv_events_publisher* publisher) {
  return publisher == nullptr ? nullptr : malloc_copy(kMetricsText);
}

int kv_events_flush(kv_events_publisher* publisher, uint64_t) {
  return publisher == nullptr ? KV_EVENTS_ERR_INVALID_ARGUMENT : KV_EVENTS_OK;
}

void kv_events_shutdown(kv_events_publisher*) {}

// This build serves no snapshot: the source is never called, and released at once.
int kv_events_set_object_source(kv_events_publisher* publisher, kv_events_object_source_fn,
                                void* context, void (*release)(void* context)) {
  if (release != nullptr) release(context);
  return publisher == nullptr ? KV_EVENTS_ERR_INVALID_ARGUMENT : KV_EVENTS_OK;
}

// No snapshot exists in this build, so no caller has one to add to.
int kv_events_snapshot_add(kv_events_snapshot*, const char*, size_t, const char*, size_t,
                           const char*, size_t, uint8_t) {
  return KV_EVENTS_ERR_INVALID_ARGUMENT;
}

int kv_events_set_log_sink(kv_events_log_fn sink, void* context, void (*release)(void* context)) {
  pthread_mutex_lock(&sink_mutex);
  void* old_context = sink_context;
  void (*old_release)(void*) = sink_release;
  sink_write = sink;
  sink_context = sink == nullptr ? nullptr : context;
  sink_release = sink == nullptr ? nullptr : release;
  pthread_mutex_unlock(&sink_mutex);
  // Every call of the old sink ran under the mutex: none is running now.
  if (old_release != nullptr) old_release(old_context);
  return KV_EVENTS_OK;
}

}  // extern "C"
