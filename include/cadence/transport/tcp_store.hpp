/// \file
/// \ingroup transport
/// A rendezvous store over TCP: one process serves a small key-value table on a known
/// host:port and every rank of a job sets and reads keys there, so processes on hosts that
/// share no file system can find each other (what gloo's file store needs a shared folder for).
/// Every connection proves it holds the job secret before it is served, and every request and
/// answer carries a code only a holder of the secret can make (docs/transports.md, "Security").
///
///     ---- options ----      tcp_store_options, tcp_store_stats
///     ---- the wire ----     the greeting, the challenge, message codes (detail)
///     ---- the server ----   tcp_store_server: one thread, bounded connections and table
///     ---- the client ----   tcp_store: every call with a deadline, reconnecting as needed
///
/// Over 800 lines: both ends of one authenticated protocol, kept in one header so a change to
/// the wire cannot reach one end without the other.
#pragma once

#include <cadence/core/detail/sha256.hpp>
#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/posix.hpp>
#include <cadence/transport/secret.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {
/// \addtogroup transport
/// @{

// ---- options ----

/// Largest key the store accepts; a request above it closes its connection.
inline constexpr std::size_t tcp_store_max_key = 4096;
/// Largest value the store accepts; a request above it closes its connection.
inline constexpr std::size_t tcp_store_max_value = std::size_t{64} << 20;

/// How a store (server or client) guards its connections, and the server's bounds.
struct tcp_store_options {
  /// The job secret every connection must prove it holds (the default security). Empty with
  /// `security == authenticated` is refused: give one, or ask for an open store by name.
  job_secret secret;
  /// `open` serves (or talks to) anyone who reaches the port, without codes: only when asked
  /// for by name, and only on loopback unless `force_open_on_network`.
  wire_security security = wire_security::authenticated;
  /// With `open`: serve (or talk to) an address other than loopback too.
  bool force_open_on_network = false;
  /// The server binds a wildcard address (0.0.0.0, [::]) only when told to: peers must be
  /// given one of its real addresses anyway.
  bool allow_wildcard = false;
  /// Server bound: connections at once (more are closed on accept).
  std::size_t max_connections = 1024;
  /// Server bound: keys held (a set beyond it is refused, not stored).
  std::size_t max_keys = std::size_t{1} << 16;
  /// Server bound: bytes of keys and values held (a set beyond it is refused, not stored).
  std::size_t max_bytes = std::size_t{256} << 20;
  /// Server bound: how long a connection may take to authenticate.
  std::chrono::milliseconds handshake_timeout{5000};
  /// Server bound: how long a connection may stay silent before it is closed (a client that
  /// comes back reconnects by itself).
  std::chrono::milliseconds idle_timeout{60000};
  /// Called on the server's thread for every connection it refuses or closes for cause, with a
  /// line that names the peer's address and what was wrong (for a program's log).
  std::function<void(const std::string&)> on_event;
};

/// What a server refused, by cause (each also reported through tcp_store_options::on_event).
struct tcp_store_stats {
  std::size_t auth_failures = 0;        ///< a wrong code in the challenge, or on a request
  std::size_t protocol_errors = 0;      ///< a request of an unknown kind, or larger than allowed
  std::size_t handshake_timeouts = 0;   ///< connected, never authenticated in time
  std::size_t idle_closed = 0;          ///< silent past idle_timeout
  std::size_t refused_connections = 0;  ///< beyond max_connections
  std::size_t refused_sets = 0;         ///< a set beyond max_keys or max_bytes
  std::size_t accept_errors = 0;        ///< accept() failed (EMFILE, ...): the server paused accepting
  std::size_t poll_errors = 0;          ///< poll() failed: the server waited a moment and went on
};

// ---- the wire ----

namespace detail {

// The server greets every connection with the magic, its mode and a fresh nonce; in the
// authenticated mode the client answers with its own nonce and a code proving the secret, the
// server with a code proving it too (a stranger can neither be served nor pose as the store).
// Then a request is op (1 byte), key length and value length (4 bytes each, big endian), the
// key, the value; an answer is a status byte, a value length and the value; authenticated, each
// ends with a 32-byte code over its sequence number and contents, under a key of the session.
enum store_op : unsigned char { op_set = 'S', op_get = 'G', op_check = 'C' };
enum store_status : unsigned char { status_absent = 0, status_ok = 1, status_refused = 2 };
inline constexpr char store_magic[4] = {'C', 'D', 'S', '2'};
inline constexpr std::size_t store_nonce = 32;
inline constexpr std::size_t store_code = 32;
inline constexpr std::size_t store_greeting = 4 + 1 + store_nonce;

/// The codes of one connection: derived from the job secret and both nonces.
class store_session {
public:
  store_session() = default;
  store_session(const job_secret& secret, const unsigned char* server_nonce, const unsigned char* client_nonce) {
    const cadence::detail::sha256_digest k = secret.derive("tcp-store");
    auto tag = [&](const char* what) {
      cadence::detail::hmac_sha256 h(k.data(), k.size());
      h.update(what, std::strlen(what)).update(server_nonce, store_nonce).update(client_nonce, store_nonce);
      return h.finish();
    };
    client_proof_ = tag("client");
    server_proof_ = tag("server");
    key_ = tag("session");
    on_ = true;
  }
  bool on() const noexcept { return on_; }
  const cadence::detail::sha256_digest& client_proof() const noexcept { return client_proof_; }
  const cadence::detail::sha256_digest& server_proof() const noexcept { return server_proof_; }
  /// The code of the message `data` sent in direction `dir` ('Q' request, 'A' answer) as the
  /// seq-th in that direction.
  cadence::detail::sha256_digest code(char dir, std::uint64_t seq, const std::string& data) const {
    cadence::detail::hmac_sha256 h(key_.data(), key_.size());
    unsigned char s[9];
    s[0] = static_cast<unsigned char>(dir);
    for (int i = 0; i < 8; ++i) s[1 + i] = static_cast<unsigned char>(seq >> (56 - 8 * i));
    h.update(s, sizeof s).update(data);
    return h.finish();
  }

private:
  bool on_ = false;
  cadence::detail::sha256_digest client_proof_{}, server_proof_{}, key_{};
};

/// One request as the server reads it: the operation and views of its key and value.
struct store_request {
  unsigned char op = 0;
  std::string_view key, value;
};

/// How many bytes the request at `p` (`have` of them came so far) takes in all, its code
/// included when `auth`: 9 until its head has come, then the whole request. 0 when the head
/// already says it is malformed (an unknown operation, an empty or too long key, a value too
/// long, or a value on a get or check); `why` then says what. Pure: the server calls it on
/// every head before it reads further, and tests/fuzz/tcp_store_request_fuzz.cpp drives it.
inline std::size_t store_request_size(const char* p, std::size_t have, bool auth, std::string& why) {
  if (have < 9) return 9;
  const auto op = static_cast<unsigned char>(p[0]);
  const std::size_t klen = get_u32(p + 1), vlen = get_u32(p + 5);
  if (op != op_set && op != op_get && op != op_check) {
    why = "a request of unknown kind " + std::to_string(op);
    return 0;
  }
  if (klen == 0 || klen > tcp_store_max_key || vlen > tcp_store_max_value || (op != op_set && vlen != 0)) {
    why = "a request with a " + std::to_string(klen) + "-byte key and a " + std::to_string(vlen) + "-byte value";
    return 0;
  }
  return 9 + klen + vlen + (auth ? store_code : 0);
}

/// The request in the first bytes at `p`, of which store_request_size accepted the head and
/// at least its size came (views into `p`, valid while those bytes are).
inline store_request store_parse_request(const char* p) {
  store_request r;
  r.op = static_cast<unsigned char>(p[0]);
  const std::size_t klen = get_u32(p + 1), vlen = get_u32(p + 5);
  r.key = std::string_view(p + 9, klen);
  r.value = std::string_view(p + 9 + klen, vlen);
  return r;
}

/// The checks both ends make of their options, naming the end (`who`) and its address.
inline void check_store_security(const std::string& who, const host_port& hp, const tcp_store_options& o) {
  if (o.security == wire_security::authenticated && o.secret.empty())
    throw invalid_parameter_error(who + ": no job secret: set tcp_store_options::secret (job_secret::generate() "
                                        "on one process, handed to the others), or ask for "
                                        "wire_security::open by name");
  if (o.security == wire_security::open && !is_loopback_host(hp.host) && !o.force_open_on_network)
    throw invalid_parameter_error(who + ": an open store on " + hp.host +
                                  " would serve anyone who reaches it: use a job secret, or set "
                                  "force_open_on_network");
}

}  // namespace detail

// ---- the server ----

/// Serves the store on `address` ("host:port"; port 0 lets the system choose, address() then
/// says which) from a thread of its own until destroyed. One process of the job runs it
/// (usually rank 0, see gloo_options::rendezvous); it holds what the ranks set in memory, within
/// the bounds of its options. A connection that fails to authenticate, breaks the protocol or
/// stays silent is closed (counted in stats(), reported through on_event); the others go on.
class tcp_store_server {
public:
  /// Listens on `address` and serves under `options` until destroyed. Throws
  /// invalid_parameter_error for an address it cannot parse or resolve, a wildcard address
  /// without allow_wildcard, or options it refuses, and transport_error when it cannot listen
  /// there (the port is taken, or the host is not an address of this machine).
  tcp_store_server(const std::string& address, tcp_store_options options) : o_(std::move(options)) {
    const std::string who = "cadence::transport::tcp_store_server";
    const detail::host_port hp = detail::parse_host_port(address, who);
    detail::check_store_security(who, hp, o_);
    if (!o_.allow_wildcard && (hp.host == "0.0.0.0" || hp.host == "::" || hp.host == "*"))
      throw invalid_parameter_error(who + ": \"" + address + "\" binds every interface: name the address the "
                                          "ranks reach this host by (or set allow_wildcard)");
    detail::addrinfo_list ai;
    detail::resolve(hp, true, ai, who);
    int last_error = 0;
    for (addrinfo* a = ai.head; a != nullptr && listen_.get() < 0; a = a->ai_next) {
      detail::fd_guard fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) {
        last_error = errno;
        continue;
      }
      const int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), SOMAXCONN) != 0) {
        last_error = errno;
        continue;
      }
      listen_ = std::move(fd);
    }
    if (listen_.get() < 0)
      throw transport_error(who + ": cannot listen on " + address + ": " + detail::errno_text(last_error) +
                            (last_error == EADDRINUSE ? " (another job, or an earlier run, holds the port)"
                             : last_error == EADDRNOTAVAIL ? " (the host is not an address of this machine)"
                                                            : ""));
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    address_ = name_of(bound, len);
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) throw transport_error(who + ": pipe: " + detail::errno_text(errno));
    wake_read_ = detail::fd_guard(wake[0]);
    wake_write_ = detail::fd_guard(wake[1]);
    ::fcntl(listen_.get(), F_SETFL, O_NONBLOCK);
    thread_ = std::thread([this] { serve(); });
  }

  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  ~tcp_store_server() {
    stop_.store(true, std::memory_order_release);
    const char b = 1;
    [[maybe_unused]] const auto w = ::write(wake_write_.get(), &b, 1);
    if (thread_.joinable()) thread_.join();
  }

  /// The address it listens on, the port resolved ("127.0.0.1:41234").
  const std::string& address() const noexcept { return address_; }
  /// How many keys it holds.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return table_.size();
  }
  /// What it refused so far, by cause.
  tcp_store_stats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  /// Connections closed for breaking the protocol or failing authentication.
  std::size_t rejected() const {
    const auto s = stats();
    return s.protocol_errors + s.auth_failures;
  }

private:
  using clock = std::chrono::steady_clock;

  // One connection: where its handshake is, its session, what of the current message came.
  struct client {
    detail::fd_guard fd;
    std::string peer;
    bool authenticated = false;
    unsigned char nonce[detail::store_nonce] = {};
    detail::store_session session;
    std::uint64_t seq_in = 0, seq_out = 0;
    std::string in;
    clock::time_point since, last;
  };

  static std::string name_of(const sockaddr_storage& a, socklen_t len) {
    char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
    ::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV);
    return (a.ss_family == AF_INET6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" + port;
  }

  // Counts a refusal and reports it (outside the table's lock).
  void report(std::size_t tcp_store_stats::*counter, const std::string& line) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++(stats_.*counter);
    }
    if (o_.on_event) {
      try {
        o_.on_event("cadence::transport::tcp_store_server at " + address_ + ": " + line);
      } catch (...) {
      }
    }
  }

  void serve() {
    std::vector<client> clients;
    std::vector<pollfd> fds;
    auto accept_paused_until = clock::time_point{};
    while (!stop_.load(std::memory_order_acquire)) {
      const auto now = clock::now();
      const bool accepting = now >= accept_paused_until;
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({accepting ? listen_.get() : -1, POLLIN, 0});
      for (const client& c : clients) fds.push_back({c.fd.get(), POLLIN, 0});
      // Wake at least every 100 ms to close connections whose time is up.
      if (::poll(fds.data(), fds.size(), 100) < 0) {
        if (errno != EINTR) {
          report(&tcp_store_stats::poll_errors, "poll failed: " + detail::errno_text(errno));
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        continue;
      }
      if (accepting && (fds[1].revents & POLLIN) != 0) accept_all(clients, accept_paused_until);
      // fds[2 + i] is clients[i] as they were before the accepts above.
      const std::size_t polled = fds.size() - 2;
      for (std::size_t i = 0; i < polled; ++i)
        if (fds[2 + i].revents != 0 && !serve_one(clients[i])) clients[i].fd.reset();
      expire(clients, clock::now());
      clients.erase(std::remove_if(clients.begin(), clients.end(), [](const client& c) { return c.fd.get() < 0; }),
                    clients.end());
    }
  }

  void accept_all(std::vector<client>& clients, clock::time_point& paused_until) {
    for (;;) {
      sockaddr_storage from{};
      socklen_t len = sizeof from;
      const int fd = ::accept4(listen_.get(), reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
        // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays queued in
        // the kernel; stop polling the listener for a moment instead of spinning on it.
        report(&tcp_store_stats::accept_errors,
               "accept failed: " + detail::errno_text(errno) + "; pausing new connections for 100 ms");
        paused_until = clock::now() + std::chrono::milliseconds(100);
        return;
      }
      detail::fd_guard guard(fd);
      const std::string peer = name_of(from, len);
      if (clients.size() >= o_.max_connections) {
        report(&tcp_store_stats::refused_connections,
               "refused a connection from " + peer + ": " + std::to_string(o_.max_connections) + " are open");
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      client c;
      c.fd = std::move(guard);
      c.peer = peer;
      c.since = c.last = clock::now();
      std::string greeting(detail::store_magic, 4);
      const bool auth = o_.security == wire_security::authenticated;
      greeting.push_back(auth ? 1 : 0);
      cadence::detail::random_bytes(c.nonce, sizeof c.nonce);
      greeting.append(reinterpret_cast<const char*>(c.nonce), sizeof c.nonce);
      c.authenticated = !auth;
      if (!send_all(c.fd.get(), greeting)) continue;
      clients.push_back(std::move(c));
    }
  }

  // Closes what is past its time: a handshake not done, a connection silent too long.
  void expire(std::vector<client>& clients, clock::time_point now) {
    for (client& c : clients) {
      if (c.fd.get() < 0) continue;
      if (!c.authenticated && now - c.since > o_.handshake_timeout) {
        report(&tcp_store_stats::handshake_timeouts,
               "closed " + c.peer + ": it did not authenticate within " +
                   std::to_string(o_.handshake_timeout.count()) + " ms");
        c.fd.reset();
      } else if (c.authenticated && now - c.last > o_.idle_timeout) {
        report(&tcp_store_stats::idle_closed,
               "closed " + c.peer + ": silent for " + std::to_string(o_.idle_timeout.count()) + " ms");
        c.fd.reset();
      }
    }
  }

  // How many bytes the message c is reading needs in all, from what has come (0: malformed).
  std::size_t needed(const client& c, std::string& why) const {
    if (!c.authenticated) return detail::store_nonce + detail::store_code;
    return detail::store_request_size(c.in.data(), c.in.size(), o_.security == wire_security::authenticated, why);
  }

  // Reads what c sent, never more than the message it is in needs, and answers every whole
  // one; false when c is gone or is to be closed.
  bool serve_one(client& c) {
    char buf[65536];
    for (;;) {
      std::string why;
      const std::size_t want = needed(c, why);
      if (want == 0) {
        report(&tcp_store_stats::protocol_errors, "closed " + c.peer + ": " + why);
        return false;
      }
      if (c.in.size() >= want) {
        if (!handle(c, want)) return false;
        c.in.erase(0, want);
        continue;
      }
      const std::size_t room = std::min(sizeof buf, want - c.in.size());
      const ssize_t n = ::recv(c.fd.get(), buf, room, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        c.last = clock::now();
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
  }

  // One whole message of c (the first `n` bytes of c.in).
  bool handle(client& c, std::size_t n) {
    const bool auth = o_.security == wire_security::authenticated;
    if (!c.authenticated) {  // the client's nonce and its proof
      const auto* nonce = reinterpret_cast<const unsigned char*>(c.in.data());
      c.session = detail::store_session(o_.secret, c.nonce, nonce);
      if (!cadence::detail::equal_in_constant_time(c.in.data() + detail::store_nonce, c.session.client_proof().data(),
                                          detail::store_code)) {
        report(&tcp_store_stats::auth_failures, "closed " + c.peer + ": it does not hold the job secret");
        // A proof of zeros tells an honest client of another job why, before the close.
        send_all(c.fd.get(), std::string(detail::store_code, '\0'));
        return false;
      }
      c.authenticated = true;
      return send_all(c.fd.get(), std::string(reinterpret_cast<const char*>(c.session.server_proof().data()),
                                              detail::store_code));
    }
    const std::size_t body = n - (auth ? detail::store_code : 0);
    const std::string request(c.in.data(), body);
    if (auth) {
      const auto code = c.session.code('Q', c.seq_in++, request);
      if (!cadence::detail::equal_in_constant_time(c.in.data() + body, code.data(), detail::store_code)) {
        report(&tcp_store_stats::auth_failures, "closed " + c.peer + ": a request's code is wrong");
        return false;
      }
    }
    const detail::store_request q = detail::store_parse_request(request.data());
    const unsigned char op = q.op;
    const std::size_t klen = q.key.size(), vlen = q.value.size();
    std::string key(q.key);
    std::string answer;
    bool refused = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (op == detail::op_set) {
        const auto it = table_.find(key);
        const std::size_t old = it == table_.end() ? 0 : it->first.size() + it->second.size();
        const bool room = (it != table_.end() || table_.size() < o_.max_keys) &&
                          bytes_ - old + klen + vlen <= o_.max_bytes;
        if (room) {
          bytes_ = bytes_ - old + klen + vlen;
          table_[std::move(key)] = std::string(q.value);
          answer.push_back(static_cast<char>(detail::status_ok));
        } else {
          ++stats_.refused_sets;
          refused = true;
          answer.push_back(static_cast<char>(detail::status_refused));
        }
        detail::put_u32(answer, 0);
      } else {
        const auto it = table_.find(key);
        answer.push_back(static_cast<char>(it != table_.end() ? detail::status_ok : detail::status_absent));
        const bool with_value = op == detail::op_get && it != table_.end();
        detail::put_u32(answer, with_value ? static_cast<std::uint32_t>(it->second.size()) : 0);
        if (with_value) answer += it->second;
      }
    }
    if (refused && o_.on_event)
      try {
        o_.on_event("cadence::transport::tcp_store_server at " + address_ + ": refused a set from " + c.peer +
                    ": the table is full (" + std::to_string(o_.max_keys) + " keys, " + std::to_string(o_.max_bytes) +
                    " bytes)");
      } catch (...) {
      }
    if (auth) {
      const auto code = c.session.code('A', c.seq_out++, answer);
      answer.append(reinterpret_cast<const char*>(code.data()), code.size());
    }
    return send_all(c.fd.get(), answer);
  }

  // A client that stops reading its answers for a second is dropped rather than stall the
  // others (answers are small; a healthy client reads each one before its next request).
  static bool send_all(int fd, const std::string& a) {
    std::size_t sent = 0;
    const deadline d(std::chrono::seconds(1));
    while (sent < a.size()) {
      const ssize_t n = ::send(fd, a.data() + sent, a.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && detail::wait_fd(fd, POLLOUT, d) && !d.passed())
        continue;
      return false;
    }
    return true;
  }

  tcp_store_options o_;
  detail::fd_guard listen_, wake_read_, wake_write_;
  std::string address_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;  // guards table_, bytes_ and stats_
  std::map<std::string, std::string> table_;
  std::size_t bytes_ = 0;
  tcp_store_stats stats_;
  std::thread thread_;
};

// ---- the client ----

/// One rank's connection to a tcp_store_server. Every call has a deadline; a server that is not
/// up yet (connection refused) is retried until then, and a connection that breaks (the server
/// restarted, or a server of an earlier communicator went away, or closed it as idle) is opened
/// again and this client's own keys are set again before the call goes on, so ranks may start
/// in any order. A server that does not prove the job secret, or that answers with a wrong code,
/// is never believed. One thread uses a client at a time.
class tcp_store {
public:
  /// Connects to `address` ("host:port"), retrying every `retry` until `d`. Throws
  /// invalid_parameter_error for an address it cannot parse or resolve or options it refuses,
  /// and transport_error naming the address when nothing answers there before `d`, or when the
  /// store there does not prove the job secret (or demands one this client lacks).
  tcp_store(std::string address, tcp_store_options options, deadline d = {},
            std::chrono::milliseconds retry = std::chrono::milliseconds(20))
      : address_(std::move(address)), o_(std::move(options)), retry_(retry) {
    const detail::host_port hp = detail::parse_host_port(address_, who());
    detail::check_store_security(who(), hp, o_);
    detail::resolve(hp, false, peer_, who());
    connect(d);
  }

  /// The server's address, as given ("host:port").
  const std::string& address() const noexcept { return address_; }

  /// Sets `key` to `value` (replacing an earlier value) within deadline `d`. Throws
  /// transport_error when the store refuses it (its table is full).
  void set(const std::string& key, const std::string& value, deadline d = {}) {
    check_key(key);
    if (value.size() > tcp_store_max_value)
      throw invalid_parameter_error(who() + ": the value of \"" + key + "\" has " + std::to_string(value.size()) +
                                    " bytes, more than the store's " + std::to_string(tcp_store_max_value));
    mine_[key] = value;
    if (ask(detail::op_set, key, value, d) == detail::status_refused)
      throw transport_error(who() + ": the store at " + address_ + " refused \"" + key + "\": its table is full");
  }

  /// The value of `key`, or nothing when no rank has set it yet; asked within deadline `d`.
  std::optional<std::string> try_get(const std::string& key, deadline d = {}) {
    check_key(key);
    std::string value;
    if (ask(detail::op_get, key, {}, d, &value) != detail::status_ok) return std::nullopt;
    return value;
  }

  /// The value of `key`, waiting (polling every `poll`) until some rank sets it. Throws
  /// transport_error naming the key when `d` passes first.
  std::string get(const std::string& key, deadline d = {}, std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
    const auto late = [&] { return transport_error(who() + ": no rank set \"" + key + "\" at " + address_ + " in time"); };
    for (;;) {
      try {
        if (auto v = try_get(key, d)) return std::move(*v);
      } catch (const transport_error&) {
        if (d.passed()) throw late();  // the deadline passed with a request in flight
        throw;
      }
      if (d.passed()) throw late();
      std::this_thread::sleep_for(poll);
    }
  }

  /// The keys among `keys` that nobody has set yet, in their order, asked within deadline `d`.
  std::vector<std::string> missing(const std::vector<std::string>& keys, deadline d = {}) {
    std::vector<std::string> out;
    for (const std::string& k : keys) {
      check_key(k);
      if (ask(detail::op_check, k, {}, d) != detail::status_ok) out.push_back(k);
    }
    return out;
  }

  /// Waits until every key in `keys` is set, asking again every `poll`; throws transport_error
  /// naming those still missing when `d` passes.
  void wait(const std::vector<std::string>& keys, deadline d = {},
            std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
    std::vector<std::string> left = keys;
    const auto late = [&] {
      std::string names;
      for (std::size_t i = 0; i < left.size() && i < 8; ++i) names += (i ? ", \"" : "\"") + left[i] + "\"";
      if (left.size() > 8) names += " and " + std::to_string(left.size() - 8) + " more";
      return transport_error(who() + ": nobody set " + names + " at " + address_ + " in time");
    };
    for (;;) {
      try {
        left = missing(left, d);
      } catch (const transport_error&) {
        if (d.passed()) throw late();  // the deadline passed with a request in flight: as last seen
        throw;
      }
      if (left.empty()) return;
      if (d.passed()) throw late();
      std::this_thread::sleep_for(poll);
    }
  }

private:
  static std::string who() { return "cadence::transport::tcp_store"; }

  static void check_key(const std::string& key) {
    if (key.empty() || key.size() > tcp_store_max_key)
      throw invalid_parameter_error(who() + ": a key must have 1 to " + std::to_string(tcp_store_max_key) +
                                    " bytes, not " + std::to_string(key.size()));
  }

  // Opens a connection and completes the greeting (and, authenticated, the challenge). A store
  // that cannot prove the secret, or whose mode differs from ours, is an error at once: waiting
  // would not change it.
  void connect(const deadline& d) {
    int last_error = 0;
    for (;;) {
      for (addrinfo* a = peer_.head; a != nullptr; a = a->ai_next) {
        detail::fd_guard fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
        if (fd.get() < 0) {
          last_error = errno;
          continue;
        }
        // Non-blocking connect, so an unreachable host is bounded by the deadline too.
        ::fcntl(fd.get(), F_SETFL, O_NONBLOCK);
        int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          if (!detail::wait_fd(fd.get(), POLLOUT, d)) {
            last_error = ETIMEDOUT;
            continue;
          }
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc != 0) {
          last_error = errno;
          continue;
        }
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = std::move(fd);
        if (greet(d)) return;
        fd_.reset();
        last_error = ECONNRESET;
      }
      if (d.passed())
        throw transport_error(who() + ": nothing answered at " + address_ + " in time (last error: " +
                              detail::errno_text(last_error) + "; is the rank that serves the store running?)");
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(retry_, d.remaining()));
    }
  }

  // False when the connection broke during the greeting (the caller retries).
  bool greet(const deadline& d) {
    char g[detail::store_greeting];
    if (!read_all(g, sizeof g, d)) return false;
    if (std::memcmp(g, detail::store_magic, 4) != 0)
      throw transport_error(who() + ": what answers at " + address_ + " is not a Cadence store (or an older one)");
    const bool theirs = g[4] != 0, ours = o_.security == wire_security::authenticated;
    if (theirs != ours)
      throw transport_error(who() + ": the store at " + address_ +
                            (theirs ? " demands a job secret; this process has none (an open client)"
                                    : " is open (it authenticates nobody); this process holds a job secret and will not "
                                      "trust it"));
    seq_out_ = seq_in_ = 0;
    if (!ours) {
      session_ = {};
      return true;
    }
    unsigned char nonce[detail::store_nonce];
    cadence::detail::random_bytes(nonce, sizeof nonce);
    session_ = detail::store_session(o_.secret, reinterpret_cast<const unsigned char*>(g + 5), nonce);
    std::string hello(reinterpret_cast<const char*>(nonce), sizeof nonce);
    hello.append(reinterpret_cast<const char*>(session_.client_proof().data()), detail::store_code);
    if (!write_all(hello.data(), hello.size(), d)) return false;
    char proof[detail::store_code];
    if (!read_all(proof, sizeof proof, d)) return false;
    if (!cadence::detail::equal_in_constant_time(proof, session_.server_proof().data(), detail::store_code))
      throw transport_error(who() + ": the store at " + address_ +
                            " and this process hold different job secrets (another job's store, or a stranger)");
    return true;
  }

  // Sends one request and reads its answer; returns the status byte. A broken connection is
  // opened again (setting this client's keys again first) until `d`.
  unsigned char ask(detail::store_op op, const std::string& key, const std::string& value, const deadline& d,
                    std::string* out = nullptr) {
    for (;;) {
      if (fd_.get() < 0) {
        connect(d);
        if (!replay(d)) continue;
      }
      unsigned char status = 0;
      if (exchange(op, key, value, d, status, out)) return status;
      fd_.reset();
      if (d.passed())  // mid-request: the answer did not come in time, or the connection broke
        throw transport_error(who() + ": the store at " + address_ + " did not answer in time (no answer, or the "
                              "connection broke and did not come back)");
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(retry_, d.remaining()));
    }
  }

  bool replay(const deadline& d) {
    for (const auto& [k, v] : mine_) {
      unsigned char status = 0;
      if (!exchange(detail::op_set, k, v, d, status, nullptr)) {
        fd_.reset();
        return false;
      }
    }
    return true;
  }

  // False when the connection broke (or d passed) mid-request, or the answer's code is wrong.
  bool exchange(detail::store_op op, const std::string& key, const std::string& value, const deadline& d,
                unsigned char& status, std::string* out) {
    std::string req;
    req.reserve(9 + key.size() + value.size() + detail::store_code);
    req.push_back(static_cast<char>(op));
    detail::put_u32(req, static_cast<std::uint32_t>(key.size()));
    detail::put_u32(req, static_cast<std::uint32_t>(value.size()));
    req += key;
    req += value;
    if (session_.on()) {
      const auto code = session_.code('Q', seq_out_++, req);
      req.append(reinterpret_cast<const char*>(code.data()), code.size());
    }
    if (!write_all(req.data(), req.size(), d)) return false;
    char head[5];
    if (!read_all(head, 5, d)) return false;
    status = static_cast<unsigned char>(head[0]);
    const std::size_t len = detail::get_u32(head + 1);
    if (len > tcp_store_max_value) return false;
    std::string answer(head, 5);
    answer.resize(5 + len);
    if (len > 0 && !read_all(answer.data() + 5, len, d)) return false;
    if (session_.on()) {
      char code[detail::store_code];
      if (!read_all(code, sizeof code, d)) return false;
      const auto want = session_.code('A', seq_in_++, answer);
      if (!cadence::detail::equal_in_constant_time(code, want.data(), detail::store_code)) return false;
    }
    if (out != nullptr) *out = answer.substr(5);
    return true;
  }

  bool write_all(const char* p, std::size_t n, const deadline& d) {
    return move_all(p, n, POLLOUT, d,
                    [this](const char* q, std::size_t k) { return ::send(fd_.get(), q, k, MSG_NOSIGNAL); });
  }

  bool read_all(char* p, std::size_t n, const deadline& d) {
    return move_all(p, n, POLLIN, d, [this](char* q, std::size_t k) { return ::recv(fd_.get(), q, k, 0); });
  }

  // Moves all n bytes at p with `io` (a send or a recv on the socket), waiting for `events`
  // while the socket would block; false on a closed connection, an error or the deadline.
  template <class Char, class Io>
  bool move_all(Char* p, std::size_t n, short events, const deadline& d, Io io) {
    while (n > 0) {
      const ssize_t r = io(p, n);
      if (r > 0) {
        p += r;
        n -= static_cast<std::size_t>(r);
      } else if (r < 0 && errno == EINTR) {
        continue;
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!detail::wait_fd(fd_.get(), events, d)) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  std::string address_;
  tcp_store_options o_;
  std::chrono::milliseconds retry_;
  detail::addrinfo_list peer_;
  detail::fd_guard fd_;
  detail::store_session session_;
  std::uint64_t seq_out_ = 0, seq_in_ = 0;
  std::map<std::string, std::string> mine_;  // what this client set, for a new connection
};

/// @}
}  // namespace cadence::transport
