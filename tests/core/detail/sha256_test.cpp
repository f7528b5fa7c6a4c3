// core/detail/sha256.hpp: SHA-256 and HMAC-SHA256 agree with the published test vectors (FIPS
// 180-4's examples, RFC 4231), however the input is split; the comparison is exact.
#include <cadence/core/detail/sha256.hpp>

#include <doctest/doctest.h>

#include <string>

namespace {
std::string hex_of(const cadence::detail::sha256_digest& d) { return cadence::detail::to_hex(d.data(), d.size()); }
std::string sha_hex(const std::string& s) {
  cadence::detail::sha256 h;
  return hex_of(h.update(s).finish());
}
std::string hmac_hex(const std::string& key, const std::string& data) {
  cadence::detail::hmac_sha256 h(key.data(), key.size());
  return hex_of(h.update(data).finish());
}
}  // namespace

TEST_CASE("sha256 gives the FIPS 180-4 digests, whole or fed in pieces") {
  CHECK(sha_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(sha_hex(two_blocks) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  cadence::detail::sha256 pieces;
  for (std::size_t i = 0; i < two_blocks.size(); i += 7) pieces.update(two_blocks.substr(i, 7));
  CHECK(hex_of(pieces.finish()) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // A message of exactly 55, 56 and 64 bytes ends its padding in different blocks.
  CHECK(sha_hex(std::string(55, 'x')) != sha_hex(std::string(56, 'x')));
  cadence::detail::sha256 reused;
  reused.update("abc").finish();
  CHECK(hex_of(reused.update("abc").finish()) == sha_hex("abc"));  // finish() starts over
}

TEST_CASE("hmac_sha256 gives RFC 4231's codes, with short, long and block-size-exceeding keys") {
  CHECK(hmac_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  cadence::detail::hmac_sha256 twice("Jefe", 4);
  twice.update("what do ya want for nothing?").finish();
  CHECK(hex_of(twice.update("what do ya want for nothing?").finish()) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");  // reusable after finish()
}

TEST_CASE("equal_in_constant_time compares whole strings; random_bytes differ from call to call") {
  CHECK(cadence::detail::equal_in_constant_time("abcd", "abcd", 4));
  CHECK_FALSE(cadence::detail::equal_in_constant_time("abcd", "abce", 4));
  CHECK_FALSE(cadence::detail::equal_in_constant_time("xbcd", "abcd", 4));
  unsigned char a[32] = {}, b[32] = {};
  cadence::detail::random_bytes(a, sizeof a);
  cadence::detail::random_bytes(b, sizeof b);
  CHECK_FALSE(cadence::detail::equal_in_constant_time(a, b, sizeof a));
}
