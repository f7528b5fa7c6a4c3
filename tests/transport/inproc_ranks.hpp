// Test support: runs a body on one thread per rank of an in-process world, so a suite can
// exercise ranks as threads; an exception escaping a rank fails the test, naming the rank. Also
// the harness the shared suites (exchange/collective_suite.hpp, exchange/ps_suite.hpp) take: a
// fresh world per run (support/threads.hpp's threads_harness).
#pragma once

#include <cadence/transport/inproc.hpp>

#include "support/threads.hpp"

#include <doctest/doctest.h>

namespace cadence_test {

/// body(comm) on one thread per rank of `world`, each with the rank's communicator.
template <class Body>
void run_inproc_ranks(cadence::transport::inproc_world& world, Body body) {
  run_threads(world.size(), [&](int r) {
    cadence::transport::inproc_communicator c = world.join(r);
    body(c);
  });
}

/// What the ranks of one suite run share: a fresh world of N ranks.
template <int N>
struct fresh_inproc_world {
  cadence::transport::inproc_world world{N};
  cadence::transport::inproc_communicator join(int r, int) { return world.join(r); }
};

/// A suite's harness: run(body) calls body(comm) on every rank of a fresh world of N ranks, with
/// fresh current_events() for the ranks to signal each other.
template <int N>
using inproc_harness = threads_harness<N, fresh_inproc_world<N>>;
/// The worlds the shared suites run on in-process (named so in their reports).
using inproc_4 = inproc_harness<4>;
using inproc_3 = inproc_harness<3>;

}  // namespace cadence_test

// The suites' names for the worlds, declared once here so that test files sharing a unity
// build do not declare them twice.
TYPE_TO_STRING_AS("inproc_4", cadence_test::inproc_harness<4>);
TYPE_TO_STRING_AS("inproc_3", cadence_test::inproc_harness<3>);
