// Parsing command lines for Cadence's tools: a reader for "--flag value" / "--flag=value"
// arguments, and integers, reals and "a,b" pairs with range checks and messages that name the
// flag. Kept in a header so the rules are unit-tested and every tool follows the same ones.
#pragma once

#include <cadence/core/error.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace cadence::tools {

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

/// Parses a real number for `flag`: finite, and > 0 (or >= 0 with allow_zero), at most max.
/// Throws parse_error "FLAG: expected a number > 0, got 'TEXT'" (">= 0" with allow_zero).
inline double parse_flag_real(std::string_view flag, std::string_view text, bool allow_zero = false,
                              double max = 1e12) {
  // std::from_chars for double is missing from some standard libraries; strtod is enough.
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v < 0 ||
      (v == 0 && !allow_zero) || v > max)
    throw parse_error(std::string(flag) + ": expected a number " + (allow_zero ? ">= 0" : "> 0") +
                      ", got '" + s + "'");
  return v;
}

/// A bad command line (as opposed to bad input data): tools exit with status 2 for it.
class usage_error : public parse_error {
public:
  using parse_error::parse_error;
};

/// Walks argv[1..argc) as flags, each "--flag value" or "--flag=value":
///   for (flag_reader args(argc, argv); args.next();)
///     if (args.flag() == "--seed") seed = parse_flag_integer<...>(args.flag(), args.value(), ...);
///     else if (args.flag() == "--json") { args.no_value(); json = true; }
///     else args.unknown();
/// Errors are usage_error naming the flag.
class flag_reader {
public:
  flag_reader(int argc, char** argv) noexcept : argc_(argc), argv_(argv) {}

  /// Moves to the next argument; false when there is none.
  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    inline_ = false;
    if (const auto eq = flag_.find('='); flag_.rfind("--", 0) == 0 && eq != std::string_view::npos) {
      value_ = flag_.substr(eq + 1);
      flag_ = flag_.substr(0, eq);
      inline_ = true;
    }
    return true;
  }
  /// The current flag, without any "=value".
  std::string_view flag() const noexcept { return flag_; }
  /// The current flag's value: after '=' or the next argument.
  std::string_view value() {
    if (inline_) return value_;
    if (i_ + 1 >= argc_) throw usage_error(std::string(flag_) + ": missing value");
    return argv_[++i_];
  }
  /// For flags that take no value: rejects "--flag=value".
  void no_value() const {
    if (inline_) throw usage_error(std::string(flag_) + ": takes no value");
  }
  /// Throws the error for an unknown option.
  [[noreturn]] void unknown() const {
    throw usage_error("unknown option '" + std::string(argv_[i_]) + "' (see --help)");
  }

private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string_view flag_, value_;
  bool inline_ = false;
};

}  // namespace cadence::tools
