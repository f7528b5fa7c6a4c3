// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), a constant-time comparison and bytes from the
// kernel's random source: what the job secret's authentication needs, kept in the core so that
// cadence::cadence still asks a consumer for nothing but threads.
#pragma once

#include <cadence/core/error.hpp>

#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace cadence::detail {

using sha256_digest = std::array<unsigned char, 32>;

/// Incremental SHA-256.
class sha256 {
public:
  sha256() noexcept { reset(); }

  void reset() noexcept {
    static constexpr std::uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::memcpy(h_, init, sizeof h_);
    length_ = 0;
    used_ = 0;
  }

  sha256& update(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    length_ += static_cast<std::uint64_t>(n);
    while (n > 0) {
      const std::size_t take = std::min<std::size_t>(64 - used_, n);
      std::memcpy(block_ + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ == 64) {
        compress(block_);
        used_ = 0;
      }
    }
    return *this;
  }
  sha256& update(const std::string& s) noexcept { return update(s.data(), s.size()); }

  sha256_digest finish() noexcept {
    const std::uint64_t bits = length_ * 8;
    const unsigned char one = 0x80, zero = 0;
    update(&one, 1);
    while (used_ != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(len, 8);
    sha256_digest out{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) out[static_cast<std::size_t>(4 * i + j)] = static_cast<unsigned char>(h_[i] >> (24 - 8 * j));
    reset();
    return out;
  }

private:
  static constexpr std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

  void compress(const unsigned char* b) noexcept {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (std::uint32_t{b[4 * i]} << 24) | (std::uint32_t{b[4 * i + 1]} << 16) | (std::uint32_t{b[4 * i + 2]} << 8) |
             std::uint32_t{b[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], bb = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = bb;
      bb = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += bb;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::uint32_t h_[8];
  unsigned char block_[64];
  std::uint64_t length_ = 0;
  std::size_t used_ = 0;
};

/// HMAC-SHA256 (RFC 2104) with `key`, over the concatenation of the parts fed to update().
class hmac_sha256 {
public:
  hmac_sha256(const void* key, std::size_t n) noexcept {
    unsigned char k[64] = {};
    if (n > 64) {
      sha256 s;
      const sha256_digest d = s.update(key, n).finish();
      std::memcpy(k, d.data(), d.size());
    } else if (n > 0) {
      std::memcpy(k, key, n);
    }
    for (int i = 0; i < 64; ++i) {
      ipad_[i] = static_cast<unsigned char>(k[i] ^ 0x36);
      opad_[i] = static_cast<unsigned char>(k[i] ^ 0x5c);
    }
    inner_.update(ipad_, sizeof ipad_);
  }
  hmac_sha256& update(const void* data, std::size_t n) noexcept {
    inner_.update(data, n);
    return *this;
  }
  hmac_sha256& update(const std::string& s) noexcept { return update(s.data(), s.size()); }
  sha256_digest finish() noexcept {
    const sha256_digest in = inner_.finish();
    sha256 outer;
    outer.update(opad_, sizeof opad_).update(in.data(), in.size());
    inner_.update(ipad_, sizeof ipad_);
    return outer.finish();
  }

private:
  unsigned char ipad_[64];
  unsigned char opad_[64];
  sha256 inner_;
};

/// Whether two byte strings of length n are equal, in time independent of where they differ.
inline bool equal_in_constant_time(const void* a, const void* b, std::size_t n) noexcept {
  const auto* x = static_cast<const volatile unsigned char*>(a);
  const auto* y = static_cast<const volatile unsigned char*>(b);
  unsigned char diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff = static_cast<unsigned char>(diff | (x[i] ^ y[i]));
  return diff == 0;
}

/// n bytes from the kernel's random source (getrandom(2)); throws cadence::error if it fails.
inline void random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw error(std::string("cadence: getrandom failed: ") + std::strerror(errno));
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

/// Lower-case hexadecimal of n bytes.
inline std::string to_hex(const void* data, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string s(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 0xF];
  }
  return s;
}

}  // namespace cadence::detail
