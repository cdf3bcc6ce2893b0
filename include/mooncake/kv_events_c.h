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
 *   ignored.
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
 * enable_kv_events). Fill it with kv_events_config_init, then set what differs. Strings are
 * NUL-terminated, NULL is ""; the library copies them, so they need to live only during
 * kv_events_create. Empty strings and block_size 0 go on the wire as nil. */
typedef struct kv_events_config {
  bool enable_kv_events;         /* false (default): a disabled publisher, every call a no-op */
  const char* bind_endpoint;     /* required when enabled, e.g. "tcp://0.0.0.0:5557" */
  const char* backend_id;        /* required when enabled: names this store in every event */
  const char* model_name;
  uint32_t block_size;           /* in tokens; 0 is nil */
  const char* additional_salt;
  const char* lora_name;
  uint32_t dp_rank;              /* in every event and in every batch trailer */
  bool emit_object_key;          /* default true; false suppresses every stored/removed */
  bool emit_legacy_compat;       /* default true; adds type, block_hashes, parent_block_hash */
  uint32_t queue_capacity;       /* default 65536; calls queued before the oldest is dropped */
  const char* curve_secret_key_file; /* the publisher's NAME.key: the stream speaks CURVE */
  const char* curve_allow;       /* a subscriber's .pub file or a directory of them */
  const char* null_allow_addresses; /* comma-separated IP addresses that may connect */
  const char* ipc_mode;          /* default "0660": the octal mode of an ipc:// socket file */
  uint32_t handshake_timeout_ms; /* default 3000: a connection not handshaken by then is closed */
  uint32_t max_connections;      /* default 512: connections held at once; more are refused */
  uint32_t max_connections_per_address; /* default 64: connections one peer address may hold */
  uint32_t send_hwm;             /* default 10000: messages held for a subscriber not reading */
  const char* replay_endpoint;   /* ROUTER endpoint for info and replay; "" (default): off */
  uint64_t replay_buffer_bytes;  /* default 67108864: bytes of sent payloads kept for replay */
} kv_events_config;

/* Fills the first `config_size` bytes of *config with the defaults (those of the table above);
 * pass sizeof(kv_events_config). NULL does nothing. */
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

/* A Put, BatchPut or Upsert committed: `stored` for every medium in `media`, cpu first. */
MOONCAKE_KV_EVENTS_API int kv_events_on_put_commit(kv_events_publisher* publisher,
                                                   const char* tenant_id, size_t tenant_id_len,
                                                   const char* object_key, size_t object_key_len,
                                                   const char* group_id, size_t group_id_len,
                                                   uint8_t media);

/* Any other mutation of an object's replicas: `removed` for each medium in before - after, then
 * `stored` for each in after - before. */
MOONCAKE_KV_EVENTS_API int kv_events_on_medium_delta(kv_events_publisher* publisher,
                                                     const char* tenant_id, size_t tenant_id_len,
                                                     const char* object_key,
                                                     size_t object_key_len, const char* group_id,
                                                     size_t group_id_len, uint8_t before,
                                                     uint8_t after);

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

/* The publisher's counters; all zero and enabled false when disabled. Each counter is read on
 * its own: a snapshot is a set of recent values, not one instant. */
typedef struct kv_events_stats {
  bool enabled;
  uint64_t published_batches;      /* messages handed to the PUB socket */
  uint64_t published_events;       /* events in those messages */
  uint64_t dropped_events;         /* lost before encoding; each is a sequence gap */
  uint64_t skipped_keyless_events; /* stored/removed suppressed: empty key, emit_object_key */
  uint64_t cleared_suppressed;     /* RemoveAll results that emitted no cleared */
  uint64_t send_failures;          /* messages the socket refused */
  uint64_t queue_depth;            /* calls whose events wait in the queue now */
  uint64_t queue_capacity;         /* calls the queue holds before dropping the oldest */
  uint64_t last_sequence;          /* last sequence taken: a message, or drops since it */
  uint64_t refused_handshakes;     /* subscriber handshakes refused: allow-list, CURVE */
  uint64_t incarnation;             /* random id of this publisher's life; a restart shows a new one */
  uint64_t connections;             /* connections the sockets hold now */
  uint64_t connections_refused;     /* closed at once: over a bound, or no descriptor left */
  uint64_t handshake_timeouts;      /* closed: no handshake within handshake_timeout_ms */
  uint64_t subscriptions_refused;   /* subscriptions to a topic but the empty one; peer cut */
  uint64_t replay_requests;         /* requests the replay socket answered */
  uint64_t replayed_messages;       /* messages the replay socket sent again */
  uint64_t bad_requests;            /* replay requests that could not be read */
  uint64_t replays_abandoned;       /* replays given up: the requester stopped reading */
  uint64_t replay_buffer_bytes;     /* bytes of payloads the replay buffer holds */
  uint64_t replay_oldest_sequence;  /* oldest sequence a replay can send, 0 when none */
  uint64_t snapshots_served;        /* snapshots sent whole, each ended by snapshot-end */
  uint64_t snapshots_abandoned;     /* snapshots given up: requester gone or not reading */
  uint64_t snapshot_objects;        /* objects held by the snapshots sent whole */
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
