// Parsing command-line values for Cadence's tools: integers and "a,b" pairs with range checks
// and messages that name the flag. Kept in a header so the rules are unit-tested.
#pragma once

#include <cadence/core/error.hpp>

#include <charconv>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace cadence {

/// Parses a decimal integer for `flag` and checks min <= value <= max. Throws parse_error
/// "FLAG: 'TEXT' is not an integer" or "FLAG: VALUE is out of range [MIN, MAX]".
template <class I>
I parse_flag_integer(std::string_view flag, std::string_view text, I min, I max) {
  static_assert(std::is_integral_v<I>, "cadence::parse_flag_integer: I must be an integer type");
  I v{};
  const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || res.ptr != text.data() + text.size() ||
      res.ec == std::errc::invalid_argument)
    throw parse_error(std::string(flag) + ": '" + std::string(text) + "' is not an integer");
  if (res.ec == std::errc::result_out_of_range || v < min || v > max)
    throw parse_error(std::string(flag) + ": " + std::string(text) + " is out of range [" +
                      std::to_string(min) + ", " + std::to_string(max) + "]");
  return v;
}

/// Parses "A,B" for `flag`, each an integer in [min, max]. Throws parse_error naming the
/// flag when the comma is missing or either part is bad.
template <class I>
std::pair<I, I> parse_flag_pair(std::string_view flag, std::string_view text, I min, I max) {
  const auto comma = text.find(',');
  if (comma == std::string_view::npos)
    throw parse_error(std::string(flag) + ": expected two integers 'A,B', got '" +
                      std::string(text) + "'");
  return {parse_flag_integer<I>(flag, text.substr(0, comma), min, max),
          parse_flag_integer<I>(flag, text.substr(comma + 1), min, max)};
}

}  // namespace cadence
