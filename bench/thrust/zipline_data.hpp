// Benchmark input shared by the Thrust benchmarks: n workers whose push history (previous and
// last push) gives R predicted pushes each through the paper's last-interval predictor.
#pragma once

#include <cadence/core/span.hpp>
#include <cadence/predict/interval.hpp>

#include <cstddef>
#include <random>
#include <vector>

namespace cadence_bench {

struct zipline_input {
  std::vector<double> previous, last;  // push history, n each
  std::vector<double> rows;            // n x r predictions, row-major
  std::size_t n = 0, r = 0;
};

// Periods spread +-25% around 1 s and phases spread over one period, as in a cluster of
// similar GPUs; the rows are what cadence::last_interval predicts from (previous, last).
inline zipline_input make_zipline_input(std::size_t n, std::size_t r, unsigned seed = 1) {
  zipline_input in;
  in.n = n;
  in.r = r;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> period(0.8, 1.25), phase(0.0, 1.0);
  for (std::size_t p = 0; p < n; ++p) {
    const double step = period(rng);
    const double t = 100.0 + phase(rng) * step;
    in.previous.push_back(t - step);
    in.last.push_back(t);
  }
  in.rows.resize(n * r);
  for (std::size_t p = 0; p < n; ++p) {
    const double history[] = {in.previous[p], in.last[p]};
    cadence::last_interval{}.predict(cadence::span<const double>(history, 2), r, in.rows.data() + p * r);
  }
  return in;
}

}  // namespace cadence_bench
