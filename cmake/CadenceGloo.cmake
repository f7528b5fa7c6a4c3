# cadence::gloo — the gloo communicator (include/cadence/transport/gloo/) and gloo itself.
# Optional by design: without gloo (or with CADENCE_ENABLE_GLOO=OFF) there is no target and
# nothing fails. gloo's rendezvous API changed upstream in 2023 (connectFullMesh takes the store
# as a std::shared_ptr instead of a reference); the form the installed gloo has is detected here
# and passed to the header as CADENCE_GLOO_RENDEZVOUS_SHARED_STORE.
option(CADENCE_ENABLE_GLOO "Provide cadence::gloo when gloo is found" ON)
if(NOT CADENCE_ENABLE_GLOO)
  message(STATUS "cadence: cadence::gloo disabled (CADENCE_ENABLE_GLOO=OFF)")
  return()
endif()

# Debian's libgloo-dev ships /usr/share/cmake/Gloo/GlooConfig.cmake with an imported target
# `gloo`; a config that is missing or broken falls back to the header and the library.
find_package(Gloo CONFIG QUIET)
set(_cadence_gloo_link "")
if(Gloo_FOUND AND TARGET gloo)
  set(_cadence_gloo_link gloo)
  set(_cadence_gloo_from_config ON)
else()
  find_path(CADENCE_GLOO_INCLUDE_DIR gloo/context.h)
  find_library(CADENCE_GLOO_LIBRARY gloo)
  if(CADENCE_GLOO_INCLUDE_DIR AND CADENCE_GLOO_LIBRARY)
    set(_cadence_gloo_link ${CADENCE_GLOO_LIBRARY})
    set(_cadence_gloo_from_config OFF)
  endif()
endif()
if(NOT _cadence_gloo_link)
  message(STATUS "cadence: gloo not found; cadence::gloo not provided (install libgloo-dev)")
  return()
endif()

# Which rendezvous API compiles against the installed gloo.
include(CheckCXXSourceCompiles)
include(CMakePushCheckState)
cmake_push_check_state(RESET)
if(_cadence_gloo_from_config)
  set(CMAKE_REQUIRED_LIBRARIES gloo Threads::Threads)
else()
  set(CMAKE_REQUIRED_INCLUDES ${CADENCE_GLOO_INCLUDE_DIR})
  set(CMAKE_REQUIRED_LIBRARIES ${CADENCE_GLOO_LIBRARY} Threads::Threads)
endif()
set(CMAKE_REQUIRED_QUIET ON)
set(_cadence_gloo_check_head [=[
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <memory>
int main() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  std::shared_ptr<gloo::transport::Device> dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(0, 1);
]=])
set(_cadence_gloo_check_tail [=[
  std::unique_ptr<gloo::transport::UnboundBuffer> ub = ctx->createUnboundBuffer(nullptr, 0);
  ub->abortWaitRecv();
  ctx->closeConnections();
  return 0;
}
]=])
check_cxx_source_compiles("${_cadence_gloo_check_head}
  gloo::rendezvous::FileStore store(\"/tmp\");
  ctx->connectFullMesh(store, dev);
${_cadence_gloo_check_tail}" CADENCE_GLOO_HAS_STORE_REFERENCE)
if(NOT CADENCE_GLOO_HAS_STORE_REFERENCE)
  check_cxx_source_compiles("${_cadence_gloo_check_head}
  auto store = std::make_shared<gloo::rendezvous::FileStore>(\"/tmp\");
  ctx->connectFullMesh(store, dev);
${_cadence_gloo_check_tail}" CADENCE_GLOO_HAS_STORE_SHARED_PTR)
endif()
# Testing an operation without waiting reads the completion counts of gloo's TCP buffers
# (gloo/transport/tcp/unbound_buffer.h). That header includes gloo/common/memory.h, which Debian's
# libgloo-dev does not install; our stand-in (include/cadence/transport/gloo/compat) is added to
# the include path when the header compiles only with it.
set(_cadence_gloo_peek_check [=[
#include <gloo/transport/tcp/unbound_buffer.h>
#include <mutex>
struct peek : gloo::transport::tcp::UnboundBuffer {
  static int get(gloo::transport::tcp::UnboundBuffer& b) {
    std::mutex gloo::transport::tcp::UnboundBuffer::*m = &peek::m_;
    int gloo::transport::tcp::UnboundBuffer::*n = &peek::recvCompletions_;
    std::lock_guard<std::mutex> lock(b.*m);
    return b.*n;
  }
};
int main() { return 0; }
]=])
set(_cadence_gloo_compat_dir ${cadence_SOURCE_DIR}/include/cadence/transport/gloo/compat)
check_cxx_source_compiles("${_cadence_gloo_peek_check}" CADENCE_GLOO_TCP_PEEK)
set(_cadence_gloo_needs_compat OFF)
if(NOT CADENCE_GLOO_TCP_PEEK)
  list(APPEND CMAKE_REQUIRED_INCLUDES ${_cadence_gloo_compat_dir})
  check_cxx_source_compiles("${_cadence_gloo_peek_check}" CADENCE_GLOO_TCP_PEEK_WITH_COMPAT)
  if(CADENCE_GLOO_TCP_PEEK_WITH_COMPAT)
    set(_cadence_gloo_needs_compat ON)
  endif()
endif()
cmake_pop_check_state()
if(CADENCE_GLOO_TCP_PEEK OR _cadence_gloo_needs_compat)
  set(_cadence_gloo_peek 1)
else()
  set(_cadence_gloo_peek 0)
  message(STATUS "cadence: gloo's TCP unbound buffer header does not compile; cadence::gloo's "
                 "work handles will block in test()")
endif()
if(CADENCE_GLOO_HAS_STORE_REFERENCE)
  set(_cadence_gloo_shared_store 0)
  set(_cadence_gloo_api "connectFullMesh(Store&, ...)")
elseif(CADENCE_GLOO_HAS_STORE_SHARED_PTR)
  set(_cadence_gloo_shared_store 1)
  set(_cadence_gloo_api "connectFullMesh(std::shared_ptr<Store>, ...)")
else()
  message(STATUS "cadence: gloo found (${_cadence_gloo_link}) but neither rendezvous API "
                 "(connectFullMesh with a Store& or a std::shared_ptr<Store>, with unbound buffers) "
                 "compiles against it; cadence::gloo not provided (see CMakeFiles/CMakeError.log)")
  return()
endif()
if(_cadence_gloo_from_config)
  message(STATUS "cadence: cadence::gloo with gloo ${Gloo_VERSION} (${_cadence_gloo_api})")
else()
  message(STATUS "cadence: cadence::gloo with ${CADENCE_GLOO_LIBRARY} (no usable GlooConfig.cmake; "
                 "${_cadence_gloo_api}; not exported with the package)")
endif()

cadence_backend(gloo)
if(_cadence_gloo_from_config)
  target_link_libraries(cadence_gloo INTERFACE gloo)
else()
  # Not from a package config: the consumer's build sees the paths found here.
  target_include_directories(cadence_gloo SYSTEM INTERFACE $<BUILD_INTERFACE:${CADENCE_GLOO_INCLUDE_DIR}>)
  target_link_libraries(cadence_gloo INTERFACE $<BUILD_INTERFACE:${CADENCE_GLOO_LIBRARY}>)
endif()
target_compile_definitions(cadence_gloo INTERFACE
  CADENCE_GLOO_RENDEZVOUS_SHARED_STORE=${_cadence_gloo_shared_store}
  CADENCE_GLOO_TCP_PEEK=${_cadence_gloo_peek})
cadence_headers(cadence_gloo membership/gloo group.hpp)
cadence_headers(cadence_gloo transport/gloo communicator.hpp options.hpp)
cadence_headers(cadence_gloo transport/gloo/detail link.hpp p2p.hpp rendezvous.hpp wire.hpp)
if(_cadence_gloo_needs_compat)
  target_include_directories(cadence_gloo SYSTEM INTERFACE
    $<BUILD_INTERFACE:${_cadence_gloo_compat_dir}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/cadence/transport/gloo/compat>)
  target_sources(cadence_gloo INTERFACE FILE_SET HEADERS FILES ${_cadence_gloo_compat_dir}/gloo/common/memory.h)
  message(STATUS "cadence: gloo lacks gloo/common/memory.h; using cadence's stand-in for its TCP header")
endif()
set(CADENCE_GLOO_FROM_CONFIG ${_cadence_gloo_from_config})
