// The training race: the cluster simulator with the real controllers deciding who waits, where
// every push carries a real gradient of a real model, computed on the weights the worker pulled
// and applied by the server when the push arrives, so staleness costs what it really costs.
#pragma once

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/controller.hpp>
#include <cadence/controllers/make_controller.hpp>
#include <cadence/core/error.hpp>
#include <cadence/sim/metrics.hpp>
#include <cadence/sim/random.hpp>
#include <cadence/sim/scenario.hpp>
#include <cadence/sim/simulator.hpp>
#include "idx.hpp"
#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::train {

/// Most points a race's curve may have. Each is an evaluation of the server's weights on up to
/// test_limit test examples, so an eval_every_seconds far below the run's length would run for
/// hours without a line of output; this bounds it relative to the run instead.
inline constexpr std::size_t max_curve_points = 1000;

/// How the race trains. The cluster (worker speeds, push and pull costs, run length) is the
/// scenario's; these are the learning knobs and how often to measure.
struct race_options {
  /// SGD step the server applies for each push: w -= learning_rate * (mean minibatch gradient).
  double learning_rate = 0.005;
  /// Examples per worker iteration (capped at a worker's shard size).
  std::size_t batch_size = 32;
  /// Simulated seconds between two test evaluations of the server's weights (the curve); at
  /// most max_curve_points evaluations over the run.
  double eval_every_seconds = 2.0;
  /// Use only the first train_limit training examples (0: all), split into one disjoint
  /// shard per worker.
  std::size_t train_limit = 0;
  /// Evaluate the curve on the first test_limit test examples (0: all): the periodic
  /// evaluations are the race's main cost after the gradients.
  std::size_t test_limit = 2000;
  /// Accuracies whose first crossing (on the curve) is reported as a time to accuracy.
  std::vector<double> targets = {0.7, 0.8};
  /// Seeds the order in which each worker walks its shard.
  std::uint64_t seed = 1;
};

/// The server's weights measured at one simulated time, after every push that arrived by then.
struct curve_point {
  double seconds = 0;
  double accuracy = 0;
  double loss = 0;
  /// Gradients the server had applied by then.
  std::uint64_t updates = 0;
};

/// When the curve first reached an accuracy; seconds is infinity if it never did.
struct time_to_accuracy {
  double target = 0;
  double seconds = HUGE_VAL;
  bool reached() const noexcept { return std::isfinite(seconds); }
};

/// What one policy achieved in the race.
struct race_result {
  /// The simulator's measurements of the same run: throughput, waiting and both kinds of
  /// staleness. metrics.max_start_staleness and its histogram are the clock gap a worker
  /// started an iteration at (what SSP and DSSP bound); metrics.mean_updates_behind,
  /// max_updates_behind and updates_behind_histogram count, for each applied gradient, the
  /// other gradients the server applied between the worker's pull and its push: the staleness
  /// the model actually sees (under BSP up to n - 1, because the server applies a round's
  /// gradients one by one).
  sim::run_metrics metrics;
  /// Test accuracy and loss every eval_every_seconds from t = 0, on the first test_limit
  /// test examples, ending with a point at the end of the run.
  std::vector<curve_point> curve;
  /// The weights at the end of the run on the whole test set.
  evaluation final_test;
  std::size_t final_test_examples = 0;
  /// Highest accuracy on the curve.
  double best_accuracy = 0;
  /// One entry per race_options::targets, in that order.
  std::vector<time_to_accuracy> reached;
};

namespace detail {

inline std::string too_many_evaluations(double run_seconds, double eval_every) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "eval_every_seconds %g means more than %zu test evaluations in %g simulated s; "
                "use eval_every_seconds >= %g",
                eval_every, max_curve_points, run_seconds, run_seconds / static_cast<double>(max_curve_points));
  return buf;
}

inline void check_race(const sim::scenario& s, const train_test_data& data, const race_options& o) {
  auto fail = [](const std::string& what) { throw invalid_parameter_error("cadence::train::run_race: " + what); };
  if (!(o.learning_rate > 0) || !std::isfinite(o.learning_rate))
    fail("learning_rate must be finite and > 0, got " + std::to_string(o.learning_rate));
  if (o.batch_size == 0) fail("batch_size must be >= 1");
  if (!(o.eval_every_seconds > 0) || !std::isfinite(o.eval_every_seconds))
    fail("eval_every_seconds must be finite and > 0, got " + std::to_string(o.eval_every_seconds));
  // A run limited by iterations has no length yet: run_race checks its curve as it grows.
  if (s.seconds > 0 && s.seconds / o.eval_every_seconds > static_cast<double>(max_curve_points))
    fail(too_many_evaluations(s.seconds, o.eval_every_seconds));
  const std::size_t n_train = o.train_limit == 0 ? data.train.size() : std::min(o.train_limit, data.train.size());
  if (n_train < s.workers.size())
    fail("every worker needs at least one training example: " + std::to_string(n_train) + " examples for " +
         std::to_string(s.workers.size()) + " workers");
  if (n_train > 0xFFFFFFFFu) fail("at most 2^32 - 1 training examples");
  if (data.test.size() == 0) fail("the test set is empty");
  if (data.train.features() != data.test.features() || data.train.features() == 0)
    fail("training examples have " + std::to_string(data.train.features()) + " features, test examples " +
         std::to_string(data.test.features()));
  for (const double t : o.targets)
    if (!(t >= 0 && t <= 1)) fail("targets must be accuracies in [0, 1], got " + std::to_string(t));
}

/// One worker's walk over its shard: a seeded shuffle, reshuffled at every epoch.
class shard_walk {
public:
  shard_walk(std::uint32_t first, std::uint32_t last, std::size_t batch, std::uint64_t seed)
      : order_(last - first), batch_(std::min<std::size_t>(batch, last - first)), rng_(seed) {
    for (std::uint32_t i = first; i < last; ++i) order_[i - first] = i;
    shuffle();
  }
  /// The next batch (drops an epoch's last partial batch, so every batch is full).
  span<const std::uint32_t> next() {
    if (cursor_ + batch_ > order_.size()) {
      shuffle();
      cursor_ = 0;
    }
    const span<const std::uint32_t> b(order_.data() + cursor_, batch_);
    cursor_ += batch_;
    return b;
  }

private:
  void shuffle() {
    // Fisher-Yates with the simulator's portable random stream: the same order everywhere.
    for (std::size_t i = order_.size(); i > 1; --i) {
      const auto j = static_cast<std::size_t>(rng_.uniform() * static_cast<double>(i));
      std::swap(order_[i - 1], order_[j < i ? j : i - 1]);
    }
  }
  std::vector<std::uint32_t> order_;
  std::size_t batch_;
  std::size_t cursor_ = 0;
  sim::random_stream rng_;
};

}  // namespace detail

/// Races controller c (freshly built for s.workers.size() workers) on scenario s, training a
/// softmax regression on data.train and measuring it on data.test. The simulator decides
/// when each worker starts and pushes and who waits (see sim::simulate); the race adds the
/// learning: when worker p starts an iteration it computes the gradient of its next minibatch
/// at the server's current weights (what it pulled), and when its push arrives the server
/// applies that gradient, however many other updates landed in between. All workers start
/// from zero weights. The result is a pure function of (s, policy, data, options). Throws
/// invalid_parameter_error for bad options and whatever sim::simulate throws.
template <class Controller,
          std::enable_if_t<!std::is_convertible_v<Controller&, std::string_view>, int> = 0>
race_result run_race(Controller& c, const sim::scenario& s, const train_test_data& data,
                     const race_options& o = {}) {
  sim::validate(s);
  detail::check_race(s, data, o);
  const std::size_t n = s.workers.size();
  const std::size_t n_train = o.train_limit == 0 ? data.train.size() : std::min(o.train_limit, data.train.size());

  softmax_regression model(data.train.features(), std::max(data.train.classes, data.test.classes), o.batch_size);
  const std::size_t params = model.parameter_count();
  std::vector<float> weights(params, 0.0f);
  std::vector<float> grads(n * params, 0.0f);
  std::vector<detail::shard_walk> walks;
  walks.reserve(n);
  for (std::size_t p = 0; p < n; ++p)
    walks.emplace_back(static_cast<std::uint32_t>(p * n_train / n), static_cast<std::uint32_t>((p + 1) * n_train / n),
                       o.batch_size, sim::mix_seed(o.seed, p));
  const auto lr = static_cast<float>(o.learning_rate);

  race_result r;
  std::uint64_t updates = 0;
  double next_eval = 0;
  auto measure = [&](double t) {
    const evaluation e = model.evaluate(weights, data.test, o.test_limit);
    r.curve.push_back({t, e.accuracy, e.loss, updates});
  };
  // Curve points at k * eval_every that lie before time t (pushes at t come after them).
  auto measure_before = [&](double t) {
    while (next_eval < t) {
      if (s.seconds == 0 && r.curve.size() >= max_curve_points)  // check_race bounded timed runs
        throw invalid_parameter_error("cadence::train::run_race: " + detail::too_many_evaluations(t, o.eval_every_seconds));
      measure(next_eval);
      next_eval = static_cast<double>(r.curve.size()) * o.eval_every_seconds;
    }
  };

  sim::run_options opt;
  opt.time_controller = false;
  opt.on_iteration_start = [&](worker_id p, double) {
    const span<float> g(grads.data() + p * params, params);
    model.gradient(weights, data.train, walks[p].next(), g);
  };
  opt.on_push = [&](worker_id p, double t) {
    measure_before(t);
    softmax_regression::sgd_step(weights, span<const float>(grads.data() + p * params, params), lr);
    ++updates;
  };
  r.metrics = sim::simulate(c, s, opt);

  const double end = r.metrics.simulated_seconds;
  measure_before(end);
  measure(end);  // the point at the end (after every push by then)
  const evaluation f = model.evaluate(weights, data.test, 0);
  r.final_test = f;
  r.final_test_examples = data.test.size();
  for (const curve_point& pt : r.curve) r.best_accuracy = std::max(r.best_accuracy, pt.accuracy);
  for (const double target : o.targets) {
    time_to_accuracy t{target, HUGE_VAL};
    for (const curve_point& pt : r.curve)
      if (pt.accuracy >= target) {
        t.seconds = pt.seconds;
        break;
      }
    r.reached.push_back(t);
  }
  return r;
}

/// Builds the policy from its config string (see make_controller) and races it.
inline race_result run_race(std::string_view policy, const sim::scenario& s, const train_test_data& data,
                            const race_options& o = {}) {
  sim::validate(s);
  any_controller c = make_controller(policy, s.workers.size());
  return run_race(c, s, data, o);
}

}  // namespace cadence::train
