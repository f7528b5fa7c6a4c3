// The parameter server over the ZeroMQ backend: the shared suite (tests/exchange/ps_suite.hpp)
// with ranks as threads, each with its own communicator over 127.0.0.1 (server rank 0, workers
// 1-3). The server waits with try_recv(any_source); a silent worker is evicted by the server's
// own liveness rule (the suite's stalled-worker case), not by the transport: its process (here,
// its thread) is alive. A worker that sends a message of another size than its receive is
// dropped alone (tests/exchange/ps/bad_peer_suite.hpp: the zmq backend throws peer_error for it
// and stays usable).
#include <cadence/transport/zmq/communicator.hpp>

#include "exchange/ps/bad_peer_suite.hpp"
#include "exchange/ps_suite.hpp"
#include "zmq_ranks.hpp"

using zmq_4 = cadence_zmq_test::zmq_threads_harness<4>;

CADENCE_PS_SUITE(zmq_4);
CADENCE_PS_BAD_PEER_SUITE(zmq_4);
