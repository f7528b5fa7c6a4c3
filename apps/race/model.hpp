// The model the training race trains: multinomial logistic regression (softmax over a linear
// map of the pixels), with minibatch gradients on any weights snapshot and plain SGD.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include "idx.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cadence::train {

/// Accuracy and mean cross-entropy loss of a model on (part of) a dataset.
struct evaluation {
  double accuracy = 0;
  double loss = 0;
};

namespace detail {

/// Dot product of a[0..n) and b[0..n) in 8 interleaved partial sums added in a fixed order, so
/// the compiler may vectorize it without changing a bit of the result.
inline float dot8(const float* a, const float* b, std::size_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (std::size_t k = 0; k < 8; ++k) acc[k] += a[j + k] * b[j + k];
  for (std::size_t k = 0; j < n; ++j, ++k) acc[k] += a[j] * b[j];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/// Turns logits[0..classes) into softmax probabilities in place and returns -log p(label), in
/// log-sum-exp form: finite even when p underflows to 0.
inline double softmax_cross_entropy(float* logits, std::size_t classes, std::uint8_t label) noexcept {
  float top = -HUGE_VALF;
  for (std::size_t c = 0; c < classes; ++c)
    if (logits[c] > top) top = logits[c];
  const double label_logit = static_cast<double>(logits[label]) - static_cast<double>(top);
  double sum = 0;
  for (std::size_t c = 0; c < classes; ++c) {
    logits[c] = std::exp(logits[c] - top);
    sum += logits[c];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (std::size_t c = 0; c < classes; ++c) logits[c] *= inv;
  return std::log(sum) - label_logit;
}

/// Accuracy and mean loss on the first `limit` examples of d (0: all) for a model whose
/// forward(image, label) returns -log p(label) and leaves the class probabilities in
/// probabilities[0..classes): the evaluation of both apps' models (softmax_regression, mlp).
template <class Forward>
evaluation evaluate_examples(const dataset& d, std::size_t limit, const float* probabilities,
                             std::size_t classes, Forward forward) {
  const std::size_t n = limit == 0 || limit > d.size() ? d.size() : limit;
  evaluation e;
  if (n == 0) return e;
  std::size_t correct = 0;
  for (std::size_t i = 0; i < n; ++i) {
    e.loss += forward(d.image(i), d.labels[i]);
    std::size_t best = 0;
    for (std::size_t c = 1; c < classes; ++c)
      if (probabilities[c] > probabilities[best]) best = c;
    correct += best == d.labels[i];
  }
  e.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  e.loss /= static_cast<double>(n);
  return e;
}

/// Throws invalid_parameter_error "MODEL::WHO: dataset has F features and C classes, the model
/// F' and C'" unless d fits a model with `features` inputs and `classes` outputs (MODEL as
/// "cadence::train::mlp").
inline void check_fits(const dataset& d, std::size_t features, std::size_t classes, const char* model, const char* who) {
  if (d.features() != features || d.classes > classes)
    throw invalid_parameter_error(std::string(model) + "::" + who + ": dataset has " + std::to_string(d.features()) +
                                  " features and " + std::to_string(d.classes) + " classes, the model " +
                                  std::to_string(features) + " and " + std::to_string(classes));
}

}  // namespace detail

/// Softmax regression with `features` inputs and `classes` outputs. Parameters live in one
/// flat vector owned by the caller: weights row-major [class][feature], then one bias per
/// class. Deterministic: no threads, every sum in a fixed order (8 interleaved partial sums
/// for the dot products, so the compiler may vectorize without changing a bit of the result).
/// The object holds the scratch space of one batch; after construction gradient() and
/// evaluate() allocate nothing. Not thread-safe (one object per thread).
class softmax_regression {
public:
  softmax_regression(std::size_t features, std::size_t classes, std::size_t max_batch)
      : features_(features), classes_(classes), max_batch_(max_batch), logits_(classes) {
    if (features == 0 || classes < 2 || max_batch == 0)
      throw invalid_parameter_error("cadence::train::softmax_regression: needs features >= 1, classes >= 2 and "
                                    "max_batch >= 1, got " + std::to_string(features) + ", " +
                                    std::to_string(classes) + ", " + std::to_string(max_batch));
  }

  std::size_t features() const noexcept { return features_; }
  std::size_t classes() const noexcept { return classes_; }
  std::size_t max_batch() const noexcept { return max_batch_; }
  std::size_t parameter_count() const noexcept { return classes_ * (features_ + 1); }

  /// Writes into `grad` the gradient of the mean cross-entropy of the examples `batch` (indices
  /// into d) at weights `w`, and returns that loss. w and grad have parameter_count() values;
  /// batch has 1..max_batch() entries.
  double gradient(span<const float> w, const dataset& d, span<const std::uint32_t> batch, span<float> grad) {
    check(w, d, "gradient");
    if (grad.size() != parameter_count())
      throw invalid_parameter_error("cadence::train::softmax_regression::gradient: grad has " +
                                    std::to_string(grad.size()) + " values, expected " +
                                    std::to_string(parameter_count()));
    if (batch.empty() || batch.size() > max_batch_)
      throw invalid_parameter_error("cadence::train::softmax_regression::gradient: batch of " +
                                    std::to_string(batch.size()) + " examples, expected 1.." +
                                    std::to_string(max_batch_));
    for (float& g : grad) g = 0.0f;
    float* gb = grad.data() + classes_ * features_;
    const float scale = 1.0f / static_cast<float>(batch.size());
    double loss = 0;
    for (const std::uint32_t i : batch) {
      const float* x = d.image(i);
      loss += forward(w, x, d.labels[i]);
      // logits_ now holds softmax probabilities; d loss / d logit_c = p_c - [c == y].
      for (std::size_t c = 0; c < classes_; ++c) {
        const float delta = (logits_[c] - (c == d.labels[i] ? 1.0f : 0.0f)) * scale;
        float* g = grad.data() + c * features_;
        for (std::size_t j = 0; j < features_; ++j) g[j] += delta * x[j];
        gb[c] += delta;
      }
    }
    return loss / static_cast<double>(batch.size());
  }

  /// w -= learning_rate * grad.
  static void sgd_step(span<float> w, span<const float> grad, float learning_rate) {
    if (w.size() != grad.size())
      throw invalid_parameter_error("cadence::train::softmax_regression::sgd_step: weights have " +
                                    std::to_string(w.size()) + " values but grad " + std::to_string(grad.size()));
    float* pw = w.data();
    const float* pg = grad.data();
    for (std::size_t k = 0; k < w.size(); ++k) pw[k] -= learning_rate * pg[k];
  }

  /// Accuracy and mean loss at weights w on the first `limit` examples of d (0: all).
  evaluation evaluate(span<const float> w, const dataset& d, std::size_t limit = 0) {
    check(w, d, "evaluate");
    return detail::evaluate_examples(d, limit, logits_.data(), classes_,
                                     [&](const float* x, std::uint8_t y) { return forward(w, x, y); });
  }

private:
  void check(span<const float> w, const dataset& d, const char* who) const {
    if (w.size() != parameter_count())
      throw invalid_parameter_error(std::string("cadence::train::softmax_regression::") + who + ": weights have " +
                                    std::to_string(w.size()) + " values, expected " +
                                    std::to_string(parameter_count()));
    detail::check_fits(d, features_, classes_, "cadence::train::softmax_regression", who);
  }

  /// Leaves the softmax probabilities of x in logits_ and returns -log p(label).
  double forward(span<const float> w, const float* x, std::uint8_t label) noexcept {
    const float* bias = w.data() + classes_ * features_;
    for (std::size_t c = 0; c < classes_; ++c)
      logits_[c] = detail::dot8(w.data() + c * features_, x, features_) + bias[c];
    return detail::softmax_cross_entropy(logits_.data(), classes_, label);
  }

  std::size_t features_;
  std::size_t classes_;
  std::size_t max_batch_;
  std::vector<float> logits_;
};

}  // namespace cadence::train
