// A rendezvous store over TCP: one process serves a small key-value table on a known
// host:port and every rank of a job sets and reads keys there, so processes on hosts that share
// no file system can find each other (what gloo's file store needs a shared folder for).
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>

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
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence::transport {

/// Largest key and value the store accepts; a request above them closes its connection.
inline constexpr std::size_t tcp_store_max_key = 4096;
inline constexpr std::size_t tcp_store_max_value = std::size_t{64} << 20;

namespace detail {

// "host:port", "tcp://host:port" or "[v6 address]:port".
struct host_port {
  std::string host, port;
};

inline host_port parse_host_port(const std::string& address, const std::string& who) {
  std::string a = address;
  if (a.rfind("tcp://", 0) == 0) a = a.substr(6);
  host_port hp;
  std::size_t colon;
  if (!a.empty() && a.front() == '[') {
    const auto close = a.find(']');
    if (close == std::string::npos || close + 1 >= a.size() || a[close + 1] != ':')
      throw invalid_parameter_error(who + ": the address \"" + address + "\" is not [host]:port");
    hp.host = a.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = a.rfind(':');
    if (colon == std::string::npos)
      throw invalid_parameter_error(who + ": the address \"" + address + "\" has no port (host:port)");
    hp.host = a.substr(0, colon);
  }
  hp.port = a.substr(colon + 1);
  if (hp.host.empty())
    throw invalid_parameter_error(who + ": the address \"" + address + "\" has no host (host:port)");
  const bool digits = !hp.port.empty() && hp.port.size() <= 5 &&
                      std::all_of(hp.port.begin(), hp.port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stol(hp.port) > 65535)
    throw invalid_parameter_error(who + ": the port of \"" + address + "\" is not a number in 0..65535");
  return hp;
}

struct addrinfo_list {
  addrinfo* head = nullptr;
  addrinfo_list() = default;
  addrinfo_list(const addrinfo_list&) = delete;
  addrinfo_list& operator=(const addrinfo_list&) = delete;
  ~addrinfo_list() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

inline void resolve(const host_port& hp, bool passive, addrinfo_list& out, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const int rc = ::getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &out.head);
  if (rc != 0)
    throw invalid_parameter_error(who + ": cannot resolve \"" + hp.host + "\": " + ::gai_strerror(rc));
}

inline int poll_ms(const deadline& d, std::chrono::milliseconds cap = std::chrono::milliseconds(1000)) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d.remaining());
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(left.count() + 1, 0, cap.count()));
}

// Waits until fd is ready for `events`; false when d passes first. Throws nothing.
inline bool wait_fd(int fd, short events, const deadline& d) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, poll_ms(d));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // the next read or write reports the error
    if (d.passed()) return false;
  }
}

// The store's wire: a request is op (1 byte), key length and value length (4 bytes each, big
// endian), the key, the value; an answer is a status byte and a value length, then the value.
enum store_op : unsigned char { op_set = 'S', op_get = 'G', op_check = 'C' };

inline void put_u32(std::string& s, std::uint32_t v) {
  const std::uint32_t n = htonl(v);
  s.append(reinterpret_cast<const char*>(&n), 4);
}
inline std::uint32_t get_u32(const char* p) {
  std::uint32_t n;
  std::memcpy(&n, p, 4);
  return ntohl(n);
}

class fd_guard {
public:
  explicit fd_guard(int fd = -1) noexcept : fd_(fd) {}
  fd_guard(fd_guard&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  fd_guard& operator=(fd_guard&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

private:
  int fd_;
};

inline std::string errno_text(int e) { return std::strerror(e); }

}  // namespace detail

// ---- the server ----

/// Serves the store on `address` ("host:port"; port 0 lets the system choose, address() then
/// says which) from a thread of its own until destroyed. One process of the job runs it
/// (usually rank 0, see gloo_options::rendezvous); it holds what the ranks set in memory and
/// never ends a connection except one that breaks the protocol. Anyone who can reach the port
/// can read and write the table: serve it on a network the job's hosts trust.
class tcp_store_server {
public:
  explicit tcp_store_server(const std::string& address) {
    const std::string who = "cadence::transport::tcp_store_server";
    const detail::host_port hp = detail::parse_host_port(address, who);
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
    char host[NI_MAXHOST], port[NI_MAXSERV];
    ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV);
    address_ = (bound.ss_family == AF_INET6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" + port;
    int wake[2];
    if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0)
      throw transport_error(who + ": pipe: " + detail::errno_text(errno));
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
  /// Connections that broke the protocol (a request too large or of an unknown kind); each
  /// was closed.
  std::size_t rejected() const noexcept { return rejected_.load(std::memory_order_relaxed); }

private:
  struct client {
    detail::fd_guard fd;
    std::string in;
  };

  void serve() {
    std::vector<client> clients;
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), POLLIN, 0});
      for (const client& c : clients) fds.push_back({c.fd.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
      if ((fds[1].revents & POLLIN) != 0)
        for (;;) {
          const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (fd < 0) break;
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          clients.push_back({detail::fd_guard(fd), {}});
        }
      // fds[2 + i] is clients[i] as they were before the accepts above.
      const std::size_t polled = fds.size() - 2;
      for (std::size_t i = 0; i < polled; ++i)
        if (fds[2 + i].revents != 0 && !serve_one(clients[i])) clients[i].fd.reset();
      clients.erase(std::remove_if(clients.begin(), clients.end(), [](const client& c) { return c.fd.get() < 0; }),
                    clients.end());
    }
  }

  // Reads what c sent and answers every whole request; false when c is gone or broke the wire.
  bool serve_one(client& c) {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    std::size_t at = 0;
    while (c.in.size() - at >= 9) {
      const char* h = c.in.data() + at;
      const auto op = static_cast<unsigned char>(h[0]);
      const std::size_t klen = detail::get_u32(h + 1), vlen = detail::get_u32(h + 5);
      if ((op != detail::op_set && op != detail::op_get && op != detail::op_check) || klen > tcp_store_max_key ||
          vlen > tcp_store_max_value || (op != detail::op_set && vlen != 0)) {
        rejected_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      if (c.in.size() - at < 9 + klen + vlen) break;
      std::string key(h + 9, klen);
      std::string answer;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (op == detail::op_set) {
          table_[std::move(key)] = std::string(h + 9 + klen, vlen);
          answer.push_back(1);
          detail::put_u32(answer, 0);
        } else {
          const auto it = table_.find(key);
          answer.push_back(it != table_.end() ? 1 : 0);
          const bool with_value = op == detail::op_get && it != table_.end();
          detail::put_u32(answer, with_value ? static_cast<std::uint32_t>(it->second.size()) : 0);
          if (with_value) answer += it->second;
        }
      }
      at += 9 + klen + vlen;
      if (!send_answer(c.fd.get(), answer)) return false;
    }
    c.in.erase(0, at);
    return true;
  }

  // A client that stops reading its answers for a second is dropped rather than stall the
  // others (answers are small; a healthy client reads each one before its next request).
  bool send_answer(int fd, const std::string& a) {
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

  detail::fd_guard listen_, wake_read_, wake_write_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> rejected_{0};
  mutable std::mutex mutex_;
  std::map<std::string, std::string> table_;
  std::thread thread_;
};

// ---- the client ----

/// One rank's connection to a tcp_store_server. Every call has a deadline; a server that is not
/// up yet (connection refused) is retried until then, and a connection that breaks (the server
/// restarted, or a server of an earlier communicator went away) is opened again and this
/// client's own keys are set again before the call goes on, so ranks may start in any order.
/// One thread uses a client at a time.
class tcp_store {
public:
  /// Connects to `address` ("host:port"), retrying every `retry` until `d`. Throws
  /// invalid_parameter_error for an address it cannot parse or resolve, and transport_error
  /// naming the address when nothing answers there before `d`.
  explicit tcp_store(std::string address, deadline d = {},
                     std::chrono::milliseconds retry = std::chrono::milliseconds(20))
      : address_(std::move(address)), retry_(retry) {
    const detail::host_port hp = detail::parse_host_port(address_, who());
    detail::resolve(hp, false, peer_, who());
    connect(d);
  }

  const std::string& address() const noexcept { return address_; }

  /// Sets `key` to `value` (replacing an earlier value).
  void set(const std::string& key, const std::string& value, deadline d = {}) {
    check_key(key);
    if (value.size() > tcp_store_max_value)
      throw invalid_parameter_error(who() + ": the value of \"" + key + "\" has " + std::to_string(value.size()) +
                                    " bytes, more than the store's " + std::to_string(tcp_store_max_value));
    mine_[key] = value;
    ask(detail::op_set, key, value, d);
  }

  /// The value of `key`, or nothing when no rank has set it yet.
  std::optional<std::string> try_get(const std::string& key, deadline d = {}) {
    check_key(key);
    std::string value;
    if (!ask(detail::op_get, key, {}, d, &value)) return std::nullopt;
    return value;
  }

  /// The value of `key`, waiting (polling every `poll`) until some rank sets it. Throws
  /// transport_error naming the key when `d` passes first.
  std::string get(const std::string& key, deadline d = {},
                  std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
    for (;;) {
      if (auto v = try_get(key, d)) return std::move(*v);
      if (d.passed()) throw transport_error(who() + ": no rank set \"" + key + "\" at " + address_ + " in time");
      std::this_thread::sleep_for(poll);
    }
  }

  /// The keys among `keys` that nobody has set yet, in their order.
  std::vector<std::string> missing(const std::vector<std::string>& keys, deadline d = {}) {
    std::vector<std::string> out;
    for (const std::string& k : keys) {
      check_key(k);
      if (!ask(detail::op_check, k, {}, d)) out.push_back(k);
    }
    return out;
  }

  /// Waits until every key in `keys` is set; throws transport_error naming those still
  /// missing when `d` passes.
  void wait(const std::vector<std::string>& keys, deadline d = {},
            std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
    std::vector<std::string> left = keys;
    for (;;) {
      left = missing(left, d);
      if (left.empty()) return;
      if (d.passed()) {
        std::string names;
        for (std::size_t i = 0; i < left.size() && i < 8; ++i) names += (i ? ", \"" : "\"") + left[i] + "\"";
        if (left.size() > 8) names += " and " + std::to_string(left.size() - 8) + " more";
        throw transport_error(who() + ": nobody set " + names + " at " + address_ + " in time");
      }
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
        return;
      }
      if (d.passed())
        throw transport_error(who() + ": nothing answered at " + address_ + " in time (last error: " +
                              detail::errno_text(last_error) + "; is the rank that serves the store running?)");
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(retry_, d.remaining()));
    }
  }

  // Sends one request and reads its answer; returns the status byte. A broken connection is
  // opened again (setting this client's keys again first) until `d`.
  bool ask(detail::store_op op, const std::string& key, const std::string& value, const deadline& d,
           std::string* out = nullptr) {
    for (;;) {
      if (fd_.get() < 0) {
        connect(d);
        if (!replay(d)) continue;
      }
      bool status = false;
      if (exchange(op, key, value, d, status, out)) return status;
      fd_.reset();
      if (d.passed())
        throw transport_error(who() + ": the connection to " + address_ + " broke and did not come back in time");
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(retry_, d.remaining()));
    }
  }

  bool replay(const deadline& d) {
    for (const auto& [k, v] : mine_) {
      bool status = false;
      if (!exchange(detail::op_set, k, v, d, status, nullptr)) {
        fd_.reset();
        return false;
      }
    }
    return true;
  }

  // False when the connection broke (or d passed) mid-request.
  bool exchange(detail::store_op op, const std::string& key, const std::string& value, const deadline& d,
                bool& status, std::string* out) {
    std::string req;
    req.reserve(9 + key.size() + value.size());
    req.push_back(static_cast<char>(op));
    detail::put_u32(req, static_cast<std::uint32_t>(key.size()));
    detail::put_u32(req, static_cast<std::uint32_t>(value.size()));
    req += key;
    req += value;
    if (!write_all(req.data(), req.size(), d)) return false;
    char head[5];
    if (!read_all(head, 5, d)) return false;
    status = head[0] != 0;
    const std::size_t len = detail::get_u32(head + 1);
    if (len > tcp_store_max_value) return false;
    std::string v(len, '\0');
    if (len > 0 && !read_all(v.data(), len, d)) return false;
    if (out != nullptr) *out = std::move(v);
    return true;
  }

  bool write_all(const char* p, std::size_t n, const deadline& d) {
    while (n > 0) {
      const ssize_t w = ::send(fd_.get(), p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= static_cast<std::size_t>(w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!detail::wait_fd(fd_.get(), POLLOUT, d)) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  bool read_all(char* p, std::size_t n, const deadline& d) {
    while (n > 0) {
      const ssize_t r = ::recv(fd_.get(), p, n, 0);
      if (r > 0) {
        p += r;
        n -= static_cast<std::size_t>(r);
      } else if (r < 0 && errno == EINTR) {
        continue;
      } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!detail::wait_fd(fd_.get(), POLLIN, d)) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  std::string address_;
  std::chrono::milliseconds retry_;
  detail::addrinfo_list peer_;
  detail::fd_guard fd_;
  std::map<std::string, std::string> mine_;  // what this client set, for a new connection
};

}  // namespace cadence::transport
