// predict/predictor.hpp: the trait and concept accept exactly the predictor shape, and the
// shared rules (history checks, strictly increasing output) hold.
#include <cadence/predict/interval.hpp>
#include <cadence/predict/predictor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

struct good_predictor {
  template <class T>
  void predict(cadence::span<const T>, std::size_t r, T* out) const {
    for (std::size_t i = 0; i < r; ++i) out[i] = static_cast<T>(i);
  }
  std::size_t min_history() const { return 2; }
  std::string name() const { return "good"; }
};

struct double_only_predictor {
  void predict(cadence::span<const double>, std::size_t, double*) const {}
  int min_history() const { return 2; }
  const char* name() const { return "d"; }
};

struct no_name {
  void predict(cadence::span<const double>, std::size_t, double*) const {}
  std::size_t min_history() const { return 2; }
};

struct mutable_predict {
  void predict(cadence::span<const double>, std::size_t, double*) {}
  std::size_t min_history() const { return 2; }
  std::string name() const { return "m"; }
};

}  // namespace

TEST_CASE("is_predictor_v accepts the predictor shape and rejects what misses a requirement") {
  CHECK(cadence::is_predictor_v<good_predictor, double>);
  CHECK(cadence::is_predictor_v<good_predictor, std::int64_t>);
  CHECK(cadence::is_predictor_v<double_only_predictor, double>);
  CHECK_FALSE(cadence::is_predictor_v<double_only_predictor, std::int64_t>);
  CHECK_FALSE(cadence::is_predictor_v<no_name, double>);
  CHECK_FALSE(cadence::is_predictor_v<mutable_predict, double>);
  CHECK(cadence::is_predictor_v<cadence::last_interval, float>);
  CHECK(cadence::is_predictor_v<cadence::ewma, std::uint64_t>);
#if defined(__cpp_concepts) && __cpp_concepts >= 201907L
  CHECK(cadence::predictor<good_predictor, double>);
  CHECK(cadence::predictor<cadence::median_interval, int>);
  CHECK_FALSE(cadence::predictor<no_name>);
  CHECK_FALSE(cadence::predictor<mutable_predict>);
#endif
}

TEST_CASE("values not above their predecessor are bumped to the next representable value") {
  SUBCASE("integers get +1") {
    std::vector<int> out{10, 10, 9, 15};
    cadence::detail::make_strictly_increasing(10, out.data(), out.size(), "test");
    CHECK(out == std::vector<int>{11, 12, 13, 15});
  }
  SUBCASE("floating point gets nextafter") {
    std::vector<double> out{1.0, 1.0};
    cadence::detail::make_strictly_increasing(1.0, out.data(), out.size(), "test");
    CHECK(out[0] == std::nextafter(1.0, 2.0));
    CHECK(out[1] == std::nextafter(out[0], 2.0));
  }
  SUBCASE("no representable value left is a time_error") {
    std::vector<std::uint8_t> out{255};
    CHECK_THROWS_AS(cadence::detail::make_strictly_increasing(std::uint8_t{255}, out.data(), 1,
                                                              "test"),
                    cadence::time_error);
  }
}

TEST_CASE("histories that are too short, non-finite or go back in time are rejected") {
  const double one[] = {5.0};
  CHECK_THROWS_WITH_AS(cadence::detail::check_history(cadence::span<const double>(one, 1), 2,
                                                      "last_interval"),
                       "cadence::last_interval: needs at least 2 push timestamps, got 1",
                       cadence::invalid_parameter_error);
  const double nan[] = {1.0, std::nan("")};
  CHECK_THROWS_WITH_AS(
      cadence::detail::check_history(cadence::span<const double>(nan, 2), 2, "ewma"),
      doctest::Contains("history index 1 is not finite"), cadence::time_error);
  const int back[] = {1, 3, 2};
  CHECK_THROWS_WITH_AS(
      cadence::detail::check_history(cadence::span<const int>(back, 3), 2, "mean_interval"),
      doctest::Contains("goes back in time at index 2"), cadence::time_error);
}
