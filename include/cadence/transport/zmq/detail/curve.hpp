// The ZeroMQ backend's authentication: CURVE keys derived from the job secret (every rank holds
// the same two key pairs: one for its listening sockets, one for its dialling ones), and the ZAP
// handler that accepts a connection only from a peer that proves the client key, hence the
// secret. Traffic between holders is encrypted by CURVE (CurveZMQ, RFC 26).
#pragma once

#include <cadence/core/detail/sha256.hpp>
#include <cadence/core/error.hpp>
#include <cadence/transport/secret.hpp>

#include <zmq.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace cadence::transport::detail {

/// The two key pairs, in ZeroMQ's Z85 text (40 characters and a NUL), and the client's public
/// key in binary, as the ZAP handler compares it.
struct zmq_curve_keys {
  char server_public[41] = {};
  char server_secret[41] = {};
  char client_public[41] = {};
  char client_secret[41] = {};
  unsigned char client_public_bytes[32] = {};
};

/// Curve25519 secret keys are any 32 bytes (the scalar is clamped when used): HMAC-derived from
/// the secret, one per role; the public keys follow from them.
inline zmq_curve_keys zmq_derive_keys(const job_secret& secret) {
  zmq_curve_keys k;
  const cadence::detail::sha256_digest s = secret.derive("zmq/curve/server"), c = secret.derive("zmq/curve/client");
  if (zmq_z85_encode(k.server_secret, s.data(), s.size()) == nullptr ||
      zmq_z85_encode(k.client_secret, c.data(), c.size()) == nullptr ||
      zmq_curve_public(k.server_public, k.server_secret) != 0 ||
      zmq_curve_public(k.client_public, k.client_secret) != 0 ||
      zmq_z85_decode(k.client_public_bytes, k.client_public) == nullptr)
    throw transport_error("cadence::transport[zmq]: deriving the CURVE keys failed: " + std::string(zmq_strerror(errno)) +
                          " (is libzmq built with CURVE? zmq_has(\"curve\") is " + std::to_string(zmq_has("curve")) +
                          ")");
  return k;
}

/// A listening socket: it proves the server key and asks ZAP about each client.
inline void zmq_secure_server(void* s, const zmq_curve_keys& k) {
  const int one = 1;
  zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k.server_secret, 40);
  zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "cadence", 7);
}
/// A dialling socket: it expects the server key and proves the client key.
inline void zmq_secure_client(void* s, const zmq_curve_keys& k) {
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, k.server_public, 40);
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, k.client_public, 40);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, k.client_secret, 40);
}

/// The ZAP handler (RFC 27) of one context: a thread of its own answers the context's
/// authentication requests (a handshake must be answered while the owning thread computes),
/// accepting the CURVE client key and nothing else. Started before any listening socket
/// exists, stopped before the context terminates. A refusal fails the client's handshake, which
/// the listening socket's monitor counts (zmq_stats::refused_connections).
class zmq_zap {
public:
  zmq_zap() = default;
  zmq_zap(const zmq_zap&) = delete;
  zmq_zap& operator=(const zmq_zap&) = delete;
  ~zmq_zap() { stop(); }

  /// Binds the handler in `ctx` and returns once it answers (throws when it cannot bind).
  void start(void* ctx, const unsigned char (&client_key)[32]) {
    std::memcpy(key_, client_key, sizeof key_);
    auto bound = std::make_shared<std::promise<int>>();
    auto ready = bound->get_future();
    thread_ = std::thread([this, ctx, bound] { loop(ctx, *bound); });
    const int rc = ready.get();
    if (rc != 0) {
      stop();
      throw transport_error("cadence::transport[zmq]: binding the ZAP handler failed: " + std::string(zmq_strerror(rc)));
    }
  }

  void stop() noexcept {
    stop_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
  }

private:
  static void set_int(void* s, int opt, int v) noexcept { zmq_setsockopt(s, opt, &v, sizeof v); }

  void loop(void* ctx, std::promise<int>& bound) {
    void* rep = zmq_socket(ctx, ZMQ_REP);
    if (rep == nullptr) {
      bound.set_value(zmq_errno());
      return;
    }
    set_int(rep, ZMQ_LINGER, 0);
    if (zmq_bind(rep, "inproc://zeromq.zap.01") != 0) {
      const int err = zmq_errno();
      zmq_close(rep);
      bound.set_value(err);
      return;
    }
    bound.set_value(0);
    while (!stop_.load(std::memory_order_acquire)) {
      zmq_pollitem_t item{rep, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0) continue;
      answer(rep);
    }
    zmq_close(rep);
  }

  // One request: version, request id, domain, address, identity, mechanism, credentials.
  void answer(void* rep) {
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, rep, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
      if (!more || frames.size() > 16) break;
    }
    const bool ok = frames.size() >= 7 && frames[0] == "1.0" && frames[5] == "CURVE" && frames[6].size() == 32 &&
                    cadence::detail::equal_in_constant_time(frames[6].data(), key_, 32);
    const std::string id = frames.size() >= 2 ? frames[1] : std::string();
    const std::string reply[6] = {"1.0", id, ok ? "200" : "400", ok ? "OK" : "not a holder of the job secret", "", ""};
    for (int i = 0; i < 6; ++i)
      zmq_send(rep, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
  }

  std::thread thread_;
  std::atomic<bool> stop_{false};
  unsigned char key_[32] = {};
};

}  // namespace cadence::transport::detail
