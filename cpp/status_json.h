// Internal to the library: the status JSON of a publisher that has no Rust side (disabled, or
// the stub build). Its keys are those of the Rust publisher's status_json().
#pragma once

#include <string>

#include "mooncake/kv_events.h"

namespace mooncake::kv_events::detail {

inline std::string status_json(const Stats& s, bool built_with_kv_events) {
  auto field = [](const char* name, uint64_t value) {
    return std::string(",\"") + name + "\":" + std::to_string(value);
  };
  return std::string("{\"built_with_kv_events\":") + (built_with_kv_events ? "true" : "false") +
         ",\"enabled\":" + (s.enabled ? "true" : "false") +
         field("published_batches", s.published_batches) +
         field("published_events", s.published_events) +
         field("dropped_events", s.dropped_events) +
         field("skipped_keyless_events", s.skipped_keyless_events) +
         field("cleared_suppressed", s.cleared_suppressed) +
         field("send_failures", s.send_failures) + field("queue_depth", s.queue_depth) +
         field("queue_capacity", s.queue_capacity) + field("last_sequence", s.last_sequence) +
         field("refused_handshakes", s.refused_handshakes) + "}";
}

// The metrics of a publisher that has no Rust side: only the gauge that says so.
inline std::string metrics_text_disabled() {
  return "# HELP mooncake_kv_events_enabled 1 when events are published, 0 when disabled.\n"
         "# TYPE mooncake_kv_events_enabled gauge\n"
         "mooncake_kv_events_enabled 0\n";
}

}  // namespace mooncake::kv_events::detail
