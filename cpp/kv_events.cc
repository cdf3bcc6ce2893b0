// The ENABLE_KV_EVENTS=ON side of include/mooncake/kv_events.h: forwards every call to the
// Rust publisher through the cxx bridge (src/ffi.rs). Strings cross as byte slices, never
// rust::Str, so keys that are not UTF-8 reach the wire unchanged and nothing throws.

#include "mooncake/kv_events.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "log_sink.h"
#include "mooncake-kv-events/src/ffi.rs.h"
#include "rust/cxx.h"
#include "status_json.h"

namespace mooncake::kv_events {
namespace {

const uint8_t* data(std::string_view s) noexcept {
  return reinterpret_cast<const uint8_t*>(s.data());
}

// The config strings are Rust Strings: refuse one that is not UTF-8, naming its flag.
rust::String utf8(const std::string& value, const char* flag) {
  try {
    return rust::String(value);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument(std::string(flag) + " is not valid UTF-8");
  }
}

bridge::BridgeConfig to_bridge(const Config& c) {
  bridge::BridgeConfig b;
  b.enable_kv_events = c.enable_kv_events;
  b.bind_endpoint = utf8(c.bind_endpoint, "kv_events_bind_endpoint");
  b.backend_id = utf8(c.backend_id, "kv_events_backend_id");
  b.model_name = utf8(c.model_name, "kv_events_model_name");
  b.block_size = c.block_size;
  b.additional_salt = utf8(c.additional_salt, "kv_events_additional_salt");
  b.lora_name = utf8(c.lora_name, "kv_events_lora_name");
  b.dp_rank = c.dp_rank;
  b.emit_object_key = c.emit_object_key;
  b.emit_legacy_compat = c.emit_legacy_compat;
  b.queue_capacity = c.queue_capacity;
  b.curve_secret_key_file = utf8(c.curve_secret_key_file, "kv_events_curve_secret_key_file");
  b.curve_allow = utf8(c.curve_allow, "kv_events_curve_allow");
  b.null_allow_addresses = utf8(c.null_allow_addresses, "kv_events_null_allow_addresses");
  b.ipc_mode = utf8(c.ipc_mode, "kv_events_ipc_mode");
  return b;
}

}  // namespace

void set_log_sink(std::function<void(LogLevel, std::string_view)> sink) {
  if (!sink) {
    bridge::set_log_sink(nullptr);
    return;
  }
  bridge::set_log_sink(std::make_unique<bridge::LogSink>(
      [sink = std::move(sink)](uint8_t level, std::string_view line) {
        sink(static_cast<LogLevel>(level), line);
      }));
}

struct Publisher::Impl {
  explicit Impl(rust::Box<bridge::RustPublisher> p) noexcept : rust(std::move(p)) {}
  rust::Box<bridge::RustPublisher> rust;  // dropping it shuts the publisher down
};

std::unique_ptr<Publisher> Publisher::create(const Config& config) {
  if (!config.enable_kv_events) {
    return std::unique_ptr<Publisher>(new Publisher(nullptr));
  }
  const bridge::BridgeConfig bridge_config = to_bridge(config);
  try {
    bridge::validate_config(bridge_config);
  } catch (const rust::Error& e) {
    throw std::invalid_argument(e.what());
  }
  std::unique_ptr<Impl> impl;
  try {
    impl = std::make_unique<Impl>(bridge::create_publisher(bridge_config));
  } catch (const rust::Error& e) {
    throw std::runtime_error(e.what());
  }
  return std::unique_ptr<Publisher>(new Publisher(std::move(impl)));
}

Publisher::Publisher(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Publisher::~Publisher() = default;

bool Publisher::enabled() const noexcept { return impl_ != nullptr; }

void Publisher::on_put_commit(std::string_view tenant_id, std::string_view object_key,
                              std::string_view group_id, MediumSet media) noexcept {
  if (!impl_) return;
  // A commit is the delta from no medium: stored for every medium in `media`.
  impl_->rust->on_medium_delta(data(tenant_id), tenant_id.size(), data(object_key),
                               object_key.size(), data(group_id), group_id.size(),
                               MediumSet().bits(), media.bits());
}

void Publisher::on_medium_delta(std::string_view tenant_id, std::string_view object_key,
                                std::string_view group_id, MediumSet before,
                                MediumSet after) noexcept {
  if (!impl_) return;
  impl_->rust->on_medium_delta(data(tenant_id), tenant_id.size(), data(object_key),
                               object_key.size(), data(group_id), group_id.size(), before.bits(),
                               after.bits());
}

RemoveAllScan Publisher::begin_remove_all() noexcept {
  if (!impl_) return RemoveAllScan();
  return RemoveAllScan(impl_->rust->begin_remove_all());
}

void Publisher::on_remove_all(const RemoveAllScan& scan, std::string_view tenant_id,
                              uint64_t objects_removed, uint64_t objects_skipped) noexcept {
  if (!impl_) return;
  impl_->rust->on_remove_all(scan.id(), data(tenant_id), tenant_id.size(), objects_removed,
                             objects_skipped);
}

Stats Publisher::stats() const noexcept {
  if (!impl_) return Stats{};
  const bridge::BridgeStats s = impl_->rust->stats();
  Stats stats;
  stats.enabled = s.enabled;
  stats.published_batches = s.published_batches;
  stats.published_events = s.published_events;
  stats.dropped_events = s.dropped_events;
  stats.skipped_keyless_events = s.skipped_keyless_events;
  stats.cleared_suppressed = s.cleared_suppressed;
  stats.send_failures = s.send_failures;
  stats.queue_depth = s.queue_depth;
  stats.queue_capacity = s.queue_capacity;
  stats.last_sequence = s.last_sequence;
  stats.refused_handshakes = s.refused_handshakes;
  return stats;
}

std::string Publisher::status_json() const {
  if (!impl_) return detail::status_json(Stats{}, /*built_with_kv_events=*/true);
  const std::string json(impl_->rust->status_json());
  // The Rust side writes one JSON object of the stats; announce the build variant in it.
  if (json.size() < 2 || json.front() != '{') return json;
  const char* separator = json.size() > 2 ? "," : "";
  return "{\"built_with_kv_events\":true" + (separator + json.substr(1));
}

std::string Publisher::metrics_text() const {
  if (!impl_) return detail::metrics_text_disabled();
  return std::string(impl_->rust->metrics_text());
}

bool Publisher::flush(std::chrono::milliseconds timeout) noexcept {
  if (!impl_) return true;
  const auto ms = std::max<std::chrono::milliseconds::rep>(timeout.count(), 0);
  return impl_->rust->flush(static_cast<uint64_t>(ms));
}

void Publisher::shutdown() noexcept {
  if (impl_) impl_->rust->shutdown();
}

}  // namespace mooncake::kv_events
