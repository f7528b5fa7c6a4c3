// doctest's runner for the gloo tests. The multi-process tests start this same executable again
// as their ranks: with `--gloo-rank` it runs one rank of a scenario instead of the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

int cadence_gloo_rank_main(int argc, char** argv);  // communicator_test.cpp

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--gloo-rank") == 0) return cadence_gloo_rank_main(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
