// Internal to the library: the master's object source (kv_events_set_object_source) as the
// Rust side calls it. Inline, like log_sink.h, so the Rust side links without the rest of the
// C++ layer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rust/cxx.h"

struct kv_events_snapshot;

namespace mooncake::kv_events::bridge {

struct Snapshot;

class ObjectSource {
 public:
  // As kv_events_object_source_fn: (context, tenant_id or NULL, tenant_id_len, snapshot).
  using Function = int (*)(void* context, const char* tenant_id, size_t tenant_id_len,
                           kv_events_snapshot* snapshot);

  ObjectSource(Function objects, void* context, void (*release)(void*)) noexcept
      : objects_(objects), context_(context), release_(release) {}
  ObjectSource(const ObjectSource&) = delete;
  ObjectSource& operator=(const ObjectSource&) = delete;

  // The Rust side drops the source once it was replaced and no snapshot uses it.
  ~ObjectSource() {
    if (release_ != nullptr) release_(context_);
  }

  // Called on the thread kv-events-snapshot. The C API's kv_events_snapshot is the Rust side's
  // Snapshot; what a C++ source throws is stopped here and reported as a failure.
  int32_t objects(rust::Slice<const uint8_t> tenant, bool every_tenant,
                  Snapshot& snapshot) const noexcept {
    try {
      const char* name = every_tenant ? nullptr : reinterpret_cast<const char*>(tenant.data());
      return objects_(context_, name, every_tenant ? 0 : tenant.size(),
                      reinterpret_cast<kv_events_snapshot*>(&snapshot));
    } catch (...) {
      return -1;
    }
  }

 private:
  Function objects_;
  void* context_;
  void (*release_)(void*);
};

}  // namespace mooncake::kv_events::bridge
