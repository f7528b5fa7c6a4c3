// cadence/exchange/bucketed_allreducer.hpp over in-process ranks: the shared suite
// (exchange/collective_suite.hpp; the backends run it too) and how tensors are bucketed.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/transport/inproc.hpp>

#include "exchange/collective_suite.hpp"
#include "transport/inproc_ranks.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace cadence::exchange;
using namespace std::chrono_literals;

namespace {
using inproc_4 = cadence_test::inproc_harness<4>;
using inproc_3 = cadence_test::inproc_harness<3>;
}  // namespace

TYPE_TO_STRING(inproc_4);
TYPE_TO_STRING(inproc_3);
CADENCE_BUCKETED_ALLREDUCER_SUITE(inproc_4);
CADENCE_BUCKETED_ALLREDUCER_SUITE(inproc_3);

TEST_CASE("the bucketed all-reducer fuses small tensors and leaves big ones alone" * doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    bucketed_allreducer_options o;
    o.bucket_bytes = 100;
    bucketed_allreducer<inproc_communicator> red(c, o);
    std::vector<float> a(10), b(10), big(1000), d(5);
    std::vector<double> e(3);
    red.add(a);
    red.add(b);
    red.add(big);
    red.add(d);
    red.add(e);
    // a+b (80 bytes) fused; big alone; d (f32) and e (f64) split by dtype.
    CHECK(red.buckets() == 4);
  });
}
