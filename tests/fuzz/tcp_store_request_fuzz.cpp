// Fuzzes the TCP store server's request decoder (cadence/transport/tcp_store.hpp:
// detail::store_request_size and detail::store_parse_request), fed the way the server feeds it:
// a byte stream split into requests, each head judged before the rest is read, the bytes held in
// a buffer of exactly what came so far (AddressSanitizer stops a read past it). What must hold:
//   - a head is judged from its first 9 bytes alone, and before more than that is read; a
//     malformed one is refused with a reason (the server closes the connection), never read
//     further;
//   - an accepted request never needs more than 9 + 4 KiB + 64 MiB + a code (so the server
//     never buffers more for one request), and its key (1 to 4 KiB) and value (none for a get
//     or check) lie inside it, in order, ending where the code starts;
//   - nothing throws.
// Input: byte 0's bit 0 says whether the connection is authenticated (each request then ends in
// a 32-byte code); the rest is what the client sent.
#include <cadence/transport/tcp_store.hpp>

#include "fuzz_check.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace ct = cadence::transport;
namespace cd = cadence::transport::detail;

#define FUZZ_CHECK(cond) CADENCE_FUZZ_CHECK("tcp_store_request_fuzz", cond)

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool auth = (data[0] & 1) != 0;
  const char* stream = reinterpret_cast<const char*>(data + 1);
  std::size_t left = size - 1;
  const std::size_t most = 9 + ct::tcp_store_max_key + ct::tcp_store_max_value + cd::store_code;
  while (left > 0) {
    // What the server holds of this request: never more than the decoder asked for.
    std::vector<char> in;
    std::size_t want = 0;
    std::string why;
    for (;;) {
      want = cd::store_request_size(in.data(), in.size(), auth, why);
      if (want == 0 || in.size() >= want || in.size() == left) break;
      const std::size_t more = std::min(want - in.size(), left - in.size());
      in.insert(in.end(), stream + in.size(), stream + in.size() + more);
    }
    if (want == 0) {  // malformed: the connection closes here
      FUZZ_CHECK(!why.empty() && in.size() == 9);
      return 0;
    }
    FUZZ_CHECK(why.empty());
    if (in.size() < 9) {  // the stream ended within a head: the server waits for the rest
      FUZZ_CHECK(want == 9);
      return 0;
    }
    FUZZ_CHECK(want >= 9 + 1 + (auth ? cd::store_code : 0) && want <= most);
    if (in.size() < want) return 0;  // the stream ended mid-request: the server waits for more
    const std::vector<char> whole(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(want));
    const cd::store_request q = cd::store_parse_request(whole.data());
    FUZZ_CHECK(q.op == cd::op_set || q.op == cd::op_get || q.op == cd::op_check);
    FUZZ_CHECK(!q.key.empty() && q.key.size() <= ct::tcp_store_max_key);
    FUZZ_CHECK(q.value.size() <= ct::tcp_store_max_value);
    FUZZ_CHECK(q.op == cd::op_set || q.value.empty());
    FUZZ_CHECK(q.key.data() == whole.data() + 9);
    FUZZ_CHECK(q.value.data() == q.key.data() + q.key.size());
    FUZZ_CHECK(9 + q.key.size() + q.value.size() + (auth ? cd::store_code : 0) == want);
    // Read them as the server does (a copy of each).
    const std::string key(q.key), value(q.value);
    FUZZ_CHECK(key.size() + value.size() + 9 <= want);
    stream += want;
    left -= want;
  }
  return 0;
}
