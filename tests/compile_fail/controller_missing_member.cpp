// Must not compile: blocking_controller over a type that has every controller member but
// max_staleness() (requirement 4 of cadence/controllers/controller.hpp). It must stop at
// CADENCE_REQUIRE_CONTROLLER, whose message names the library and the concept, with the
// instantiation that names the type, rather than at an error deep inside the wrapper.
// check.cmake matches the compiler's output against each "expected error" line (a regex).
//
// expected error: cadence: C does not model synchronization_controller
// expected error: is_synchronization_controller_v<no_max_staleness>
#include <cadence/runtime/blocking_controller.hpp>

#include <string>
#include <vector>

using namespace cadence;

struct no_max_staleness {
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
  std::vector<worker_id> waiting_for(worker_id) const { return {}; }
  std::string config() const { return "none"; }
};

int main() {
  blocking_controller<no_max_staleness> c{no_max_staleness{}};
  (void)c;
}
