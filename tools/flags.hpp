// The command lines of Cadence's tools, apps and command-line benchmarks, on CLI11: the rules
// CLI11 does not have (strict integers, reals and "A,B" pairs with bounds, each error naming
// the flag and the rule it broke; a flag at most once unless it is repeatable; flags that
// exclude each other; a flag takes no "=value"), the help layout the tools share, and main's
// exit status. Kept in a header so the rules are unit-tested. Not part of the library.
//
//   ---- usage_error ----           a bad command line (exit status 2)
//   ---- values ----                parse_integer, parse_pair, parse_real: the rule a text broke
//   ---- validators ----            the same rules as CLI11 checks: integer, integer_pair, real...
//   ---- help_formatter ----        usage, description, groups of flags, footer
//   ---- command_line ----          a CLI::App with the rules between flags and read()
//   ---- guarded_main ----          exceptions to "TOOL: error: ..." and an exit status
#pragma once

#include <CLI/CLI.hpp>
#include <cadence/core/error.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace cadence::tools {

// ---- usage_error ----

/// A bad command line (as opposed to bad input data): tools exit with status 2 for it.
class usage_error : public parse_error {
public:
  using parse_error::parse_error;
};

// ---- values ----

namespace detail {

/// "WHAT " or "" (WHAT names the value as the usage text does: "R", "N").
inline std::string what_prefix(std::string_view what) {
  return what.empty() ? std::string() : std::string(what) + ' ';
}

inline std::string number_text(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

}  // namespace detail

/// Parses a decimal integer and checks min <= value <= max. `what` names the value in messages
/// when the flag has several or a usage name ("R" for "--lookahead R"). Throws usage_error
/// "[WHAT ]'TEXT' is not an integer", "[WHAT ]must be at least MIN, got TEXT" or "[WHAT ]must
/// be at most MAX, got TEXT" (CLI11 puts "FLAG: " before it).
template <class I>
I parse_integer(std::string_view text, I min, I max, std::string_view what = {}) {
  static_assert(std::is_integral_v<I>, "cadence::tools::parse_integer: I must be an integer type");
  const std::string prefix = detail::what_prefix(what);
  const auto too_small = [&] {
    return usage_error(prefix + "must be at least " + std::to_string(min) + ", got " + std::string(text));
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
  if (text.empty() || res.ptr != text.data() + text.size() || res.ec == std::errc::invalid_argument)
    throw usage_error(prefix + "'" + std::string(text) + "' is not an integer");
  const bool negative = text.front() == '-';
  if ((res.ec == std::errc::result_out_of_range && negative) || v < min) throw too_small();
  if (res.ec == std::errc::result_out_of_range || v > max)
    throw usage_error(prefix + "must be at most " + std::to_string(max) + ", got " + std::string(text));
  return v;
}

/// Splits "A,B" into its two parts; first and second name them as the usage text does ("N"
/// and "T" for "--generate N,T"; "A" and "B" when empty). Throws usage_error "expected
/// 'N,T' (two integers), got 'TEXT'" unless there is exactly one comma.
inline std::pair<std::string_view, std::string_view> split_pair(std::string_view text, std::string_view first = {},
                                                                std::string_view second = {}) {
  const auto comma = text.find(',');
  if (comma == std::string_view::npos || text.find(',', comma + 1) != std::string_view::npos)
    throw usage_error("expected '" + std::string(first.empty() ? "A" : first) + "," +
                      std::string(second.empty() ? "B" : second) + "' (two integers), got '" + std::string(text) +
                      "'");
  return {text.substr(0, comma), text.substr(comma + 1)};
}

/// Parses "A,B", each an integer in [min, max]; first and second name the parts in messages as
/// parse_integer's `what`. Throws usage_error as split_pair and parse_integer do.
template <class I>
std::pair<I, I> parse_pair(std::string_view text, I min, I max, std::string_view first = {},
                           std::string_view second = {}) {
  const auto [a, b] = split_pair(text, first, second);
  return {parse_integer<I>(a, min, max, first), parse_integer<I>(b, min, max, second)};
}

/// Parses a real number: finite, > 0 (or >= 0 with allow_zero) and at most max. Throws
/// usage_error "expected a number > 0, got 'TEXT'" (">= 0" with allow_zero; "a finite number"
/// for NaN and infinities) or "must be at most MAX, got TEXT".
inline double parse_real(std::string_view text, bool allow_zero = false, double max = 1e12) {
  // std::from_chars for double is missing from some standard libraries; strtod is enough.
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  const bool number = !s.empty() && end == s.c_str() + s.size();
  if (!number || !std::isfinite(v) || v < 0 || (v == 0 && !allow_zero))
    throw usage_error(std::string("expected a ") + (number && !std::isfinite(v) ? "finite " : "") + "number " +
                      (allow_zero ? ">= 0" : "> 0") + ", got '" + s + "'");
  if (v > max) throw usage_error("must be at most " + detail::number_text(max) + ", got " + s);
  return v;
}

/// A rule's message with the flag before it, as CLI11 words a validator's: "FLAG: MESSAGE".
/// For values that come from elsewhere than argv (an environment variable).
template <class Parse>
auto with_flag(std::string_view flag, Parse parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const usage_error& e) {
    throw usage_error(std::string(flag) + ": " + e.what());
  }
}

// ---- validators: the rules above as CLI11 checks them, before it converts the text ----

/// A validator from `check(text)`, which throws usage_error with the rule a text broke (CLI11
/// puts "FLAG: " before it) and may rewrite the text into the form CLI11 converts.
template <class Check>
CLI::Validator checked(Check check, std::string description = {}) {
  return CLI::Validator(
      [check](std::string& text) {
        try {
          check(text);
          return std::string();
        } catch (const usage_error& e) {
          return std::string(e.what());
        }
      },
      std::move(description));
}

/// An integer in [min, max] (parse_integer).
template <class I>
CLI::Validator integer(I min, I max, std::string what = {}) {
  return checked([=](std::string& text) { text = std::to_string(parse_integer<I>(text, min, max, what)); },
                 "INTEGER in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

/// A real number > 0 and at most max (parse_real).
inline CLI::Validator positive(double max = 1e12) {
  return checked([=](std::string& text) { (void)parse_real(text, false, max); }, "NUMBER > 0");
}

/// A real number >= 0 and at most max (parse_real).
inline CLI::Validator non_negative(double max = 1e12) {
  return checked([=](std::string& text) { (void)parse_real(text, true, max); }, "NUMBER >= 0");
}

/// "A,B", two integers in [min, max] (parse_pair).
template <class I>
CLI::Validator integer_pair(I min, I max, std::string first, std::string second) {
  return checked([=](std::string& text) { (void)parse_pair<I>(text, min, max, first, second); },
                 first + "," + second);
}

/// Any text but the empty one: "expected EXPECTED, got ''".
inline CLI::Validator not_empty(std::string expected) {
  return checked([=](std::string& text) {
    if (text.empty()) throw usage_error("expected " + expected + ", got ''");
  });
}

/// One of `choices`: "expected mpi, gloo or zmq, got 'tcp'".
inline CLI::Validator one_of(std::vector<std::string> choices) {
  std::string list;
  for (std::size_t k = 0; k < choices.size(); ++k)
    list += (k == 0 ? "" : k + 1 == choices.size() ? " or " : ", ") + choices[k];
  return checked([=](std::string& text) {
    if (std::find(choices.begin(), choices.end(), text) == choices.end())
      throw usage_error("expected " + list + ", got '" + text + "'");
  });
}

// ---- help_formatter ----

/// The tools' --help: the usage lines, the description, then each group of flags as
///   GROUP:
///     --flag VALUE       what it does, its lines kept
/// with the value's name from Option::option_text and descriptions at `column`, then the footer.
class help_formatter : public CLI::Formatter {
public:
  help_formatter(std::string usage, std::size_t column) : usage_(std::move(usage)) { column_width(column); }

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::ostringstream out;
    out << usage_;
    if (!app->get_description().empty()) out << '\n' << app->get_description();
    for (const std::string& group : app->get_groups()) {
      const auto opts = app->get_options(
          [&group](const CLI::Option* o) { return o->get_group() == group && o->nonpositional(); });
      if (group.empty() || opts.empty()) continue;  // a group "" is hidden
      out << '\n' << group << ":\n";
      for (const CLI::Option* o : opts) out << make_option(o, false);
    }
    if (!app->get_footer().empty()) out << '\n' << app->get_footer();
    return out.str();
  }
  // "--flag": the long name alone ("-h" is accepted but not listed).
  std::string make_option_name(const CLI::Option* o, bool) const override {
    return o->get_lnames().empty() ? "-" + o->get_snames().front() : "--" + o->get_lnames().front();
  }
  // " VALUE" from option_text, nothing else (no types, defaults or "Excludes:").
  std::string make_option_opts(const CLI::Option* o) const override {
    return o->get_option_text().empty() ? std::string() : " " + o->get_option_text();
  }

private:
  std::string usage_;
};

// ---- command_line ----

/// A CLI::App with the tools' rules: declare the flags with add_option/add_flag (the value's
/// name in option_text, the rule in check), repeatable ones with add_list, --seed with
/// add_seed, groups of flags that exclude each other with at_most_one_of, then read(argc, argv):
///   cadence::tools::command_line cli("usage: tool [options]\n", "What it does.\n");
///   cli.add_option("--workers", workers, "number of workers (default 16)")->option_text("N")
///       ->check(cadence::tools::integer<std::size_t>(1, 100000));
///   cli.add_flag("--json", json, "print JSON");
///   cli.at_most_one_of({"--json", "--csv"});
///   if (!cli.read(argc, argv)) { std::cout << cli.help(); return 0; }
/// Every flag may be given once unless it is repeatable; a flag without a value takes no
/// "=value"; every error is a usage_error that names the flag.
class command_line : public CLI::App {
public:
  /// `usage`: the first lines of --help ("usage: ...\n"); `description`: what follows them;
  /// `column`: where flag descriptions start.
  command_line(std::string usage, std::string description = {}, std::size_t column = 21)
      : CLI::App(std::move(description)) {
    formatter(std::make_shared<help_formatter>(std::move(usage), column));
    set_help_flag();  // added last (add_help), so that it is listed last
    option_defaults()
        ->group("options")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)  // read() says "given twice"
        ->disable_flag_override();
    allow_extras();  // read() names the first one
  }

  /// A repeatable flag: each occurrence adds one value.
  template <class T>
  CLI::Option* add_list(std::string name, std::vector<T>& values, std::string help) {
    return add_option(std::move(name), values, std::move(help))
        ->allow_extra_args(false)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }

  /// --seed: any 64-bit unsigned integer (a seed gives the same run every time); `value_name`
  /// names it in --help.
  CLI::Option* add_seed(std::uint64_t& seed, std::string value_name, std::string help) {
    return add_option("--seed", seed, std::move(help))
        ->option_text(std::move(value_name))
        ->check(integer<std::uint64_t>(0, UINT64_MAX));
  }

  /// --help (and -h) with this description, in the group of the flags declared before it.
  /// read() adds it with "this text" when it is missing.
  command_line& add_help(std::string text = "this text") {
    set_help_flag("--help,-h", std::move(text));
    return *this;
  }

  /// Flags of which a command line may give at most one: read() rejects the second with
  /// "SECOND: cannot be combined with FIRST" (groups of three or more add "(give at most one of
  /// A, B, C)"). Flags are written with their "--".
  command_line& at_most_one_of(std::initializer_list<std::string> group) {
    groups_.emplace_back(group);
    return *this;
  }

  /// Reads argv[1..argc). Returns false when --help was given (the caller prints help() and
  /// exits 0). Throws usage_error naming the flag for a bad value (the validators' rules), a
  /// flag given twice, flags of one at_most_one_of group together, a missing value, a value
  /// given to a flag that takes none, or an unknown option.
  bool read(int argc, const char* const* argv) {
    if (get_help_ptr() == nullptr) add_help();
    try {
      parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      return false;
    } catch (const CLI::ParseError& e) {
      throw usage_error(message_of(e));
    }
    const auto extra = remaining();
    if (!extra.empty()) throw usage_error("unknown option '" + extra.front() + "' (see --help)");
    check_order();
    return true;
  }
  bool read(int argc, char** argv) { return read(argc, const_cast<const char* const*>(argv)); }

  /// Whether `flag` ("--seed") was given.
  bool given(const std::string& flag) const { return count(flag) > 0; }

private:
  // CLI11's words for a missing value and a value given to a flag, in the tools' words.
  static std::string message_of(const CLI::ParseError& e) {
    std::string m = e.what();
    const std::string missing = " missing", override = " was given a disallowed flag override";
    const auto colon = m.find(": ");
    if (e.get_name() == "ArgumentMismatch" && colon != std::string::npos && m.find(" required ") != std::string::npos &&
        m.size() > missing.size() && m.compare(m.size() - missing.size(), missing.size(), missing) == 0)
      return m.substr(0, colon) + ": missing value";
    if (m.size() > override.size() && m.compare(m.size() - override.size(), override.size(), override) == 0)
      return "--" + m.substr(0, m.size() - override.size()) + ": takes no value";
    return m;
  }

  // The rules between flags, in the order of the command line: the first offence is reported.
  void check_order() const {
    std::vector<std::string> seen;
    for (const CLI::Option* o : parse_order()) {
      const std::string flag = o->get_name();
      const bool repeatable = o->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
      if (!repeatable && std::find(seen.begin(), seen.end(), flag) != seen.end())
        throw usage_error(flag + ": given twice");
      for (const auto& group : groups_) {
        if (std::find(group.begin(), group.end(), flag) == group.end()) continue;
        for (const auto& earlier : seen) {
          if (earlier == flag || std::find(group.begin(), group.end(), earlier) == group.end()) continue;
          std::string msg = flag + ": cannot be combined with " + earlier;
          if (group.size() > 2) {
            msg += " (give at most one of ";
            for (std::size_t k = 0; k < group.size(); ++k) msg += (k ? ", " : "") + group[k];
            msg += ")";
          }
          throw usage_error(msg);
        }
      }
      seen.push_back(flag);
    }
  }

  std::vector<std::vector<std::string>> groups_;
};

// ---- guarded_main ----

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
