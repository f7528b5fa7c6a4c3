// doctest's runner for the gloo tests. The multi-process tests start this same executable again
// as their ranks: with `--gloo-rank` it runs one rank of a scenario instead of the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/processes.hpp"

int cadence_gloo_rank_main(int argc, char** argv);  // communicator_test.cpp

int main(int argc, char** argv) {
  return cadence_test::tests_or_rank(argc, argv, "--gloo-rank", &cadence_gloo_rank_main);
}
