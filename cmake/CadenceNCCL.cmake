# cadence::nccl — the NCCL communicator (include/cadence/transport/nccl/) with NCCL and the CUDA
# runtime. Optional by design: without the CUDA toolkit or NCCL (or with CADENCE_ENABLE_NCCL=OFF)
# there is no target and nothing fails. Host code only: no CUDA compiler is needed.
option(CADENCE_ENABLE_NCCL "Provide cadence::nccl when the CUDA toolkit and NCCL are found" ON)
if(NOT CADENCE_ENABLE_NCCL)
  message(STATUS "cadence: cadence::nccl disabled (CADENCE_ENABLE_NCCL=OFF)")
  return()
endif()

if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  message(STATUS "cadence: CUDA toolkit not found; cadence::nccl not provided")
  return()
endif()

# NCCL ships beside the toolkit (/usr/local/cuda) or in the system's paths; NCCL_ROOT overrides.
set(_cadence_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT}
    ${CUDAToolkit_INCLUDE_DIRS}/.. /usr/local/cuda)
find_path(CADENCE_NCCL_INCLUDE_DIR nccl.h HINTS ${_cadence_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
find_library(CADENCE_NCCL_LIBRARY nccl HINTS ${_cadence_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
             PATH_SUFFIXES lib64 lib)
if(NOT CADENCE_NCCL_INCLUDE_DIR OR NOT CADENCE_NCCL_LIBRARY)
  message(STATUS "cadence: NCCL not found (nccl.h: ${CADENCE_NCCL_INCLUDE_DIR}, libnccl: "
                 "${CADENCE_NCCL_LIBRARY}); cadence::nccl not provided")
  return()
endif()

# Non-blocking init (ncclConfig_t::blocking, ncclCommInitRankConfig, ncclCommFinalize) came with
# NCCL 2.14; the backend polls init, so an older NCCL cannot bound it by a deadline.
file(STRINGS ${CADENCE_NCCL_INCLUDE_DIR}/nccl.h _cadence_nccl_code_line
     REGEX "^#define NCCL_VERSION_CODE [0-9]+")
string(REGEX REPLACE ".* ([0-9]+)$" "\\1" CADENCE_NCCL_VERSION_CODE "${_cadence_nccl_code_line}")
if(NOT CADENCE_NCCL_VERSION_CODE OR CADENCE_NCCL_VERSION_CODE LESS 21400)
  message(STATUS "cadence: NCCL at ${CADENCE_NCCL_INCLUDE_DIR} is too old (NCCL_VERSION_CODE "
                 "'${CADENCE_NCCL_VERSION_CODE}', need 21400: non-blocking init); cadence::nccl not provided")
  return()
endif()
message(STATUS "cadence: cadence::nccl with NCCL ${CADENCE_NCCL_VERSION_CODE} (${CADENCE_NCCL_LIBRARY}), "
               "CUDA ${CUDAToolkit_VERSION}")

if(NOT TARGET cadence_nccl_library)
  add_library(cadence_nccl_library UNKNOWN IMPORTED GLOBAL)
  set_target_properties(cadence_nccl_library PROPERTIES
    IMPORTED_LOCATION ${CADENCE_NCCL_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${CADENCE_NCCL_INCLUDE_DIR})
endif()

cadence_backend(nccl)
# An imported target is not exported: the installed package's config (cadence-config.cmake)
# finds CUDAToolkit and NCCL again and recreates the library as cadence::nccl_library.
target_link_libraries(cadence_nccl INTERFACE CUDA::cudart
  $<BUILD_INTERFACE:cadence_nccl_library>
  $<INSTALL_INTERFACE:cadence::nccl_library>)
cadence_headers(cadence_nccl transport/nccl api.hpp protocol.hpp communicator.hpp)
cadence_headers(cadence_nccl membership/nccl group.hpp)
