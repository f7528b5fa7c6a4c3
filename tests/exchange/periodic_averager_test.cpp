// cadence/exchange/periodic_averager.hpp over in-process ranks: the shared suite
// (exchange/collective_suite.hpp; the backends run it too) and several tensors in one merge.
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/transport/inproc.hpp>

#include "exchange/inproc_suites.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace cadence::transport;
using namespace cadence::exchange;

CADENCE_INPROC_EXCHANGE_SUITE(CADENCE_PERIODIC_AVERAGER_SUITE);

TEST_CASE("several tensors of both dtypes merge at once, and a sync without tensors still counts" *
          doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    periodic_averager<inproc_communicator> per(c, 1);
    std::vector<float> a(3, static_cast<float>(c.rank()));
    std::vector<double> b(2, static_cast<double>(4 * c.rank()));
    CHECK(per.step_done());
    per.sync({a, b});
    CHECK(a == std::vector<float>(3, 0.5f));
    CHECK(b == std::vector<double>(2, 2.0));
    CHECK(per.step_done());
    per.sync();
    CHECK(per.barriers() == 2);
  });
}
