// predict/interval.hpp: exact predictions of last_interval, mean_interval, median_interval
// and ewma, their parameter checks, and the strictly-increasing guarantee.
#include <cadence/predict/interval.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

template <class P, class T>
std::vector<T> run(const P& p, const std::vector<T>& history, std::size_t r) {
  std::vector<T> out(r);
  p.predict(cadence::span<const T>(history.data(), history.size()), r, out.data());
  return out;
}

}  // namespace

TEST_CASE("last_interval extrapolates the last interval exactly as the paper does") {
  const std::vector<std::int64_t> h{100, 1100, 2300};
  CHECK(run(cadence::last_interval{}, h, 3) == std::vector<std::int64_t>{3500, 4700, 5900});
  const std::vector<double> hd{0.5, 1.75};
  CHECK(run(cadence::last_interval{}, hd, 2) == std::vector<double>{3.0, 4.25});
  CHECK(cadence::last_interval{}.name() == "last");
  CHECK(cadence::last_interval::min_history() == 2);
}

TEST_CASE("mean_interval averages the last k intervals and uses fewer when fewer exist") {
  const std::vector<std::int64_t> h{0, 10, 30, 40, 100};  // intervals 10 20 10 60
  CHECK(run(cadence::mean_interval(2), h, 2) == std::vector<std::int64_t>{135, 170});
  CHECK(run(cadence::mean_interval(10), h, 1) == std::vector<std::int64_t>{125});
  // mean 25/3 ms: i * 25/3 rounded half up gives 8, 17, 25
  const std::vector<std::int64_t> h3{0, 5, 15, 25};
  CHECK(run(cadence::mean_interval(3), h3, 3) == std::vector<std::int64_t>{33, 42, 50});
  const std::vector<double> hd{0.0, 1.0, 3.0};
  CHECK(run(cadence::mean_interval(2), hd, 2) == std::vector<double>{4.5, 6.0});
  CHECK(cadence::mean_interval(4).name() == "mean:4");
  CHECK_THROWS_AS(cadence::mean_interval(0), cadence::invalid_parameter_error);
}

TEST_CASE("median_interval ignores a single straggler interval") {
  const std::vector<std::int64_t> h{0, 10, 20, 500, 510};  // intervals 10 10 480 10
  CHECK(run(cadence::median_interval(3), h, 2) == std::vector<std::int64_t>{520, 530});
  // even count: median of 10 and 25 is 17.5, so i * 17.5 rounds half up: 18, 35
  const std::vector<std::int64_t> h2{0, 10, 35};
  CHECK(run(cadence::median_interval(2), h2, 2) == std::vector<std::int64_t>{53, 70});
  const std::vector<double> hd{0.0, 1.0, 3.5};
  CHECK(run(cadence::median_interval(8), hd, 1) == std::vector<double>{5.25});
  CHECK(cadence::median_interval(5).name() == "median:5");
  CHECK_THROWS_AS(cadence::median_interval(0), cadence::invalid_parameter_error);
  CHECK_THROWS_WITH_AS(cadence::median_interval(65), doctest::Contains("[1, 64]"),
                       cadence::invalid_parameter_error);
}

TEST_CASE("ewma weights recent intervals by alpha") {
  const std::vector<double> h{0.0, 10.0, 30.0};  // s = 10, then 0.5*20 + 0.5*10 = 15
  CHECK(run(cadence::ewma(0.5), h, 2) == std::vector<double>{45.0, 60.0});
  const std::vector<std::int64_t> hi{0, 10, 30};
  CHECK(run(cadence::ewma(1.0), hi, 2) == std::vector<std::int64_t>{50, 70});
  CHECK(run(cadence::ewma(0.25), hi, 1) == std::vector<std::int64_t>{43});  // 12.5 rounds up
  CHECK(cadence::ewma(0.3).name() == "ewma:0.3");
  CHECK_THROWS_AS(cadence::ewma(0.0), cadence::invalid_parameter_error);
  CHECK_THROWS_AS(cadence::ewma(1.5), cadence::invalid_parameter_error);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(cadence::ewma{nan}, cadence::invalid_parameter_error);
}

TEST_CASE("every predictor's output is strictly increasing and starts above the last push") {
  std::mt19937_64 rng(6);
  const cadence::last_interval last;
  const cadence::mean_interval mean(3);
  const cadence::median_interval median(4);
  const cadence::ewma smooth(0.2);
  for (int iter = 0; iter < 500; ++iter) {
    std::vector<std::int64_t> h;
    std::vector<double> hd;
    std::int64_t t = static_cast<std::int64_t>(rng() % 100);
    for (std::size_t i = 0, len = 2 + rng() % 8; i < len; ++i) {
      t += static_cast<std::int64_t>(rng() % 3);  // zero intervals are common
      h.push_back(t);
      hd.push_back(static_cast<double>(t) * 1e-3);
    }
    const auto check = [](auto last_value, const auto& out) {
      auto prev = last_value;
      for (auto v : out) {
        REQUIRE(v > prev);
        prev = v;
      }
    };
    check(h.back(), run(last, h, 7));
    check(h.back(), run(mean, h, 7));
    check(h.back(), run(median, h, 7));
    check(h.back(), run(smooth, h, 7));
    check(hd.back(), run(last, hd, 7));
    check(hd.back(), run(mean, hd, 7));
    check(hd.back(), run(median, hd, 7));
    check(hd.back(), run(smooth, hd, 7));
  }
}

TEST_CASE("a prediction beyond the timestamp type's range is a time_error") {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max() - 10;
  const std::vector<std::int64_t> h{big - 8, big};
  CHECK_NOTHROW(run(cadence::last_interval{}, h, 1));
  CHECK_THROWS_WITH_AS(run(cadence::last_interval{}, h, 2),
                       doctest::Contains("predicted push 2 does not fit"), cadence::time_error);
  CHECK_THROWS_AS(run(cadence::mean_interval(2), h, 2), cadence::time_error);
  CHECK_THROWS_AS(run(cadence::median_interval(2), h, 2), cadence::time_error);
  CHECK_THROWS_AS(run(cadence::ewma(0.5), h, 2), cadence::time_error);
  const std::vector<std::int64_t> flat{big, big};  // zero interval: bumps up to the limit
  CHECK_THROWS_AS(run(cadence::last_interval{}, flat, 11), cadence::time_error);
  CHECK(run(cadence::last_interval{}, flat, 10).back() == std::numeric_limits<std::int64_t>::max());
}
