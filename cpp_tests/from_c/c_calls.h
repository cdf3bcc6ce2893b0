/* The C side of kv_events_c_api_test: code compiled as C99, not C++, that uses only
 * mooncake/kv_events_c.h, as a C program (or a cgo or ctypes binding) would. The C++ driver
 * (c_api_test.cc) runs it and reads what it published with a real SUB socket. Each function
 * returns 0, or 1 with what failed written into `failure`. */
#ifndef KV_EVENTS_TEST_C_CALLS_H
#define KV_EVENTS_TEST_C_CALLS_H

#include <stddef.h>

#include "mooncake/kv_events_c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Installs a log sink, then creates an enabled publisher on `endpoint` for backend `backend_id`
 * into *publisher; checks the sink saw the effective configuration. */
int c_calls_create(const char* endpoint, const char* backend_id, kv_events_publisher** publisher,
                   char* failure, size_t failure_size);

/* Makes each call of the C API once, valid and refused ones, and checks what each returns,
 * the stats, status and metrics. Publishes, in this order: stored cpu and stored disk of
 * "key\0bin" (tenant-a, group-a), removed cpu of "k2", stored cpu of "k3" (empty tenant),
 * removed cpu of "k4" (tenant-b), cleared tenant-b. */
int c_calls_publish(kv_events_publisher* publisher, char* failure, size_t failure_size);

/* Shuts the publisher down, destroys it, and restores the default log sink: the sink's context
 * must be released exactly once. */
int c_calls_finish(kv_events_publisher* publisher, char* failure, size_t failure_size);

/* What kv_events_create refuses, with which code and message; a disabled publisher; NULL
 * arguments everywhere. Publishes nothing on `endpoint`. */
int c_calls_refusals(const char* endpoint, char* failure, size_t failure_size);

/* Registers an object source written in C on `publisher`: it adds ("tenant-a", "s1", "g",
 * cpu|disk) and ("", "s2", no group, disk), checks that kv_events_snapshot_add refuses NULL
 * strings, and records the tenant it was asked for. */
int c_calls_register_source(kv_events_publisher* publisher, char* failure, size_t failure_size);
/* What the source saw: how often it ran, the tenant of its last call ("*" for every tenant),
 * whether the refusals were as documented, and how often its context was released. */
void c_calls_source_state(int* calls, char* last_tenant, size_t last_tenant_size, int* refusals_ok,
                          int* released);
#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KV_EVENTS_TEST_C_CALLS_H */
