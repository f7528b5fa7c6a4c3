/// \file
/// \ingroup core
/// Cadence's version, for code that must check which release it compiles against. The numbers
/// repeat the top-level VERSION file, which CMake, Meson, Conan and pyproject.toml read; the
/// tests fail when the two disagree (tests/version_test.cpp, the consumer.* ctest entries).
#pragma once

/// \addtogroup core
/// @{

/// The major version: before 1, a minor version may break the API (docs/compatibility.md).
#define CADENCE_VERSION_MAJOR 0
/// The minor version.
#define CADENCE_VERSION_MINOR 1
/// The patch version: fixes and additions only.
#define CADENCE_VERSION_PATCH 0

/// MAJOR * 10000 + MINOR * 100 + PATCH, for comparisons in `#if`.
#define CADENCE_VERSION \
  (CADENCE_VERSION_MAJOR * 10000 + CADENCE_VERSION_MINOR * 100 + CADENCE_VERSION_PATCH)

#define CADENCE_DETAIL_STRINGIFY_(x) #x
#define CADENCE_DETAIL_STRINGIFY(x) CADENCE_DETAIL_STRINGIFY_(x)
/// "MAJOR.MINOR.PATCH".
#define CADENCE_VERSION_STRING                                                              \
  CADENCE_DETAIL_STRINGIFY(CADENCE_VERSION_MAJOR) "." CADENCE_DETAIL_STRINGIFY(              \
      CADENCE_VERSION_MINOR) "." CADENCE_DETAIL_STRINGIFY(CADENCE_VERSION_PATCH)
/// @}
