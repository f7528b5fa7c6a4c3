#include <cadence/sim/worker_model.hpp>

#include "support/message_of.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

using namespace cadence;
using namespace cadence::sim;

TEST_CASE("a worker without jitter, stragglers or drift takes exactly its base time") {
  worker_model m;
  m.iteration_seconds = 0.125;
  iteration_sampler s(m, 1);
  for (int i = 0; i < 100; ++i) CHECK(s.next(i * 0.2) == 0.125);
}

TEST_CASE("drift scales the iteration time by exp(drift * t)") {
  worker_model m;
  m.iteration_seconds = 0.1;
  m.drift_per_second = std::log(2.0) / 300.0;
  iteration_sampler s(m, 1);
  CHECK(s.next(0.0) == doctest::Approx(0.1));
  CHECK(s.next(300.0) == doctest::Approx(0.2));
}

TEST_CASE("a straggler episode slows every iteration that starts inside it") {
  worker_model m;
  m.iteration_seconds = 0.1;
  m.straggle_probability = 1.0;  // an episode starts as soon as the previous one ends
  m.straggle_factor = 4.0;
  m.straggle_seconds = 5.0;
  iteration_sampler s(m, 9);
  CHECK(s.next(0.0) == doctest::Approx(0.4));
  CHECK(s.straggling(0.0));
}

TEST_CASE("jittered iteration times keep their mean and stay positive") {
  for (const auto kind : {jitter_kind::normal, jitter_kind::lognormal}) {
    worker_model m;
    m.iteration_seconds = 0.17;
    m.jitter = kind;
    m.jitter_cv = 0.1;
    iteration_sampler s(m, 21);
    double sum = 0;
    for (int i = 0; i < 20000; ++i) {
      const double d = s.next(0.0);
      REQUIRE(d > 0);
      sum += d;
    }
    CHECK(sum / 20000 == doctest::Approx(0.17).epsilon(0.01));
  }
}

TEST_CASE("a bad worker model is an invalid_parameter_error naming the worker and the field") {
  const auto message = [](const worker_model& m) {
    return test::message_of<invalid_parameter_error>([&] { validate(m, 7); });
  };
  // Each case spoils one field of a valid model; the message must contain `names`.
  struct bad_field {
    void (*spoil)(worker_model&);
    const char* names;
  };
  const bad_field cases[] = {
      {[](worker_model& m) { m.iteration_seconds = 0; }, "worker 7: iteration_seconds"},
      {[](worker_model& m) { m.iteration_seconds = NAN; }, "iteration_seconds"},
      {[](worker_model& m) { m.jitter_cv = -0.1; }, "jitter_cv"},
      {[](worker_model& m) { m.straggle_probability = 1.5; }, "straggle_probability"},
      {[](worker_model& m) { m.straggle_probability = 0.1; }, "straggle_seconds"},
      {[](worker_model& m) { m.straggle_factor = 0; }, "straggle_factor"},
      {[](worker_model& m) { m.drift_per_second = 2; }, "drift_per_second"},
      {[](worker_model& m) { m.fails_at = -1; }, "fails_at"},
      {[](worker_model& m) { m.push_seconds = -0.001; },
       "worker 7: push_seconds (its own link) must be finite and >= 0"},
      {[](worker_model& m) { m.pull_seconds = NAN; }, "worker 7: pull_seconds (its own link)"},
      {[](worker_model& m) { m.pull_seconds = HUGE_VAL; }, "pull_seconds"},
  };
  for (const auto& c : cases) {
    worker_model m;
    c.spoil(m);
    CAPTURE(c.names);
    CHECK(message(m).find(c.names) != std::string::npos);
  }
  worker_model m;
  m.push_seconds = 0;  // a free link is allowed
  m.pull_seconds = 0.5;
  CHECK(message(m) == test::no_exception);
  CHECK(message(worker_model{}) == test::no_exception);
}
