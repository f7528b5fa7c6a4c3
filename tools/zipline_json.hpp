// The JSON object cadence-zipline prints per variant:
// {"variant": str, "n": int, "spread": number, "barrier": number, "choice": [int...],
//  "seconds": number}. Kept in a header so its exact shape is unit-tested.
#pragma once

#include "json.hpp"

#include <cadence/zipline/result.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace cadence::tools {

/// A number for the text output, as the JSON writes it where the two agree: integers exactly,
/// doubles in their shortest round-trip form ("5.5", "0.1"; an integral double without ".0").
template <class N>
std::string number_text(N v) {
  if constexpr (std::is_floating_point_v<N>) {
    if (!std::isfinite(v)) return "null";
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

/// One variant's result: choice[p] is the 0-based index into row p; n is the number of rows.
template <class T>
json zipline_result_json(std::string_view variant, const zipline_result<T>& r, double seconds) {
  return json{{"variant", variant},        {"n", r.choice.size()},   {"spread", r.spread},
              {"barrier", r.barrier},      {"choice", r.choice},     {"seconds", seconds}};
}

}  // namespace cadence::tools
