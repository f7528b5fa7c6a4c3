/// \file
/// \ingroup transport
/// The job secret: one key that every process of a job holds and a stranger does not. Every
/// listener of a job authenticates its peers with keys derived from it (the TCP store's
/// challenge and message codes, ZeroMQ's CURVE keys), so a peer without it cannot complete a
/// handshake, read a key, join, take a slot or send a message. See docs/transports.md,
/// "Security".
#pragma once

#include <cadence/core/detail/sha256.hpp>
#include <cadence/core/error.hpp>

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// Whether a listener demands the job secret of every peer (the default) or serves anyone who
/// reaches it (`open`: only when asked for by name, and only on loopback unless forced).
enum class wire_security : std::uint8_t { authenticated, open };

/// A job's shared key: at least 16 random bytes, held as bytes, given as hexadecimal text (a
/// key file's first line, or an environment variable the launcher sets). Copyable; never
/// printed (fingerprint() names it in logs).
class job_secret {
public:
  /// The fewest bytes a secret may have: 128 bits.
  static constexpr std::size_t min_bytes = 16;

  /// No secret (empty()).
  job_secret() = default;

  /// 32 fresh bytes from the kernel's random source.
  static job_secret generate() {
    job_secret s;
    s.bytes_.resize(32);
    cadence::detail::random_bytes(s.bytes_.data(), s.bytes_.size());
    return s;
  }

  /// From hexadecimal text (surrounding white space ignored); `where` names the source in the
  /// error when the text is not an even number of hex digits of at least min_bytes bytes.
  static job_secret from_hex(std::string_view text, const std::string& where = "the job secret") {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' || text.back() == '\t'))
      text.remove_suffix(1);
    while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
    auto nibble = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (text.size() % 2 != 0 || text.size() / 2 < min_bytes)
      throw invalid_parameter_error("cadence: " + where + " must be at least " + std::to_string(2 * min_bytes) +
                                    " hexadecimal digits (an even number), got " + std::to_string(text.size()) +
                                    " characters");
    job_secret s;
    s.bytes_.resize(text.size() / 2);
    for (std::size_t i = 0; i < s.bytes_.size(); ++i) {
      const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
      if (hi < 0 || lo < 0)
        throw invalid_parameter_error("cadence: " + where + " is not hexadecimal (character " +
                                      std::to_string(2 * i + (hi < 0 ? 1 : 2)) + ")");
      s.bytes_[i] = static_cast<unsigned char>(hi * 16 + lo);
    }
    return s;
  }

  /// The first line of the key file at `path`, in hexadecimal (as hex() writes it). The file
  /// must be a regular file that neither its group nor others may read or write (as ssh
  /// insists for its keys).
  static job_secret from_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw invalid_parameter_error("cadence: the job secret file \"" + path + "\" does not exist or is not a file");
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
      throw invalid_parameter_error("cadence: the job secret file \"" + path +
                                    "\" may be read or written by others (chmod 600 it)");
    std::ifstream in(path);
    std::string line;
    if (!std::getline(in, line))
      throw invalid_parameter_error("cadence: the job secret file \"" + path + "\" is empty or unreadable");
    return from_hex(line, "the job secret in \"" + path + "\"");
  }

  /// The value of environment variable `name` (hexadecimal), or no secret when it is unset or
  /// empty. For programs (the library reads no environment on its own).
  static job_secret from_environment(const char* name = "CADENCE_JOB_SECRET") {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) return {};
    return from_hex(v, std::string("$") + name);
  }

  /// Whether there is no secret (default-constructed, or an unset environment variable).
  bool empty() const noexcept { return bytes_.empty(); }
  /// The secret in hexadecimal, for a launcher to hand to its processes.
  std::string hex() const { return cadence::detail::to_hex(bytes_.data(), bytes_.size()); }
  /// Eight hex digits that name the secret in logs without revealing it.
  std::string fingerprint() const {
    const auto d = derive("fingerprint");
    return cadence::detail::to_hex(d.data(), 4);
  }
  /// 32 bytes for one use (`purpose`): HMAC-SHA256(secret, "cadence/" + purpose), so the keys
  /// of different uses are independent.
  cadence::detail::sha256_digest derive(std::string_view purpose) const {
    cadence::detail::hmac_sha256 h(bytes_.data(), bytes_.size());
    h.update("cadence/", 8).update(purpose.data(), purpose.size());
    return h.finish();
  }

  ///@{
  /// Whether `a` and `b` are the same key, compared in constant time (no timing tells how much
  /// of a guess was right).
  friend bool operator==(const job_secret& a, const job_secret& b) noexcept {
    return a.bytes_.size() == b.bytes_.size() &&
           cadence::detail::equal_in_constant_time(a.bytes_.data(), b.bytes_.data(), a.bytes_.size());
  }
  friend bool operator!=(const job_secret& a, const job_secret& b) noexcept { return !(a == b); }
  ///@}

private:
  std::vector<unsigned char> bytes_;
};

namespace detail {
/// Whether `host` names this machine's loopback (where an open listener may serve).
inline bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}
}  // namespace detail

/// @}
}  // namespace cadence::transport
