// doctest's runner for the ZeroMQ tests. The multi-process tests start this same executable
// again as their ranks: with `--zmq-rank` it runs one rank of a scenario instead of the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>

int cadence_zmq_rank_main(int argc, char** argv);  // fault_test.cpp

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--zmq-rank") == 0) return cadence_zmq_rank_main(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}
