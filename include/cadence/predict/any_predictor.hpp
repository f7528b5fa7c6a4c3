/// \file
/// \ingroup predict
/// any_predictor: a type-erased predictor with value semantics, and make_predictor, which
/// builds one from a config string ("last", "mean:k", "median:k", "ewma:alpha").
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>
#include <cadence/predict/interval.hpp>
#include <cadence/predict/predictor.hpp>

#include <charconv>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace cadence {
/// \addtogroup predict
/// @{

/// Holds any predictor of T timestamps (is_predictor_v<P, T>) by value: copies copy the
/// predictor. Construction and copies allocate; predict() does not (one virtual call).
/// A default-constructed any_predictor is last_interval, the paper's predictor.
template <class T = double>
class any_predictor {
  struct concept_t {
    virtual ~concept_t() = default;
    virtual void predict(span<const T> history, std::size_t r, T* out) const = 0;
    virtual std::size_t min_history() const = 0;
    virtual std::string name() const = 0;
    virtual std::unique_ptr<concept_t> clone() const = 0;
  };
  template <class P>
  struct model_t final : concept_t {
    explicit model_t(P p) : p_(std::move(p)) {}
    void predict(span<const T> history, std::size_t r, T* out) const override {
      p_.predict(history, r, out);
    }
    std::size_t min_history() const override { return static_cast<std::size_t>(p_.min_history()); }
    std::string name() const override { return p_.name(); }
    std::unique_ptr<concept_t> clone() const override { return std::make_unique<model_t>(p_); }
    P p_;
  };

public:
  /// The timestamp type it predicts.
  using value_type = T;

  /// last_interval, the paper's predictor.
  any_predictor() : self_(std::make_unique<model_t<last_interval>>(last_interval{})) {}

  /// Holds a copy of predictor p; a P that is not a predictor of T fails to compile with a
  /// static_assert naming the requirements.
  template <class P, class D = std::decay_t<P>,
            class = std::enable_if_t<!std::is_same_v<D, any_predictor>>>
  any_predictor(P&& p) : self_(std::make_unique<model_t<D>>(std::forward<P>(p))) {
    static_assert(is_predictor_v<D, T>,
                  "cadence::any_predictor<T>: P must satisfy cadence::is_predictor_v<P, T> "
                  "(predict(span<const T>, size_t, T*) const, min_history(), name(), copyable)");
  }

  ///@{
  /// A copy holds its own copy of the predictor. A moved-from any_predictor may only be
  /// assigned to or destroyed.
  any_predictor(const any_predictor& o) : self_(o.self_->clone()) {}
  any_predictor(any_predictor&& o) noexcept = default;
  any_predictor& operator=(const any_predictor& o) {
    if (this != &o) self_ = o.self_->clone();
    return *this;
  }
  any_predictor& operator=(any_predictor&& o) noexcept = default;
  ///@}
  ~any_predictor() = default;

  /// Writes the next r push times after history into out[0..r); see is_predictor_v.
  void predict(span<const T> history, std::size_t r, T* out) const {
    self_->predict(history, r, out);
  }
  /// The held predictor's min_history().
  std::size_t min_history() const { return self_->min_history(); }
  /// The held predictor's config string ("last", "median:5", ...).
  std::string name() const { return self_->name(); }

private:
  // A moved-from any_predictor may only be assigned to or destroyed.
  std::unique_ptr<concept_t> self_;
};

namespace detail {

[[noreturn]] inline void bad_predictor_spec(std::string_view spec, const std::string& why) {
  throw parse_error("cadence::make_predictor: '" + std::string(spec) + "': " + why +
                    " (valid: last, mean:K, median:K, ewma:ALPHA; K >= 1, 0 < ALPHA <= 1)");
}

inline std::size_t parse_predictor_k(std::string_view spec, std::string_view arg) {
  std::size_t k = 0;
  const auto res = std::from_chars(arg.data(), arg.data() + arg.size(), k);
  if (arg.empty() || res.ec == std::errc::invalid_argument || res.ptr != arg.data() + arg.size())
    bad_predictor_spec(spec, "K must be a decimal integer");
  if (res.ec == std::errc::result_out_of_range) bad_predictor_spec(spec, "K is too large");
  return k;
}

}  // namespace detail

/// Builds a predictor from its config string spec, the same string name() returns:
/// "last", "mean:K", "median:K" (K >= 1; median K <= 64) or "ewma:ALPHA" (0 < ALPHA <= 1).
/// Throws parse_error for malformed strings and invalid_parameter_error for values out of
/// range (mean:0, ewma:1.5, ...).
template <class T = double>
any_predictor<T> make_predictor(std::string_view spec) {
  const auto colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  const std::string_view arg =
      colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  if (kind == "last") {
    if (colon != std::string_view::npos) detail::bad_predictor_spec(spec, "'last' takes no value");
    return any_predictor<T>(last_interval{});
  }
  if (kind == "mean" || kind == "median") {
    if (colon == std::string_view::npos) detail::bad_predictor_spec(spec, "missing ':K'");
    const std::size_t k = detail::parse_predictor_k(spec, arg);
    if (kind == "mean") return any_predictor<T>(mean_interval(k));
    return any_predictor<T>(median_interval(k));
  }
  if (kind == "ewma") {
    if (colon == std::string_view::npos) detail::bad_predictor_spec(spec, "missing ':ALPHA'");
    double alpha = 0;
    const auto res = std::from_chars(arg.data(), arg.data() + arg.size(), alpha);
    if (arg.empty() || res.ec != std::errc() || res.ptr != arg.data() + arg.size())
      detail::bad_predictor_spec(spec, "ALPHA must be a decimal number");
    return any_predictor<T>(ewma(alpha));
  }
  detail::bad_predictor_spec(spec, "unknown predictor");
}

/// @}
}  // namespace cadence
