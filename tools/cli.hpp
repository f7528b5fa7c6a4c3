// Parsing command lines for Cadence's tools: a reader for "--flag value" / "--flag=value"
// arguments that also enforces which flags exclude each other, integers, reals and "a,b"
// pairs with bounds, and main's exit status. Kept in a header so the rules are unit-tested
// and every tool words them the same way.
#pragma once

#include <cadence/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::tools {

/// A bad command line (as opposed to bad input data): tools exit with status 2 for it.
class usage_error : public parse_error {
public:
  using parse_error::parse_error;
};

namespace detail {

/// "FLAG: " or "FLAG: WHAT " (WHAT names the value as the usage text does: "R", "N").
inline std::string flag_prefix(std::string_view flag, std::string_view what) {
  std::string s(flag);
  s += ": ";
  if (!what.empty()) {
    s += what;
    s += ' ';
  }
  return s;
}

inline std::string number_text(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

}  // namespace detail

/// Parses a decimal integer for `flag` and checks min <= value <= max. `what` names the value
/// in messages when the flag has several or a usage name ("R" for "--lookahead R"). Throws
/// usage_error "FLAG: [WHAT ]'TEXT' is not an integer", "FLAG: [WHAT ]must be at least MIN,
/// got TEXT" or "FLAG: [WHAT ]must be at most MAX, got TEXT".
template <class I>
I parse_flag_integer(std::string_view flag, std::string_view text, I min, I max,
                     std::string_view what = {}) {
  static_assert(std::is_integral_v<I>, "cadence::parse_flag_integer: I must be an integer type");
  const std::string prefix = detail::flag_prefix(flag, what);
  const auto too_small = [&] {
    return usage_error(prefix + "must be at least " + std::to_string(min) + ", got " +
                       std::string(text));
  };
  // Negative text for an unsigned type is a number below the bound, not a malformed one.
  if constexpr (std::is_unsigned_v<I>) {
    if (text.size() > 1 && text.front() == '-' &&
        std::all_of(text.begin() + 1, text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      if (text.find_first_not_of("-0") != std::string_view::npos || min > 0) throw too_small();
      return I{0};  // "-0"
    }
  }
  I v{};
  const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || res.ptr != text.data() + text.size() ||
      res.ec == std::errc::invalid_argument)
    throw usage_error(prefix + "'" + std::string(text) + "' is not an integer");
  const bool negative = text.front() == '-';
  if ((res.ec == std::errc::result_out_of_range && negative) || v < min) throw too_small();
  if (res.ec == std::errc::result_out_of_range || v > max)
    throw usage_error(prefix + "must be at most " + std::to_string(max) + ", got " +
                      std::string(text));
  return v;
}

/// Splits "A,B" for `flag` into its two parts; first and second name them as the usage text
/// does ("N" and "T" for "--generate N,T"; "A" and "B" when empty). Throws usage_error
/// "FLAG: expected 'N,T' (two integers), got 'TEXT'" unless there is exactly one comma.
inline std::pair<std::string_view, std::string_view> split_flag_pair(std::string_view flag,
                                                                     std::string_view text,
                                                                     std::string_view first = {},
                                                                     std::string_view second = {}) {
  const auto comma = text.find(',');
  if (comma == std::string_view::npos || text.find(',', comma + 1) != std::string_view::npos)
    throw usage_error(std::string(flag) + ": expected '" +
                      std::string(first.empty() ? "A" : first) + "," +
                      std::string(second.empty() ? "B" : second) + "' (two integers), got '" +
                      std::string(text) + "'");
  return {text.substr(0, comma), text.substr(comma + 1)};
}

/// Parses "A,B" for `flag`, each an integer in [min, max]; first and second name the parts
/// in messages as for parse_flag_integer's `what`. Throws usage_error as split_flag_pair and
/// parse_flag_integer do.
template <class I>
std::pair<I, I> parse_flag_pair(std::string_view flag, std::string_view text, I min, I max,
                                std::string_view first = {}, std::string_view second = {}) {
  const auto [a, b] = split_flag_pair(flag, text, first, second);
  return {parse_flag_integer<I>(flag, a, min, max, first),
          parse_flag_integer<I>(flag, b, min, max, second)};
}

/// Parses a real number for `flag`: finite, > 0 (or >= 0 with allow_zero) and at most max.
/// Throws usage_error "FLAG: expected a number > 0, got 'TEXT'" (">= 0" with allow_zero;
/// "a finite number" for NaN and infinities) or "FLAG: must be at most MAX, got TEXT".
inline double parse_flag_real(std::string_view flag, std::string_view text, bool allow_zero = false,
                              double max = 1e12) {
  // std::from_chars for double is missing from some standard libraries; strtod is enough.
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  const bool number = !s.empty() && end == s.c_str() + s.size();
  if (!number || !std::isfinite(v) || v < 0 || (v == 0 && !allow_zero))
    throw usage_error(std::string(flag) + ": expected a " +
                      (number && !std::isfinite(v) ? "finite " : "") + "number " +
                      (allow_zero ? ">= 0" : "> 0") + ", got '" + s + "'");
  if (v > max)
    throw usage_error(std::string(flag) + ": must be at most " + detail::number_text(max) +
                      ", got " + s);
  return v;
}

/// Walks argv[1..argc) as flags, each "--flag value" or "--flag=value":
///   flag_reader args(argc, argv);
///   args.at_most_one_of({"--json", "--csv"});
///   while (args.next())
///     if (args.flag() == "--seed") seed = parse_flag_integer<...>(args.flag(), args.value(), ...);
///     else if (args.flag() == "--json") { args.no_value(); json = true; }
///     else args.unknown();
/// Errors are usage_error naming the flag.
class flag_reader {
public:
  flag_reader(int argc, char** argv) noexcept : argc_(argc), argv_(argv) {}

  /// Declares flags of which a command line may give at most one, once: next() rejects the
  /// second with "SECOND: cannot be combined with FIRST" (groups of three or more add
  /// "(give at most one of A, B, C)"), or "FLAG: given twice". A group of one flag only
  /// forbids repeating it. Flags are written with their "--"; declare before next().
  flag_reader& at_most_one_of(std::initializer_list<std::string_view> group) {
    groups_.emplace_back(group.begin(), group.end());
    return *this;
  }
  /// Each of `flags` at most once: a group of one per flag.
  flag_reader& at_most_once(std::initializer_list<std::string_view> flags) {
    for (const auto flag : flags) groups_.push_back({std::string(flag)});
    return *this;
  }

  /// Moves to the next argument; false when there is none. Throws usage_error when it breaks
  /// an at_most_one_of group.
  bool next() {
    if (++i_ >= argc_) return false;
    flag_ = argv_[i_];
    inline_ = has_value_ = false;
    if (const auto eq = flag_.find('='); flag_.rfind("--", 0) == 0 && eq != std::string_view::npos) {
      value_ = flag_.substr(eq + 1);
      flag_ = flag_.substr(0, eq);
      inline_ = has_value_ = true;
    }
    check_groups();
    given_.push_back(flag_);
    return true;
  }
  /// The current flag, without any "=value".
  std::string_view flag() const noexcept { return flag_; }
  /// The current flag's value: after '=' or the next argument (taken once, so calling
  /// value() again returns the same text instead of consuming another argument).
  std::string_view value() {
    if (!has_value_) {
      if (i_ + 1 >= argc_) throw usage_error(std::string(flag_) + ": missing value");
      value_ = argv_[++i_];
      has_value_ = true;
    }
    return value_;
  }
  /// For flags that take no value: rejects "--flag=value".
  void no_value() const {
    if (inline_) throw usage_error(std::string(flag_) + ": takes no value");
  }
  /// Throws the error for an unknown option.
  [[noreturn]] void unknown() const {
    throw usage_error("unknown option '" + std::string(argv_[i_]) + "' (see --help)");
  }
  /// Whether `flag` was among the flags read so far (values are not counted).
  bool given(std::string_view flag) const {
    return std::find(given_.begin(), given_.end(), flag) != given_.end();
  }

private:
  void check_groups() const {
    for (const auto& group : groups_) {
      if (std::find(group.begin(), group.end(), flag_) == group.end()) continue;
      for (const auto earlier : given_) {
        if (std::find(group.begin(), group.end(), earlier) == group.end()) continue;
        const std::string flag(flag_);
        if (earlier == flag_) throw usage_error(flag + ": given twice");
        std::string msg = flag + ": cannot be combined with " + std::string(earlier);
        if (group.size() > 2) {
          msg += " (give at most one of ";
          for (std::size_t k = 0; k < group.size(); ++k) msg += (k ? ", " : "") + group[k];
          msg += ")";
        }
        throw usage_error(msg);
      }
    }
  }

  int argc_;
  char** argv_;
  int i_ = 0;
  std::string_view flag_, value_;
  bool inline_ = false;     // the value came after '='
  bool has_value_ = false;  // value_ holds the current flag's value
  std::vector<std::vector<std::string>> groups_;
  std::vector<std::string_view> given_;  // flags read so far; they point into argv
};

/// Runs `run(argc, argv)` and turns exceptions into "TOOL: error: MESSAGE" on stderr and an
/// exit status: 2 for a bad command line (usage_error), 1 for anything else (bad input data).
template <class Run>
int guarded_main(const char* tool, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace cadence::tools
