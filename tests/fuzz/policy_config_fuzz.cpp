// Fuzzes the policy config strings a trainer takes from its command line or a config file
// (cadence/controllers/make_controller.hpp and what it calls: make_controller, the collective
// modes, parse_elastic_config, make_predictor, parse_zipline_variant). What must hold:
//   - every string either builds or is refused with cadence::parse_error or
//     cadence::invalid_parameter_error (a message that names the string), never another
//     exception, a crash or an allocation the string's numbers size without bound;
//   - a controller that was built works: its workers push in turn at rising times (each only
//     while it may run, a parked one when a later decision releases it), then one is removed
//     and one added, without any exception (a config that builds is a usable policy).
// Input: byte 0 picks the worker count (1..64); the rest is the config string.
#include <cadence/controllers/make_controller.hpp>
#include <cadence/predict/any_predictor.hpp>
#include <cadence/zipline/variant.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace {

[[noreturn]] void fail(const char* what, const std::string& config) {
  std::fprintf(stderr, "policy_config_fuzz: %s for config '%s'\n", what, config.c_str());
  std::abort();
}

// Runs f; a cadence::parse_error or invalid_parameter_error is a refusal, anything else a bug.
template <class F>
bool refused_or_built(const std::string& config, F&& f) {
  try {
    f();
    return false;
  } catch (const cadence::parse_error&) {
  } catch (const cadence::invalid_parameter_error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "policy_config_fuzz: unexpected exception: %s\n", e.what());
    fail("an exception that is not parse_error or invalid_parameter_error", config);
  }
  return true;
}

// Pushes from every worker in turn, 4 rounds, at rising times; a parked worker waits for a
// release. Any exception fails: a built controller must take correct use.
void drive(cadence::any_controller& c, std::size_t workers, const std::string& config) {
  std::vector<char> running(workers, 1);
  double t = 0;
  try {
    for (int round = 0; round < 4; ++round) {
      for (std::size_t p = 0; p < workers; ++p) {
        if (!running[p]) continue;
        t += 0.25 + 0.125 * static_cast<double>(p % 3);
        const cadence::decision d = c.push(static_cast<cadence::worker_id>(p), t);
        running[p] = d.proceed ? 1 : 0;
        for (cadence::worker_id q : d.released) {
          if (q < 0 || static_cast<std::size_t>(q) >= workers) fail("a released worker out of range", config);
          running[static_cast<std::size_t>(q)] = 1;
        }
      }
    }
    if (workers > 1) {
      for (cadence::worker_id q : c.remove_worker(0)) {
        if (q < 0 || static_cast<std::size_t>(q) >= workers) fail("a released worker out of range", config);
      }
      const cadence::worker_id fresh = c.add_worker();
      if (fresh < 0) fail("add_worker gave a negative id", config);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "policy_config_fuzz: %s\n", e.what());
    fail("a controller that was built threw under correct use", config);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t workers = 1 + data[0] % 64;
  const std::string config(reinterpret_cast<const char*>(data + 1), size - 1);

  cadence::any_controller c;
  const bool refused = refused_or_built(config, [&] { c = cadence::make_controller(config, workers); });
  if (!refused) drive(c, workers, config);

  // The collective modes share the flag: is_collective_config and collective_mode agree.
  const bool collective = cadence::is_collective_config(config);
  const bool mode_refused = refused_or_built(config, [&] { (void)cadence::collective_mode(config); });
  if (collective == mode_refused) fail("is_collective_config and collective_mode disagree", config);
  if (!refused && collective) fail("a config that is a controller and a collective mode", config);

  // The parts make_controller delegates to, on the whole string.
  refused_or_built(config, [&] { (void)cadence::detail::parse_elastic_config(config); });
  refused_or_built(config, [&] {
    const auto p = cadence::make_predictor<double>(config);
    if (p.name().empty()) fail("a predictor without a name", config);
    // Its name is a spec that builds the same predictor.
    if (cadence::make_predictor<double>(p.name()).name() != p.name())
      fail("a predictor's name does not rebuild it", config);
  });
  refused_or_built(config, [&] { (void)cadence::parse_zipline_variant(config); });
  return 0;
}
