# Runs CMD (a ;-list) and passes only if it exits with status 0 and its stdout matches REGEX:
# ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status, and a usage printed for a bad
# command line (exit 2) must not pass for one printed by --help.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit 0, got '${rc}'\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT out MATCHES "${REGEX}")
  message(FATAL_ERROR "stdout does not match '${REGEX}':\n${out}\nstderr: ${err}")
endif()
