// cadence/thrust/zipline.hpp: the Thrust ZipLine returns zipline_brute_force's exact answer
// (ties, equal timestamps, ragged rows, n = 1) on whichever device system this file is built
// for; the batched, device-input and device-prediction forms agree with the plain one, and the
// device predictor writes exactly what the host's last_interval predicts.
#include <cadence/thrust/zipline.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/fast.hpp>

#include <thrust/copy.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>

#include "support/message_of.hpp"
#include "support/ragged_rows.hpp"
#include "support/separate_rows.hpp"
#include "support/trials.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

// The random comparisons' trial counts: a fifth under AddressSanitizer, whose -O0 build runs the
// OMP system about 70x slower (24 s for this file in CI, 34 s of it the row-subset sweeps); it is
// there for memory errors, which show on the first trials as on the last. The Release build runs
// every trial (tests/support/trials.hpp).
constexpr int trials(int n) { return static_cast<int>(cadence_test::sanitized_trials(static_cast<std::uint64_t>(n))); }

// Rows stored ragged (values + offsets), the general layout.
template <class T>
using instance = cadence::test::ragged_rows<T>;

// n rows of 1..max_len strictly increasing values drawn from a grid of `range` steps of
// `step`: a small range forces equal timestamps across rows and tied optima.
template <class T>
instance<T> random_instance(std::mt19937_64& rng, std::size_t n, std::size_t max_len, int range,
                            T step, bool equal_rows = false) {
  instance<T> inst;
  std::uniform_int_distribution<std::size_t> len_dist(1, max_len);
  const std::size_t common = len_dist(rng);
  for (std::size_t p = 0; p < n; ++p) {
    const std::size_t len =
        std::min<std::size_t>(equal_rows ? common : len_dist(rng), static_cast<std::size_t>(range));
    std::vector<int> grid(static_cast<std::size_t>(range));
    for (int i = 0; i < range; ++i) grid[static_cast<std::size_t>(i)] = i;
    std::shuffle(grid.begin(), grid.end(), rng);
    grid.resize(len);
    std::sort(grid.begin(), grid.end());
    std::vector<T> row;
    for (int g : grid) row.push_back(static_cast<T>(static_cast<T>(g) * step));
    inst.add(row);
  }
  return inst;
}

// O(N log N) reference for sizes the brute force cannot reach: sort by time, slide the
// tightest window covering every row, keep the smallest (spread, barrier).
template <class T>
cadence::zipline_result<T> sliding_window_reference(cadence::rows_view<T> rows) {
  std::vector<std::pair<T, std::size_t>> pts;
  for (std::size_t p = 0; p < rows.size(); ++p)
    for (T v : rows[p]) pts.emplace_back(v, p);
  std::sort(pts.begin(), pts.end());
  std::vector<std::size_t> count(rows.size(), 0);
  std::size_t covered = 0, left = 0;
  cadence::zipline_result<T> best;
  bool found = false;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    if (count[pts[i].second]++ == 0) ++covered;
    while (count[pts[left].second] > 1) --count[pts[left++].second];
    if (covered < rows.size()) continue;
    const T d = pts[i].first - pts[left].first;
    if (!found || d < best.spread || (d == best.spread && pts[i].first < best.barrier)) {
      best.spread = d;
      best.barrier = pts[i].first;
      found = true;
    }
  }
  for (std::size_t p = 0; p < rows.size(); ++p) {
    const auto row = rows[p];
    best.choice.push_back(
        static_cast<std::size_t>(std::upper_bound(row.begin(), row.end(), best.barrier) - row.begin()) - 1);
  }
  return best;
}

using cadence::test::message_of;

// The Thrust ZipLine checked against zipline_brute_force, its workspace and result kept from
// call to call as a trainer keeps them.
template <class T>
struct thrust_vs_brute_force {
  cadence::thrust_zipline_workspace ws;
  cadence::zipline_result<T> got;
  // Solves rows and requires the brute force's exact answer, naming `what` if not.
  void require_same(cadence::rows_view<T> rows, const std::string& what) {
    cadence::zipline_thrust(rows, ws, got);
    const auto want = cadence::zipline_brute_force(rows);
    REQUIRE_MESSAGE(got == want, what << ": spread " << got.spread << " vs " << want.spread
                                      << ", barrier " << got.barrier << " vs " << want.barrier);
  }
};

// What the host's last_interval predictor makes of each worker's two pushes, row after row.
template <class T>
std::vector<T> predict_on_host(const std::vector<T>& prev, const std::vector<T>& last,
                               std::size_t r) {
  std::vector<T> out(prev.size() * r);
  for (std::size_t p = 0; p < prev.size(); ++p) {
    const T history[] = {prev[p], last[p]};
    cadence::last_interval{}.predict(cadence::span<const T>(history, 2), r, out.data() + p * r);
  }
  return out;
}

// What zipline_thrust_predicted's device predictor writes for the same pushes, copied back.
template <class T>
std::vector<T> predict_on_device(const std::vector<T>& prev, const std::vector<T>& last,
                                 std::size_t r) {
  using ::thrust::raw_pointer_cast;
  const ::thrust::device_vector<T> d_prev(prev.begin(), prev.end());
  const ::thrust::device_vector<T> d_last(last.begin(), last.end());
  ::thrust::device_vector<T> d_out(prev.size() * r);
  cadence::detail::zl_predict_last_interval(::thrust::device, raw_pointer_cast(d_prev.data()),
                                            raw_pointer_cast(d_last.data()), prev.size(), r,
                                            raw_pointer_cast(d_out.data()));
  std::vector<T> out(d_out.size());
  ::thrust::copy(d_out.begin(), d_out.end(), out.begin());
  return out;
}

// Bit for bit, so a -0.0 where the host has 0.0 counts as a difference.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void check_device_predicts_as_host(const std::vector<T>& prev, const std::vector<T>& last,
                                   std::size_t r) {
  const auto host = predict_on_host(prev, last, r);
  const auto device = predict_on_device(prev, last, r);
  for (std::size_t k = 0; k < host.size(); ++k) {
    CAPTURE(k);
    CHECK(device[k] == host[k]);
  }
  CHECK(same_bits(device, host));
}

}  // namespace

TEST_CASE("the Thrust ZipLine reports the device system this file was built for") {
  CHECK(std::string(cadence::thrust_device_system_name()) == CADENCE_TEST_EXPECTED_SYSTEM);
}

TEST_CASE("the Thrust ZipLine equals the brute force on thousands of random integer instances") {
  std::mt19937_64 rng(20240611);
  thrust_vs_brute_force<int> check;
  for (int trial = 0; trial < trials(1500); ++trial) {
    const std::size_t n = 1 + rng() % 8;
    const int range = 4 + static_cast<int>(rng() % 40);  // small ranges: many equal timestamps
    const auto inst = random_instance<int>(rng, n, 10, range, 1, trial % 3 == 0);
    check.require_same(inst.view(), "trial " + std::to_string(trial) + " n " + std::to_string(n));
  }
}

TEST_CASE("the Thrust ZipLine equals the brute force on random double instances, matrix, ragged and separate") {
  std::mt19937_64 rng(7);
  thrust_vs_brute_force<double> check;
  for (int trial = 0; trial < trials(1000); ++trial) {
    const std::size_t n = 1 + rng() % 10;
    const bool matrix = trial % 2 == 0;
    const double step = trial % 4 < 2 ? 0.25 : 0.001 * static_cast<double>(1 + rng() % 1000);
    const auto inst = random_instance<double>(rng, n, 12, 8 + static_cast<int>(rng() % 60), step, matrix);
    const auto rows = matrix ? cadence::rows_view<double>::matrix(inst.values.data(), n,
                                                                  inst.offsets[1])
                             : inst.view();
    check.require_same(rows, "trial " + std::to_string(trial));
    // The same rows in separate allocations: gathered on the host, one transfer.
    const cadence::test::separate_rows<double> sep(rows);
    check.require_same(sep.view(), "trial " + std::to_string(trial) + " (separate rows)");
  }
}

TEST_CASE("the Thrust ZipLine handles one row, rows of one point, and offsets that do not start at zero") {
  SUBCASE("one row: the answer is its first point with spread zero") {
    const std::vector<double> row{3.5, 4.0, 9.0};
    const auto r = cadence::zipline_thrust(cadence::rows_view<double>::matrix(row.data(), 1, 3));
    CHECK(r.spread == 0.0);
    CHECK(r.barrier == 3.5);
    CHECK(r.choice == std::vector<std::size_t>{0});
  }
  SUBCASE("every row one point: spread is max minus min") {
    const std::vector<long> v{5, -3, 12, 12, 0};
    const auto rows = cadence::rows_view<long>::matrix(v.data(), 5, 1);
    const auto r = cadence::zipline_thrust(rows);
    CHECK(r.spread == 15);
    CHECK(r.barrier == 12);
    CHECK(r == cadence::zipline_brute_force(rows));
  }
  SUBCASE("all rows identical: every row picks the first point") {
    const std::vector<int> v{1, 2, 3, 1, 2, 3, 1, 2, 3};
    const auto r = cadence::zipline_thrust(cadence::rows_view<int>::matrix(v.data(), 3, 3));
    CHECK(r.spread == 0);
    CHECK(r.barrier == 1);
    CHECK(r.choice == std::vector<std::size_t>{0, 0, 0});
  }
  SUBCASE("a ragged view into the middle of a larger offsets array") {
    const std::vector<int> v{100, 1, 4, 7, 2, 3, 8, 5};
    const std::vector<std::size_t> off{1, 4, 7, 8};  // rows {1,4,7} {2,3,8} {5}
    const auto rows = cadence::rows_view<int>::ragged(v.data(), off.data(), 3);
    const auto r = cadence::zipline_thrust(rows);
    CHECK(r == cadence::zipline_brute_force(rows));
    CHECK(r.spread == 2);
    CHECK(r.barrier == 5);
    CHECK(r.choice == std::vector<std::size_t>{1, 1, 0});
  }
}

TEST_CASE("the Thrust ZipLine equals an O(N log N) sliding window on large instances") {
  std::mt19937_64 rng(99);
  cadence::thrust_zipline_workspace ws;
  SUBCASE("doubles, 2000 workers x 50 predicted pushes") {
    std::vector<double> v;
    for (std::size_t p = 0; p < 2000; ++p) {
      double t = std::uniform_real_distribution<double>(0.0, 5.0)(rng);
      const double period = std::uniform_real_distribution<double>(0.8, 1.25)(rng);
      for (int i = 0; i < 50; ++i) v.push_back(t += period);
    }
    const auto rows = cadence::rows_view<double>::matrix(v.data(), 2000, 50);
    cadence::zipline_result<double> got;
    cadence::zipline_thrust(rows, ws, got);
    CHECK(got == sliding_window_reference(rows));
    CHECK(got == cadence::zipline(rows));
  }
  SUBCASE("integers on a coarse grid, 3000 ragged rows") {
    const auto inst = random_instance<std::int64_t>(rng, 3000, 40, 200, 3);
    cadence::zipline_result<std::int64_t> got;
    cadence::zipline_thrust(inst.view(), ws, got);
    CHECK(got == sliding_window_reference(inst.view()));
    CHECK(got == cadence::zipline(inst.view()));
  }
}

TEST_CASE("from 256 rows the Thrust ZipLine sweeps a certified row subset, in one sweep or two") {
  // As zipline_fast: the first sweep takes the rows with the widest gaps; when a row left out
  // has no point in its window, the certified second subset is swept. Steps spread widely
  // (one sweep), narrowly (two), all equal, and ragged rows ending early; every answer must
  // equal the CPU's, for integers and doubles, matrix, ragged, separate and device input.
  std::mt19937_64 rng(11);
  int sweeps_seen[3] = {0, 0, 0};
  cadence::thrust_zipline_workspace ws;
  for (int trial = 0; trial < trials(40); ++trial) {
    CAPTURE(trial);
    const auto [n, r, mode, ints, doubles] = cadence::test::draw_subset_trial(rng, trial, 5000);
    const auto want_ints = cadence::zipline_fast(ints.view());
    const auto want_doubles = cadence::zipline_fast(doubles.view());
    cadence::zipline_result<std::int64_t> got_ints;
    cadence::zipline_thrust(ints.view(), ws, got_ints);
    CHECK(got_ints == want_ints);
    const int sweeps = cadence::detail::thrust_zipline_workspace_access::sweeps(ws);
    REQUIRE(sweeps >= 1);
    REQUIRE(sweeps <= 2);
    ++sweeps_seen[sweeps];
    cadence::zipline_result<double> got_doubles;
    cadence::zipline_thrust(doubles.view(), ws, got_doubles);
    CHECK(got_doubles == want_doubles);
    const cadence::test::separate_rows<double> sep(doubles.view());
    cadence::zipline_thrust(sep.view(), ws, got_doubles);
    CHECK(got_doubles == want_doubles);
    if (mode != 3) {  // equal rows: the matrix forms, on the host and in device memory
      const auto matrix = cadence::rows_view<double>::matrix(doubles.values.data(), n, r);
      cadence::zipline_thrust(matrix, ws, got_doubles);
      CHECK(got_doubles == want_doubles);
      const ::thrust::device_vector<double> d(doubles.values.begin(), doubles.values.end());
      cadence::zipline_thrust_device(::thrust::raw_pointer_cast(d.data()), n, r, ws, got_doubles);
      CHECK(got_doubles == want_doubles);
    }
  }
  CHECK(sweeps_seen[1] > 0);
  CHECK(sweeps_seen[2] > 0);
  // The sample the first subset's threshold comes from is strided past 4096 rows; below it the
  // threshold is zipline_fast's own.
  std::vector<double> v;
  for (std::size_t p = 0; p < 20000; ++p)
    for (int i = 0; i < 4; ++i) v.push_back(static_cast<double>(p % 7) * 0.01 + i * (0.8 + 0.00002 * static_cast<double>(p)));
  const auto rows = cadence::rows_view<double>::matrix(v.data(), 20000, 4);
  CHECK(cadence::zipline_thrust(rows) == cadence::zipline_fast(rows));
}

TEST_CASE("a violation anywhere in a large input is reported by row and index") {
  // The solve's row pass finds it; validate names it, as for the CPU variants.
  std::vector<double> v;
  const std::size_t n = 3000, r = 20;
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t i = 0; i < r; ++i) v.push_back(static_cast<double>(i) + 0.001 * static_cast<double>(p % 100));
  cadence::thrust_zipline_workspace ws;
  cadence::zipline_result<double> out;
  const auto rows = cadence::rows_view<double>::matrix(v.data(), n, r);
  auto bad = v;
  bad[2718 * r + 13] = bad[2718 * r + 12];  // equal neighbours: not strictly increasing
  const auto bad_rows = cadence::rows_view<double>::matrix(bad.data(), n, r);
  const auto msg = message_of<cadence::zipline_input_error>([&] { cadence::zipline_thrust(bad_rows, ws, out); });
  CHECK(msg.find("row 2718 is not strictly increasing at index 13") != std::string::npos);
  auto nan = v;
  nan[1999 * r + 7] = std::nan("");
  const auto nan_msg = message_of<cadence::zipline_input_error>([&] {
    cadence::zipline_thrust(cadence::rows_view<double>::matrix(nan.data(), n, r), ws, out);
  });
  CHECK(nan_msg.find("row 1999 index 7 is not finite") != std::string::npos);
  // A rejected input leaves the workspace ready for the next solve.
  cadence::zipline_thrust(rows, ws, out);
  CHECK(out == cadence::zipline_fast(rows));
}

TEST_CASE("the batched Thrust ZipLine equals a loop of single solves") {
  std::mt19937_64 rng(31337);
  std::vector<instance<double>> insts;
  for (int k = 0; k < 300; ++k) {
    const std::size_t n = 1 + rng() % (k % 10 == 0 ? 60 : 6);
    insts.push_back(random_instance<double>(rng, n, 9, 5 + static_cast<int>(rng() % 30), 0.5));
  }
  std::vector<cadence::rows_view<double>> views;
  for (const auto& i : insts) views.push_back(i.view());
  cadence::thrust_zipline_workspace ws;

  SUBCASE("many instances at once") {
    std::vector<cadence::zipline_result<double>> got;
    cadence::zipline_thrust_batched(views.data(), views.size(), ws, got);
    REQUIRE(got.size() == views.size());
    for (std::size_t k = 0; k < views.size(); ++k) {
      cadence::zipline_result<double> single;
      cadence::zipline_thrust(views[k], ws, single);
      REQUIRE_MESSAGE(got[k] == single, "instance " << k);
      REQUIRE(got[k] == cadence::zipline_brute_force(views[k]));
    }
  }
  SUBCASE("instances with separately allocated rows, mixed with ragged ones") {
    std::vector<std::unique_ptr<cadence::test::separate_rows<double>>> owned;
    for (std::size_t k = 0; k < views.size(); k += 3) {
      owned.push_back(std::make_unique<cadence::test::separate_rows<double>>(views[k]));
      views[k] = owned.back()->view();
    }
    std::vector<cadence::zipline_result<double>> got;
    cadence::zipline_thrust_batched(views.data(), views.size(), ws, got);
    REQUIRE(got.size() == views.size());
    for (std::size_t k = 0; k < views.size(); ++k)
      REQUIRE_MESSAGE(got[k] == cadence::zipline_brute_force(views[k]), "instance " << k);
  }
  SUBCASE("a batch of one and a batch of none") {
    const auto one = cadence::zipline_thrust_batched(views.data(), 1);
    REQUIRE(one.size() == 1);
    CHECK(one[0] == cadence::zipline_brute_force(views[0]));
    CHECK(cadence::zipline_thrust_batched(views.data(), 0).empty());
  }
  SUBCASE("a bad instance is named in the error") {
    const std::vector<double> bad{1.0, 1.0};
    views[4] = cadence::rows_view<double>::matrix(bad.data(), 1, 2);
    const auto msg = message_of<cadence::zipline_input_error>(
        [&] { (void)cadence::zipline_thrust_batched(views.data(), views.size()); });
    CHECK(msg.find("instance 4") != std::string::npos);
    CHECK(msg.find("not strictly increasing") != std::string::npos);
  }
}

TEST_CASE("the device predictor writes exactly what the host's last_interval predicts") {
  SUBCASE("integers: equal pushes predict last + 1, last + 2, ... on both sides") {
    const std::vector<std::int64_t> prev{5, 7, -3, 0, 100}, last{5, 9, -3, 4, 100};
    check_device_predicts_as_host(prev, last, 6);
    CHECK(predict_on_host(prev, last, 6)[5] == 11);  // the rule the parity is about
  }
  SUBCASE("unsigned and narrow integers, equal pushes included") {
    check_device_predicts_as_host<std::uint32_t>({0, 7, 9}, {0, 7, 12}, 5);
    check_device_predicts_as_host<std::int8_t>({-3, 4}, {-3, 6}, 9);
  }
  SUBCASE("doubles: equal pushes step one representable value at a time") {
    const double tiny = std::numeric_limits<double>::denorm_min();
    const double below_two = std::nextafter(2.0, 0.0);
    // Ordinary values, through zero from below (-0.0 comes first), across a binade boundary,
    // zero itself, and one worker with a positive interval among them.
    check_device_predicts_as_host<double>({1.0, -2 * tiny, below_two, 0.0, 3.5},
                                          {1.0, -2 * tiny, below_two, 0.0, 4.25}, 5);
    CHECK(predict_on_host<double>({1.0}, {1.0}, 1)[0] == std::nextafter(1.0, 2.0));
  }
  SUBCASE("floats: equal pushes, and an interval too small to move the sum") {
    // From just below 2 to 2 the interval is half of 2's ulp: 2 + interval rounds back to 2.
    const float below_two = std::nextafter(2.0f, 0.0f);
    check_device_predicts_as_host<float>({10.0f, 1e8f, below_two}, {10.0f, 1e8f, 2.0f}, 7);
  }
  SUBCASE("doubles: intervals lost to rounding above 2^53 are spread as on the host") {
    // Above 2^53 doubles are 2 apart: 2^53 + 1 rounds back to 2^53, 2^53 + 3 to 2^53 + 4.
    const double big = 9007199254740992.0;
    check_device_predicts_as_host<double>({big - 1.0}, {big}, 4);
  }
  SUBCASE("random histories in which a third of the workers pushed twice at the same time") {
    std::mt19937_64 rng(77);
    for (int trial = 0; trial < 20; ++trial) {
      const std::size_t n = 1 + rng() % 40, r = 1 + rng() % 30;
      std::vector<double> dp(n), dl(n);
      std::vector<int> ip(n), il(n);
      for (std::size_t p = 0; p < n; ++p) {
        const bool same = rng() % 3 == 0;
        dp[p] = std::uniform_real_distribution<double>(-50.0, 50.0)(rng);
        dl[p] = same ? dp[p] : dp[p] + std::uniform_real_distribution<double>(0.01, 3.0)(rng);
        ip[p] = static_cast<int>(rng() % 1000) - 500;
        il[p] = same ? ip[p] : ip[p] + static_cast<int>(rng() % 9);
      }
      check_device_predicts_as_host(dp, dl, r);
      check_device_predicts_as_host(ip, il, r);
    }
  }
}

TEST_CASE("predicting on the device equals predicting on the host and then solving") {
  std::mt19937_64 rng(4242);
  cadence::thrust_zipline_workspace ws;
  SUBCASE("doubles") {
    for (int trial = 0; trial < 40; ++trial) {
      const std::size_t n = 1 + rng() % 300, r = 1 + rng() % 40;
      std::vector<double> prev(n), last(n);
      for (std::size_t p = 0; p < n; ++p) {
        prev[p] = std::uniform_real_distribution<double>(0.0, 100.0)(rng);
        last[p] = prev[p] + std::uniform_real_distribution<double>(0.3, 3.0)(rng);
      }
      const auto host = predict_on_host(prev, last, r);
      cadence::zipline_result<double> got;
      cadence::zipline_thrust_predicted(prev.data(), last.data(), n, r, ws, got);
      const auto rows = cadence::rows_view<double>::matrix(host.data(), n, r);
      REQUIRE_MESSAGE(got == cadence::zipline_thrust(rows), "trial " << trial);
      REQUIRE(got == sliding_window_reference(rows));
    }
  }
  SUBCASE("integers with shared timestamps and workers that pushed twice at the same time") {
    for (int trial = 0; trial < 40; ++trial) {
      const std::size_t n = 1 + rng() % 50, r = 1 + rng() % 20;
      std::vector<int> prev(n), last(n);
      for (std::size_t p = 0; p < n; ++p) {
        prev[p] = static_cast<int>(rng() % 20);
        last[p] = prev[p] + static_cast<int>(rng() % 5);
      }
      const auto host = predict_on_host(prev, last, r);
      const auto got = cadence::zipline_thrust_predicted(prev.data(), last.data(), n, r);
      REQUIRE(got ==
              cadence::zipline_brute_force(cadence::rows_view<int>::matrix(host.data(), n, r)));
    }
  }
  SUBCASE("equal pushes in floating point plan as the host predictor's rows do") {
    // Worker 0 pushed twice at 1.0, so its predictions lie one ulp apart above 1.0; worker 1
    // predicts 1.0, 6.0, 11.0. The tightest window is 1.0 with worker 0's first prediction.
    const std::vector<double> prev{1.0, -9.0}, last{1.0, -4.0};
    const auto host = predict_on_host(prev, last, 3);
    const auto got = cadence::zipline_thrust_predicted(prev.data(), last.data(), 2, 3);
    CHECK(got == cadence::zipline(cadence::rows_view<double>::matrix(host.data(), 2, 3)));
    const double up = std::nextafter(1.0, 2.0);
    CHECK(got.spread == up - 1.0);
    CHECK(got.barrier == up);
    CHECK(got.choice == std::vector<std::size_t>{0, 0});
  }
  SUBCASE("a worker whose last push is before its previous one is an input error") {
    const std::vector<double> prev{1.0, 5.0}, last{2.0, 4.0};
    const auto msg = message_of<cadence::zipline_input_error>(
        [&] { (void)cadence::zipline_thrust_predicted(prev.data(), last.data(), 2, 3); });
    CHECK(msg.find("worker 1") != std::string::npos);
  }
  SUBCASE("predictions that overflow the integer type are an input error") {
    const std::vector<std::int32_t> prev{0}, last{std::numeric_limits<std::int32_t>::max() / 2};
    CHECK_THROWS_AS((void)cadence::zipline_thrust_predicted(prev.data(), last.data(), 1, 3),
                    cadence::zipline_input_error);
    // Equal pushes one below the maximum: the host predictor's +1 steps overflow at the second.
    const std::vector<std::int32_t> top{std::numeric_limits<std::int32_t>::max() - 1};
    CHECK_NOTHROW((void)cadence::zipline_thrust_predicted(top.data(), top.data(), 1, 1));
    CHECK_THROWS_AS((void)cadence::zipline_thrust_predicted(top.data(), top.data(), 1, 2),
                    cadence::zipline_input_error);
  }
}

TEST_CASE("input already in device memory gives the same answer and the same errors") {
  std::mt19937_64 rng(5);
  cadence::thrust_zipline_workspace ws;
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + rng() % 20;
    const auto inst = random_instance<double>(rng, n, 8, 30, 0.5, true);
    const std::size_t r = inst.offsets[1];
    ::thrust::device_vector<double> d(inst.values.begin(), inst.values.end());
    cadence::zipline_result<double> got;
    cadence::zipline_thrust_device(::thrust::raw_pointer_cast(d.data()), n, r, ws, got);
    REQUIRE(got == cadence::zipline_brute_force(cadence::rows_view<double>::matrix(inst.values.data(), n, r)));
  }
  const std::vector<double> bad{1.0, 2.0, 3.0, 4.0, std::nan(""), 6.0};
  ::thrust::device_vector<double> d(bad.begin(), bad.end());
  cadence::zipline_result<double> got;
  const auto device_msg = message_of<cadence::zipline_input_error>([&] {
    cadence::zipline_thrust_device(::thrust::raw_pointer_cast(d.data()), 2, 3, ws, got);
  });
  const auto host_msg = message_of<cadence::zipline_input_error>(
      [&] { cadence::validate(cadence::rows_view<double>::matrix(bad.data(), 2, 3)); });
  CHECK(device_msg == host_msg);
  CHECK(device_msg.find("row 1 index 1") != std::string::npos);
}

TEST_CASE("bad input is rejected with the row and index, as validate reports it") {
  // The solve's first pass finds the violation on the device; validate then names it.
  using rv = cadence::rows_view<double>;
  cadence::thrust_zipline_workspace ws;
  cadence::zipline_result<double> out;
  const std::vector<double> ok{1.0, 2.0};
  CHECK_THROWS_AS(cadence::zipline_thrust(rv::matrix(ok.data(), 0, 2), ws, out),
                  cadence::zipline_input_error);
  const std::vector<std::size_t> off{0, 2, 2};
  CHECK(message_of<cadence::zipline_input_error>([&] {
          cadence::zipline_thrust(rv::ragged(ok.data(), off.data(), 2), ws, out);
        }).find("row 1 is empty") != std::string::npos);
  const std::vector<double> unsorted{1.0, 3.0, 2.0};
  CHECK(message_of<cadence::zipline_input_error>([&] {
          cadence::zipline_thrust(rv::matrix(unsorted.data(), 1, 3), ws, out);
        }).find("not strictly increasing at index 2") != std::string::npos);
  const std::vector<double> inf{1.0, std::numeric_limits<double>::infinity()};
  CHECK_THROWS_AS(cadence::zipline_thrust(rv::matrix(inf.data(), 2, 1), ws, out),
                  cadence::zipline_input_error);
  const std::vector<int> wide{std::numeric_limits<int>::min(), std::numeric_limits<int>::max()};
  CHECK_THROWS_AS((void)cadence::zipline_thrust(cadence::rows_view<int>::matrix(wide.data(), 2, 1)),
                  cadence::zipline_input_error);
  CHECK_THROWS_AS(cadence::zipline_thrust_device(ok.data(), 1, 0, ws, out), cadence::zipline_input_error);
  // A rejected input leaves the workspace usable.
  cadence::zipline_thrust(rv::matrix(ok.data(), 1, 2), ws, out);
  CHECK(out.barrier == 1.0);
  CHECK(out.spread == 0.0);
}

TEST_CASE("a workspace is reused across sizes and timestamp types and can be released") {
  cadence::thrust_zipline_workspace ws;
  const std::vector<double> a{1.0, 2.0, 3.0, 1.5, 2.5, 3.5};
  cadence::zipline_result<double> rd;
  cadence::zipline_thrust(cadence::rows_view<double>::matrix(a.data(), 2, 3), ws, rd);
  CHECK(ws.bytes_reserved() > 0);
  const std::vector<std::int64_t> b{10, 20, 30, 40, 11, 21, 31, 41, 12, 22, 32, 42};
  cadence::zipline_result<std::int64_t> ri;
  cadence::zipline_thrust(cadence::rows_view<std::int64_t>::matrix(b.data(), 3, 4), ws, ri);
  CHECK(ri.spread == 2);
  CHECK(ri.barrier == 12);
  cadence::zipline_thrust(cadence::rows_view<double>::matrix(a.data(), 2, 3), ws, rd);
  CHECK(rd == cadence::zipline_brute_force(cadence::rows_view<double>::matrix(a.data(), 2, 3)));
  cadence::thrust_zipline_workspace moved = std::move(ws);
  moved.release();
  CHECK(moved.bytes_reserved() == 0);
}
