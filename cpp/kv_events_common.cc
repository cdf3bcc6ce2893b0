// The functions of include/mooncake/kv_events_c.h that both builds implement alike, compiled
// into each: into libmooncake_kv_events.so (ON, cpp/kv_events.cc) and into the stub archive
// (OFF, cpp/kv_events_stub.cc). Free of the C++ runtime, as the stub must be.

#include <cstdlib>

#include "c_api_common.h"
#include "mooncake/kv_events_c.h"

extern "C" {

void kv_events_config_init(kv_events_config* config, size_t config_size) {
  if (config == nullptr) return;
  const kv_events_config defaults = mooncake::kv_events::detail::default_config();
  std::memcpy(config, &defaults, config_size < sizeof defaults ? config_size : sizeof defaults);
}

int kv_events_on_put_commit(kv_events_publisher* publisher, const char* tenant_id,
                            size_t tenant_id_len, const char* object_key, size_t object_key_len,
                            const char* group_id, size_t group_id_len, uint8_t media) {
  // A commit is the delta from no medium: stored for every medium in `media`.
  return kv_events_on_medium_delta(publisher, tenant_id, tenant_id_len, object_key,
                                   object_key_len, group_id, group_id_len, 0, media);
}

void kv_events_string_free(char* string) { std::free(string); }

void kv_events_version(int* major, int* minor, int* patch) {
  if (major != nullptr) *major = MOONCAKE_KV_EVENTS_VERSION_MAJOR;
  if (minor != nullptr) *minor = MOONCAKE_KV_EVENTS_VERSION_MINOR;
  if (patch != nullptr) *patch = MOONCAKE_KV_EVENTS_VERSION_PATCH;
}

}  // extern "C"
