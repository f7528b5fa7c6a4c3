// Fuzzes what a ZeroMQ rank reads off its sockets before anything acts on it
// (cadence/transport/zmq/detail/wire.hpp): zmq_parse, the checker of every data-path message (a
// routing id, a header frame, an optional data frame), and zmq_reader, which the rendezvous reads
// its hello, welcome, refused, update and replaced messages with (in rendezvous.hpp's order and
// limits). Each frame lives in a buffer of exactly its size, so AddressSanitizer stops any read
// past it. What must hold:
//   - zmq_parse never throws and accepts a message only when everything it says is within the
//     frames: a known kind, sender and destination in range and matching the routing id, data
//     exactly as long as the header and the frame say, and per kind what its fields allow;
//     every byte of an accepted message's data can be read from the frame it names;
//   - zmq_reader never reads past the message, refuses a string longer than its limit unread,
//     and what it hands back adds up to no more than the message.
//
// Input: byte 0 picks the decoder (bit 0: rendezvous, else data path) and, for the data path,
// whether a second frame comes (bit 1); byte 1 the world size (1..8), byte 2 this rank; then a
// length byte and the routing id; then two bytes of the first frame's length; the rest is that
// frame and the second one. For the rendezvous the rest after byte 2 is the message.
#include <cadence/transport/zmq/detail/wire.hpp>

#include "fuzz_check.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace cadence::transport::detail;

#define FUZZ_CHECK(cond) CADENCE_FUZZ_CHECK("zmq_message_fuzz", cond)

// A frame in a heap block of exactly its size (none for an empty one: a null pointer that must
// not be read).
struct frame {
  explicit frame(const std::uint8_t* p, std::size_t n) : bytes(n) {
    if (n != 0) std::memcpy(bytes.data(), p, n);
  }
  const unsigned char* data() const { return bytes.empty() ? nullptr : bytes.data(); }
  std::size_t size() const { return bytes.size(); }
  std::vector<unsigned char> bytes;
};

bool text_kind(std::uint8_t k) {
  return k == static_cast<std::uint8_t>(zmq_kind::refuse) || k == static_cast<std::uint8_t>(zmq_kind::coll_fail);
}

void data_path(const std::uint8_t* d, std::size_t n, bool two, int size, int rank) {
  if (n < 1) return;
  const std::size_t id_len = std::min<std::size_t>(d[0] % 24, n - 1);
  const frame id(d + 1, id_len);
  d += 1 + id_len;
  n -= 1 + id_len;
  std::size_t first_len = n;
  if (two) {
    if (n < 2) return;
    first_len = std::min<std::size_t>(static_cast<std::size_t>(d[0]) | (static_cast<std::size_t>(d[1]) << 8), n - 2);
    d += 2;
    n -= 2;
  }
  const frame first(d, first_len);
  const frame second(d + first_len, n - first_len);
  const std::size_t second_len = second.size();
  const zmq_parsed m =
      zmq_parse(id.data(), id.size(), first.data(), first.size(), two ? &second_len : nullptr, rank, size);
  if (!m.why.empty()) return;  // refused, with a reason: the engine drops it (and its sender)
  // Accepted: everything it claims lies within what came.
  FUZZ_CHECK(m.src >= 0 && m.src < size && m.src != rank);
  FUZZ_CHECK(zmq_identity(m.src, m.inc) == std::string(reinterpret_cast<const char*>(id.data()), id.size()));
  FUZZ_CHECK(m.h.src == m.src && m.h.dst == rank);
  FUZZ_CHECK(m.in_second == two);
  const frame& holder = two ? second : first;
  const std::size_t at = two ? 0 : sizeof(zmq_header);
  FUZZ_CHECK(first.size() >= sizeof(zmq_header));
  FUZZ_CHECK(!two || first.size() == sizeof(zmq_header));
  FUZZ_CHECK(m.data_len == m.h.length && at + m.data_len == holder.size());
  const auto kind = static_cast<zmq_kind>(m.h.kind);
  FUZZ_CHECK(m.h.kind >= 1 && m.h.kind <= 12);
  switch (kind) {
    case zmq_kind::eager: FUZZ_CHECK(m.h.bytes == m.data_len && m.h.tag >= 0); break;
    case zmq_kind::announce:
    case zmq_kind::stream: FUZZ_CHECK(m.data_len == 0 && m.h.tag >= 0); break;
    case zmq_kind::piece: FUZZ_CHECK(m.data_len > 0 && m.h.offset + m.data_len >= m.h.offset); break;
    case zmq_kind::credit: FUZZ_CHECK(m.data_len == 0 && m.h.offset != 0); break;
    case zmq_kind::coll:
      FUZZ_CHECK(m.h.id != 0 && (m.h.coll == 1 || m.h.coll == 2));
      if (m.h.step == zmq_notice_step) FUZZ_CHECK(m.data_len == 0);
      break;
    default:
      if (text_kind(m.h.kind))
        FUZZ_CHECK(m.data_len <= zmq_max_text);
      else
        FUZZ_CHECK(m.data_len == 0);
  }
  // The data, read as the engine reads it: from the frame it names, at the offset it names.
  std::vector<unsigned char> copy(m.data_len);
  if (m.data_len != 0) std::memcpy(copy.data(), holder.data() + at, m.data_len);
}

// The rendezvous messages, read in rendezvous.hpp's order with its limits.
void rendezvous(const std::uint8_t* d, std::size_t n, int size) {
  const frame body(d, n);
  zmq_reader rd(body.data() == nullptr ? reinterpret_cast<const unsigned char*>("") : body.data(), body.size());
  const auto kind = rd.kind();
  if (!kind) {
    FUZZ_CHECK(n < 5 || std::memcmp(d, zmq_rdv_magic, 4) != 0);
    return;
  }
  std::size_t taken = 5;  // what the reader handed back, which cannot exceed the message
  auto str = [&](std::string& s, std::uint32_t limit = 4096) {
    if (!rd.get_string(s, limit)) return false;
    FUZZ_CHECK(s.size() <= limit);
    taken += 4 + s.size();
    return true;
  };
  auto get = [&](auto& v) {
    if (!rd.get(v)) return false;
    taken += sizeof v;
    return true;
  };
  std::int32_t r = 0, k = 0;
  std::uint64_t inc = 0;
  std::string text;
  switch (*kind) {
    case zmq_rdv_kind::hello:
      if (get(r) && get(k) && str(text)) get(inc);  // inc: the process's token
      break;
    case zmq_rdv_kind::welcome:
      if (get(inc) && get(k) && k == size) {
        for (int p = 0; p < k; ++p) {
          std::uint8_t state = 0;
          if (!get(inc) || !get(state) || !str(text)) break;
        }
      }
      break;
    case zmq_rdv_kind::refused: str(text); break;
    case zmq_rdv_kind::update:
      if (get(r) && get(inc)) str(text);
      break;
    case zmq_rdv_kind::replaced: get(inc); break;
    default: {
      // A kind the rendezvous ignores: the reader still never goes past the end.
      while (str(text)) {
      }
    }
  }
  FUZZ_CHECK(taken <= n);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const bool rdv = (data[0] & 1) != 0, two = (data[0] & 2) != 0;
  const int world = 1 + data[1] % 8;
  const int rank = data[2] % world;
  if (rdv)
    rendezvous(data + 3, size - 3, world);
  else
    data_path(data + 3, size - 3, two, world, rank);
  return 0;
}
