// The message of the exception a call throws, for tests that compare a whole message, or one
// call's message with another's (a fast path's error with the reference's).
#pragma once

#include <string>

namespace cadence::test {

/// What message_of returns when the call throws no E.
inline constexpr const char* no_exception = "<no exception>";

/// The what() of the E that f() throws, or no_exception; any other exception goes on.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return no_exception;
}

}  // namespace cadence::test
