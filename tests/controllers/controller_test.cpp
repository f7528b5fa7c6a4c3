#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/ssp.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace cadence;

namespace {

// The smallest type that models the concept: every numbered requirement, nothing more.
struct minimal {
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
  clock_value max_staleness() const { return 0; }
  std::vector<worker_id> waiting_for(worker_id) const { return {}; }
  std::string config() const { return "minimal"; }
};

// Requirement 5 missing: a timeout could not name the stragglers.
struct no_waiting_for {
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
  clock_value max_staleness() const { return 0; }
  std::string config() const { return "x"; }
};

// Requirement 1 broken: push must return a decision.
struct wrong_push : minimal {
  bool push(worker_id, timestamp) { return true; }
};

}  // namespace

TEST_CASE("every shipped controller models the controller concept") {
  static_assert(is_synchronization_controller_v<ssp>);
  static_assert(is_synchronization_controller_v<bsp>);
  static_assert(is_synchronization_controller_v<asp>);
  static_assert(is_synchronization_controller_v<dssp>);
  static_assert(is_synchronization_controller_v<elastic_bsp>);
  static_assert(is_synchronization_controller_v<any_controller>);
  static_assert(!is_synchronization_controller_v<int>);
  static_assert(!is_synchronization_controller_v<no_waiting_for>);
  static_assert(!is_synchronization_controller_v<wrong_push>);
  static_assert(is_synchronization_controller_v<minimal>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  static_assert(synchronization_controller<ssp>);
  static_assert(!synchronization_controller<double>);
#endif
  // Anything that models the concept can be type-erased and driven like a shipped policy.
  any_controller erased = minimal{};
  CHECK(erased.config() == "minimal");
  CHECK_FALSE(erased.push(0, 0.0).proceed);
}
