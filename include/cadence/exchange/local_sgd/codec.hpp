/// \file
/// \ingroup exchange
/// The wire formats of outer gradients (pseudo-gradients) in the local-SGD family: f32 (none),
/// bf16, fp16, and int8 or int4 with one f32 scale per block of 128 elements. Encoding and
/// decoding are plain functions on host memory, deterministic, so every rank that decodes the
/// same bytes gets the same floats (the adapters rely on it to keep the global weights
/// identical on every rank).
#pragma once

#include <cadence/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

namespace cadence::exchange {
/// \addtogroup exchange
/// @{

/// How a pseudo-gradient travels. Pick f32 when bandwidth is plentiful; bf16 or fp16 halve the
/// bytes at a rounding error below what training notices (fp16 overflows above 65504, bf16
/// keeps f32's range); int8 and int4 cut them 4x and 8x (plus 4 bytes per 128 elements for the
/// scale) and need error feedback, which the adapter keeps by default (Streaming DiLoCo, arXiv
/// 2501.18512, sends 4-bit outer gradients).
enum class outer_codec : std::uint8_t {
  f32,   ///< 4 bytes per element, exact
  bf16,  ///< 2 bytes: f32's exponent, 8 bits of mantissa, rounded to nearest even
  fp16,  ///< 2 bytes: IEEE half precision, rounded to nearest even
  int8,  ///< 1 byte: symmetric, scale = max |x| / 127 per block
  int4,  ///< half a byte: symmetric, scale = max |x| / 7 per block, two codes per byte
};

/// Elements that share one scale in the int8 and int4 formats.
inline constexpr std::size_t codec_block = 128;

namespace detail {
// Every codec with its name, which outer_codec_name gives and parse_outer_codec reads.
inline constexpr std::pair<outer_codec, const char*> outer_codec_names[] = {
    {outer_codec::f32, "f32"}, {outer_codec::bf16, "bf16"}, {outer_codec::fp16, "fp16"},
    {outer_codec::int8, "int8"}, {outer_codec::int4, "int4"}};
}  // namespace detail

/// The name of `c`: "f32", "bf16", "fp16", "int8" or "int4".
constexpr const char* outer_codec_name(outer_codec c) noexcept {
  for (const auto& e : detail::outer_codec_names)
    if (e.first == c) return e.second;
  return "unknown codec";
}

/// The codec `name` names ("f32" or "none", "bf16", "fp16", "int8", "int4"); throws
/// parse_error naming it and the valid names.
inline outer_codec parse_outer_codec(std::string_view name) {
  if (name == "none") return outer_codec::f32;
  for (const auto& e : detail::outer_codec_names)
    if (name == e.second) return e.first;
  throw parse_error("cadence: unknown codec '" + std::string(name) + "' (valid: f32, none, bf16, fp16, int8, int4)");
}

/// Whether `c` loses information (every codec but f32), so error feedback applies.
constexpr bool codec_is_lossy(outer_codec c) noexcept { return c != outer_codec::f32; }

/// Bytes that `n` elements take in format `c`.
constexpr std::size_t encoded_bytes(outer_codec c, std::size_t n) noexcept {
  const std::size_t blocks = (n + codec_block - 1) / codec_block;
  switch (c) {
    case outer_codec::f32: return 4 * n;
    case outer_codec::bf16:
    case outer_codec::fp16: return 2 * n;
    case outer_codec::int8: return n + 4 * blocks;
    case outer_codec::int4: {
      // each block: its scale, then its codes, two per byte (a last odd code alone)
      std::size_t b = 0;
      for (std::size_t k = 0; k < blocks; ++k) {
        const std::size_t m = std::min(codec_block, n - k * codec_block);
        b += 4 + (m + 1) / 2;
      }
      return b;
    }
  }
  return 0;
}

namespace detail {

inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float bits_float(std::uint32_t x) noexcept {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

/// f32 to bf16, rounded to nearest even; a NaN stays a (quiet) NaN.
inline std::uint16_t bf16_from_float(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
inline float float_from_bf16(std::uint16_t h) noexcept { return bits_float(static_cast<std::uint32_t>(h) << 16); }

/// f32 to IEEE half, rounded to nearest even: overflow to infinity, subnormals kept, NaN quiet.
inline std::uint16_t half_from_float(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t a = x & 0x7FFFFFFFu;
  if (a >= 0x7F800000u)  // infinity or NaN
    return static_cast<std::uint16_t>(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u | ((a >> 13) & 0x3FFu) : 0u));
  if (a >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (a < 0x38800000u) {                                                    // below 2^-14: subnormal
    if (a < 0x33000000u) return sign;                                       // at most 2^-25: zero
    const std::uint32_t e = a >> 23;
    const std::uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t h = (a - 0x38000000u) >> 13;  // rebias the exponent by 127 - 15
  const std::uint32_t rem = a & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
inline float float_from_half(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1Fu;
  const std::uint32_t m = h & 0x3FFu;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// One int8/int4 block of m elements: its f32 scale, then the codes.
template <int QMax>
void encode_block(const float* in, std::size_t m, unsigned char* out) noexcept {
  float amax = 0;
  bool finite_in = true;
  for (std::size_t i = 0; i < m; ++i) {
    if (!std::isfinite(in[i])) finite_in = false;
    else amax = std::max(amax, std::fabs(in[i]));
  }
  if (!finite_in) amax = std::numeric_limits<float>::quiet_NaN();
  const float scale = amax / static_cast<float>(QMax);
  std::memcpy(out, &scale, 4);
  out += 4;
  const bool finite = std::isfinite(scale) && scale > 0;
  const float inv = finite ? 1.0f / scale : 0.0f;
  auto code = [&](float x) -> int {
    if (!finite) return 0;
    const long q = std::lrint(x * inv);
    return static_cast<int>(std::clamp<long>(q, -QMax, QMax));
  };
  if constexpr (QMax == 127) {
    for (std::size_t i = 0; i < m; ++i) out[i] = static_cast<unsigned char>(static_cast<std::int8_t>(code(in[i])));
  } else {
    for (std::size_t i = 0; i < m; i += 2) {
      const int lo = code(in[i]) + 8;
      const int hi = i + 1 < m ? code(in[i + 1]) + 8 : 8;
      out[i / 2] = static_cast<unsigned char>(lo | (hi << 4));
    }
  }
}
template <int QMax>
void decode_block(const unsigned char* in, std::size_t m, float* out) noexcept {
  float scale;
  std::memcpy(&scale, in, 4);
  in += 4;
  if (!std::isfinite(scale)) {  // a non-finite input stays visible (NaN)
    std::fill(out, out + m, scale);
    return;
  }
  if constexpr (QMax == 127) {
    for (std::size_t i = 0; i < m; ++i) out[i] = static_cast<float>(static_cast<std::int8_t>(in[i])) * scale;
  } else {
    for (std::size_t i = 0; i < m; ++i) {
      const int c = (i % 2 == 0 ? in[i / 2] & 0x0F : in[i / 2] >> 4) - 8;
      out[i] = static_cast<float>(c) * scale;
    }
  }
}

template <int QMax>
void encode_blocks(const float* in, std::size_t n, unsigned char* out) noexcept {
  for (std::size_t k = 0; k < n; k += codec_block) {
    const std::size_t m = std::min(codec_block, n - k);
    encode_block<QMax>(in + k, m, out);
    out += 4 + (QMax == 127 ? m : (m + 1) / 2);
  }
}
template <int QMax>
void decode_blocks(const unsigned char* in, std::size_t n, float* out) noexcept {
  for (std::size_t k = 0; k < n; k += codec_block) {
    const std::size_t m = std::min(codec_block, n - k);
    decode_block<QMax>(in, m, out + k);
    in += 4 + (QMax == 127 ? m : (m + 1) / 2);
  }
}

// The 2-byte formats (bf16, fp16): element i is the 16 bits at 2 i, Narrow(x) of x and Widen(h)
// back.
template <std::uint16_t (*Narrow)(float) noexcept>
void encode_16(const float* in, std::size_t n, unsigned char* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = Narrow(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}
template <float (*Widen)(std::uint16_t) noexcept>
void decode_16(const unsigned char* in, std::size_t n, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = Widen(h);
  }
}

// The two directions of every format but f32 (a plain copy either way), so that encode and
// decode share one dispatch on the codec.
struct encoding {
  static constexpr auto bf16 = encode_16<bf16_from_float>;
  static constexpr auto fp16 = encode_16<half_from_float>;
  static constexpr auto int8 = encode_blocks<127>;
  static constexpr auto int4 = encode_blocks<7>;
};
struct decoding {
  static constexpr auto bf16 = decode_16<float_from_bf16>;
  static constexpr auto fp16 = decode_16<float_from_half>;
  static constexpr auto int8 = decode_blocks<127>;
  static constexpr auto int4 = decode_blocks<7>;
};
template <class Direction, class In, class Out>
void transcode(outer_codec c, const In* in, std::size_t n, Out* out) noexcept {
  switch (c) {
    case outer_codec::f32: std::memcpy(out, in, 4 * n); return;
    case outer_codec::bf16: Direction::bf16(in, n, out); return;
    case outer_codec::fp16: Direction::fp16(in, n, out); return;
    case outer_codec::int8: Direction::int8(in, n, out); return;
    case outer_codec::int4: Direction::int4(in, n, out); return;
  }
}

}  // namespace detail

/// Writes `n` floats from `in` in format `c` to `out` (encoded_bytes(c, n) bytes). int8 and
/// int4 round each x / scale to the nearest integer (ties to even); a block whose largest
/// magnitude is 0 encodes as zeros, one holding a NaN or an infinity decodes as NaNs (a diverged
/// run stays visible).
inline void encode(outer_codec c, const float* in, std::size_t n, unsigned char* out) noexcept {
  detail::transcode<detail::encoding>(c, in, n, out);
}

/// Reads `n` floats in format `c` from `in` into `out`.
inline void decode(outer_codec c, const unsigned char* in, std::size_t n, float* out) noexcept {
  detail::transcode<detail::decoding>(c, in, n, out);
}

/// @}
}  // namespace cadence::exchange
