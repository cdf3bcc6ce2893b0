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

// What a disabled Rust publisher reports, as the ON build gives it; tests/c_api.rs checks
// that these are exactly the real library's.
constexpr char kStatusJson[] =
    R"status({"built_with_kv_events":false,"enabled":false,"published_batches":0,"published_events":0,"dropped_events":0,"skipped_keyless_events":0,"cleared_suppressed":0,"send_failures":0,"queue_depth":0,"queue_capacity":0,"last_sequence":0,"refused_handshakes":0,"incarnation":0,"connections":0,"connections_refused":0,"handshake_timeouts":0,"subscriptions_refused":0,"replay_requests":0,"replayed_messages":0,"bad_requests":0,"replays_abandoned":0,"replay_buffer_bytes":0,"replay_oldest_sequence":0,"snapshots_served":0,"snapshots_abandoned":0,"snapshot_objects":0})status";
constexpr char kMetricsText[] =
    R"metrics(# HELP mooncake_kv_events_enabled 1 when events are published, 0 when disabled.
# TYPE mooncake_kv_events_enabled gauge
mooncake_kv_events_enabled 0
# HELP mooncake_kv_events_published_batches_total Messages handed to the PUB socket.
# TYPE mooncake_kv_events_published_batches_total counter
mooncake_kv_events_published_batches_total 0
# HELP mooncake_kv_events_published_events_total Events in published messages.
# TYPE mooncake_kv_events_published_events_total counter
mooncake_kv_events_published_events_total 0
# HELP mooncake_kv_events_dropped_events_total Events lost before encoding (full queue, shutdown, oversized); each is a sequence gap.
# TYPE mooncake_kv_events_dropped_events_total counter
mooncake_kv_events_dropped_events_total 0
# HELP mooncake_kv_events_skipped_keyless_events_total stored/removed not emitted: empty key or emit_object_key=false.
# TYPE mooncake_kv_events_skipped_keyless_events_total counter
mooncake_kv_events_skipped_keyless_events_total 0
# HELP mooncake_kv_events_cleared_suppressed_total RemoveAll results that emitted no cleared.
# TYPE mooncake_kv_events_cleared_suppressed_total counter
mooncake_kv_events_cleared_suppressed_total 0
# HELP mooncake_kv_events_send_failures_total Messages the socket refused.
# TYPE mooncake_kv_events_send_failures_total counter
mooncake_kv_events_send_failures_total 0
# HELP mooncake_kv_events_queue_depth Calls whose events wait in the queue.
# TYPE mooncake_kv_events_queue_depth gauge
mooncake_kv_events_queue_depth 0
# HELP mooncake_kv_events_queue_capacity Calls the queue holds before dropping the oldest.
# TYPE mooncake_kv_events_queue_capacity gauge
mooncake_kv_events_queue_capacity 0
# HELP mooncake_kv_events_last_sequence Last transport sequence taken: by a message, or by events dropped since.
# TYPE mooncake_kv_events_last_sequence gauge
mooncake_kv_events_last_sequence 0
# HELP mooncake_kv_events_refused_handshakes_total Subscriber handshakes refused: not on an allow-list, wrong mechanism, wrong CURVE key.
# TYPE mooncake_kv_events_refused_handshakes_total counter
mooncake_kv_events_refused_handshakes_total 0
# HELP mooncake_kv_events_connections Connections the publisher's sockets hold now.
# TYPE mooncake_kv_events_connections gauge
mooncake_kv_events_connections 0
# HELP mooncake_kv_events_connections_refused_total Connections closed at once: over a connection bound, or no descriptor to spare.
# TYPE mooncake_kv_events_connections_refused_total counter
mooncake_kv_events_connections_refused_total 0
# HELP mooncake_kv_events_handshake_timeouts_total Connections closed because their handshake did not finish in time.
# TYPE mooncake_kv_events_handshake_timeouts_total counter
mooncake_kv_events_handshake_timeouts_total 0
# HELP mooncake_kv_events_subscriptions_refused_total Subscriptions to a topic that can never match; the peer is disconnected.
# TYPE mooncake_kv_events_subscriptions_refused_total counter
mooncake_kv_events_subscriptions_refused_total 0
# HELP mooncake_kv_events_replay_requests_total Requests the replay socket answered.
# TYPE mooncake_kv_events_replay_requests_total counter
mooncake_kv_events_replay_requests_total 0
# HELP mooncake_kv_events_replayed_messages_total Messages sent again by the replay socket.
# TYPE mooncake_kv_events_replayed_messages_total counter
mooncake_kv_events_replayed_messages_total 0
# HELP mooncake_kv_events_bad_requests_total Replay socket requests that could not be read, each answered with an error.
# TYPE mooncake_kv_events_bad_requests_total counter
mooncake_kv_events_bad_requests_total 0
# HELP mooncake_kv_events_replays_abandoned_total Replays given up because the requester stopped reading.
# TYPE mooncake_kv_events_replays_abandoned_total counter
mooncake_kv_events_replays_abandoned_total 0
# HELP mooncake_kv_events_replay_buffer_bytes Bytes of payloads the replay buffer holds.
# TYPE mooncake_kv_events_replay_buffer_bytes gauge
mooncake_kv_events_replay_buffer_bytes 0
# HELP mooncake_kv_events_replay_oldest_sequence Oldest sequence a replay can send; 0 when the buffer is empty.
# TYPE mooncake_kv_events_replay_oldest_sequence gauge
mooncake_kv_events_replay_oldest_sequence 0
# HELP mooncake_kv_events_snapshots_served_total Snapshots sent whole on the replay socket.
# TYPE mooncake_kv_events_snapshots_served_total counter
mooncake_kv_events_snapshots_served_total 0
# HELP mooncake_kv_events_snapshots_abandoned_total Snapshots given up because the requester stopped reading or the publisher stopped.
# TYPE mooncake_kv_events_snapshots_abandoned_total counter
mooncake_kv_events_snapshots_abandoned_total 0
# HELP mooncake_kv_events_snapshot_objects_total Objects held by the snapshots sent whole.
# TYPE mooncake_kv_events_snapshot_objects_total counter
mooncake_kv_events_snapshot_objects_total 0
# HELP mooncake_kv_events_incarnation_info The random id of this publisher's life, which changes at every restart or takeover, as the label incarnation.
# TYPE mooncake_kv_events_incarnation_info gauge
mooncake_kv_events_incarnation_info{incarnation="0"} 1
)metrics";

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
    warn("kv events: enable_kv_events is true, but this master was built with "
         "ENABLE_KV_EVENTS=OFF: no events will be published (rebuild with "
         "-DENABLE_KV_EVENTS=ON to publish them)");
  }
  return KV_EVENTS_OK;
}

void kv_events_destroy(kv_events_publisher* publisher) { std::free(publisher); }

bool kv_events_enabled(const kv_events_publisher*) { return false; }

int kv_events_on_medium_delta(kv_events_publisher* publisher, const char* tenant_id,
                              size_t tenant_id_len, const char* object_key,
                              size_t object_key_len, const char* group_id, size_t group_id_len,
                              uint8_t, uint8_t) {
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
