// What the C side of the library holds without Rust, printed for tests/c_api.rs, which compiles
// this file with the OFF build's stub (cpp/kv_events_stub.cc, cpp/kv_events_common.cc) and
// compares what it prints with the Rust side. One argument says what:
//   config   kv_events_config_init's defaults, a field a line as `{:#?}` prints a Rust struct's
//            (`name: value`, strings quoted; no default needs escaping);
//   stats    the names of KV_EVENTS_STATS_FIELDS, one a line;
//   status   the stub's kv_events_status_json();
//   metrics  the stub's kv_events_metrics_text().
#include <stdio.h>
#include <string.h>

#include "mooncake/kv_events_c.h"

namespace {

int print_config() {
  kv_events_config c;
  kv_events_config_init(&c, sizeof c);
#define PRINT_BOOL(name, default_value) printf("%s: %s\n", #name, c.name ? "true" : "false");
#define PRINT_U32(name, default_value) printf("%s: %lu\n", #name, (unsigned long)c.name);
#define PRINT_U64(name, default_value) printf("%s: %llu\n", #name, (unsigned long long)c.name);
#define PRINT_STRING(name, default_value) \
  printf("%s: \"%s\"\n", #name, c.name == NULL ? "" : c.name);
  KV_EVENTS_CONFIG_FIELDS(PRINT_BOOL, PRINT_U32, PRINT_U64, PRINT_STRING)
  return 0;
}

int print_stats() {
#define PRINT_NAME(name, kind, help) printf("%s\n", #name);
  KV_EVENTS_STATS_FIELDS(PRINT_NAME)
  return 0;
}

int print_text(bool status) {
  kv_events_config config;
  kv_events_config_init(&config, sizeof config);
  kv_events_publisher* publisher = NULL;
  if (kv_events_create(&config, sizeof config, &publisher, NULL, 0) != KV_EVENTS_OK) return 1;
  char* text = status ? kv_events_status_json(publisher) : kv_events_metrics_text(publisher);
  if (text == NULL) return 1;
  fputs(text, stdout);
  kv_events_string_free(text);
  kv_events_destroy(publisher);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc == 2 ? argv[1] : "";
  if (strcmp(what, "config") == 0) return print_config();
  if (strcmp(what, "stats") == 0) return print_stats();
  if (strcmp(what, "status") == 0) return print_text(true);
  if (strcmp(what, "metrics") == 0) return print_text(false);
  fprintf(stderr, "usage: %s config|stats|status|metrics\n", argv[0]);
  return 2;
}
