// Internal to the library: the master's log sink as the Rust side calls it. Everything here is
// inline, so the cxx bridge compiles it into the Rust archive and the Rust side links without
// the rest of the C++ layer (as in `cargo test`).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

#include "rust/cxx.h"

namespace mooncake::kv_events::bridge {

class LogSink {
 public:
  // `level` is 0 debug, 1 info, 2 warning, 3 error.
  using Function = std::function<void(uint8_t level, std::string_view message)>;

  explicit LogSink(Function write) noexcept : write_(std::move(write)) {}

  // Called by the Rust side from the master's threads and the publishing thread. Whatever the
  // master's sink throws stops here: an exception must not unwind into Rust.
  void write(uint8_t level, rust::Slice<const uint8_t> message) const noexcept {
    try {
      write_(level, std::string_view(reinterpret_cast<const char*>(message.data()), message.size()));
    } catch (...) {
    }
  }

 private:
  Function write_;
};

}  // namespace mooncake::kv_events::bridge
