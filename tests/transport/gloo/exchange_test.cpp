// The collective adapters (cadence/exchange/) over the gloo backend: the shared suite with ranks
// as threads, each its own gloo context over one temporary file store (as the conformance tests).
#include <cadence/transport/gloo/communicator.hpp>

#include "exchange/collective_suite.hpp"
#include "gloo_ranks.hpp"

using cadence_gloo_test::gloo_harness;

CADENCE_COLLECTIVE_SUITE(gloo_harness);
