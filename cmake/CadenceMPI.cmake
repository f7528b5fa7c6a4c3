# cadence::mpi — the MPI communicator (include/cadence/transport/mpi/) and MPI itself. Optional
# by design: without MPI (or with CADENCE_ENABLE_MPI=OFF) there is no target and nothing fails.
# Only MPI's C API is used, so the deprecated C++ bindings are never linked.
option(CADENCE_ENABLE_MPI "Provide cadence::mpi when MPI is found" ON)
if(NOT CADENCE_ENABLE_MPI)
  message(STATUS "cadence: cadence::mpi disabled (CADENCE_ENABLE_MPI=OFF)")
  return()
endif()

set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "Do not link MPI's C++ bindings")
find_package(MPI QUIET COMPONENTS CXX)
if(NOT MPI_CXX_FOUND)
  message(STATUS "cadence: MPI not found; cadence::mpi not provided (install libopenmpi-dev)")
  return()
endif()
message(STATUS "cadence: cadence::mpi with MPI ${MPI_CXX_VERSION} (${MPIEXEC_EXECUTABLE})")

cadence_backend(mpi)
target_link_libraries(cadence_mpi INTERFACE MPI::MPI_CXX)
cadence_headers(cadence_mpi transport/mpi communicator.hpp options.hpp)
cadence_headers(cadence_mpi transport/mpi/detail layout.hpp wire.hpp)

# mpirun flags for our tests and benchmark: Open MPI refuses to run as root without
# --allow-run-as-root, and 4 ranks on a 2-core CI machine need --oversubscribe.
if(NOT DEFINED CADENCE_MPIEXEC_TEST_FLAGS)
  set(_cadence_mpiexec_flags "")
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _cadence_mpiexec_version
                  ERROR_QUIET RESULT_VARIABLE _cadence_mpiexec_rc)
  if(_cadence_mpiexec_rc EQUAL 0 AND _cadence_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(_cadence_mpiexec_flags --allow-run-as-root --oversubscribe)
  endif()
  set(CADENCE_MPIEXEC_TEST_FLAGS "${_cadence_mpiexec_flags}" CACHE STRING
      "Extra mpiexec flags for Cadence's MPI tests and benchmark")
endif()
