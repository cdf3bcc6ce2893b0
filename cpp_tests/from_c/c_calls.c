/* See c_calls.h. Compiled with -std=c99 -pedantic: it proves the header is C. */
#include "c_calls.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Fails the enclosing function with the line and the condition. */
#define CHECK(condition)                                                              \
  do {                                                                                \
    if (!(condition)) {                                                               \
      snprintf(failure, failure_size, "c_calls.c:%d: %s", __LINE__, #condition);      \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

/* What the log sink saw: the sink is called from the publishing thread too. */
struct sink_state {
  pthread_mutex_t mutex;
  int lines;
  int saw_config; /* an info line naming the bind endpoint */
  int released;
};

static struct sink_state sink = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0};

static void sink_write(void* context, int level, const char* line, size_t line_len) {
  struct sink_state* state = (struct sink_state*)context;
  static const char needle[] = "bind_endpoint=";
  size_t i;
  pthread_mutex_lock(&state->mutex);
  state->lines++;
  for (i = 0; level == KV_EVENTS_LOG_INFO && i + sizeof needle - 1 <= line_len; i++) {
    if (memcmp(line + i, needle, sizeof needle - 1) == 0) state->saw_config = 1;
  }
  pthread_mutex_unlock(&state->mutex);
}

static void sink_release(void* context) {
  struct sink_state* state = (struct sink_state*)context;
  pthread_mutex_lock(&state->mutex);
  state->released++;
  pthread_mutex_unlock(&state->mutex);
}

static int contains(const char* text, const char* needle) {
  return text != NULL && strstr(text, needle) != NULL;
}

int c_calls_create(const char* endpoint, const char* backend_id, kv_events_publisher** publisher,
                   char* failure, size_t failure_size) {
  kv_events_config config;
  char error[512];
  int saw_config;
  CHECK(kv_events_set_log_sink(sink_write, &sink, sink_release) == KV_EVENTS_OK);
  kv_events_config_init(&config, sizeof config);
  config.enable_kv_events = true;
  config.bind_endpoint = endpoint;
  config.backend_id = backend_id;
  CHECK(kv_events_create(&config, sizeof config, publisher, error, sizeof error) ==
        KV_EVENTS_OK);
  CHECK(*publisher != NULL);
  CHECK(error[0] == '\0');
  CHECK(kv_events_enabled(*publisher));
  pthread_mutex_lock(&sink.mutex);
  saw_config = sink.saw_config;
  pthread_mutex_unlock(&sink.mutex);
  CHECK(saw_config);
  return 0;
}

int c_calls_publish(kv_events_publisher* p, char* failure, size_t failure_size) {
  static const char key[] = {'k', 'e', 'y', '\0', 'b', 'i', 'n'}; /* an embedded NUL */
  const uint8_t cpu = KV_EVENTS_MEDIUM_CPU;
  const uint8_t disk = KV_EVENTS_MEDIUM_DISK;
  uint64_t scan;
  kv_events_stats stats;
  kv_events_stats partial;
  char* text;
  int major = -1, minor = -1, patch = -1;

  CHECK(kv_events_on_put_commit(p, "tenant-a", 8, key, sizeof key, "group-a", 7, cpu | disk) ==
        KV_EVENTS_OK);
  CHECK(kv_events_on_medium_delta(p, "tenant-a", 8, "k2", 2, "group-a", 7, cpu | disk, disk) ==
        KV_EVENTS_OK);
  /* NULL with length 0 is the empty string: the tenant is "default", the group nil. */
  CHECK(kv_events_on_medium_delta(p, NULL, 0, "k3", 2, NULL, 0, 0, cpu) == KV_EVENTS_OK);
  /* Refused: nothing emitted. */
  CHECK(kv_events_on_put_commit(p, NULL, 3, "kx", 2, "", 0, cpu) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_on_medium_delta(p, "t", 1, NULL, 2, "", 0, 0, cpu) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_on_remove_all(p, 1, NULL, 1, 1, 0) == KV_EVENTS_ERR_INVALID_ARGUMENT);

  scan = kv_events_begin_remove_all(p);
  CHECK(scan != 0);
  CHECK(kv_events_on_medium_delta(p, "tenant-b", 8, "k4", 2, "", 0, cpu, 0) == KV_EVENTS_OK);
  CHECK(kv_events_on_remove_all(p, scan, "tenant-b", 8, 1, 0) == KV_EVENTS_OK);
  /* A tenant with a skipped object: no cleared, counted. */
  CHECK(kv_events_on_remove_all(p, scan, "tenant-c", 8, 1, 1) == KV_EVENTS_OK);

  CHECK(kv_events_flush(p, 10000) == KV_EVENTS_OK);

  CHECK(kv_events_get_stats(p, &stats, sizeof stats) == KV_EVENTS_OK);
  CHECK(stats.enabled);
  CHECK(stats.published_events == 6);
  CHECK(stats.cleared_suppressed == 1);
  CHECK(stats.dropped_events == 0);
  CHECK(stats.queue_capacity == 65536);
  /* Messages 0 to published_batches - 1, no event dropped: the next is published_batches. */
  CHECK(stats.next_sequence == stats.published_batches);
  /* A caller that knows fewer fields gets exactly those: nothing past its size is written. */
  memset(&partial, 0xAB, sizeof partial);
  CHECK(kv_events_get_stats(p, &partial, offsetof(kv_events_stats, published_events)) ==
        KV_EVENTS_OK);
  CHECK(partial.published_batches == stats.published_batches);
  CHECK(partial.published_events == UINT64_C(0xABABABABABABABAB));

  text = kv_events_status_json(p);
  CHECK(contains(text, "\"built_with_kv_events\":true,"));
  CHECK(contains(text, "\"published_events\":6,"));
  kv_events_string_free(text);
  text = kv_events_metrics_text(p);
  CHECK(contains(text, "\nmooncake_kv_events_published_events_total 6\n"));
  CHECK(contains(text, "# TYPE mooncake_kv_events_cleared_suppressed_total counter\n"));
  kv_events_string_free(text);

  kv_events_version(&major, &minor, &patch);
  CHECK(major == MOONCAKE_KV_EVENTS_VERSION_MAJOR);
  CHECK(minor == MOONCAKE_KV_EVENTS_VERSION_MINOR);
  CHECK(patch == MOONCAKE_KV_EVENTS_VERSION_PATCH);
  kv_events_version(NULL, NULL, NULL);
  return 0;
}

int c_calls_finish(kv_events_publisher* p, char* failure, size_t failure_size) {
  kv_events_stats stats;
  int released;
  kv_events_shutdown(p);
  kv_events_shutdown(p); /* idempotent */
  CHECK(kv_events_on_put_commit(p, "t", 1, "late", 4, "", 0, KV_EVENTS_MEDIUM_CPU) ==
        KV_EVENTS_OK);
  CHECK(kv_events_get_stats(p, &stats, sizeof stats) == KV_EVENTS_OK);
  CHECK(stats.dropped_events == 1); /* the call after shutdown */
  CHECK(kv_events_enabled(p));      /* still: it was created enabled */
  CHECK(kv_events_flush(p, 100) == KV_EVENTS_ERR_NOT_FLUSHED);
  kv_events_destroy(p);
  CHECK(kv_events_set_log_sink(NULL, NULL, NULL) == KV_EVENTS_OK);
  pthread_mutex_lock(&sink.mutex);
  released = sink.released;
  pthread_mutex_unlock(&sink.mutex);
  CHECK(released == 1);
  return 0;
}

int c_calls_refusals(const char* endpoint, char* failure, size_t failure_size) {
  kv_events_config config;
  kv_events_publisher* p = NULL;
  kv_events_stats stats;
  char error[512];
  char tiny[8];
  char* text;

  /* A bad flag: KV_EVENTS_ERR_INVALID_CONFIG, naming the flag. */
  kv_events_config_init(&config, sizeof config);
  config.enable_kv_events = true;
  config.bind_endpoint = endpoint;
  CHECK(kv_events_create(&config, sizeof config, &p, error, sizeof error) ==
        KV_EVENTS_ERR_INVALID_CONFIG);
  CHECK(p == NULL);
  CHECK(contains(error, "kv_events_backend_id"));
  config.backend_id = "store-a";
  config.queue_capacity = 0;
  CHECK(kv_events_create(&config, sizeof config, &p, error, sizeof error) ==
        KV_EVENTS_ERR_INVALID_CONFIG);
  CHECK(contains(error, "kv_events_queue_capacity"));
  config.queue_capacity = 16;
  config.model_name = "\xff\xfe";
  CHECK(kv_events_create(&config, sizeof config, &p, error, sizeof error) ==
        KV_EVENTS_ERR_INVALID_CONFIG);
  CHECK(strcmp(error, "kv_events_model_name is not valid UTF-8") == 0);
  config.model_name = NULL;
  config.non_utf8 = "latin1";
  CHECK(kv_events_create(&config, sizeof config, &p, error, sizeof error) ==
        KV_EVENTS_ERR_INVALID_CONFIG);
  CHECK(p == NULL);
  CHECK(contains(error, "kv_events_non_utf8"));
  config.non_utf8 = "skip";

  /* An endpoint that cannot be bound: KV_EVENTS_ERR_BIND, naming it; truncated to the buffer. */
  config.bind_endpoint = "not-an-endpoint";
  CHECK(kv_events_create(&config, sizeof config, &p, error, sizeof error) == KV_EVENTS_ERR_BIND);
  CHECK(p == NULL);
  CHECK(contains(error, "\"not-an-endpoint\" cannot be bound"));
  CHECK(kv_events_create(&config, sizeof config, &p, tiny, sizeof tiny) == KV_EVENTS_ERR_BIND);
  CHECK(strlen(tiny) == sizeof tiny - 1);
  CHECK(kv_events_create(&config, sizeof config, &p, NULL, 0) == KV_EVENTS_ERR_BIND);

  /* NULL arguments. */
  CHECK(kv_events_create(NULL, sizeof config, &p, error, sizeof error) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_create(&config, sizeof config, NULL, error, sizeof error) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_on_put_commit(NULL, "t", 1, "k", 1, "", 0, 1) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_on_medium_delta(NULL, "t", 1, "k", 1, "", 0, 0, 1) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_begin_remove_all(NULL) == 0);
  CHECK(kv_events_on_remove_all(NULL, 1, "t", 1, 1, 0) == KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_get_stats(NULL, &stats, sizeof stats) == KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(kv_events_status_json(NULL) == NULL);
  CHECK(kv_events_metrics_text(NULL) == NULL);
  CHECK(kv_events_flush(NULL, 0) == KV_EVENTS_ERR_INVALID_ARGUMENT);
  CHECK(!kv_events_enabled(NULL));
  kv_events_shutdown(NULL);
  kv_events_destroy(NULL);
  kv_events_string_free(NULL);
  kv_events_config_init(NULL, sizeof config);

  /* The defaults. */
  kv_events_config_init(&config, sizeof config);
  CHECK(config.queue_capacity == 65536 && config.emit_object_key && config.emit_legacy_compat);
  CHECK(strcmp(config.ipc_mode, "0660") == 0);
  CHECK(!config.reannounce_remaining && strcmp(config.non_utf8, "skip") == 0);

  /* A disabled config, from a caller whose header ends before emit_object_key (an older one):
   * a publisher whose calls do nothing, any string accepted. */
  kv_events_config_init(&config, sizeof config);
  config.model_name = "\xff";
  CHECK(kv_events_create(&config, offsetof(kv_events_config, emit_object_key), &p, error,
                         sizeof error) == KV_EVENTS_OK);
  CHECK(!kv_events_enabled(p));
  CHECK(kv_events_on_put_commit(p, "t", 1, "k", 1, "", 0, 1) == KV_EVENTS_OK);
  CHECK(kv_events_begin_remove_all(p) == 0);
  CHECK(kv_events_flush(p, 0) == KV_EVENTS_OK);
  CHECK(kv_events_get_stats(p, &stats, sizeof stats) == KV_EVENTS_OK);
  CHECK(!stats.enabled && stats.published_events == 0);
  text = kv_events_metrics_text(p);
  CHECK(contains(text, "\nmooncake_kv_events_enabled 0\n"));
  CHECK(contains(text, "\nmooncake_kv_events_published_events_total 0\n"));
  kv_events_string_free(text);
  kv_events_destroy(p);
  return 0;
}

/* The object source's record: it runs on the library's snapshot thread. */
struct source_state {
  pthread_mutex_t mutex;
  int calls;
  char last_tenant[64];
  int refusals_ok;
  int released;
};

static struct source_state source = {PTHREAD_MUTEX_INITIALIZER, 0, "", 0, 0};

static int source_objects(void* context, const char* tenant_id, size_t tenant_id_len,
                          kv_events_snapshot* snapshot) {
  struct source_state* state = (struct source_state*)context;
  const uint8_t cpu = KV_EVENTS_MEDIUM_CPU, disk = KV_EVENTS_MEDIUM_DISK;
  int refusals_ok =
      kv_events_snapshot_add(snapshot, NULL, 2, "k", 1, "", 0, cpu) ==
          KV_EVENTS_ERR_INVALID_ARGUMENT &&
      kv_events_snapshot_add(NULL, "t", 1, "k", 1, "", 0, cpu) == KV_EVENTS_ERR_INVALID_ARGUMENT;
  int added = kv_events_snapshot_add(snapshot, "tenant-a", 8, "s1", 2, "g", 1, cpu | disk) ==
                  KV_EVENTS_OK &&
              kv_events_snapshot_add(snapshot, NULL, 0, "s2", 2, NULL, 0, disk) == KV_EVENTS_OK;
  pthread_mutex_lock(&state->mutex);
  state->calls++;
  state->refusals_ok = refusals_ok;
  if (tenant_id == NULL) {
    strcpy(state->last_tenant, "*");
  } else if (tenant_id_len < sizeof state->last_tenant) {
    memcpy(state->last_tenant, tenant_id, tenant_id_len);
    state->last_tenant[tenant_id_len] = '\0';
  }
  pthread_mutex_unlock(&state->mutex);
  return added ? 0 : 1;
}

static void source_release(void* context) {
  struct source_state* state = (struct source_state*)context;
  pthread_mutex_lock(&state->mutex);
  state->released++;
  pthread_mutex_unlock(&state->mutex);
}

int c_calls_register_source(kv_events_publisher* publisher, char* failure, size_t failure_size) {
  CHECK(kv_events_set_object_source(NULL, source_objects, &source, source_release) ==
        KV_EVENTS_ERR_INVALID_ARGUMENT);
  pthread_mutex_lock(&source.mutex);
  CHECK(source.released == 1); /* a refused registration releases the context too */
  source.released = 0;
  pthread_mutex_unlock(&source.mutex);
  CHECK(kv_events_set_object_source(publisher, source_objects, &source, source_release) ==
        KV_EVENTS_OK);
  return 0;
}

void c_calls_source_state(int* calls, char* last_tenant, size_t last_tenant_size,
                          int* refusals_ok, int* released) {
  pthread_mutex_lock(&source.mutex);
  *calls = source.calls;
  snprintf(last_tenant, last_tenant_size, "%s", source.last_tenant);
  *refusals_ok = source.refusals_ok;
  *released = source.released;
  pthread_mutex_unlock(&source.mutex);
}
