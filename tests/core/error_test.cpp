#include <cadence/core/error.hpp>

#include <doctest/doctest.h>

#include <stdexcept>
#include <type_traits>

using namespace cadence;

TEST_CASE("every cadence exception is a cadence::error and a std::runtime_error") {
  static_assert(std::is_base_of_v<std::runtime_error, error>);
  static_assert(std::is_base_of_v<error, invalid_parameter_error>);
  static_assert(std::is_base_of_v<error, worker_error>);
  static_assert(std::is_base_of_v<error, time_error>);
  static_assert(std::is_base_of_v<error, parse_error>);
  static_assert(std::is_base_of_v<error, zipline_input_error>);
  static_assert(std::is_base_of_v<error, timeout_error>);
  static_assert(std::is_base_of_v<error, deadlock_error>);
  static_assert(std::is_base_of_v<error, device_error>);
  // One catch clause handles all of them, and the message survives.
  try {
    throw worker_error("cadence::ssp: push: unknown worker 9");
  } catch (const error& e) {
    CHECK(std::string(e.what()) == "cadence::ssp: push: unknown worker 9");
  }
}
