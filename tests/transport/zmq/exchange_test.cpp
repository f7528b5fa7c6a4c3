// The collective adapters (cadence/exchange/) over the ZeroMQ backend: the shared suite with
// ranks as threads, each with its own communicator over 127.0.0.1.
#include <cadence/transport/zmq/communicator.hpp>

#include "exchange/collective_suite.hpp"
#include "zmq_ranks.hpp"

using cadence_zmq_test::zmq_harness;

CADENCE_COLLECTIVE_SUITE(zmq_harness);
