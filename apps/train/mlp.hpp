// The model cadence-train trains: a one-hidden-layer perceptron (features-hidden-classes, ReLU,
// softmax cross-entropy) with minibatch gradients on any weights snapshot, seeded Glorot init.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/sim/random.hpp>
#include "idx.hpp"
#include "model.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cadence::train {

/// A multilayer perceptron with one hidden ReLU layer. Parameters live in one flat vector
/// owned by the caller, in this order: W1 [hidden][features], b1 [hidden], W2 [classes][hidden],
/// b2 [classes]. Deterministic (no threads, sums in a fixed order). Holds the scratch space of
/// one example; gradient() and evaluate() allocate nothing. Not thread-safe.
class mlp {
public:
  mlp(std::size_t features, std::size_t hidden, std::size_t classes)
      : features_(features), hidden_(hidden), classes_(classes), pre_(hidden), act_(hidden),
        dhid_(hidden), out_(classes) {
    if (features == 0 || hidden == 0 || classes < 2)
      throw invalid_parameter_error("cadence::train::mlp: needs features >= 1, hidden >= 1 and classes >= 2, got " +
                                    std::to_string(features) + ", " + std::to_string(hidden) + ", " +
                                    std::to_string(classes));
  }

  std::size_t features() const noexcept { return features_; }
  std::size_t hidden() const noexcept { return hidden_; }
  std::size_t classes() const noexcept { return classes_; }
  std::size_t parameter_count() const noexcept {
    return hidden_ * features_ + hidden_ + classes_ * hidden_ + classes_;
  }

  /// Glorot-uniform weights (U(-a, a), a = sqrt(6 / (fan_in + fan_out))), zero biases, drawn
  /// from the simulator's portable random stream: the same on every rank for one seed.
  void initialize(span<float> w, std::uint64_t seed) const {
    check_size(w.size(), "initialize");
    sim::random_stream rng(seed);
    const double a1 = std::sqrt(6.0 / static_cast<double>(features_ + hidden_));
    const double a2 = std::sqrt(6.0 / static_cast<double>(hidden_ + classes_));
    float* p = w.data();
    for (std::size_t k = 0; k < hidden_ * features_; ++k) *p++ = static_cast<float>((2 * rng.uniform() - 1) * a1);
    for (std::size_t k = 0; k < hidden_; ++k) *p++ = 0.0f;
    for (std::size_t k = 0; k < classes_ * hidden_; ++k) *p++ = static_cast<float>((2 * rng.uniform() - 1) * a2);
    for (std::size_t k = 0; k < classes_; ++k) *p++ = 0.0f;
  }

  /// Writes into `grad` the gradient of the mean cross-entropy of the examples `batch`
  /// (indices into d) at weights `w` and returns that loss. batch must not be empty.
  double gradient(span<const float> w, const dataset& d, span<const std::uint32_t> batch, span<float> grad) {
    check(w, d, "gradient");
    check_size(grad.size(), "gradient (grad)");
    if (batch.empty()) throw invalid_parameter_error("cadence::train::mlp::gradient: empty batch");
    for (float& g : grad) g = 0.0f;
    float* gw1 = grad.data();
    float* gb1 = gw1 + hidden_ * features_;
    float* gw2 = gb1 + hidden_;
    float* gb2 = gw2 + classes_ * hidden_;
    const float* w2 = w.data() + hidden_ * features_ + hidden_;
    const float scale = 1.0f / static_cast<float>(batch.size());
    double loss = 0;
    for (const std::uint32_t i : batch) {
      const float* x = d.image(i);
      const std::uint8_t y = d.labels[i];
      loss += forward(w, x, y);
      // out_ holds the softmax probabilities: d loss / d logit_c = p_c - [c == y].
      for (std::size_t h = 0; h < hidden_; ++h) dhid_[h] = 0.0f;
      for (std::size_t c = 0; c < classes_; ++c) {
        const float delta = (out_[c] - (c == y ? 1.0f : 0.0f)) * scale;
        gb2[c] += delta;
        float* g = gw2 + c * hidden_;
        const float* wr = w2 + c * hidden_;
        for (std::size_t h = 0; h < hidden_; ++h) {
          g[h] += delta * act_[h];
          dhid_[h] += delta * wr[h];
        }
      }
      for (std::size_t h = 0; h < hidden_; ++h) {
        if (pre_[h] <= 0.0f) continue;  // ReLU: no gradient through an inactive unit
        const float dh = dhid_[h];
        gb1[h] += dh;
        float* g = gw1 + h * features_;
        for (std::size_t j = 0; j < features_; ++j) g[j] += dh * x[j];
      }
    }
    return loss / static_cast<double>(batch.size());
  }

  /// Accuracy and mean loss at weights w on the first `limit` examples of d (0: all).
  evaluation evaluate(span<const float> w, const dataset& d, std::size_t limit = 0) {
    check(w, d, "evaluate");
    return detail::evaluate_examples(d, limit, out_.data(), classes_,
                                     [&](const float* x, std::uint8_t y) { return forward(w, x, y); });
  }

private:
  void check_size(std::size_t got, const char* who) const {
    if (got != parameter_count())
      throw invalid_parameter_error(std::string("cadence::train::mlp::") + who + ": " + std::to_string(got) +
                                    " values, expected " + std::to_string(parameter_count()));
  }
  void check(span<const float> w, const dataset& d, const char* who) const {
    check_size(w.size(), who);
    detail::check_fits(d, features_, classes_, "cadence::train::mlp", who);
  }

  /// Leaves pre-activations in pre_, activations in act_, softmax probabilities in out_;
  /// returns -log p(label).
  double forward(span<const float> w, const float* x, std::uint8_t label) noexcept {
    const float* w1 = w.data();
    const float* b1 = w1 + hidden_ * features_;
    const float* w2 = b1 + hidden_;
    const float* b2 = w2 + classes_ * hidden_;
    for (std::size_t h = 0; h < hidden_; ++h) {
      pre_[h] = detail::dot8(w1 + h * features_, x, features_) + b1[h];
      act_[h] = pre_[h] > 0.0f ? pre_[h] : 0.0f;
    }
    for (std::size_t c = 0; c < classes_; ++c)
      out_[c] = detail::dot8(w2 + c * hidden_, act_.data(), hidden_) + b2[c];
    return detail::softmax_cross_entropy(out_.data(), classes_, label);
  }

  std::size_t features_, hidden_, classes_;
  std::vector<float> pre_, act_, dhid_, out_;
};

}  // namespace cadence::train
