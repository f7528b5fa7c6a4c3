// A rank's thread in the membership-over-ZeroMQ tests: runs `f`, and an exception it throws is
// recorded in the test's job (`j.fail(who + ": " + what)`) instead of ending the process, so the
// test's main thread reports every rank's failure after joining them.
#pragma once

#include <exception>
#include <string>
#include <thread>

namespace cadence_membership_zmq_test {

template <class Job, class F>
std::thread guarded(Job& j, const std::string& who, F f) {
  return std::thread([&j, who, f] {
    try {
      f();
    } catch (const std::exception& e) {
      j.fail(who + ": " + e.what());
    }
  });
}

}  // namespace cadence_membership_zmq_test
