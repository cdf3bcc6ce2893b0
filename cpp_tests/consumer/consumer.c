/* A C program on the C API: creates an enabled publisher on the endpoint given as its argument
 * and prints its status JSON, which says which library answered. Built by each route of
 * CMakeLists.txt here, and with pkg-config alone (check_consumer.cmake). */
#include <stdio.h>

#include "mooncake/kv_events_c.h"

int main(int argc, char** argv) {
  kv_events_config config;
  kv_events_publisher* publisher = NULL;
  char error[512];
  char* status;
  if (argc != 2) {
    fprintf(stderr, "usage: consumer_c ipc:///path/to/socket\n");
    return 2;
  }
  kv_events_config_init(&config, sizeof config);
  config.enable_kv_events = true;
  config.bind_endpoint = argv[1];
  config.backend_id = "consumer-c";
  if (kv_events_create(&config, sizeof config, &publisher, error, sizeof error) != KV_EVENTS_OK) {
    fprintf(stderr, "consumer_c: %s\n", error);
    return 1;
  }
  status = kv_events_status_json(publisher);
  printf("%s\n", status);
  kv_events_string_free(status);
  kv_events_destroy(publisher);
  return 0;
}
