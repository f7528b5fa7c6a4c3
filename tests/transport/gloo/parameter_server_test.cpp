// The parameter server over gloo: the shared suite (tests/transport/ps_suite.hpp) with ranks as
// threads, each with its own gloo context over one temporary file store (server rank 0, workers
// 1-3). The server waits with try_recv(any_source), which sees a crashed worker only through its
// deadline on gloo, so eviction by silence (the suite's stalled-worker case) is how gloo drops a
// worker.
#include <cadence/transport/gloo/communicator.hpp>

#include "exchange/ps_suite.hpp"
#include "gloo_ranks.hpp"

using gloo_4 = cadence_gloo_test::gloo_threads_harness<4>;

CADENCE_PS_SUITE(gloo_4);
