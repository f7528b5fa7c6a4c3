// Controllers promise no allocation per push once warmed up: counted here by replacing the
// global operator new for this test executable. The one exception is by design: policies whose
// clock gap is unbounded (ASP, ElasticBSP) double their clock ring when the gap doubles, so
// they allocate O(log gap) times over a whole run.
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/predict/interval.hpp>

#include "support/count_allocations.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

using cadence::test::allocations;

namespace {

// Workers with fixed, different iteration times pushing in time order; returns the number of
// allocations made during the last `measured` pushes after `warmup` pushes.
template <class C>
std::size_t allocations_per_run(C& c, std::size_t warmup, std::size_t measured) {
  const std::size_t n = c.worker_capacity();
  std::vector<double> period(n), next(n);
  for (std::size_t p = 0; p < n; ++p) next[p] = period[p] = 1.0 + 0.37 * static_cast<double>(p % 5);
  std::size_t before = 0;
  for (std::size_t e = 0; e < warmup + measured; ++e) {
    if (e == warmup) before = allocations;
    cadence::worker_id who = 0;
    bool found = false;
    for (cadence::worker_id p = 0; p < n; ++p)
      if (!c.is_waiting(p) && (!found || next[p] < next[who])) {
        who = p;
        found = true;
      }
    REQUIRE(found);
    const double t = next[who];
    const cadence::decision d = c.push(who, t);
    next[who] = t + period[who];
    for (const cadence::worker_id q : d.released) next[q] = t + period[q];
  }
  return allocations - before;
}

}  // namespace

TEST_CASE("no controller allocates per push once warmed up") {
  SUBCASE("bsp") {
    cadence::bsp c(64);
    CHECK(allocations_per_run(c, 10000, 50000) == 0);
  }
  SUBCASE("ssp") {
    cadence::ssp c(64, 3);
    CHECK(allocations_per_run(c, 10000, 50000) == 0);
  }
  SUBCASE("dssp") {
    cadence::dssp c(64, 2, 10);
    CHECK(allocations_per_run(c, 10000, 50000) == 0);
    CHECK(c.grants() > 0);
  }
  SUBCASE("dssp with a median predictor") {
    cadence::basic_dssp<cadence::median_interval> c(64, 2, 10, cadence::median_interval(5));
    CHECK(allocations_per_run(c, 10000, 50000) == 0);
  }
  SUBCASE("elastic_bsp, planning included: only the clock ring grows, log2(gap) times") {
    cadence::elastic_bsp c(64, 15);
    const std::size_t a = allocations_per_run(c, 10000, 50000);
    CHECK(c.barriers() > 10);
    CHECK(c.max_staleness() > 256);
    CHECK(a <= static_cast<std::size_t>(std::log2(static_cast<double>(c.max_staleness()))));
  }
  SUBCASE("asp: only the clock ring grows, log2(gap) times") {
    cadence::asp c(64);
    const std::size_t a = allocations_per_run(c, 10000, 50000);
    CHECK(c.max_staleness() > 256);
    CHECK(a <= static_cast<std::size_t>(std::log2(static_cast<double>(c.max_staleness()))));
  }
}
