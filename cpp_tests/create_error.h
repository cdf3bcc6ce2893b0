// The message of the exception Publisher::create throws, for the suites that check what it
// refuses (create_test.cc, security_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "mooncake/kv_events.h"

namespace kv_events_test {

// The message of the exception of type E that create(config) throws; fails if none.
template <typename E>
std::string create_error(const mooncake::kv_events::Config& config) {
  try {
    static_cast<void>(mooncake::kv_events::Publisher::create(config));
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "create() did not throw";
  return "";
}

}  // namespace kv_events_test
