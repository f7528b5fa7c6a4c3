// cadence/exchange/ps/options.hpp: the cut of the model into slices, the shipped update rule,
// the percentiles of a staleness histogram, and the checks every rank makes of ps_options.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/exchange/parameter_server.hpp>
#include <cadence/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;
using namespace cadence::transport;
using namespace std::chrono_literals;

TEST_CASE("ps_slice_of cuts a model into contiguous slices that cover it") {
  for (std::size_t size : {0u, 1u, 7u, 1000u, 1001u}) {
    for (int servers : {1, 2, 3, 5}) {
      std::size_t next = 0;
      for (int s = 0; s < servers; ++s) {
        const ps_slice sl = ps_slice_of(size, servers, s);
        CHECK(sl.offset == next);
        CHECK(sl.count + 1 >= size / static_cast<std::size_t>(servers));
        next += sl.count;
      }
      CHECK(next == size);
    }
  }
  CHECK_THROWS_AS(ps_slice_of(10, 2, 2), invalid_parameter_error);
}

TEST_CASE("sgd's in-place and out-of-place forms give the same weights") {
  const sgd<double> rule{0.5};
  const std::vector<double> g{1.0, -2.0, 0.25, 4.0};
  std::vector<double> in_place{3.0, 3.0, 3.0, 3.0}, out(4, -1.0);
  const std::vector<double> in = in_place;
  rule(in_place.data(), g.data(), g.size(), 7);
  rule(out.data(), in.data(), g.data(), g.size(), 7);
  CHECK(in_place == std::vector<double>{2.5, 4.0, 2.875, 1.0});
  CHECK(out == in_place);
  CHECK(in == std::vector<double>(4, 3.0));  // the out-of-place form leaves its input alone
  CHECK(sgd<float>{}.learning_rate == doctest::Approx(0.01f));
}

TEST_CASE("histogram_percentile reads a percentile off the bounded staleness histogram") {
  CHECK(histogram_percentile({0, 3, 1}, 50.0) == 1);
  CHECK(histogram_percentile({0, 3, 1}, 100.0) == 2);
  CHECK(histogram_percentile({}, 99.0) == 0);
  CHECK(histogram_percentile({0, 0, 0}, 50.0) == 0);  // nothing counted
  // 100 releases: 90 at gap 0, 9 at gap 1, one at gap 5.
  std::vector<std::int64_t> h(ps_histogram_top + 1, 0);
  h[0] = 90;
  h[1] = 9;
  h[5] = 1;
  CHECK(histogram_percentile(h, 90.0) == 0);
  CHECK(histogram_percentile(h, 90.5) == 1);
  CHECK(histogram_percentile(h, 99.0) == 1);
  CHECK(histogram_percentile(h, 99.5) == 5);
  CHECK(histogram_percentile(h, 0.001) == 0);  // the smallest gap counted
}

TEST_CASE("options are checked" ) {
  inproc_world world(2);
  auto c0 = world.join(0);
  std::vector<float> w0(4);
  ps_options o;
  o.servers = 2;  // no worker left
  CHECK_THROWS_WITH_AS((ps_worker<inproc_communicator>(c0, 4, o)), doctest::Contains("leaves no worker"),
                       invalid_parameter_error);
  o.servers = 1;
  o.evict_after = std::chrono::nanoseconds(0);
  CHECK_THROWS_AS((parameter_server<inproc_communicator, any_controller>(c0, 4, w0.data(),
                                                                         make_controller("bsp", 1), {}, o)),
                  invalid_parameter_error);
  o.evict_after.reset();
  CHECK_THROWS_WITH_AS((parameter_server<inproc_communicator, any_controller>(c0, 4, w0.data(),
                                                                              make_controller("bsp", 3), {}, o)),
                       doctest::Contains("the controller has 3 workers but the world has 1 initial ones"),
                       invalid_parameter_error);
}

TEST_CASE("each option's check names the option and the rule it breaks") {
  inproc_world world(3);
  auto c2 = world.join(2);  // a worker rank: the checks run before anything is sent
  const auto refused = [&](ps_options o, const char* says) {
    CAPTURE(says);
    CHECK_THROWS_WITH_AS((ps_worker<inproc_communicator>(c2, 4, o)), doctest::Contains(says),
                         invalid_parameter_error);
  };
  ps_options o;
  o.initial_workers = 3;
  refused(o, "initial_workers = 3 is not in [0, 2]");
  o = {};
  o.reply_timeout = 0s;
  refused(o, "timeouts must be > 0");
  o = {};
  o.evict_after = 10s;
  o.transfer_timeout = 5s;
  o.reply_timeout = 15s;  // a parked worker may wait evict_after + transfer_timeout
  refused(o, "must exceed evict_after + transfer_timeout");
  o.reply_timeout = 16s;
  CHECK_NOTHROW((ps_worker<inproc_communicator>(c2, 4, o)));
  o = {};
  o.max_outstanding = 0;
  refused(o, "max_outstanding must be >= 1");
  o = {};
  o.tag_base = max_tag - 2;
  refused(o, "leaves no room for 4 tags");
  o = {};
  o.servers = 0;
  refused(o, "servers = 0 leaves no worker");
  o.servers = 3;
  refused(o, "servers = 3 leaves no worker in a world of 3 ranks");
  o.servers = 2;  // ranks 0 and 1 serve, rank 2 works
  CHECK_NOTHROW((ps_worker<inproc_communicator>(c2, 4, o)));
}
