# cadence::thrust — the Thrust ZipLine headers (include/cadence/thrust/) plus the CCCL headers
# of the CUDA toolkit, built for one Thrust device system. Optional by design: without the CCCL
# headers (or with CADENCE_ENABLE_THRUST=OFF) there is no target and nothing fails.
#
#   CADENCE_THRUST_DEVICE_SYSTEM  OMP (default) | CPP | CUDA: the THRUST_DEVICE_SYSTEM a target
#       linking cadence::thrust gets. CUDA needs a CUDA compiler (falls back to OMP without
#       one); OMP needs OpenMP (falls back to CPP without it).
#   A consuming target may pick its own system with the target property of the same name:
#       set_target_properties(my_tool PROPERTIES CADENCE_THRUST_DEVICE_SYSTEM CPP)
#   so one build tree can hold OMP, CPP and CUDA programs (the tests build OMP and CPP).

if(NOT CADENCE_ENABLE_THRUST)
  message(STATUS "cadence: cadence::thrust disabled (CADENCE_ENABLE_THRUST=OFF)")
  return()
endif()

set(CADENCE_THRUST_DEVICE_SYSTEM OMP CACHE STRING "Thrust device system of cadence::thrust: OMP, CPP or CUDA")
set_property(CACHE CADENCE_THRUST_DEVICE_SYSTEM PROPERTY STRINGS OMP CPP CUDA)

# ---- the CCCL headers (Thrust, CUB, libcu++) ----
find_path(CADENCE_CCCL_INCLUDE_DIR NAMES thrust/version.h
  HINTS ${CCCL_INCLUDE_DIR} ${CUDAToolkit_ROOT}/include $ENV{CUDA_PATH}/include $ENV{CUDA_HOME}/include
        /usr/local/cuda/include
  PATH_SUFFIXES cccl
  DOC "Directory holding thrust/, cub/ and cuda/ (the CCCL headers)")
if(NOT CADENCE_CCCL_INCLUDE_DIR)
  # Fall back to CCCL's own package (a standalone CCCL install, or a toolkit elsewhere).
  find_package(CCCL CONFIG QUIET HINTS /usr/local/cuda/lib/cmake/cccl)
  if(CCCL_FOUND AND EXISTS "${CCCL_DIR}/../../../include/cccl/thrust/version.h")
    get_filename_component(CADENCE_CCCL_INCLUDE_DIR "${CCCL_DIR}/../../../include/cccl" ABSOLUTE)
    set(CADENCE_CCCL_INCLUDE_DIR ${CADENCE_CCCL_INCLUDE_DIR} CACHE PATH "CCCL headers" FORCE)
  endif()
endif()
if(NOT CADENCE_CCCL_INCLUDE_DIR)
  message(STATUS "cadence: CCCL (Thrust) headers not found; cadence::thrust not provided "
                 "(set CADENCE_CCCL_INCLUDE_DIR or CUDAToolkit_ROOT to enable it)")
  return()
endif()
file(STRINGS "${CADENCE_CCCL_INCLUDE_DIR}/thrust/version.h" _cadence_thrust_version_line
     REGEX "^#define THRUST_VERSION [0-9]+")
string(REGEX MATCH "[0-9]+" _cadence_thrust_version "${_cadence_thrust_version_line}")
if(_cadence_thrust_version LESS 200000)
  message(STATUS "cadence: Thrust ${_cadence_thrust_version} in ${CADENCE_CCCL_INCLUDE_DIR} is older "
                 "than 2.0; cadence::thrust not provided")
  return()
endif()

# ---- the device system ----
string(TOUPPER "${CADENCE_THRUST_DEVICE_SYSTEM}" _cadence_thrust_system)
if(NOT _cadence_thrust_system MATCHES "^(OMP|CPP|CUDA)$")
  message(FATAL_ERROR "cadence: CADENCE_THRUST_DEVICE_SYSTEM must be OMP, CPP or CUDA, not '${CADENCE_THRUST_DEVICE_SYSTEM}'")
endif()
if(_cadence_thrust_system STREQUAL "CUDA")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
  else()
    message(STATUS "cadence: CADENCE_THRUST_DEVICE_SYSTEM=CUDA but no CUDA compiler was found; using OMP")
    set(_cadence_thrust_system OMP)
  endif()
endif()
# OpenMP is looked for whatever the default, so OMP programs can sit next to CUDA ones.
find_package(OpenMP QUIET COMPONENTS CXX)
if(_cadence_thrust_system STREQUAL "OMP" AND NOT OpenMP_CXX_FOUND)
  message(STATUS "cadence: OpenMP not found; cadence::thrust uses the serial CPP system")
  set(_cadence_thrust_system CPP)
endif()
# The system actually in effect, for tests/thrust and bench/thrust.
set(CADENCE_THRUST_SYSTEM ${_cadence_thrust_system})
message(STATUS "cadence: cadence::thrust with Thrust ${_cadence_thrust_version} "
               "(${CADENCE_CCCL_INCLUDE_DIR}), device system ${CADENCE_THRUST_SYSTEM}")

# ---- the target ----
cadence_backend(thrust)
# The toolkit's include directory is an absolute system path; it is exported as such, so an
# installed Cadence expects the CUDA toolkit (or CCCL) where it was found at build time.
target_include_directories(cadence_thrust SYSTEM INTERFACE ${CADENCE_CCCL_INCLUDE_DIR})
cadence_headers(cadence_thrust thrust config.hpp workspace.hpp zipline.hpp)
cadence_headers(cadence_thrust thrust/detail device.hpp functors.hpp memory.hpp predict.hpp row_functors.hpp
                solve.hpp subset.hpp)

# Device system of the consuming target: its CADENCE_THRUST_DEVICE_SYSTEM property, else ours.
set(_cadence_sys_prop "$<TARGET_PROPERTY:CADENCE_THRUST_DEVICE_SYSTEM>")
set(_cadence_sys "$<IF:$<BOOL:${_cadence_sys_prop}>,$<UPPER_CASE:${_cadence_sys_prop}>,${CADENCE_THRUST_SYSTEM}>")
target_compile_definitions(cadence_thrust INTERFACE
  THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_${_cadence_sys})
if(OpenMP_CXX_FOUND)
  # Plain flags rather than OpenMP::OpenMP_CXX so the exported target needs no find_dependency.
  separate_arguments(_cadence_omp_flags NATIVE_COMMAND "${OpenMP_CXX_FLAGS}")
  set(_cadence_is_omp "$<STREQUAL:${_cadence_sys},OMP>")
  target_compile_options(cadence_thrust INTERFACE
    "$<$<AND:${_cadence_is_omp},$<COMPILE_LANGUAGE:CXX>>:${_cadence_omp_flags}>")
  target_link_options(cadence_thrust INTERFACE "$<${_cadence_is_omp}:${_cadence_omp_flags}>")
endif()

if(CADENCE_THRUST_SYSTEM STREQUAL "CUDA")
  # The headers are checked one by one as C++ sources, which a CUDA device system cannot compile.
  set_target_properties(cadence_thrust PROPERTIES VERIFY_INTERFACE_HEADER_SETS OFF)
endif()
