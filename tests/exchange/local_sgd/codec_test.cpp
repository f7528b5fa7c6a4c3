// cadence/exchange/local_sgd/codec.hpp: the half-precision conversions against values whose
// encoding is known (ties, overflow, subnormals, NaN), the quantisers' error bound per block,
// and the byte counts.
#include <cadence/exchange/local_sgd/codec.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace cadence;
using namespace cadence::exchange;

namespace codec_test {
std::vector<float> roundtrip(outer_codec c, const std::vector<float>& x) {
  std::vector<unsigned char> b(encoded_bytes(c, x.size()));
  encode(c, x.data(), x.size(), b.data());
  std::vector<float> y(x.size());
  decode(c, b.data(), x.size(), y.data());
  return y;
}
}  // namespace codec_test
using namespace codec_test;

TEST_CASE("fp16 keeps representable values exactly and rounds to nearest even") {
  using cadence::exchange::detail::float_from_half;
  using cadence::exchange::detail::half_from_float;
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f /* 2^-14 */, 5.960464477539063e-08f /* 2^-24 */})
    CHECK(float_from_half(half_from_float(v)) == v);
  CHECK(half_from_float(1.0f) == 0x3C00);
  CHECK(half_from_float(65504.0f) == 0x7BFF);
  CHECK(half_from_float(65520.0f) == 0x7C00);           // the tie above the largest rounds to infinity
  CHECK(half_from_float(65519.0f) == 0x7BFF);
  CHECK(half_from_float(1.0f + 1.0f / 2048) == 0x3C00);  // a tie between 1 and 1 + 2^-10: to even
  CHECK(half_from_float(1.0f + 3.0f / 2048) == 0x3C02);
  CHECK(half_from_float(2.9802322387695312e-08f) == 0);  // 2^-25: the tie with 2^-24 goes to 0
  CHECK(half_from_float(-std::numeric_limits<float>::infinity()) == 0xFC00);
  CHECK(std::isnan(float_from_half(half_from_float(std::numeric_limits<float>::quiet_NaN()))));
  // Every half value converts to a float and back to itself.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) continue;  // NaNs: payload kept, quiet bit set
    CHECK_MESSAGE(half_from_float(float_from_half(static_cast<std::uint16_t>(h))) == h, h);
  }
}

TEST_CASE("bf16 keeps f32's range and rounds the mantissa to nearest even") {
  using cadence::exchange::detail::bf16_from_float;
  using cadence::exchange::detail::float_from_bf16;
  CHECK(float_from_bf16(bf16_from_float(1.0f)) == 1.0f);
  CHECK(float_from_bf16(bf16_from_float(3e38f)) == doctest::Approx(3e38f).epsilon(0.01));
  CHECK(bf16_from_float(1.0f + 1.0f / 256) == 0x3F80);  // tie: to even
  CHECK(bf16_from_float(1.0f + 3.0f / 256) == 0x3F82);
  CHECK(std::isnan(float_from_bf16(bf16_from_float(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("int8 and int4 lose at most half a quantisation step per element, per block") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const outer_codec c : {outer_codec::int8, outer_codec::int4}) {
    const float qmax = c == outer_codec::int8 ? 127.0f : 7.0f;
    for (const std::size_t n : {1u, 2u, 127u, 128u, 129u, 1000u}) {
      std::vector<float> x(n);
      for (auto& v : x) v = nd(rng) * 3.0f;
      const auto y = roundtrip(c, x);
      for (std::size_t k = 0; k < n; k += codec_block) {
        float amax = 0;
        for (std::size_t i = k; i < std::min(n, k + codec_block); ++i) amax = std::max(amax, std::fabs(x[i]));
        const float step = amax / qmax;
        for (std::size_t i = k; i < std::min(n, k + codec_block); ++i)
          CHECK_MESSAGE(std::fabs(y[i] - x[i]) <= step * 0.5001f, outer_codec_name(c) << " n " << n << " i " << i);
      }
    }
  }
}

TEST_CASE("a zero block stays zero and a block with a NaN or an infinity decodes as NaN") {
  for (const outer_codec c : {outer_codec::int8, outer_codec::int4}) {
    CHECK(roundtrip(c, std::vector<float>(5, 0.0f)) == std::vector<float>(5, 0.0f));
    const auto y = roundtrip(c, {1.0f, std::numeric_limits<float>::infinity(), 2.0f});
    CHECK(std::isnan(y[0]));
    CHECK(std::isnan(y[2]));
  }
}

TEST_CASE("encoded sizes: 4, 2, 2, 1 and 1/2 bytes per element plus 4 bytes per 128-element block") {
  CHECK(encoded_bytes(outer_codec::f32, 10) == 40);
  CHECK(encoded_bytes(outer_codec::bf16, 10) == 20);
  CHECK(encoded_bytes(outer_codec::fp16, 10) == 20);
  CHECK(encoded_bytes(outer_codec::int8, 256) == 256 + 8);
  CHECK(encoded_bytes(outer_codec::int8, 129) == 129 + 8);
  CHECK(encoded_bytes(outer_codec::int4, 256) == 128 + 8);
  CHECK(encoded_bytes(outer_codec::int4, 129) == 64 + 4 + 1 + 4);
  CHECK(encoded_bytes(outer_codec::int4, 0) == 0);
}

TEST_CASE("codec names parse back, and an unknown one is refused naming the valid ones") {
  for (const outer_codec c :
       {outer_codec::f32, outer_codec::bf16, outer_codec::fp16, outer_codec::int8, outer_codec::int4})
    CHECK(parse_outer_codec(outer_codec_name(c)) == c);
  CHECK(parse_outer_codec("none") == outer_codec::f32);
  try {
    (void)parse_outer_codec("int2");
    FAIL("no error");
  } catch (const parse_error& e) {
    CHECK(std::string(e.what()).find("'int2' (valid: f32, none, bf16") != std::string::npos);
  }
}
