// Typed suite tests (doctest's TEST_CASE_TEMPLATE_DEFINE over a harness H) whose body runs on
// every rank: the body is a function template of the rank's communicator instead of a lambda
// wrapped in H::run in each test.
#pragma once

#include <doctest/doctest.h>

/// A test declared by `define(name, id)` (a suite's own test macro, over a harness H) that runs
/// `runner(body)` (H::run, or a filter of it) with the body written after the macro:
/// `template <class C> void ns::id_on_rank(C& c)`, where c is the rank's communicator, C its type,
/// and the names of namespace `ns` (the suite's helpers) are in scope.
#define CADENCE_RANK_TEST(define, name, id, ns, runner)                       \
  namespace ns {                                                            \
  template <class C>                                                        \
  void id##_on_rank(C& c);                                                  \
  }                                                                         \
  define(name, id) { runner([](auto& c) { ns::id##_on_rank(c); }); }       \
  template <class C>                                                        \
  void ns::id##_on_rank(C& c)
