#include <cadence/sim/worker_model.hpp>

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
  auto message = [](worker_model m) {
    try {
      validate(m, 7);
    } catch (const invalid_parameter_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  worker_model m;
  m.iteration_seconds = 0;
  CHECK(message(m).find("worker 7: iteration_seconds") != std::string::npos);
  m = {};
  m.iteration_seconds = NAN;
  CHECK(message(m).find("iteration_seconds") != std::string::npos);
  m = {};
  m.jitter_cv = -0.1;
  CHECK(message(m).find("jitter_cv") != std::string::npos);
  m = {};
  m.straggle_probability = 1.5;
  CHECK(message(m).find("straggle_probability") != std::string::npos);
  m = {};
  m.straggle_probability = 0.1;
  CHECK(message(m).find("straggle_seconds") != std::string::npos);
  m = {};
  m.straggle_factor = 0;
  CHECK(message(m).find("straggle_factor") != std::string::npos);
  m = {};
  m.drift_per_second = 2;
  CHECK(message(m).find("drift_per_second") != std::string::npos);
  m = {};
  m.fails_at = -1;
  CHECK(message(m).find("fails_at") != std::string::npos);
  m = {};
  m.push_seconds = -0.001;
  CHECK(message(m).find("worker 7: push_seconds (its own link) must be finite and >= 0") != std::string::npos);
  m = {};
  m.pull_seconds = NAN;
  CHECK(message(m).find("worker 7: pull_seconds (its own link)") != std::string::npos);
  m = {};
  m.pull_seconds = HUGE_VAL;
  CHECK(message(m).find("pull_seconds") != std::string::npos);
  m = {};
  m.push_seconds = 0;  // a free link is allowed
  m.pull_seconds = 0.5;
  CHECK(message(m) == "no error");
  CHECK(message(worker_model{}) == "no error");
}
