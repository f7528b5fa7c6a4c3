// cadence/exchange/elastic_averager.hpp over in-process ranks: the shared suite
// (exchange/collective_suite.hpp; the backends run it too) and what needs fault injection (a
// rank stalled by the world, deterministically). The planner on its own:
// tests/controllers/elastic_planner_test.cpp.
#include <cadence/exchange/elastic_averager.hpp>
#include <cadence/transport/inproc.hpp>

#include "exchange/inproc_suites.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace cadence;
using namespace cadence::transport;
using namespace cadence::exchange;
using namespace std::chrono_literals;

CADENCE_INPROC_EXCHANGE_SUITE(CADENCE_ELASTIC_AVERAGER_SUITE);

static_assert(is_communicator_v<inproc_communicator>);

TEST_CASE("a rank stalled by fault injection makes the others' sync throw transport_error "
          "naming it within the deadline" * doctest::timeout(60)) {
  inproc_world world(4);
  const int stalled = 2;
  std::mutex m;
  std::vector<std::string> errors(4);
  std::vector<double> waited(4, 0.0);
  cadence_test::run_inproc_ranks(world, [&](inproc_communicator& c) {
    elastic_averager_options o;
    o.timeout = 1s;
    elastic_averager<inproc_communicator> avg(c, "elastic:6:median:3", o);
    std::vector<double> x(100, 2.0);
    std::uint64_t step = 0;
    try {
      for (;;) {
        if (!avg.step_done(cadence_exchange_suite::step_us(c.rank(), ++step))) continue;
        // The stalled rank stops contributing at its 8th barrier, mid-run, after warm-up.
        if (c.rank() == stalled && avg.barriers() == 7) world.stall(stalled);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          avg.sync(x);
        } catch (...) {
          waited[static_cast<std::size_t>(c.rank())] = cadence_conformance::seconds_since(t0);
          throw;
        }
        if (avg.barriers() > 50) break;  // the stall must have stopped us long before
      }
    } catch (const transport_error& e) {
      std::lock_guard<std::mutex> lock(m);
      errors[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (int r = 0; r < 4; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(!e.empty(), "rank " << r << " did not throw");
    if (r != stalled) {
      CHECK_MESSAGE(e.find("rank " + std::to_string(stalled)) != std::string::npos, e);
      CHECK_MESSAGE(e.find("on rank " + std::to_string(r)) != std::string::npos, e);
    }
    CHECK_MESSAGE(waited[static_cast<std::size_t>(r)] >= 0.99, "rank " << r << " gave up early");
    CHECK_MESSAGE(waited[static_cast<std::size_t>(r)] < 10.0, "rank " << r << " overran its deadline");
  }
}

TEST_CASE("the elastic averager on one rank runs R local steps between merges" * doctest::timeout(30)) {
  inproc_world world(1);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    elastic_averager<inproc_communicator> avg(c, "elastic:5");
    std::vector<float> x(3, 1.5f);
    int syncs = 0;
    for (int s = 1; s <= 41; ++s)
      if (avg.step_done(100)) {
        avg.sync(x);
        ++syncs;
      }
    CHECK(avg.round().steps[0] == 5);
    CHECK(syncs == 1 + 8);  // one warm-up step, then every 5
    CHECK(x[0] == 1.5f);
  });
}

TEST_CASE("a sync without tensors still plans" * doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    elastic_averager<inproc_communicator> avg(c, "elastic:3");
    CHECK(avg.step_done(100 * (c.rank() + 1)));
    avg.sync();
    CHECK(avg.barriers() == 1);
    CHECK_FALSE(avg.round().warmup);
    CHECK(avg.round().steps == std::vector<std::int64_t>{2, 1});
  });
}

TEST_CASE("summed deltas refuse, before communicating, tensors that changed since the last barrier" *
          doctest::timeout(30)) {
  inproc_world world(2);
  cadence_test::run_inproc_ranks(world, [](inproc_communicator& c) {
    elastic_averager_options o;
    o.merge = merge_rule::summed_deltas;
    elastic_averager<inproc_communicator> avg(c, "elastic:1", o);
    std::vector<double> x(4, static_cast<double>(2 * c.rank())), y(3, 0.0);
    CHECK(avg.step_done(10));
    avg.sync(x);  // first barrier: the average
    CHECK(x == std::vector<double>(4, 1.0));
    CHECK(avg.step_done(10));
    cadence_conformance::expect_throw<invalid_parameter_error>(
        c.rank(), [&] { avg.sync(x, y); }, {"summed_deltas", "2 tensors, the last had 1"});
    std::vector<double> z(5, 0.0);
    cadence_conformance::expect_throw<invalid_parameter_error>(
        c.rank(), [&] { avg.sync(z); }, {"tensor 0 changed size"});
    x.assign(4, 1.0 + c.rank());  // deltas 0 and 1
    avg.sync(x);                  // still in step: nothing was communicated above
    CHECK(x == std::vector<double>(4, 2.0));
  });
}
