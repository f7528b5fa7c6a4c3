// Test support for the progress engine's tests (engine_test.cpp, latch_test.cpp): the message
// of the transport_error a call throws, so that a test compares whole messages.
#pragma once

#include <cadence/core/error.hpp>

#include <string>

namespace cadence_engine_test {

/// The message of the transport_error `f` throws ("" if it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const cadence::transport_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace cadence_engine_test
