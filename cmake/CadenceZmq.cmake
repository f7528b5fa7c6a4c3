# cadence::zmq — the ZeroMQ communicator (include/cadence/transport/zmq/) and libzmq itself.
# Optional by design: without libzmq (or with CADENCE_ENABLE_ZMQ=OFF) there is no target and
# nothing fails. libzmq is found through pkg-config (Debian's libzmq3-dev ships libzmq.pc) or, failing
# that, by its header and library; the C API only (no cppzmq). 4.2 or later: ZMTP heartbeats.
option(CADENCE_ENABLE_ZMQ "Provide cadence::zmq when libzmq is found" ON)
if(NOT CADENCE_ENABLE_ZMQ)
  message(STATUS "cadence: cadence::zmq disabled (CADENCE_ENABLE_ZMQ=OFF)")
  return()
endif()

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(CADENCE_PC_ZMQ QUIET libzmq>=4.2)
endif()
find_path(CADENCE_ZMQ_INCLUDE_DIR zmq.h HINTS ${CADENCE_PC_ZMQ_INCLUDE_DIRS} ${ZMQ_ROOT} $ENV{ZMQ_ROOT}
          PATH_SUFFIXES include)
find_library(CADENCE_ZMQ_LIBRARY NAMES zmq libzmq HINTS ${CADENCE_PC_ZMQ_LIBRARY_DIRS} ${ZMQ_ROOT} $ENV{ZMQ_ROOT}
             PATH_SUFFIXES lib lib64)
if(NOT CADENCE_ZMQ_INCLUDE_DIR OR NOT CADENCE_ZMQ_LIBRARY)
  message(STATUS "cadence: libzmq not found; cadence::zmq not provided (install libzmq3-dev)")
  return()
endif()

# The version, from zmq.h: heartbeats (ZMQ_HEARTBEAT_IVL) came with 4.2.
file(STRINGS ${CADENCE_ZMQ_INCLUDE_DIR}/zmq.h _cadence_zmq_version_lines
     REGEX "^#define ZMQ_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
foreach(_line IN LISTS _cadence_zmq_version_lines)
  string(REGEX MATCH "ZMQ_VERSION_([A-Z]+) +([0-9]+)" _ "${_line}")
  set(_cadence_zmq_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
endforeach()
set(CADENCE_ZMQ_VERSION "${_cadence_zmq_MAJOR}.${_cadence_zmq_MINOR}.${_cadence_zmq_PATCH}")
if(CADENCE_ZMQ_VERSION VERSION_LESS 4.2)
  message(STATUS "cadence: libzmq ${CADENCE_ZMQ_VERSION} at ${CADENCE_ZMQ_LIBRARY} is too old (need 4.2: "
                 "ZMTP heartbeats); cadence::zmq not provided")
  return()
endif()
message(STATUS "cadence: cadence::zmq with libzmq ${CADENCE_ZMQ_VERSION} (${CADENCE_ZMQ_LIBRARY})")

# Imported under a name of our own (libzmq has no CMake package on Debian); the installed
# package config finds libzmq again and imports it under the same name.
if(NOT TARGET cadence_zmq_library)
  add_library(cadence_zmq_library UNKNOWN IMPORTED GLOBAL)
  set_target_properties(cadence_zmq_library PROPERTIES
    IMPORTED_LOCATION ${CADENCE_ZMQ_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${CADENCE_ZMQ_INCLUDE_DIR})
endif()

cadence_backend(zmq)
target_link_libraries(cadence_zmq INTERFACE
  $<BUILD_INTERFACE:cadence_zmq_library>
  $<INSTALL_INTERFACE:cadence::zmq_library>)
cadence_headers(cadence_zmq transport/zmq communicator.hpp options.hpp)
cadence_headers(cadence_zmq transport/zmq/detail collectives.hpp colls.hpp curve.hpp engine.hpp ops.hpp
                p2p.hpp peers.hpp rendezvous.hpp sockets.hpp wire.hpp)
cadence_headers(cadence_zmq membership/zmq rendezvous.hpp)
