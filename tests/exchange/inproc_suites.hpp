// Test support: a shared exchange suite (collective_suite.hpp) instantiated over the in-process
// worlds of transport/inproc_ranks.hpp, of 4 ranks and of 3, as each adapter's in-process test
// runs it. The backends run the same suites themselves.
#pragma once

#include "exchange/collective_suite.hpp"
#include "transport/inproc_ranks.hpp"

/// SUITE (CADENCE_BUCKETED_ALLREDUCER_SUITE, ...) over 4 and over 3 in-process ranks.
#define CADENCE_INPROC_EXCHANGE_SUITE(SUITE) \
  SUITE(cadence_test::inproc_4);             \
  SUITE(cadence_test::inproc_3)
