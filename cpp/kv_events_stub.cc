// The ENABLE_KV_EVENTS=OFF side of include/mooncake/kv_events.h: the same API with no Rust
// and no ZeroMQ behind it. Every publisher is disabled: every call does nothing, enabled() is
// false, stats() is zeros and status_json() says events were not built in. create() accepts
// any config, an enabled one included, so a master built without events starts as usual; an
// enabled one makes it say so once, as a warning, so the operator who asked for events learns
// that this build has none.

#include "mooncake/kv_events.h"

#include <iostream>
#include <mutex>
#include <utility>

#include "status_json.h"

namespace mooncake::kv_events {

namespace {

std::mutex sink_mutex;
std::function<void(LogLevel, std::string_view)> sink;  // guarded by sink_mutex; empty: stderr

void warn(std::string_view line) noexcept {
  try {
    std::lock_guard<std::mutex> lock(sink_mutex);
    if (sink) {
      sink(LogLevel::kWarning, line);
    } else {
      std::cerr << line << std::endl;
    }
  } catch (...) {
  }
}

}  // namespace

struct Publisher::Impl {};

std::unique_ptr<Publisher> Publisher::create(const Config& config) {
  if (config.enable_kv_events) {
    warn(
        "kv events: enable_kv_events is true, but this master was built with "
        "ENABLE_KV_EVENTS=OFF: no events will be published (rebuild with "
        "-DENABLE_KV_EVENTS=ON to publish them)");
  }
  return std::unique_ptr<Publisher>(new Publisher(nullptr));
}

Publisher::Publisher(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

Publisher::~Publisher() = default;

bool Publisher::enabled() const noexcept { return false; }

void Publisher::on_put_commit(std::string_view, std::string_view, std::string_view,
                              MediumSet) noexcept {}

void Publisher::on_medium_delta(std::string_view, std::string_view, std::string_view,
                                MediumSet, MediumSet) noexcept {}

RemoveAllScan Publisher::begin_remove_all() noexcept { return RemoveAllScan(); }

void Publisher::on_remove_all(const RemoveAllScan&, std::string_view, uint64_t,
                              uint64_t) noexcept {}

Stats Publisher::stats() const noexcept { return Stats{}; }

std::string Publisher::status_json() const {
  return detail::status_json(Stats{}, /*built_with_kv_events=*/false);
}

std::string Publisher::metrics_text() const { return detail::metrics_text_disabled(); }

bool Publisher::flush(std::chrono::milliseconds) noexcept { return true; }

void set_log_sink(std::function<void(LogLevel, std::string_view)> new_sink) {
  std::lock_guard<std::mutex> lock(sink_mutex);
  sink = std::move(new_sink);
}

void Publisher::shutdown() noexcept {}

}  // namespace mooncake::kv_events
