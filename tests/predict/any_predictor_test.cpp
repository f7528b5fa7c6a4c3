// predict/any_predictor.hpp: make_predictor parses every documented form and rejects the
// rest with the right error; any_predictor behaves as a value.
#include <cadence/predict/any_predictor.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

TEST_CASE("make_predictor parses every documented form and name() gives the string back") {
  for (const char* spec : {"last", "mean:1", "mean:12", "median:3", "median:64", "ewma:0.5",
                           "ewma:1", "ewma:0.125"}) {
    CAPTURE(spec);
    const auto p = cadence::make_predictor(spec);
    CHECK(p.name() == spec);
    CHECK(p.min_history() == 2);
    CHECK(cadence::make_predictor<std::int64_t>(spec).name() == spec);
  }
}

TEST_CASE("malformed predictor strings are parse_errors that list the valid forms") {
  for (const char* spec : {"", "lastt", "last:3", "mean", "mean:", "mean:x", "mean:3x",
                           "mean:-1", "median:2.5", "ewma", "ewma:", "ewma:abc", "ewma:0.5x",
                           "MEAN:3", "mean:99999999999999999999999"}) {
    CAPTURE(spec);
    CHECK_THROWS_AS(cadence::make_predictor(spec), cadence::parse_error);
    CHECK_THROWS_WITH(cadence::make_predictor(spec),
                      doctest::Contains("valid: last, mean:K, median:K, ewma:ALPHA"));
  }
}

TEST_CASE("well-formed predictor strings with out-of-range values are invalid_parameter_errors") {
  for (const char* spec : {"mean:0", "median:0", "median:65", "ewma:0", "ewma:1.5", "ewma:-0.1"}) {
    CAPTURE(spec);
    CHECK_THROWS_AS(cadence::make_predictor(spec), cadence::invalid_parameter_error);
  }
}

TEST_CASE("any_predictor predicts like the predictor it holds and copies as a value") {
  const std::vector<double> h{0.0, 10.0, 30.0};
  std::vector<double> a(2), b(2);
  cadence::any_predictor<double> p = cadence::make_predictor("median:2");
  p.predict(cadence::span<const double>(h.data(), h.size()), 2, a.data());
  cadence::median_interval(2).predict(cadence::span<const double>(h.data(), h.size()), 2, b.data());
  CHECK(a == b);
  cadence::any_predictor<double> q = p;  // copy
  p = cadence::make_predictor("last");
  CHECK(q.name() == "median:2");
  CHECK(p.name() == "last");
  CHECK(cadence::any_predictor<double>().name() == "last");
  CHECK(cadence::is_predictor_v<cadence::any_predictor<double>, double>);
}
