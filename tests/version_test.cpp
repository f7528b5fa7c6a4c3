#include <cadence/version.hpp>

#include <doctest/doctest.h>

#include <string>

// CMake passes the project version it read from VERSION; this pins that both agree and
// that the derived macros follow the components.
TEST_CASE("the version macros match the CMake project version") {
  CHECK(CADENCE_VERSION_MAJOR == CADENCE_CMAKE_VERSION_MAJOR);
  CHECK(CADENCE_VERSION_MINOR == CADENCE_CMAKE_VERSION_MINOR);
  CHECK(CADENCE_VERSION_PATCH == CADENCE_CMAKE_VERSION_PATCH);
  CHECK(std::string(CADENCE_VERSION_STRING) == CADENCE_CMAKE_VERSION_STRING);
  CHECK(CADENCE_VERSION ==
        CADENCE_VERSION_MAJOR * 10000 + CADENCE_VERSION_MINOR * 100 + CADENCE_VERSION_PATCH);
}

#if CADENCE_VERSION < 100
TEST_CASE("CADENCE_VERSION works in #if") { CHECK(CADENCE_VERSION_MAJOR == 0); }
#endif
