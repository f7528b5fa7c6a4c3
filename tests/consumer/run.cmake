# Builds tests/consumer against Cadence the two ways a user would, and runs it:
#   MODE=find_package     install Cadence into a scratch prefix, then find_package(cadence CONFIG)
#   MODE=add_subdirectory the consumer pulls Cadence's source tree in with add_subdirectory
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

set(consumer_src ${CADENCE_SOURCE_DIR}/tests/consumer)
if(MODE STREQUAL "find_package")
  run_step(${CMAKE_COMMAND} -S ${CADENCE_SOURCE_DIR} -B ${WORK_DIR}/cadence-build -G ${GENERATOR}
           -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix
           -DCADENCE_BUILD_TESTS=OFF -DCADENCE_BUILD_BENCHMARKS=OFF -DCADENCE_BUILD_TOOLS=OFF
           -DCADENCE_BUILD_EXAMPLES=OFF -DCADENCE_INSTALL=ON)
  run_step(${CMAKE_COMMAND} --install ${WORK_DIR}/cadence-build)
  # Only the library is installed: no tool or application headers.
  foreach(stray include/cadence/train include/cadence/io/cli.hpp include/cadence/io/zipline_json.hpp)
    if(EXISTS ${WORK_DIR}/prefix/${stray})
      message(FATAL_ERROR "the installed package holds ${stray}, which is not part of the library")
    endif()
  endforeach()
  run_step(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
           -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCONSUMER_MODE=find_package)
else()
  run_step(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/consumer-build -G ${GENERATOR}
           -DCMAKE_CXX_COMPILER=${CXX} -DCONSUMER_MODE=add_subdirectory
           -DCADENCE_SOURCE_DIR=${CADENCE_SOURCE_DIR})
endif()
run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run_step(${WORK_DIR}/consumer-build/consumer)
if(EXISTS ${WORK_DIR}/consumer-build/consumer_mpi)
  # A singleton MPI job: MPI_Init without mpirun. Open MPI asks for these to run as root.
  set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
  set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
  run_step(${WORK_DIR}/consumer-build/consumer_mpi)
  message(STATUS "consumer_mpi ran")
endif()
if(EXISTS ${WORK_DIR}/consumer-build/consumer_nccl)
  # Without a GPU it reports the clean construction error and exits 0; a crash fails here.
  run_step(${WORK_DIR}/consumer-build/consumer_nccl)
  message(STATUS "consumer_nccl ran")
endif()
if(EXISTS ${WORK_DIR}/consumer-build/consumer_gloo)
  run_step(${WORK_DIR}/consumer-build/consumer_gloo)
  message(STATUS "consumer_gloo ran")
endif()
if(EXISTS ${WORK_DIR}/consumer-build/consumer_zmq)
  run_step(${WORK_DIR}/consumer-build/consumer_zmq)
  message(STATUS "consumer_zmq ran")
endif()
if(EXISTS ${WORK_DIR}/consumer-build/consumer_thrust)
  run_step(${WORK_DIR}/consumer-build/consumer_thrust)
  message(STATUS "consumer_thrust ran")
endif()
