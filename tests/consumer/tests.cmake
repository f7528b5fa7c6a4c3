# Every way a project takes Cadence in, as a ctest entry that builds tests/consumer's programs
# that way and runs them (tests/consumer/run.cmake does the work; docs/install.md lists them).
# Included from tests/CMakeLists.txt. Each needs its tool: one that is missing leaves its entry
# out with a status line (scripts/install-deps.sh test installs them all).
if(NOT CADENCE_INSTALL OR CADENCE_SANITIZE)
  return()
endif()

set(_consumer_backends "")
foreach(backend thrust mpi nccl gloo zmq)
  if(TARGET cadence_${backend})
    list(APPEND _consumer_backends ${backend})
  endif()
endforeach()
string(REPLACE ";" "," _consumer_backends "${_consumer_backends}")
set(_consumer_work ${CMAKE_CURRENT_BINARY_DIR}/consumer)
find_package(Python3 COMPONENTS Interpreter)
find_program(CADENCE_PKG_CONFIG NAMES pkg-config pkgconf DOC "pkg-config, for consumer.pkg_config")
find_program(CADENCE_MESON meson DOC "Meson, for the consumer.meson_* tests")
find_program(CADENCE_BAZEL bazel DOC "Bazel, for consumer.bazel")
option(CADENCE_TEST_CONAN
       "Test the Conan recipe (consumer.conan; conan comes from PyPI into CADENCE_CONAN_VENV once)"
       ON)
if(DEFINED ENV{XDG_CACHE_HOME})
  set(_consumer_cache $ENV{XDG_CACHE_HOME})
else()
  set(_consumer_cache $ENV{HOME}/.cache)
endif()
set(CADENCE_CONAN_VENV ${_consumer_cache}/cadence/conan-venv CACHE PATH
    "Virtual environment holding the conan that consumer.conan runs (created when missing)")
set(CADENCE_CONAN_VERSION 2.34.0 CACHE STRING "The conan version consumer.conan installs and runs")

# cadence_consumer_test(MODE [INSTALLED] [TIMEOUT s] [ARGS -Dvar=value...])
function(cadence_consumer_test mode)
  cmake_parse_arguments(arg "INSTALLED" "TIMEOUT" "ARGS" ${ARGN})
  add_test(NAME consumer.${mode}
    COMMAND ${CMAKE_COMMAND} -DMODE=${mode} -DCADENCE_SOURCE_DIR=${PROJECT_SOURCE_DIR}
            -DWORK_DIR=${_consumer_work}/${mode} -DPREFIX=${_consumer_work}/prefix
            -DGENERATOR=${CMAKE_GENERATOR} -DCXX=${CMAKE_CXX_COMPILER}
            -DBACKENDS=${_consumer_backends} ${arg_ARGS}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.cmake)
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  set_tests_properties(consumer.${mode} PROPERTIES TIMEOUT ${arg_TIMEOUT})
  if(arg_INSTALLED)
    set_tests_properties(consumer.${mode} PROPERTIES FIXTURES_REQUIRED cadence_installed)
  endif()
endfunction()

# cmake --install into one prefix, which the installed ways then read.
cadence_consumer_test(install)
set_tests_properties(consumer.install PROPERTIES FIXTURES_SETUP cadence_installed)
set(_gloo_exported OFF)
if(TARGET cadence_gloo AND CADENCE_GLOO_FROM_CONFIG)
  set(_gloo_exported ON)
endif()
cadence_consumer_test(headers INSTALLED)
cadence_consumer_test(find_package INSTALLED ARGS -DGLOO_EXPORTED=${_gloo_exported})
cadence_consumer_test(add_subdirectory)
cadence_consumer_test(fetchcontent)
if(Python3_VERSION VERSION_GREATER_EQUAL 3.11)  # tomllib
  cadence_consumer_test(versions ARGS -DPYTHON=${Python3_EXECUTABLE})
else()
  message(STATUS "cadence: no Python 3.11; consumer.versions (pyproject.toml's version) left out")
endif()
if(CADENCE_PKG_CONFIG)
  cadence_consumer_test(pkg_config INSTALLED ARGS -DPKG_CONFIG=${CADENCE_PKG_CONFIG})
else()
  message(STATUS "cadence: no pkg-config; consumer.pkg_config and consumer.meson_pkg_config "
                 "left out")
endif()
if(CADENCE_MESON)
  cadence_consumer_test(meson_subproject ARGS -DMESON=${CADENCE_MESON})
  if(CADENCE_PKG_CONFIG)
    cadence_consumer_test(meson_pkg_config INSTALLED ARGS -DMESON=${CADENCE_MESON})
  endif()
else()
  message(STATUS "cadence: no meson; consumer.meson_subproject and consumer.meson_pkg_config "
                 "left out")
endif()
if(CADENCE_TEST_CONAN AND Python3_FOUND)
  cadence_consumer_test(conan TIMEOUT 600 ARGS -DPYTHON=${Python3_EXECUTABLE}
    -DCONAN_VENV=${CADENCE_CONAN_VENV} -DCONAN_VERSION=${CADENCE_CONAN_VERSION})
endif()
if(CADENCE_BAZEL)
  cadence_consumer_test(bazel ARGS -DBAZEL=${CADENCE_BAZEL})
else()
  message(STATUS "cadence: no bazel; consumer.bazel left out (Debian: bazel-bootstrap)")
endif()
