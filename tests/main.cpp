// doctest's runner: the cadence_doctest_main library, compiled once, linked into every test.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
