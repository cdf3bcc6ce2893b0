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

void kv_events_string_free(char* string) { std::free(string); }

void kv_events_version(int* major, int* minor, int* patch) {
  if (major != nullptr) *major = MOONCAKE_KV_EVENTS_VERSION_MAJOR;
  if (minor != nullptr) *minor = MOONCAKE_KV_EVENTS_VERSION_MINOR;
  if (patch != nullptr) *patch = MOONCAKE_KV_EVENTS_VERSION_PATCH;
}

}  // extern "C"
