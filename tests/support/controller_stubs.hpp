// A controller-shaped stub for the concept's tests (controllers/controller_test.cpp and
// compile_fail/): every member that cadence/controllers/controller.hpp's numbered requirements
// ask for except max_staleness() and waiting_for(), so a test type adds both to model the
// concept, or leaves one out to break exactly that requirement.
#pragma once

#include <cadence/controllers/controller.hpp>

#include <cstddef>
#include <string>

namespace cadence::test {

struct controller_stub {
  decision push(worker_id, timestamp) { return {}; }
  span<const worker_id> remove_worker(worker_id) { return {}; }
  worker_id add_worker() { return 0; }
  std::size_t worker_capacity() const { return 0; }
  clock_value clock(worker_id) const { return 0; }
  bool is_active(worker_id) const { return false; }
  bool is_waiting(worker_id) const { return false; }
  std::size_t active_workers() const { return 0; }
  clock_value min_clock() const { return 0; }
  clock_value staleness(worker_id) const { return 0; }
  std::string config() const { return "stub"; }
};

}  // namespace cadence::test
