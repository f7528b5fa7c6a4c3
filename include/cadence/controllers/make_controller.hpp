/// \file
/// \ingroup controllers
/// Builds a controller from a config string ("bsp", "asp", "ssp:3", "dssp:3:15", ...), so a
/// trainer can take its synchronization policy from a command line or a config file; and tells
/// such a config from a collective mode ("periodic:<k>", "elastic-avg:<R>"), so one flag can
/// take both.
#pragma once

#include <cadence/controllers/any_controller.hpp>
#include <cadence/controllers/dssp.hpp>
#include <cadence/controllers/elastic_bsp.hpp>
#include <cadence/controllers/ssp.hpp>
#include <cadence/core/error.hpp>

#include <charconv>
#include <string>
#include <string_view>
#include <vector>

namespace cadence {
/// \addtogroup controllers
/// @{

namespace detail {

inline std::vector<std::string_view> split_fields(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return out;
}

/// Parses a non-negative integer field of a config string, or throws parse_error naming it.
inline clock_value parse_count(std::string_view config, std::string_view field, const char* what) {
  clock_value v = 0;
  const char* first = field.data();
  const char* last = field.data() + field.size();
  const auto [ptr, ec] = std::from_chars(first, last, v);
  if (field.empty() || ec != std::errc() || ptr != last || v < 0)
    throw parse_error("cadence: bad " + std::string(what) + " '" + std::string(field) +
                      "' in policy '" + std::string(config) + "': expected an integer >= 0");
  return v;
}

/// Runs `build` (a constructor, or the predictor or variant parser), which does not know the
/// config string, and puts the string and the worker count in front of its message, so the
/// user sees which setting to fix. The exception keeps its type.
template <class F>
auto naming_config(std::string_view config, std::size_t workers, F&& build) -> decltype(build()) {
  const auto context = [&] {
    return "cadence: policy '" + std::string(config) + "' for " + std::to_string(workers) +
           " workers: ";
  };
  try {
    return build();
  } catch (const invalid_parameter_error& e) {
    throw invalid_parameter_error(context() + e.what());
  } catch (const parse_error& e) {
    throw parse_error(context() + e.what());
  }
}

/// The fields of an "elastic:<R>[:<predictor>][:<variant>]" config string, checked for shape
/// (R an integer >= 0, a known predictor kind with its value, at most one variant field) but
/// not for range: the consumer (the elastic_bsp controller, the collective elastic_averager)
/// builds its predictor and variant from these strings and reports values out of range. One
/// parser, so both accept exactly the same strings.
struct elastic_config {
  std::size_t lookahead = 0;
  std::string predictor = "last";  // a make_predictor spec: "last", "median:5", ...
  std::string variant = "fast";    // a parse_zipline_variant name
};

inline elastic_config parse_elastic_config(std::string_view config) {
  const auto f = split_fields(config, ':');
  if (f[0] != "elastic" || f.size() < 2)
    throw parse_error("cadence: policy '" + std::string(config) +
                      "' must look like 'elastic:<R>[:<predictor>][:<variant>]'");
  elastic_config out;
  out.lookahead = static_cast<std::size_t>(parse_count(config, f[1], "lookahead R"));
  std::size_t next = 2;
  if (next < f.size() && (f[next] == "last" || f[next] == "mean" || f[next] == "median" ||
                          f[next] == "ewma")) {
    out.predictor = std::string(f[next++]);
    if (out.predictor != "last") {
      if (next >= f.size())
        throw parse_error("cadence: policy '" + std::string(config) + "': predictor '" +
                          out.predictor + "' needs a value, e.g. " + out.predictor +
                          (out.predictor == "ewma" ? ":0.5" : ":5"));
      out.predictor += ":" + std::string(f[next++]);
    }
  }
  if (next < f.size()) out.variant = std::string(f[next++]);
  if (next < f.size())
    throw parse_error("cadence: policy '" + std::string(config) + "': unexpected field '" +
                      std::string(f[next]) + "'; expected elastic:<R>[:<predictor>][:<variant>]");
  return out;
}

inline const char* policy_grammar() {
  return "bsp | asp | ssp:<s> | dssp:<s_L>:<s_U>[:<predictor>] | "
         "elastic:<R>[:<predictor>][:<variant>]";
}

}  // namespace detail

/// Builds the policy named by `config` for `workers` workers (ids 0..workers-1):
/// ```
///   bsp                   Bulk Synchronous Parallel
///   asp                   Asynchronous Parallel
///   ssp:<s>               Stale Synchronous Parallel with staleness bound s >= 0
///   dssp:<s_L>:<s_U>[:<predictor>]
///                         Dynamic SSP with 0 <= s_L <= s_U; predictor as below (default last,
///                         the paper's). Example: dssp:3:15:median:5
///   elastic:<R>[:<predictor>][:<variant>]
///                         ElasticBSP with lookahead R >= 1; predictor last (default), mean:<k>,
///                         median:<k> or ewma:<alpha>; ZipLine variant fast (default), opt-bs,
///                         opt or zipline. Example: elastic:15:median:5:opt-bs
/// ```
/// Throws parse_error (unknown policy, wrong field count, non-numbers) or
/// invalid_parameter_error (values out of range, including the bounds on memory-sizing
/// parameters such as cadence::max_workers), both naming the offending string.
inline any_controller make_controller(std::string_view config, std::size_t workers) {
  const auto f = detail::split_fields(config, ':');
  const std::string_view kind = f[0];
  auto expect_fields = [&](std::size_t n, const char* form) {
    if (f.size() != n)
      throw parse_error("cadence: policy '" + std::string(config) + "' must look like '" + form +
                        "'");
  };
  auto build = [&](auto&& make) -> any_controller {
    return detail::naming_config(config, workers, [&] { return any_controller(make()); });
  };
  if (kind == "bsp") {
    expect_fields(1, "bsp");
    return build([&] { return bsp(workers); });
  }
  if (kind == "asp") {
    expect_fields(1, "asp");
    return build([&] { return asp(workers); });
  }
  if (kind == "ssp") {
    expect_fields(2, "ssp:<s>");
    const clock_value s = detail::parse_count(config, f[1], "staleness s");
    return build([&] { return ssp(workers, s); });
  }
  if (kind == "dssp") {
    if (f.size() < 3) expect_fields(3, "dssp:<s_L>:<s_U>[:<predictor>]");
    const clock_value lo = detail::parse_count(config, f[1], "lower bound s_L");
    const clock_value hi = detail::parse_count(config, f[2], "upper bound s_U");
    if (f.size() == 3) return build([&] { return dssp(workers, lo, hi); });
    // The rest is a predictor spec, which has its own ':' fields ("median:5").
    const std::string_view predictor = config.substr(f[0].size() + f[1].size() + f[2].size() + 3);
    return build([&] {
      return basic_dssp<any_predictor<timestamp>>(workers, lo, hi,
                                                  make_predictor<timestamp>(predictor));
    });
  }
  if (kind == "elastic") {
    const detail::elastic_config e = detail::parse_elastic_config(config);
    return build([&] {
      return elastic_bsp(workers, e.lookahead, make_predictor<timestamp>(e.predictor),
                         parse_zipline_variant(e.variant));
    });
  }
  throw parse_error("cadence: unknown policy '" + std::string(config) + "'; expected one of " +
                    detail::policy_grammar());
}

// ---- collective modes beside the controllers ----

/// Whether `config` names a collective mode (an averager over all-reduce among the workers)
/// rather than a parameter-server controller:
/// ```
///   periodic:<k>                               periodic_averager: average every k local steps
///   elastic-avg:<R>[:<predictor>][:<variant>]  elastic_averager: ElasticBSP over collectives
/// ```
/// Anything else is make_controller's grammar (which rejects what it does not know). Only the
/// kind is read here: the fields are checked by what builds the mode.
inline bool is_collective_config(std::string_view config) noexcept {
  return config.rfind("periodic:", 0) == 0 || config.rfind("elastic-avg:", 0) == 0;
}

/// The mode `config` names as exchange::periodic_averager, exchange::elastic_averager and
/// sim::simulate_collective spell it: "elastic-avg:<R>..." becomes "elastic:<R>...",
/// "periodic:<k>" stays. Throws parse_error for a config that is_collective_config rejects.
inline std::string collective_mode(std::string_view config) {
  if (!is_collective_config(config))
    throw parse_error("cadence: policy '" + std::string(config) +
                      "' is not a collective mode; expected periodic:<k> or "
                      "elastic-avg:<R>[:<predictor>][:<variant>]");
  if (config.rfind("elastic-avg:", 0) == 0) return "elastic:" + std::string(config.substr(12));
  return std::string(config);
}

/// @}
}  // namespace cadence
