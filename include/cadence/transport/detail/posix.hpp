// The POSIX pieces the TCP store and its clients share: "host:port" addresses, name
// resolution, descriptors closed by their owner, waiting on one with a deadline, and big-endian
// integers on the wire.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace cadence::transport::detail {


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

inline void put_u64(std::string& s, std::uint64_t v) {
  put_u32(s, static_cast<std::uint32_t>(v >> 32));
  put_u32(s, static_cast<std::uint32_t>(v));
}

}  // namespace cadence::transport::detail
