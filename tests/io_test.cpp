// The history files' opt-in header gives the reader, the writer and the generator.
#include <cadence/io.hpp>

#include <doctest/doctest.h>

#include <sstream>

TEST_CASE("the io header round-trips a generated push history through the published format") {
  cadence::generator_options options{/*workers=*/3, /*pushes=*/5};
  options.seed = 7;
  const auto generated = cadence::generate_push_history(options);
  std::ostringstream out;
  cadence::write_push_history(out, generated);
  std::istringstream in(out.str());
  CHECK(cadence::read_push_history(in, "generated") == generated);
}
