// Fuzzes the push-history readers (cadence/io/push_history.hpp: read_push_history<int64_t>,
// read_push_history<double>, read_any_push_history) on arbitrary text, with small bounds from
// the input so the bounds are exercised too. What must hold:
//   - every input is read or refused with cadence::parse_error (naming the source and line),
//     never another exception, a crash or an allocation beyond the bounds;
//   - what was read meets the format's promises (ids unique and ascending, every row at least
//     min_timestamps long and non-decreasing, strictly increasing when asked, within
//     max_workers and max_timestamps) and round-trips: written with write_push_history and
//     read again it is the same history.
// Input: byte 0 picks the bounds (bits 0-1: min_timestamps 1..4, bit 2: strictly increasing,
// bit 3: small bounds); the rest is the file.
#include <cadence/io/push_history.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <variant>

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "push_history_fuzz: %s\n", what);
  std::abort();
}

template <class T>
void check(const cadence::push_history<T>& h, const cadence::push_history_read_options& o) {
  if (h.size() > o.max_workers) fail("more workers than max_workers");
  if (h.values().size() > o.max_timestamps) fail("more timestamps than max_timestamps");
  for (std::size_t p = 0; p < h.size(); ++p) {
    if (p > 0 && h.ids()[p - 1] >= h.ids()[p]) fail("ids not unique and ascending");
    const auto row = h.row(p);
    if (row.size() < o.min_timestamps) fail("a row shorter than min_timestamps");
    for (std::size_t i = 1; i < row.size(); ++i) {
      if (row[i] < row[i - 1]) fail("a decreasing row");
      if (o.strictly_increasing && !(row[i] > row[i - 1])) fail("a row not strictly increasing");
    }
  }
  // Written and read back: the same history.
  std::stringstream text;
  cadence::write_push_history(text, h);
  cadence::push_history_read_options again = o;
  again.max_line_length = cadence::push_history_max_line_length;  // a written line may be longer than the input's
  const auto back = cadence::read_push_history<T>(text, "<written>", again);
  if (back != h) fail("a history written and read back differs");
}

template <class F>
void read_or_refuse(F&& read) {
  try {
    read();
  } catch (const cadence::parse_error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "push_history_fuzz: unexpected exception: %s\n", e.what());
    fail("an exception that is not parse_error");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  cadence::push_history_read_options o;
  o.min_timestamps = 1 + (data[0] & 3);
  o.strictly_increasing = (data[0] & 4) != 0;
  if ((data[0] & 8) != 0) {
    o.max_line_length = 64;
    o.max_workers = 4;
    o.max_timestamps = 16;
  }
  const std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  read_or_refuse([&] {
    std::istringstream in(file);
    check(cadence::read_push_history<std::int64_t>(in, "<fuzz>", o), o);
  });
  read_or_refuse([&] {
    std::istringstream in(file);
    check(cadence::read_push_history<double>(in, "<fuzz>", o), o);
  });
  read_or_refuse([&] {
    std::istringstream in(file);
    const cadence::any_push_history h = cadence::read_any_push_history(in, "<fuzz>", o);
    std::visit([&](const auto& x) { check(x, o); }, h);
  });
  return 0;
}
