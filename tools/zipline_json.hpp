// The JSON object cadence-zipline prints per variant:
// {"variant": str, "n": int, "spread": number, "barrier": number, "choice": [int...],
//  "seconds": number}. Kept in a header so its exact shape is unit-tested.
#pragma once

#include <cadence/zipline/result.hpp>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

namespace cadence::tools {

namespace detail {

/// Shortest round-trip text of a number; JSON has no NaN or infinity, so those become null.
template <class N>
void append_json_number(std::string& out, N v) {
  if constexpr (std::is_floating_point_v<N>) {
    if (!std::isfinite(v)) {
      out += "null";
      return;
    }
    char buf[64];
    const auto res = std::to_chars(buf, buf + sizeof buf, static_cast<double>(v));
    out.append(buf, res.ptr);
  } else {
    char buf[32];
    const auto res = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, res.ptr);
  }
}

inline void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      const char* hex = "0123456789abcdef";
      buf[0] = '\\';
      buf[1] = 'u';
      buf[2] = '0';
      buf[3] = '0';
      buf[4] = hex[(c >> 4) & 0xf];
      buf[5] = hex[c & 0xf];
      out.append(buf, 6);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

}  // namespace detail

/// A number as zipline_result_json writes it (shortest round-trip text), for the text output
/// to print the same values.
template <class N>
std::string number_text(N v) {
  std::string out;
  detail::append_json_number(out, v);
  return out;
}

/// One variant's result as a single-line JSON object (no trailing newline). choice[p] is the
/// 0-based index into row p; n is the number of rows.
template <class T>
std::string zipline_result_json(std::string_view variant, const zipline_result<T>& r,
                                double seconds) {
  std::string out;
  out.reserve(64 + 8 * r.choice.size());
  out += "{\"variant\": ";
  detail::append_json_string(out, variant);
  out += ", \"n\": ";
  detail::append_json_number(out, r.choice.size());
  out += ", \"spread\": ";
  detail::append_json_number(out, r.spread);
  out += ", \"barrier\": ";
  detail::append_json_number(out, r.barrier);
  out += ", \"choice\": [";
  for (std::size_t p = 0; p < r.choice.size(); ++p) {
    if (p) out += ", ";
    detail::append_json_number(out, r.choice[p]);
  }
  out += "], \"seconds\": ";
  detail::append_json_number(out, seconds);
  out += "}";
  return out;
}

}  // namespace cadence::tools
