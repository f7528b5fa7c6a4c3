# Compiles SOURCE, one translation unit that must not compile, with CXX, FLAGS (a ;-list) and
# the include directory INCLUDE, and passes only if the compiler fails (without crashing),
# its first error is the first "// expected error: REGEX" line of SOURCE, and its output
# matches every such line: a misuse must fail with the message meant for it, not with some
# other error first.
file(STRINGS "${SOURCE}" expected REGEX "^// expected error: ")
list(TRANSFORM expected REPLACE "^// expected error: " "")
if(NOT expected)
  message(FATAL_ERROR "${SOURCE} has no '// expected error: REGEX' line")
endif()
# The failure and the first expected line, as for a tool's bad command line; it leaves the
# compiler's stdout and stderr in `out` and `err`.
set(CMD "${CXX};${FLAGS};-I${INCLUDE};${SOURCE}")
list(GET expected 0 ERROR_REGEX)
include(${CMAKE_CURRENT_LIST_DIR}/../expect_failure.cmake)
set(output "${out}${err}")
string(REGEX MATCH "[^\n]*error( C[0-9]+)?:[^\n]*" first_error "${output}")
if(NOT first_error MATCHES "${ERROR_REGEX}")
  message(FATAL_ERROR "the first error is not '${ERROR_REGEX}':\n${output}")
endif()
foreach(regex IN LISTS expected)
  if(NOT output MATCHES "${regex}")
    message(FATAL_ERROR "the compiler's output does not match '${regex}':\n${output}")
  endif()
endforeach()
