/// \file
/// \ingroup exchange
/// The outer optimizers of the local-SGD family (DiLoCo): what a sync does with the averaged
/// pseudo-gradient (global minus local weights). Small value types (outer_sgd, outer_nesterov,
/// outer_adam) checked by a trait, and any_outer_optimizer with make_outer_optimizer for a
/// choice made at run time ("sgd:1", "nesterov:0.7:0.9", "adam:0.001").
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/core/span.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

// A type O is an outer optimizer when, for `const O& o`, weights `span<float> x`, the averaged
// pseudo-gradient `span<const float> g` of the same length, `float* const* s` (o.state_slots()
// arrays of that length, zero before the first step, kept by the caller between steps) and the
// 1-based count `t` of outer steps these elements have taken:
//  1. o.state_slots() -> std::size_t: per-element state arrays it keeps (0 for SGD, 1 for the
//     momentum, 2 for Adam's moments). The adapter owns the state, so that a joiner can receive
//     it and a checkpoint can hold it with the global weights.
//  2. o.step(x, g, s, t): x -= the update for g. Deterministic: every rank runs it on the same
//     bytes and must get the same weights, so no randomness and no order that depends on
//     threads. `t` counts per fragment (fragments take outer steps at different times), so
//     Adam's bias correction is right for each.
//  3. o.name() -> std::string: the config string it parses from, canonical.
// Pseudo-gradient here means global minus local (DiLoCo's sign): an SGD step with lr 1 moves
// the global weights to the average of the local ones.
namespace detail {
template <class O, class = void>
struct is_outer_optimizer_impl : std::false_type {};
template <class O>
struct is_outer_optimizer_impl<
    O, std::void_t<decltype(std::declval<const O&>().state_slots()),
                   decltype(std::declval<const O&>().step(std::declval<span<float>>(), std::declval<span<const float>>(),
                                                          std::declval<float* const*>(), std::uint64_t{})),
                   decltype(std::declval<const O&>().name())>>
    : std::bool_constant<std::is_convertible_v<decltype(std::declval<const O&>().state_slots()), std::size_t> &&
                         std::is_convertible_v<decltype(std::declval<const O&>().name()), std::string> &&
                         std::is_copy_constructible_v<O>> {};

// The shortest text that reads back as v (so 0.7f prints "0.7", not its double expansion).
template <class T>
std::string number_text(T v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace detail

/// Whether O models an outer optimizer (the requirements above).
template <class O>
inline constexpr bool is_outer_optimizer_v = detail::is_outer_optimizer_impl<O>::value;

// ---- outer_sgd ----

/// Plain SGD on the pseudo-gradient: x -= lr * g. lr = 1 is model averaging (FedAvg,
/// post-local SGD, periodic_averager); lr < 1 keeps part of the old global weights. Pick it
/// to compare with model averaging, or for every-step synchronisation (H = 1, lr = 1 is
/// exactly data parallel SGD when the inner optimizer is plain SGD).
struct outer_sgd {
  /// The outer learning rate (> 0).
  float lr = 1.0f;

  /// No per-element state.
  std::size_t state_slots() const noexcept { return 0; }
  /// x -= lr * g over the whole span (`s` and `t` unused).
  void step(span<float> x, span<const float> g, float* const* /*s*/, std::uint64_t /*t*/) const noexcept {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] -= lr * g[i];
  }
  /// "sgd:<lr>".
  std::string name() const { return "sgd:" + detail::number_text(lr); }
};

// ---- outer_nesterov ----

/// SGD with Nesterov momentum on the pseudo-gradient, DiLoCo's outer optimizer (arXiv
/// 2311.08105: lr 0.7, momentum 0.9, the defaults here), in PyTorch's form: m = mu m + g,
/// x -= lr (g + mu m). Pick it for DiLoCo as published.
struct outer_nesterov {
  /// The outer learning rate (> 0).
  float lr = 0.7f;
  /// The momentum mu, in [0, 1).
  float momentum = 0.9f;

  /// One slot: the momentum buffer m.
  std::size_t state_slots() const noexcept { return 1; }
  /// m = mu m + g; x -= lr (g + mu m), with m = s[0] (`t` unused).
  void step(span<float> x, span<const float> g, float* const* s, std::uint64_t /*t*/) const noexcept {
    float* m = s[0];
    for (std::size_t i = 0; i < x.size(); ++i) {
      m[i] = momentum * m[i] + g[i];
      x[i] -= lr * (g[i] + momentum * m[i]);
    }
  }
  /// "nesterov:<lr>:<momentum>".
  std::string name() const {
    return "nesterov:" + detail::number_text(lr) + ":" + detail::number_text(momentum);
  }
};

// ---- outer_adam ----

/// Adam on the pseudo-gradient (with bias correction; t counts this fragment's outer steps).
/// DiLoCo's ablation found it less stable than Nesterov; it is here to compare, and for
/// pseudo-gradients whose scale varies a lot between elements.
struct outer_adam {
  float lr = 1e-3f;    ///< the outer learning rate (> 0)
  float beta1 = 0.9f;  ///< first-moment decay, in [0, 1)
  float beta2 = 0.999f;  ///< second-moment decay, in [0, 1)
  float eps = 1e-8f;     ///< added to the root of the second moment (> 0)

  /// Two slots: the first and second moments.
  std::size_t state_slots() const noexcept { return 2; }
  /// m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; x -= lr m^ / (sqrt(v^) + eps), with the
  /// bias-corrected m^ and v^ of step t (>= 1); m = s[0], v = s[1].
  void step(span<float> x, span<const float> g, float* const* s, std::uint64_t t) const noexcept {
    float* m = s[0];
    float* v = s[1];
    const double tt = static_cast<double>(t == 0 ? 1 : t);
    const auto c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), tt));
    const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), tt));
    for (std::size_t i = 0; i < x.size(); ++i) {
      m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
      x[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
  /// "adam:<lr>:<beta1>:<beta2>:<eps>".
  std::string name() const {
    return "adam:" + detail::number_text(lr) + ":" + detail::number_text(beta1) + ":" +
           detail::number_text(beta2) + ":" + detail::number_text(eps);
  }
};

static_assert(is_outer_optimizer_v<outer_sgd> && is_outer_optimizer_v<outer_nesterov> &&
              is_outer_optimizer_v<outer_adam>);

// ---- any_outer_optimizer ----

/// One of the three outer optimizers, chosen at run time (a config string, a command line);
/// itself an outer optimizer. Value semantics, no allocation.
class any_outer_optimizer {
public:
  /// DiLoCo's: Nesterov, lr 0.7, momentum 0.9.
  any_outer_optimizer() = default;
  /// Holds `o`.
  any_outer_optimizer(outer_sgd o) : o_(o) {}       // NOLINT: implicit on purpose
  /// Holds `o`.
  any_outer_optimizer(outer_nesterov o) : o_(o) {}  // NOLINT
  /// Holds `o`.
  any_outer_optimizer(outer_adam o) : o_(o) {}      // NOLINT

  /// The held optimizer's state slots.
  std::size_t state_slots() const noexcept {
    return std::visit([](const auto& o) { return o.state_slots(); }, o_);
  }
  /// The held optimizer's step on `x` with pseudo-gradient `g`, state `s`, step count `t`.
  void step(span<float> x, span<const float> g, float* const* s, std::uint64_t t) const noexcept {
    std::visit([&](const auto& o) { o.step(x, g, s, t); }, o_);
  }
  /// The held optimizer's canonical config string.
  std::string name() const {
    return std::visit([](const auto& o) { return o.name(); }, o_);
  }

private:
  std::variant<outer_sgd, outer_nesterov, outer_adam> o_{outer_nesterov{}};
};

namespace detail {
[[noreturn]] inline void bad_outer_spec(std::string_view spec, const std::string& why) {
  throw parse_error("cadence: outer optimizer '" + std::string(spec) + "': " + why +
                    " (valid: sgd[:LR], nesterov[:LR[:MOMENTUM]], adam[:LR[:BETA1[:BETA2[:EPS]]]])");
}
inline float outer_field(std::string_view spec, std::string_view field, const char* what, double lo, double hi,
                         bool lo_open, bool hi_open) {
  double v = 0;
  const auto r = std::from_chars(field.data(), field.data() + field.size(), v);
  if (field.empty() || r.ec != std::errc() || r.ptr != field.data() + field.size() || !std::isfinite(v))
    bad_outer_spec(spec, std::string(what) + " '" + std::string(field) + "' is not a number");
  const bool low = lo_open ? !(v > lo) : !(v >= lo);
  const bool high = hi_open ? !(v < hi) : !(v <= hi);
  if (low || high)
    bad_outer_spec(spec, std::string(what) + " " + std::string(field) + " is not in " + (lo_open ? "(" : "[") +
                             number_text(lo) + ", " + number_text(hi) + (hi_open ? ")" : "]"));
  return static_cast<float>(v);
}

// One field of an outer optimizer's spec: where it goes, its name and its range (open or closed
// at either end).
template <class O>
struct outer_param {
  float O::*member;
  const char* name;
  double lo, hi;
  bool lo_open, hi_open;
};

// The optimizer of kind O with the fields after the kind, f[1], f[2], ..., read into `params` in
// order (those not given keep O's defaults); more fields than params fail with `takes`.
template <class O, std::size_t N>
O read_outer_params(std::string_view spec, const std::vector<std::string_view>& f, const outer_param<O> (&params)[N],
                    const char* takes) {
  if (f.size() > N + 1) bad_outer_spec(spec, takes);
  O o;
  for (std::size_t k = 1; k < f.size(); ++k) {
    const outer_param<O>& p = params[k - 1];
    o.*p.member = outer_field(spec, f[k], p.name, p.lo, p.hi, p.lo_open, p.hi_open);
  }
  return o;
}
}  // namespace detail

/// The outer optimizer `spec` names: "sgd[:lr]" (lr 1), "nesterov[:lr[:momentum]]" (0.7, 0.9),
/// "adam[:lr[:beta1[:beta2[:eps]]]]" (0.001, 0.9, 0.999, 1e-8). Throws parse_error naming
/// the string and the field that is wrong.
inline any_outer_optimizer make_outer_optimizer(std::string_view spec) {
  std::vector<std::string_view> f;
  for (std::size_t start = 0;;) {
    const std::size_t at = spec.find(':', start);
    f.push_back(spec.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  constexpr double big = 1e6;
  if (f[0] == "sgd")
    return detail::read_outer_params<outer_sgd>(spec, f, {{&outer_sgd::lr, "lr", 0, big, true, false}},
                                                "sgd takes at most a learning rate");
  if (f[0] == "nesterov")
    return detail::read_outer_params<outer_nesterov>(spec, f,
                                                     {{&outer_nesterov::lr, "lr", 0, big, true, false},
                                                      {&outer_nesterov::momentum, "momentum", 0, 1, false, true}},
                                                     "nesterov takes at most lr and momentum");
  if (f[0] == "adam")
    return detail::read_outer_params<outer_adam>(spec, f,
                                                 {{&outer_adam::lr, "lr", 0, big, true, false},
                                                  {&outer_adam::beta1, "beta1", 0, 1, false, true},
                                                  {&outer_adam::beta2, "beta2", 0, 1, false, true},
                                                  {&outer_adam::eps, "eps", 0, 1, true, false}},
                                                 "adam takes at most lr, beta1, beta2 and eps");
  detail::bad_outer_spec(spec, "unknown kind '" + std::string(f[0]) + "'");
}

/// @}
}  // namespace cadence::exchange
