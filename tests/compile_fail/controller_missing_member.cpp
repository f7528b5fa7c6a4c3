// Must not compile: blocking_controller over a type that has every controller member but
// max_staleness() (requirement 4 of cadence/controllers/controller.hpp). It must stop at
// CADENCE_REQUIRE_CONTROLLER, whose message names the library and the concept, with the
// instantiation that names the type, rather than at an error deep inside the wrapper. The
// other members come from tests/support/controller_stubs.hpp.
// check.cmake matches the compiler's output against each "expected error" line (a regex).
//
// expected error: cadence: C does not model synchronization_controller
// expected error: is_synchronization_controller_v<no_max_staleness>
#include <cadence/runtime/blocking_controller.hpp>

#include "../support/controller_stubs.hpp"

#include <vector>

using namespace cadence;

struct no_max_staleness : test::controller_stub {
  std::vector<worker_id> waiting_for(worker_id) const { return {}; }
};

int main() {
  blocking_controller<no_max_staleness> c{no_max_staleness{}};
  (void)c;
}
