// Internal to the library: what both sides of the C API (cpp/kv_events.cc, ON, and
// cpp/kv_events_stub.cc, OFF, with cpp/kv_events_common.cc) share: a config's defaults,
// reading a caller's config of any size, string arguments, strings handed to the caller.
// Header-only and free of the C++ runtime (no exceptions, nothing of the standard library that
// is not inline), so that the stub needs none.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "mooncake/kv_events_c.h"

namespace mooncake::kv_events::detail {

// The defaults of KV_EVENTS_CONFIG_FIELDS.
inline kv_events_config default_config() noexcept {
  kv_events_config c{};
#define KV_EVENTS_DEFAULT_(name, default_value) c.name = default_value;
  KV_EVENTS_CONFIG_FIELDS(KV_EVENTS_DEFAULT_, KV_EVENTS_DEFAULT_, KV_EVENTS_DEFAULT_,
                          KV_EVENTS_DEFAULT_)
#undef KV_EVENTS_DEFAULT_
  return c;
}

// The caller's config of `size` bytes: the fields it has, and defaults for those it lacks (a
// caller built against an older header). Fields beyond those this library knows are ignored.
inline kv_events_config config_of(const kv_events_config* config, size_t size) noexcept {
  kv_events_config c = default_config();
  std::memcpy(&c, config, size < sizeof c ? size : sizeof c);
  return c;
}

// Whether a (pointer, length) string of the caller can be read: NULL only with length 0.
inline bool readable(const char* data, size_t len) noexcept { return data != nullptr || len == 0; }

// A NUL-terminated copy of `text` the caller frees with kv_events_string_free (free); NULL when
// memory ran out.
inline char* malloc_copy(std::string_view text) noexcept {
  auto* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) return nullptr;
  std::memcpy(copy, text.data(), text.size());
  copy[text.size()] = '\0';
  return copy;
}

}  // namespace mooncake::kv_events::detail
