// Internal to the library: the master's log sink (kv_events_set_log_sink) as the Rust side calls
// it. Everything here is inline, so the cxx bridge compiles it into the Rust archive and the
// Rust side links without the rest of the C++ layer (as in `cargo test`).
#pragma once

#include <cstddef>
#include <cstdint>

#include "rust/cxx.h"

namespace mooncake::kv_events::bridge {

class LogSink {
 public:
  // `write` as kv_events_log_fn: (context, level, line, line_len).
  using Function = void (*)(void* context, int level, const char* line, size_t line_len);

  LogSink(Function write, void* context, void (*release)(void*)) noexcept
      : write_(write), context_(context), release_(release) {}
  LogSink(const LogSink&) = delete;
  LogSink& operator=(const LogSink&) = delete;

  // The Rust side drops the sink once it was replaced and no call of it is running: the
  // caller's context is then theirs to free.
  ~LogSink() {
    if (release_ != nullptr) release_(context_);
  }

  // Called by the Rust side from the master's threads and the publishing thread; `level` is 0
  // debug, 1 info, 2 warning, 3 error. A C++ sink that throws is stopped here: an exception
  // must not unwind into Rust.
  void write(uint8_t level, rust::Slice<const uint8_t> message) const noexcept {
    try {
      write_(context_, level, reinterpret_cast<const char*>(message.data()), message.size());
    } catch (...) {
    }
  }

 private:
  Function write_;
  void* context_;
  void (*release_)(void*);
};

}  // namespace mooncake::kv_events::bridge
