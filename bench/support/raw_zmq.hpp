// What the benchmarks' raw ZeroMQ baselines share (the all-reduce of cadence-bench-transport,
// the echo server of cadence-bench-ps): a context whose sockets queue without limit and close
// at once, and the endpoint a socket bound. Not part of the library.
#pragma once

#include <zmq.h>

#include <cstddef>
#include <string>

namespace cadence_bench {

/// A ZeroMQ context, terminated with this object (close its sockets first).
class raw_zmq_context {
public:
  raw_zmq_context() : ctx_(zmq_ctx_new()) {}
  raw_zmq_context(const raw_zmq_context&) = delete;
  raw_zmq_context& operator=(const raw_zmq_context&) = delete;
  ~raw_zmq_context() { zmq_ctx_term(ctx_); }

  /// A socket of `type` without high-water marks (a benchmark's messages never wait for room)
  /// and without linger; the caller closes it.
  void* socket(int type) const {
    void* s = zmq_socket(ctx_, type);
    const int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    return s;
  }

private:
  void* ctx_;
};

/// The endpoint socket `s` bound last ("tcp://127.0.0.1:40123": the port the system picked).
inline std::string last_endpoint(void* s) {
  char buf[256];
  std::size_t len = sizeof buf;
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &len);
  return buf;
}

}  // namespace cadence_bench
