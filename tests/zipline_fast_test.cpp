// zipline/fast.hpp: zipline_fast matches the oracle on the inputs its shortcuts are most
// likely to get wrong (trimming, clustered buckets, other timestamp types), and stops
// allocating once its workspace has grown.
#include <cadence/zipline/brute_force.hpp>
#include <cadence/zipline/fast.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

template <class T>
struct owned_rows {
  std::vector<T> values;
  std::vector<std::size_t> offsets{0};
  void add(const std::vector<T>& row) {
    values.insert(values.end(), row.begin(), row.end());
    offsets.push_back(values.size());
  }
  cadence::rows_view<T> view() const {
    return cadence::rows_view<T>::ragged(values.data(), offsets.data(), offsets.size() - 1);
  }
};

/// Rows like the ElasticBSP generator's predictions: constant per-row interval, random start.
template <class T>
owned_rows<T> periodic_rows(std::mt19937_64& rng, std::size_t n, std::size_t r, std::uint64_t lo,
                            std::uint64_t hi, std::uint64_t start_spread) {
  owned_rows<T> rows;
  for (std::size_t p = 0; p < n; ++p) {
    const auto interval = static_cast<T>(lo + rng() % (hi - lo + 1));
    const auto start = static_cast<T>(rng() % start_spread);
    std::vector<T> row(r);
    for (std::size_t i = 0; i < r; ++i) row[i] = static_cast<T>(start + static_cast<T>(i + 1) * interval);
    rows.add(row);
  }
  return rows;
}

}  // namespace

TEST_CASE("zipline_fast matches the oracle on generator-like periodic rows") {
  std::mt19937_64 rng(1);
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  for (int iter = 0; iter < 40; ++iter) {
    const auto rows = periodic_rows<double>(rng, 1 + rng() % 60, 1 + rng() % 20, 1000, 1500,
                                            1 + rng() % 20000);
    cadence::zipline_fast(rows.view(), ws, out);
    CHECK(out == cadence::zipline_brute_force(rows.view()));
  }
}

TEST_CASE("zipline_fast trims rows that start late or end early without losing the answer") {
  owned_rows<std::int64_t> rows;
  rows.add({0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100});
  rows.add({44, 47});  // every row has a point by 46; the best window is [46, 50]
  rows.add({1, 2, 3, 43, 48, 90, 91, 92});
  rows.add({46, 200, 300});
  CHECK(cadence::zipline_fast(rows.view()) == cadence::zipline_brute_force(rows.view()));
  const auto res = cadence::zipline_fast(rows.view());
  CHECK(res.spread == 4);
  CHECK(res.barrier == 50);
  CHECK(res.choice == std::vector<std::size_t>{5, 1, 4, 0});
}

TEST_CASE("zipline_fast matches the oracle when most points share one bucket") {
  // A far outlier makes the buckets wide, so the cluster lands in very few of them and the
  // per-bucket sort fallback runs.
  std::mt19937_64 rng(8);
  for (int iter = 0; iter < 20; ++iter) {
    owned_rows<std::int64_t> rows;
    rows.add({0, 1000000000});
    const std::size_t n = 2 + rng() % 30;
    for (std::size_t p = 0; p < n; ++p) {
      std::vector<std::int64_t> row;
      std::int64_t t = 500000000 + static_cast<std::int64_t>(rng() % 50);
      for (std::size_t i = 0, len = 20 + rng() % 60; i < len; ++i)
        row.push_back(t += 1 + static_cast<std::int64_t>(rng() % 3));
      rows.add(row);
    }
    CHECK(cadence::zipline_fast(rows.view()) == cadence::zipline_brute_force(rows.view()));
  }
}

TEST_CASE("zipline_fast works for float, long double and unsigned timestamps") {
  std::mt19937_64 rng(4);
  for (int iter = 0; iter < 50; ++iter) {
    const auto n = 1 + rng() % 12, r = 1 + rng() % 12;
    const auto f = periodic_rows<float>(rng, n, r, 3, 9, 40);
    CHECK(cadence::zipline_fast(f.view()) == cadence::zipline_brute_force(f.view()));
    const auto ld = periodic_rows<long double>(rng, n, r, 3, 9, 40);
    CHECK(cadence::zipline_fast(ld.view()) == cadence::zipline_brute_force(ld.view()));
    const auto u = periodic_rows<std::uint32_t>(rng, n, r, 3, 9, 40);
    CHECK(cadence::zipline_fast(u.view()) == cadence::zipline_brute_force(u.view()));
  }
}

TEST_CASE("zipline_fast does not reallocate its workspace or result once warmed up") {
  std::mt19937_64 rng(2);
  const auto big = periodic_rows<double>(rng, 200, 15, 1000, 1500, 3000);
  const auto small = periodic_rows<double>(rng, 50, 15, 1000, 1500, 3000);
  cadence::zipline_workspace<double> ws;
  cadence::zipline_result<double> out;
  cadence::zipline_fast(big.view(), ws, out);
  const auto* points = ws.points().data();
  const auto* buckets = ws.buckets().data();
  const auto* counts = ws.counts().data();
  const auto* choice = out.choice.data();
  for (int k = 0; k < 3; ++k) {
    cadence::zipline_fast(small.view(), ws, out);
    CHECK(out == cadence::zipline_brute_force(small.view()));
    cadence::zipline_fast(big.view(), ws, out);
    CHECK(ws.points().data() == points);
    CHECK(ws.buckets().data() == buckets);
    CHECK(ws.counts().data() == counts);
    CHECK(out.choice.data() == choice);
  }
}
