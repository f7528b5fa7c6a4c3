// The model and the race promise no allocation per step once built: counted here by replacing
// the global operator new for this test executable.
#include "support/count_allocations.hpp"
#include "synthetic.hpp"

#include <cadence/sim/scenarios.hpp>
#include "model.hpp"
#include "race.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <new>
#include <numeric>
#include <vector>

using cadence::test::allocations;

TEST_CASE("softmax_regression allocates nothing in gradient, sgd_step or evaluate") {
  const auto d = cadence_test::synthetic(64, 4, 3, 0.2, 1);
  cadence::train::softmax_regression m(d.features(), d.classes, 16);
  std::vector<float> w(m.parameter_count(), 0.0f), g(m.parameter_count());
  std::vector<std::uint32_t> batch(16);
  std::iota(batch.begin(), batch.end(), 0u);
  const std::size_t before = allocations;
  for (int step = 0; step < 50; ++step) {
    m.gradient(w, d, batch, g);
    cadence::train::softmax_regression::sgd_step(w, g, 0.1f);
  }
  (void)m.evaluate(w, d);
  CHECK(allocations == before);
}

TEST_CASE("the race allocates nothing per push: a run four times as long allocates about as often") {
  const auto data = cadence_test::synthetic_split(400, 100);
  cadence::train::race_options o;
  o.batch_size = 8;
  o.eval_every_seconds = 100;  // curve points only at 0 and the end: no growth with the length
  auto s = cadence::sim::make_scenario("hetero2", 4);
  auto count = [&](double seconds) {
    s.seconds = seconds;
    const std::size_t before = allocations;
    const auto r = cadence::train::run_race("ssp:2", s, data, o);
    const std::size_t used = allocations - before;
    CHECK(r.metrics.iterations > static_cast<std::uint64_t>(20 * seconds));
    return used;
  };
  const std::size_t short_run = count(10);
  const std::size_t long_run = count(40);
  CHECK(long_run <= short_run + 4);
}
