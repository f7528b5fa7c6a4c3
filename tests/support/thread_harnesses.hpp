// Test support: the harnesses a backend whose ranks run as threads of this process (gloo,
// ZeroMQ) offers the shared suites, declared once for every such backend.
#pragma once

#include "support/threads.hpp"

#include <doctest/doctest.h>

/// Declares in namespace `ns`, for ranks as threads over `world` (threads_harness):
/// `<backend>_threads_harness<N>`, `<backend>_harness` (3 ranks) and `<backend>_pair_harness`
/// (2 ranks); and names the suites' instances "<backend>_harness" (3 ranks) and "<backend>_4",
/// at global scope, once per backend header so that test files sharing a unity build do not
/// declare them twice.
#define CADENCE_THREAD_HARNESSES(ns, backend, world)                                  \
  namespace ns {                                                                    \
  template <int N>                                                                  \
  using backend##_threads_harness = cadence_test::threads_harness<N, world>;        \
  using backend##_harness = backend##_threads_harness<3>;                           \
  using backend##_pair_harness = backend##_threads_harness<2>;                      \
  }                                                                                 \
  TYPE_TO_STRING_AS(#backend "_harness", ns::backend##_threads_harness<3>);         \
  TYPE_TO_STRING_AS(#backend "_4", ns::backend##_threads_harness<4>)
