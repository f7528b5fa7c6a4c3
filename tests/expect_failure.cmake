# Runs CMD (a ;-list) and passes only if it exits with a non-zero status (not a crash) and its
# stderr matches ERROR_REGEX: a bad command line must fail with a message that says why.
# tests/compile_fail/check.cmake include()s it and then reads `out` and `err`.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "expected failure, got exit 0\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "expected a clean non-zero exit, got '${rc}'\nstderr: ${err}")
endif()
if(NOT err MATCHES "${ERROR_REGEX}")
  message(FATAL_ERROR "stderr does not match '${ERROR_REGEX}':\n${err}")
endif()
message(STATUS "exit ${rc}: ${err}")
