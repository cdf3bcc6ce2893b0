/* The C API of the KV event publisher of Mooncake's metadata master: what
 * libmooncake_kv_events.so exports, and all it exports.
 *
 * A master written in C++ includes mooncake/kv_events.h instead, an inline wrapper over this
 * header. Everything else (C, Python ctypes, Go cgo, a C++ master built with another standard
 * library or string ABI) calls these functions directly: they take and return only C types, so
 * the ABI does not change with a C++ compiler, standard library or string ABI.
 *
 * What the calls mean, the events they emit and the wire format are the same as for the C++ API
 * (docs/wiring.md, docs/subscribers.md). Build variants (CMake option ENABLE_KV_EVENTS): ON, the
 * calls reach the Rust publisher; OFF, a stub with the same functions whose publishers are all
 * disabled.
 *
 * Conventions:
 * - Every symbol starts with kv_events_ (types, functions) or KV_EVENTS_ (macros), plus the
 *   MOONCAKE_KV_EVENTS_ version macros.
 * - Strings of the event calls (tenant, object key, group) are pointer + length: any bytes,
 *   embedded NULs included, forwarded verbatim. A NULL pointer with length 0 is the empty string.
 *   The strings of kv_events_config are NUL-terminated; NULL is the empty string.
 * - A media set is a bit mask: KV_EVENTS_MEDIUM_CPU | KV_EVENTS_MEDIUM_DISK; other bits are
 *   ignored, and an event call that sets one is counted in the stats' invalid_media_calls.
 * - Functions that can fail return KV_EVENTS_OK (0) or a kv_events_status code. Nothing unwinds
 *   out of any function, and no argument crashes one: a NULL publisher, or a NULL pointer with a
 *   non-zero length, is refused with KV_EVENTS_ERR_INVALID_ARGUMENT and emits nothing.
 * - Structs that may grow (kv_events_config, kv_events_stats) are passed with their size
 *   (sizeof in the caller), so that a program built against an older header keeps working with
 *   a newer library: fields are only ever added at the end, and the library reads or writes only
 *   the first `size` bytes, using defaults for the fields the caller does not know.
 *
 * Threading: the event calls, kv_events_get_stats, kv_events_status_json,
 * kv_events_metrics_text, kv_events_flush and kv_events_enabled may be called from any number of
 * threads at once; kv_events_shutdown may race with any of them. kv_events_destroy must be the
 * last call on a publisher. */
#ifndef MOONCAKE_KV_EVENTS_C_H
#define MOONCAKE_KV_EVENTS_C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The library is compiled with hidden visibility; only what carries this macro is exported. */
#ifndef MOONCAKE_KV_EVENTS_API
#define MOONCAKE_KV_EVENTS_API __attribute__((visibility("default")))
#endif

/* The version of this header; kv_events_version() gives the library's. A change of MAJOR is a
 * change of the library's SONAME (libmooncake_kv_events.so.0 while MAJOR is 0). */
#define MOONCAKE_KV_EVENTS_VERSION_MAJOR 0
#define MOONCAKE_KV_EVENTS_VERSION_MINOR 1
#define MOONCAKE_KV_EVENTS_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* What a function that can fail returns. */
typedef enum kv_events_status {
  KV_EVENTS_OK = 0,
  /* kv_events_create: an enabled config is invalid (a flag is missing, out of range, not UTF-8,
   * a key file is unreadable, ...); the error text names the flag. The C++ API throws
   * std::invalid_argument. */
  KV_EVENTS_ERR_INVALID_CONFIG = 1,
  /* kv_events_create: the endpoint cannot be bound (unparsable, address in use, ...) or the
   * publisher cannot start; the error text names the endpoint and the reason. The C++ API throws
   * std::runtime_error. */
  KV_EVENTS_ERR_BIND = 2,
  /* A NULL publisher, a NULL pointer where one is needed, or a NULL string with a non-zero
   * length. Nothing was done. */
  KV_EVENTS_ERR_INVALID_ARGUMENT = 3,
  /* Memory ran out. Nothing was done. */
  KV_EVENTS_ERR_NO_MEMORY = 4,
  /* kv_events_flush: not everything queued before the call was sent within the timeout
   * (the time ran out, queued events were dropped, or the publisher is shut down). */
  KV_EVENTS_ERR_NOT_FLUSHED = 5,
  /* Anything else that went wrong inside the library; the error text says what. */
  KV_EVENTS_ERR_INTERNAL = 6,
  /* kv_events_snapshot_add: the snapshot was given up (its requester left or stopped reading,
   * or the publisher is stopping); the object source should return. */
  KV_EVENTS_ERR_ABANDONED = 7
} kv_events_status;

/* The bits of a media set. */
#define KV_EVENTS_MEDIUM_CPU 1u  /* memory replicas */
#define KV_EVENTS_MEDIUM_DISK 2u /* every persistent replica: disk, local disk, NVMe-oF, DFS */

/* One publisher: created by kv_events_create, freed by kv_events_destroy. */
typedef struct kv_events_publisher kv_events_publisher;

/* One publisher's fixed context, one field per master flag (kv_events_<field>, except
 * enable_kv_events), in the order of the ABI: one line each, the kind (BOOL: bool, U32:
 * uint32_t, U64: uint64_t, STRING: a NUL-terminated const char*, NULL is ""), the name and the
 * default, after what it does. New fields go at the end only.
 *
 * This list is the one place a field is written on the C and C++ side: kv_events_config below,
 * kv_events_config_init's defaults, the library's copy of a config into Rust (with the check
 * that names a string that is not UTF-8 by its flag) and the C++ header's Config (std::string
 * for STRING, the same defaults) are expanded from it. Invoke it with four macros
 * KIND(name, default) to expand it yourself. The Rust `Config` has the same fields in the same
 * order with the same defaults (tests/c_api.rs checks). */
#define KV_EVENTS_CONFIG_FIELDS(BOOL, U32, U64, STRING)                                            \
  /* false: a disabled publisher, every call a no-op */                                            \
  BOOL(enable_kv_events, false)                                                                    \
  /* required when enabled: the endpoint the PUB socket binds, e.g. "tcp://0.0.0.0:5557" or        \
   * "ipc:///run/kv.sock" */                                                                       \
  STRING(bind_endpoint, NULL)                                                                      \
  /* required when enabled: names this store in every event */                                     \
  STRING(backend_id, NULL)                                                                         \
  /* "" is nil */                                                                                  \
  STRING(model_name, NULL)                                                                         \
  /* in tokens; 0 is nil */                                                                        \
  U32(block_size, 0)                                                                               \
  /* "" is nil */                                                                                  \
  STRING(additional_salt, NULL)                                                                    \
  /* "" is nil */                                                                                  \
  STRING(lora_name, NULL)                                                                          \
  /* in every event and in every batch trailer */                                                  \
  U32(dp_rank, 0)                                                                                  \
  /* false suppresses every stored and removed (counted in skipped_keyless_events); cleared        \
   * still goes out */                                                                             \
  BOOL(emit_object_key, true)                                                                      \
  /* adds the legacy fields type, block_hashes and parent_block_hash */                            \
  BOOL(emit_legacy_compat, true)                                                                   \
  /* calls whose events wait for the publishing thread before the oldest are dropped; 0 is         \
   * refused */                                                                                    \
  U32(queue_capacity, 65536)                                                                       \
  /* the path of the publisher's secret key file as `kv-events keygen NAME` writes it              \
   * (NAME.key): the stream speaks CURVE, and only subscribers with NAME.pub can read it */        \
  STRING(curve_secret_key_file, NULL)                                                              \
  /* a subscriber's .pub file, or a directory of them: only those keys are admitted; needs         \
   * curve_secret_key_file */                                                                      \
  STRING(curve_allow, NULL)                                                                        \
  /* comma-separated IP addresses that may connect (tcp:// endpoints); others are refused */       \
  STRING(null_allow_addresses, NULL)                                                               \
  /* the octal mode of an ipc:// socket file; the default lets the owner and group connect */      \
  STRING(ipc_mode, "0660")                                                                         \
  /* milliseconds a connection may take to finish its handshake before it is closed; 100 to        \
   * 600000 */                                                                                     \
  U32(handshake_timeout_ms, 3000)                                                                  \
  /* connections held at once; one more is closed at once (at most half of `ulimit -n`) */         \
  U32(max_connections, 512)                                                                        \
  /* connections one peer address may hold at once */                                              \
  U32(max_connections_per_address, 64)                                                             \
  /* messages held for a subscriber that has not read them; past it, it loses messages */          \
  U32(send_hwm, 10000)                                                                             \
  /* a ROUTER endpoint that answers info and replays recent messages; "": off */                   \
  STRING(replay_endpoint, NULL)                                                                    \
  /* bytes of recently sent payloads kept for replay (64 MiB) */                                   \
  U64(replay_buffer_bytes, 67108864)                                                               \
  /* the first frame of every message, live and replayed, e.g. "kv@pod-1@model-a"; "" by           \
   * default; at most 255 bytes */                                                                 \
  STRING(topic, NULL)                                                                              \
  /* true: replayed messages are ["", topic, seq, payload] (vLLM 0.26 and after); false:           \
   * ["", seq, payload] (earlier vLLM, SGLang) */                                                  \
  BOOL(replay_topic_frame, true)                                                                   \
  /* milliseconds without a message after which one with no event is sent; 0: never */             \
  U32(heartbeat_ms, 0)                                                                             \
  /* requesters one snapshot serves at once; requests of the same scope share one enumeration;     \
   * 1 to 4096 */                                                                                  \
  U32(snapshot_max_requesters, 64)                                                                 \
  /* true: a removed that leaves the object readable on another medium is followed, in the same    \
   * message, by a stored for each medium left (for readers that keep only presence by key) */     \
  BOOL(reannounce_remaining, false)                                                                \
  /* a tenant, key or group that is not UTF-8: "skip" (not published, counted; "" or NULL too),    \
   * "bin" (msgpack bin) or "str" (msgpack str holding the raw bytes) */                           \
  STRING(non_utf8, "skip")

/* How the lists of this header declare a struct's members; internal to the header. */
#define KV_EVENTS_MEMBER_BOOL_(name, default_value) bool name;
#define KV_EVENTS_MEMBER_U32_(name, default_value) uint32_t name;
#define KV_EVENTS_MEMBER_U64_(name, default_value) uint64_t name;
#define KV_EVENTS_MEMBER_STRING_(name, default_value) const char* name;

/* One publisher's fixed context: a member per line of KV_EVENTS_CONFIG_FIELDS, of its kind
 * (bool enable_kv_events; const char* bind_endpoint; ...). Fill it with kv_events_config_init,
 * then set what differs. The library copies the strings, so they need to live only during
 * kv_events_create. Empty strings and block_size 0 go on the wire as nil. */
typedef struct kv_events_config {
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_MEMBER_BOOL_, KV_EVENTS_MEMBER_U32_, KV_EVENTS_MEMBER_U64_,
                          KV_EVENTS_MEMBER_STRING_)
} kv_events_config;

/* Fills the first `config_size` bytes of *config with the defaults (those of
 * KV_EVENTS_CONFIG_FIELDS); pass sizeof(kv_events_config). NULL does nothing. */
MOONCAKE_KV_EVENTS_API void kv_events_config_init(kv_events_config* config, size_t config_size);

/* Creates a publisher from the first `config_size` bytes of *config (sizeof(kv_events_config))
 * and stores it in *publisher.
 * A disabled config (or the stub build, whatever the config): a publisher whose calls do
 * nothing. An enabled one: binds the PUB socket and starts the publishing thread.
 * On failure returns KV_EVENTS_ERR_INVALID_CONFIG, KV_EVENTS_ERR_BIND, ... and, when `error` is
 * not NULL, writes the reason there, NUL-terminated and truncated to error_size - 1 bytes (the
 * messages the C++ API throws; 512 bytes hold every one but those quoting a very long
 * endpoint); *publisher is then NULL. */
MOONCAKE_KV_EVENTS_API int kv_events_create(const kv_events_config* config, size_t config_size,
                                            kv_events_publisher** publisher, char* error,
                                            size_t error_size);

/* Stops the publisher as kv_events_shutdown does and frees it. NULL does nothing. */
MOONCAKE_KV_EVENTS_API void kv_events_destroy(kv_events_publisher* publisher);

/* Whether the publisher was created enabled; false for NULL, a disabled config and the stub. It
 * stays true after shutdown. */
MOONCAKE_KV_EVENTS_API bool kv_events_enabled(const kv_events_publisher* publisher);

/* A Put, BatchPut or Upsert committed: `stored` for every medium in `media`, cpu first. A
 * commit with neither medium publishes nothing and is counted in invalid_media_calls. */
MOONCAKE_KV_EVENTS_API int kv_events_on_put_commit(kv_events_publisher* publisher,
                                                   const char* tenant_id, size_t tenant_id_len,
                                                   const char* object_key, size_t object_key_len,
                                                   const char* group_id, size_t group_id_len,
                                                   uint8_t media);

/* Any other mutation of an object's replicas: `removed` for each medium in before - after, then
 * `stored` for each in after - before. */
MOONCAKE_KV_EVENTS_API int kv_events_on_medium_delta(kv_events_publisher* publisher,
                                                     const char* tenant_id, size_t tenant_id_len,
                                                     const char* object_key, size_t object_key_len,
                                                     const char* group_id, size_t group_id_len,
                                                     uint8_t before, uint8_t after);

/* The token of a RemoveAll about to start its loop; 0 (the token of no scan) for NULL, a
 * disabled publisher and the stub. Emits nothing. */
MOONCAKE_KV_EVENTS_API uint64_t kv_events_begin_remove_all(kv_events_publisher* publisher);

/* The RemoveAll loop of `scan` finished for one tenant: one `cleared` when objects_removed > 0,
 * objects_skipped == 0 and no medium was added to the tenant since `scan` was taken; otherwise
 * nothing, counted in cleared_suppressed. */
MOONCAKE_KV_EVENTS_API int kv_events_on_remove_all(kv_events_publisher* publisher, uint64_t scan,
                                                   const char* tenant_id, size_t tenant_id_len,
                                                   uint64_t objects_removed,
                                                   uint64_t objects_skipped);

/* The publisher's counters, in the order of the ABI: one line each, the name, the kind and
 * the help text of its metric. New fields go at the end only. The kind is one of
 *   flag     a bool, the gauge mooncake_kv_events_<name> at 0 or 1;
 *   counter  a uint64_t that only grows, the counter mooncake_kv_events_<name>_total;
 *   gauge    a uint64_t level, the gauge mooncake_kv_events_<name>;
 *   info     a uint64_t id, too wide for a sample: the label <name> of the gauge
 *            mooncake_kv_events_<name>_info, always 1, after every other metric.
 * KV_EVENTS_STAT_TYPE_<kind> is the member's type.
 *
 * This list is the one place a counter is written on the C and C++ side: kv_events_stats below,
 * the library's copy of the Rust stats, the C++ header's Stats and the stub's status JSON and
 * metrics (the same as a disabled Rust publisher's, at zero) are expanded from it. Invoke it
 * with a macro X(name, kind, help) to expand it yourself. The Rust `Stats` has the same fields
 * in the same order, and the same metrics (tests/c_api.rs checks). What each means and when to
 * worry: docs/operations.md. */
#define KV_EVENTS_STATS_FIELDS(X)                                                                  \
  X(enabled, flag, "1 when events are published, 0 when disabled.")                                \
  X(published_batches, counter, "Messages handed to the PUB socket.")                              \
  X(published_events, counter, "Events in published messages.")                                    \
  X(dropped_events, counter,                                                                       \
    "Events lost before encoding (full queue, shutdown, oversized); each is a sequence gap.")      \
  X(skipped_keyless_events, counter,                                                               \
    "stored/removed not emitted: empty key or emit_object_key=false.")                             \
  X(cleared_suppressed, counter, "RemoveAll results that emitted no cleared.")                     \
  X(send_failures, counter, "Messages the socket refused.")                                        \
  X(queue_depth, gauge, "Calls whose events wait in the queue.")                                   \
  X(queue_capacity, gauge, "Calls the queue holds before dropping the oldest.")                    \
  X(next_sequence, gauge,                                                                          \
    "Transport sequence of the next message; every number below it was taken.")                    \
  X(refused_handshakes, counter,                                                                   \
    "Subscriber handshakes refused: not on an allow-list, wrong mechanism, wrong CURVE key.")      \
  X(incarnation, info,                                                                             \
    "The random id of this publisher's life, which changes at every restart or takeover, "         \
    "as the label incarnation.")                                                                   \
  X(connections, gauge, "Connections the publisher's sockets hold now.")                           \
  X(connections_refused, counter,                                                                  \
    "Connections closed at once: over a connection bound, or no descriptor to spare.")             \
  X(handshake_timeouts, counter,                                                                   \
    "Connections closed because their handshake did not finish in time.")                          \
  X(subscriptions_refused, counter,                                                                \
    "Subscriptions to a topic that can never match; the peer is disconnected.")                    \
  X(replay_requests, counter, "Requests the replay socket answered.")                              \
  X(replayed_messages, counter, "Messages sent again by the replay socket.")                       \
  X(bad_requests, counter,                                                                         \
    "Replay socket requests that could not be read, each answered with an error.")                 \
  X(replays_abandoned, counter, "Replays given up because the requester stopped reading.")         \
  X(replay_buffer_bytes, gauge, "Bytes of payloads the replay buffer holds.")                      \
  X(replay_oldest_sequence, gauge,                                                                 \
    "Oldest sequence a replay can send; the next sequence when the buffer is empty.")              \
  X(snapshots_served, counter, "Snapshots sent whole on the replay socket.")                       \
  X(snapshots_abandoned, counter,                                                                  \
    "Snapshots given up because the requester stopped reading or the publisher stopped.")          \
  X(snapshot_objects, counter, "Objects held by the snapshots sent whole.")                        \
  X(subscribers, gauge, "Subscribers connected now: PUB connections whose handshake succeeded.")   \
  X(subscriber_connects, counter, "PUB connections whose handshake succeeded.")                    \
  X(subscriber_disconnects, counter, "PUB connections closed after their handshake.")              \
  X(invalid_media_calls, counter,                                                                  \
    "Event calls with a media bit other than cpu and disk, or a put commit with no medium.")       \
  X(replay_bytes_in_flight, gauge,                                                                 \
    "Bytes of replayed messages not yet written to their requesters.")                             \
  X(heartbeats, counter, "Messages with no event sent after a silence.")                           \
  X(skipped_non_utf8_events, counter,                                                              \
    "Events not published: a tenant, key or group not UTF-8 with kv_events_non_utf8=skip.")

#define KV_EVENTS_STAT_TYPE_flag bool
#define KV_EVENTS_STAT_TYPE_counter uint64_t
#define KV_EVENTS_STAT_TYPE_gauge uint64_t
#define KV_EVENTS_STAT_TYPE_info uint64_t

#define KV_EVENTS_MEMBER_STAT_(name, kind, help) KV_EVENTS_STAT_TYPE_##kind name;

/* The publisher's counters, a member per line of KV_EVENTS_STATS_FIELDS (bool enabled;
 * uint64_t published_batches; ...); all zero and enabled false when disabled. Each counter is
 * read on its own: a snapshot is a set of recent values, not one instant. */
typedef struct kv_events_stats {
  KV_EVENTS_STATS_FIELDS(KV_EVENTS_MEMBER_STAT_)
} kv_events_stats;

/* Writes the counters into the first `stats_size` bytes of *stats (sizeof(kv_events_stats)). */
MOONCAKE_KV_EVENTS_API int kv_events_get_stats(const kv_events_publisher* publisher,
                                               kv_events_stats* stats, size_t stats_size);

/* The counters as one JSON object, plus "built_with_kv_events" (false in the stub), for the
 * master's GET /kv_events/status. A NUL-terminated string the caller frees with
 * kv_events_string_free; NULL for a NULL publisher or when memory ran out. */
MOONCAKE_KV_EVENTS_API char* kv_events_status_json(const kv_events_publisher* publisher);

/* The counters in the Prometheus text exposition format (0.0.4), every metric named
 * mooncake_kv_events_*, counters ending in _total; the same metrics, at zero, for a disabled
 * publisher and the stub. Freed with kv_events_string_free; NULL as kv_events_status_json. */
MOONCAKE_KV_EVENTS_API char* kv_events_metrics_text(const kv_events_publisher* publisher);

/* Frees a string of kv_events_status_json or kv_events_metrics_text. NULL does nothing. */
MOONCAKE_KV_EVENTS_API void kv_events_string_free(char* string);

/* Waits up to `timeout_ms` until everything queued before the call is handed to the socket:
 * KV_EVENTS_OK if so (at once for a disabled publisher), else KV_EVENTS_ERR_NOT_FLUSHED. */
MOONCAKE_KV_EVENTS_API int kv_events_flush(kv_events_publisher* publisher, uint64_t timeout_ms);

/* Stops accepting calls, sends what is queued within a bounded linger (about a second) and joins
 * the publishing thread; later calls do nothing and are counted as dropped. Idempotent. NULL
 * does nothing. */
MOONCAKE_KV_EVENTS_API void kv_events_shutdown(kv_events_publisher* publisher);

/* A snapshot under way: the object source adds the master's objects to it. */
typedef struct kv_events_snapshot kv_events_snapshot;

/* The master's object source, for snapshots on the replay socket (kv_events_replay_endpoint).
 * Adds to `snapshot`, with kv_events_snapshot_add, every object readable now: of the tenant
 * `tenant_id` (`tenant_id_len` bytes, as on the wire, where the empty tenant is "default"), or
 * of every tenant when tenant_id is NULL; the library leaves out what is not in the scope
 * anyway. Returns 0, or any other value when it failed (the requester gets an error).
 * Called on the library's thread kv-events-snapshot, one snapshot at a time, never on a master
 * thread. It should copy one shard's entries under that shard's lock, release the lock, then add
 * them: kv_events_snapshot_add may wait for the requester to read. The master must announce
 * each change (the event calls) under the lock the source copies under. */
typedef int (*kv_events_object_source_fn)(void* context, const char* tenant_id,
                                          size_t tenant_id_len, kv_events_snapshot* snapshot);

/* Registers the publisher's object source, replacing any earlier one; a NULL `source`
 * unregisters (snapshot requests are then answered with an error saying so). `release`, when not
 * NULL, is called once with `context` when the library will never call this source again
 * (replaced, unregistered or the publisher destroyed, and no snapshot running it), at once for a
 * disabled publisher or in the stub. */
MOONCAKE_KV_EVENTS_API int kv_events_set_object_source(kv_events_publisher* publisher,
                                                       kv_events_object_source_fn source,
                                                       void* context,
                                                       void (*release)(void* context));

/* Adds one readable object to `snapshot`: a `stored` event for each medium in `media`. An empty
 * object key is left out, as on the stream. Returns KV_EVENTS_OK; KV_EVENTS_ERR_ABANDONED once
 * the snapshot was given up (return from the source); KV_EVENTS_ERR_INVALID_ARGUMENT for a NULL
 * snapshot or a NULL string with a non-zero length. */
MOONCAKE_KV_EVENTS_API int kv_events_snapshot_add(kv_events_snapshot* snapshot,
                                                  const char* tenant_id, size_t tenant_id_len,
                                                  const char* object_key, size_t object_key_len,
                                                  const char* group_id, size_t group_id_len,
                                                  uint8_t media);

/* How much a log line matters. */
typedef enum kv_events_log_level {
  KV_EVENTS_LOG_DEBUG = 0,
  KV_EVENTS_LOG_INFO = 1,
  KV_EVENTS_LOG_WARNING = 2,
  KV_EVENTS_LOG_ERROR = 3
} kv_events_log_level;

/* A log sink: `line` holds `line_len` bytes, not NUL-terminated; `context` is the pointer given
 * to kv_events_set_log_sink. Called from the master's threads and the publishing thread, so it
 * must be thread-safe; it should not block. */
typedef void (*kv_events_log_fn)(void* context, int level, const char* line, size_t line_len);

/* Sends the log lines of every publisher in the process to `sink`, replacing any earlier sink:
 * the effective configuration at start (info), the warning that emit_object_key=false
 * suppresses every stored/removed, send failures (rate-limited), refused subscriber handshakes
 * and events dropped at shutdown (warnings); in the stub, one warning from kv_events_create
 * given an enabled config. A NULL sink restores the default, warnings and errors on stderr
 * (`context` and `release` are then ignored).
 * `release`, when not NULL, is called once with `context` when the library will never call this
 * sink again (it was replaced and no call of it is running), so that the context can be
 * freed. */
MOONCAKE_KV_EVENTS_API int kv_events_set_log_sink(kv_events_log_fn sink, void* context,
                                                  void (*release)(void* context));

/* The library's version (the MOONCAKE_KV_EVENTS_VERSION_* it was built with); each pointer may
 * be NULL. */
MOONCAKE_KV_EVENTS_API void kv_events_version(int* major, int* minor, int* patch);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOONCAKE_KV_EVENTS_C_H */
