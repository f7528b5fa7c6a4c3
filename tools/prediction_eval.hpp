// cadence-zipline --evaluate: replays a recorded push history and measures, per predictor and
// lookahead R, how far predicted push times fall from what happened and what ZipLine's
// barrier, planned on those predictions, really cost against the best barrier in hindsight.
// Kept in a header so the arithmetic is unit-tested on hand-computed histories.
#pragma once

#include "zipline_json.hpp"

#include <cadence/core/detail/bits.hpp>
#include <cadence/core/error.hpp>
#include <cadence/io/push_history.hpp>
#include <cadence/predict/any_predictor.hpp>
#include <cadence/zipline/fast.hpp>
#include <cadence/zipline/workspace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace cadence::tools {

/// Where the replay plans: at time `at`, worker p has made its pushes [0, first[p]) and its
/// next R pushes [first[p], first[p] + R) are the future the plan is judged on; `best` is
/// ZipLine on those actual future pushes (the barrier in hindsight).
template <class T>
struct evaluation_plan {
  T at{};
  std::vector<std::size_t> first;
  zipline_result<T> best;
};

/// The planning points of a replay with lookahead r, the same for every predictor. As
/// ElasticBSP's cycle: the first plan when every worker has pushed twice (its monitoring
/// phase); after a plan, the next one when every worker has pushed twice after the barrier,
/// here the best barrier in hindsight (so the points do not depend on any predictor). A
/// plan needs r pushes of every worker after it; the replay stops at the first that lacks
/// them. Every row must have >= 2 pushes and be non-decreasing (the readers check both).
template <class T>
std::vector<evaluation_plan<T>> evaluation_plans(const push_history<T>& h, std::size_t r) {
  std::vector<evaluation_plan<T>> plans;
  const std::size_t n = h.size();
  if (n == 0 || r == 0) return plans;
  T at = h.row(0)[1];
  for (std::size_t p = 0; p < n; ++p) at = std::max(at, h.row(p)[1]);
  std::vector<T> values;
  std::vector<std::size_t> offsets;
  zipline_workspace<T> ws;
  for (;;) {
    evaluation_plan<T> plan;
    plan.at = at;
    values.clear();
    offsets.assign(1, 0);
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = h.row(p);
      const auto k = static_cast<std::size_t>(std::upper_bound(row.begin(), row.end(), at) - row.begin());
      if (row.size() - k < r) return plans;
      plan.first.push_back(k);
      // Equal timestamps in a recorded row are one choice for the barrier: keep one of each.
      for (std::size_t i = k; i < k + r; ++i)
        if (i == k || row[i] != row[i - 1]) values.push_back(row[i]);
      offsets.push_back(values.size());
    }
    zipline(rows_view<T>::ragged(values.data(), offsets.data(), n), ws, plan.best);
    // Back to indices into the actual row (the first of equal timestamps <= the barrier).
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = h.row(p);
      const T chosen = values[offsets[p] + plan.best.choice[p]];
      plan.best.choice[p] = static_cast<std::size_t>(
          std::lower_bound(row.begin() + static_cast<std::ptrdiff_t>(plan.first[p]), row.end(), chosen) - row.begin() -
          static_cast<std::ptrdiff_t>(plan.first[p]));
    }
    const T barrier = plan.best.barrier;
    plans.push_back(std::move(plan));
    T next = barrier;
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = h.row(p);
      const auto k = static_cast<std::size_t>(std::upper_bound(row.begin(), row.end(), barrier) - row.begin());
      if (k + 2 > row.size()) return plans;
      next = std::max(next, row[k + 1]);
    }
    at = next;
  }
}

/// What one predictor achieved at one lookahead, over every plan. Errors and waits are in
/// the history's time unit; integer histories give exact integer errors, spreads and totals.
template <class T>
struct prediction_quality {
  std::string predictor;
  std::size_t lookahead = 0;
  std::size_t plans = 0;
  std::size_t points = 0;  ///< predicted pushes compared: plans x workers x lookahead
  double mean_abs_error = 0;  ///< mean |predicted - actual| push time
  T p90_abs_error{};          ///< its 90th percentile (nearest rank)
  T max_abs_error{};
  /// Sum over plans of the real wait of ZipLine's barrier: on the actual push times of the
  /// pushes it chose, latest minus earliest (the spread d: the longest any worker waits).
  T wait_total{};
  /// Sum over plans of the smallest such wait any barrier had (ZipLine on the actual times).
  T best_wait_total{};
  /// Sum over plans of the spread ZipLine predicted for its barrier.
  T predicted_wait_total{};
  double wait_mean() const { return plans ? static_cast<double>(wait_total) / static_cast<double>(plans) : 0; }
  double best_wait_mean() const { return plans ? static_cast<double>(best_wait_total) / static_cast<double>(plans) : 0; }
  double predicted_wait_mean() const {
    return plans ? static_cast<double>(predicted_wait_total) / static_cast<double>(plans) : 0;
  }
};

namespace detail {

template <class T>
T checked_sum(T a, T b, const char* what) {
  if constexpr (std::is_integral_v<T>) {
    T s;
    if (cadence::detail::add_overflows(a, b, &s))
      throw time_error(std::string("cadence-zipline --evaluate: the total ") + what + " does not fit the timestamp type");
    return s;
  } else {
    return a + b;
  }
}

template <class T>
T abs_difference(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    T d;
    if (cadence::detail::sub_overflows(a < b ? b : a, a < b ? a : b, &d))
      throw time_error("cadence-zipline --evaluate: a prediction error does not fit the timestamp type");
    return d;
  } else {
    return a < b ? b - a : a - b;
  }
}

}  // namespace detail

/// Replays h at the planning points `plans` (evaluation_plans(h, r)) with `predictor`: at
/// each, each worker's latest `history` pushes up to the plan (at least 2) are predicted r
/// pushes ahead; every prediction is compared with the push that actually came, and ZipLine
/// plans a barrier on the predictions, whose real wait is measured on the actual times.
template <class T>
prediction_quality<T> evaluate_predictor(const push_history<T>& h, const std::vector<evaluation_plan<T>>& plans,
                                         std::size_t r, const any_predictor<T>& predictor, std::size_t history) {
  prediction_quality<T> q;
  q.predictor = predictor.name();
  q.lookahead = r;
  q.plans = plans.size();
  const std::size_t n = h.size();
  std::vector<T> predicted(n * r), errors;
  errors.reserve(plans.size() * n * r);
  zipline_workspace<T> ws;
  zipline_result<T> planned;
  long double error_sum = 0;
  for (const evaluation_plan<T>& plan : plans) {
    for (std::size_t p = 0; p < n; ++p) {
      const auto row = h.row(p);
      const std::size_t k = plan.first[p];
      const std::size_t from = k > history ? k - history : 0;
      try {
        predictor.predict(span<const T>(row.data() + from, k - from), r, predicted.data() + p * r);
      } catch (const cadence::error& e) {
        throw time_error("worker " + std::to_string(h.ids()[p]) + ": " + e.what());
      }
      for (std::size_t i = 0; i < r; ++i) {
        const T e = detail::abs_difference(predicted[p * r + i], row[k + i]);
        errors.push_back(e);
        error_sum += static_cast<long double>(e);
      }
    }
    zipline(rows_view<T>::matrix(predicted.data(), n, r), ws, planned);
    T lo{}, hi{};
    for (std::size_t p = 0; p < n; ++p) {
      const T t = h.row(p)[plan.first[p] + planned.choice[p]];
      if (p == 0 || t < lo) lo = t;
      if (p == 0 || t > hi) hi = t;
    }
    q.wait_total = detail::checked_sum(q.wait_total, detail::abs_difference(hi, lo), "wait");
    q.best_wait_total = detail::checked_sum(q.best_wait_total, plan.best.spread, "best wait");
    q.predicted_wait_total = detail::checked_sum(q.predicted_wait_total, planned.spread, "predicted wait");
  }
  q.points = errors.size();
  if (!errors.empty()) {
    q.mean_abs_error = static_cast<double>(error_sum / static_cast<long double>(errors.size()));
    q.max_abs_error = *std::max_element(errors.begin(), errors.end());
    const auto rank = static_cast<std::size_t>((errors.size() * 9 + 9) / 10);  // ceil(0.9 * size)
    std::nth_element(errors.begin(), errors.begin() + static_cast<std::ptrdiff_t>(rank - 1), errors.end());
    q.p90_abs_error = errors[rank - 1];
  }
  return q;
}

/// The message for a history with no planning point at lookahead r: which worker has too
/// few pushes after the first planning time, and how many it would need.
template <class T>
std::string too_short_message(const push_history<T>& h, std::size_t r, const std::string& source) {
  T at = h.row(0)[1];
  for (std::size_t p = 0; p < h.size(); ++p) at = std::max(at, h.row(p)[1]);
  std::size_t worst = 0, fewest = SIZE_MAX;
  for (std::size_t p = 0; p < h.size(); ++p) {
    const auto row = h.row(p);
    const auto after = static_cast<std::size_t>(row.end() - std::upper_bound(row.begin(), row.end(), at));
    if (after < fewest) {
      fewest = after;
      worst = p;
    }
  }
  return source + " is too short for lookahead R = " + std::to_string(r) + ": the first plan is at " +
         number_text(at) + " (when every worker has pushed twice), after which worker " +
         std::to_string(h.ids()[worst]) + " pushes only " + std::to_string(fewest) + " times; a plan needs R = " +
         std::to_string(r) + " pushes of every worker after it (use a smaller --lookahead or a longer history)";
}

}  // namespace cadence::tools
