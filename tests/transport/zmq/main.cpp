// doctest's runner for the ZeroMQ tests. The multi-process tests start this same executable
// again as their ranks: with `--zmq-rank` it runs one rank of a scenario instead of the tests.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/processes.hpp"

int cadence_zmq_rank_main(int argc, char** argv);  // fault_test.cpp

int main(int argc, char** argv) {
  return cadence_test::tests_or_rank(argc, argv, "--zmq-rank", &cadence_zmq_rank_main);
}
