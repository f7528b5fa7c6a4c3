#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/controllers/ssp.hpp>

#include "support/controller_stubs.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace cadence;

namespace {

// Requirement 5 missing: a timeout could not name the stragglers.
struct no_waiting_for : test::controller_stub {
  clock_value max_staleness() const { return 0; }
};

// The smallest type that models the concept: every numbered requirement, nothing more (the
// type above and the member it lacks).
struct minimal : no_waiting_for {
  std::vector<worker_id> waiting_for(worker_id) const { return {}; }
  std::string config() const { return "minimal"; }
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

namespace {

// Drives a and b with the same random pushes, hinting a few arbitrary ids (some never issued)
// to a before each push, and requires the same decisions, releases in the same order.
template <class C>
void require_hints_change_nothing(C a, C b, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  double t = 0;
  for (int e = 0; e < 3000; ++e) {
    std::vector<worker_id> running;
    for (worker_id p = 0; p < a.worker_capacity(); ++p)
      if (a.is_active(p) && !a.is_waiting(p)) running.push_back(p);
    REQUIRE_FALSE(running.empty());
    const worker_id who = running[rng() % running.size()];
    for (int k = 0; k < 3; ++k)
      cadence::prefetch(a, static_cast<worker_id>(rng() % (a.worker_capacity() + 4)));
    cadence::prefetch(a, static_cast<worker_id>(-1));
    t += 0.001 + 0.001 * static_cast<double>(rng() % 100) * (1 + who % 5);
    const decision da = a.push(who, t);
    const decision db = b.push(who, t);
    REQUIRE(da.proceed == db.proceed);
    REQUIRE(std::vector<worker_id>(da.released.begin(), da.released.end()) ==
            std::vector<worker_id>(db.released.begin(), db.released.end()));
  }
}

}  // namespace

TEST_CASE("prefetch is only a hint: every controller decides the same with and without it") {
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    require_hints_change_nothing(bsp(9), bsp(9), seed);
    require_hints_change_nothing(ssp(11, 2), ssp(11, 2), seed);
    require_hints_change_nothing(asp(5), asp(5), seed);
    require_hints_change_nothing(dssp(10, 1, 6), dssp(10, 1, 6), seed);
    require_hints_change_nothing(elastic_bsp(7, 4), elastic_bsp(7, 4), seed);
    require_hints_change_nothing(make_controller("dssp:1:4", 8), make_controller("dssp:1:4", 8),
                                 seed);
  }
  // A controller without the member, and an empty any_controller, take the hint as a no-op.
  const minimal m;
  cadence::prefetch(m, 3);
  const any_controller empty;
  cadence::prefetch(empty, 0);
  empty.prefetch(0);
  static_assert(!detail::has_prefetch<minimal>::value);
  static_assert(detail::has_prefetch<ssp>::value && detail::has_prefetch<any_controller>::value);
}
