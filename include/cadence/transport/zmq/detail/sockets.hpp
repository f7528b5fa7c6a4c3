// The ZeroMQ backend's context and sockets: one context per communicator, every socket it
// opens (with the options all of them share), their monitors, and their closing; plus the small
// helpers the engine uses on sockets. Owned and used by the communicator's owning thread.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/zmq/detail/curve.hpp>
#include <cadence/transport/zmq/detail/wire.hpp>
#include <cadence/transport/zmq/options.hpp>

#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cadence::transport::detail {

inline void zmq_set_int(void* s, int opt, int v) noexcept { zmq_setsockopt(s, opt, &v, sizeof v); }

inline int zmq_clamp_ms(std::chrono::milliseconds d) noexcept {
  return static_cast<int>(std::clamp<std::int64_t>(d.count(), 1, INT_MAX / 2));
}

/// The descriptor that signals a socket's queues may have changed (ZMQ_FD).
inline int zmq_fd_of(void* s) noexcept {
  int fd = -1;
  std::size_t len = sizeof fd;
  zmq_getsockopt(s, ZMQ_FD, &fd, &len);
  return fd;
}

/// The address a socket bound last, its port resolved (ZMQ_LAST_ENDPOINT).
inline std::string zmq_last_endpoint(void* s) {
  char buf[512];
  std::size_t len = sizeof buf;
  if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, buf, &len) != 0 || len == 0) return {};
  buf[sizeof buf - 1] = 0;
  return std::string(buf, std::strlen(buf));
}

/// Binds `s` to `where`; a wildcard host is refused (peers could not dial it), and so is an
/// address ZeroMQ cannot parse (invalid_parameter_error); one it cannot bind is a transport_error.
inline void zmq_bind_endpoint(const call_info& c, void* s, const std::string& where, const char* what) {
  const auto host = where.find("://");
  if (host != std::string::npos) {
    const std::string rest = where.substr(host + 3);
    if (rest.rfind("*:", 0) == 0 || rest.rfind("0.0.0.0:", 0) == 0 || rest.rfind("[::]:", 0) == 0)
      bad_argument(c, std::string(what) + " \"" + where +
                          "\" binds every interface: name the address the peers reach this host by");
  }
  if (zmq_bind(s, where.c_str()) != 0) {
    const int err = errno;
    if (err == EINVAL || err == EPROTONOSUPPORT || err == ENODEV)
      bad_argument(c, std::string("cannot bind ") + what + " \"" + where + "\": " + zmq_reason(err));
    throw transport_error(describe(c) + ": cannot bind " + what + " \"" + where + "\": " + zmq_reason(err));
  }
}

/// Reads one monitor event: its kind and value (an fd for connection events); false when none.
inline bool zmq_read_event(void* monitor, std::uint16_t& event, std::uint32_t& value) {
  zmq_message ev;
  if (zmq_msg_recv(ev.get(), monitor, ZMQ_DONTWAIT) < 0) return false;
  event = 0;
  value = 0;
  if (ev.size() >= 6) {
    std::memcpy(&event, ev.data(), 2);
    std::memcpy(&value, ev.data() + 2, 4);
  }
  while (ev.more()) {  // the endpoint
    zmq_message rest;
    if (zmq_msg_recv(rest.get(), monitor, 0) < 0) break;
    ev = std::move(rest);
  }
  return true;
}

inline constexpr int zmq_handshake_failed =
    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

/// A communicator's ZeroMQ context and the sockets open in it.
class zmq_sockets {
public:
  zmq_sockets() = default;
  zmq_sockets(const zmq_sockets&) = delete;
  zmq_sockets& operator=(const zmq_sockets&) = delete;
  ~zmq_sockets() { terminate(); }

  /// The context: `io_threads` I/O threads, room for a DEALER and a monitor per peer; with
  /// authentication, the CURVE keys from the job secret and the ZAP handler, before any socket.
  /// `max_frame` bounds every frame a listening socket accepts (ZMQ_MAXMSGSIZE).
  void create(const call_info& c, const zmq_options& o, std::size_t max_frame) {
    heartbeat_interval_ = zmq_clamp_ms(o.heartbeat_interval);
    heartbeat_timeout_ = zmq_clamp_ms(o.heartbeat_timeout);
    max_frame_ = max_frame;
    ctx_ = zmq_ctx_new();
    if (ctx_ == nullptr) throw transport_error(describe(c) + ": zmq_ctx_new: " + zmq_reason());
    zmq_ctx_set(ctx_, ZMQ_IO_THREADS, std::max(1, o.io_threads));
    // ZeroMQ's default of 1023 sockets would cap the world.
    zmq_ctx_set(ctx_, ZMQ_MAX_SOCKETS, std::max(1024, 2 * c.size + 64));
    if (o.security == wire_security::authenticated) {
      keys_ = zmq_derive_keys(o.secret);
      zap_.start(ctx_, keys_.client_public_bytes);
      secured_ = true;
    }
  }

  /// Whether the sockets authenticate their peers (CURVE).
  bool secured() const noexcept { return secured_; }

  /// A socket with the options every socket of the backend has: linger 0 until it closes, no
  /// high-water marks, ZMTP heartbeats; a ROUTER listens (CURVE server, frames bounded), a
  /// DEALER dials (CURVE client); the monitors' PAIRs are in-process and need neither.
  void* open(const call_info& c, int type) {
    void* s = zmq_socket(ctx_, type);
    if (s == nullptr) throw transport_error(describe(c) + ": zmq_socket: " + zmq_reason());
    open_.push_back(s);
    zmq_set_int(s, ZMQ_LINGER, 0);
    // No high-water marks: credits bound what a peer may queue here, large messages move only
    // into posted receives, and a full pipe would stop ZeroMQ reading the connection, heartbeats
    // included, which would turn a receiver that is merely busy into a lost peer.
    zmq_set_int(s, ZMQ_SNDHWM, 0);
    zmq_set_int(s, ZMQ_RCVHWM, 0);
    zmq_set_int(s, ZMQ_HEARTBEAT_IVL, heartbeat_interval_);
    zmq_set_int(s, ZMQ_HEARTBEAT_TIMEOUT, heartbeat_timeout_);
    zmq_set_int(s, ZMQ_HEARTBEAT_TTL, std::min(heartbeat_timeout_, 6553500));  // deciseconds on the wire
    zmq_set_int(s, ZMQ_HANDSHAKE_IVL, heartbeat_timeout_);
    if (type == ZMQ_ROUTER) {
      const auto limit = static_cast<std::int64_t>(max_frame_);
      zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &limit, sizeof limit);
    }
    if (secured_ && type == ZMQ_ROUTER) zmq_secure_server(s, keys_);
    if (secured_ && type == ZMQ_DEALER) zmq_secure_client(s, keys_);
    return s;
  }

  /// A PAIR that receives `s`'s monitor events. It connects before anything can happen on `s`
  /// (a monitor whose PAIR is not connected would block ZeroMQ's I/O thread), and is read once:
  /// a new pipe starts out readable, and only a read that finds it empty makes its next message
  /// signal the descriptor the engine polls.
  void* monitor(const call_info& c, void* s, const std::string& addr, int events) {
    if (zmq_socket_monitor(s, addr.c_str(), events) != 0)
      throw transport_error(describe(c) + ": zmq_socket_monitor: " + zmq_reason());
    void* m = zmq_socket(ctx_, ZMQ_PAIR);
    if (m == nullptr) {
      zmq_socket_monitor(s, nullptr, 0);
      throw transport_error(describe(c) + ": zmq_socket: " + zmq_reason());
    }
    open_.push_back(m);
    zmq_set_int(m, ZMQ_LINGER, 0);
    if (zmq_connect(m, addr.c_str()) != 0) {
      zmq_socket_monitor(s, nullptr, 0);
      throw transport_error(describe(c) + ": connecting the monitor of a socket: " + zmq_reason());
    }
    zmq_message none;
    zmq_msg_recv(none.get(), m, ZMQ_DONTWAIT);
    return m;
  }

  /// Closes `s` (null afterwards); ZeroMQ lets its queued messages leave within `linger` ms.
  void close(void*& s, int linger) noexcept {
    if (s == nullptr) return;
    zmq_set_int(s, ZMQ_LINGER, linger);
    zmq_close(s);
    open_.erase(std::remove(open_.begin(), open_.end(), s), open_.end());
    s = nullptr;
  }

  /// Closes what is still open (at once) and terminates the context, which waits for the
  /// linger of what closed before and joins ZeroMQ's threads: afterwards no callback of
  /// ZeroMQ's runs. Idempotent.
  void terminate() noexcept {
    for (void* s : open_) {
      zmq_set_int(s, ZMQ_LINGER, 0);
      zmq_close(s);
    }
    open_.clear();
    zap_.stop();  // its socket closes in its thread: before the context terminates
    if (ctx_ == nullptr) return;
    while (zmq_ctx_term(ctx_) != 0 && errno == EINTR) {
    }
    ctx_ = nullptr;
  }

private:
  void* ctx_ = nullptr;
  std::vector<void*> open_;
  int heartbeat_interval_ = 1000;
  int heartbeat_timeout_ = 5000;
  std::size_t max_frame_ = 0;
  bool secured_ = false;
  zmq_curve_keys keys_;
  zmq_zap zap_;
};

}  // namespace cadence::transport::detail
