// Shared by cadence-sim and cadence-race (not installed): the scenario named by the flags,
// and main's error handling (exit 2 for a bad command line, 1 for anything else).
#pragma once

#include "cli.hpp"
#include <cadence/sim/scenarios.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace cadence::tools {

inline sim::scenario scenario_from_flags(const std::string& name, std::size_t workers, std::uint64_t seed) {
  try {
    return sim::make_scenario(name, workers, seed);
  } catch (const invalid_parameter_error& e) {
    bool known = false;
    for (const auto& info : sim::scenario_catalog()) known = known || info.name == name;
    throw usage_error(std::string(known ? "--workers: " : "--scenario: ") + e.what());
  }
}

/// Runs `run(argc, argv)` and turns exceptions into a message on stderr and an exit status.
template <class Run>
int guarded_main(const char* tool, Run run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const parse_error& e) {  // a bad command line: usage_error and bad flag values
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace cadence::tools
