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
execute_process(COMMAND "${CXX}" ${FLAGS} "-I${INCLUDE}" "${SOURCE}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(output "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but must not:\n${output}")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the compiler did not exit cleanly ('${rc}'):\n${output}")
endif()
string(REGEX MATCH "[^\n]*error( C[0-9]+)?:[^\n]*" first_error "${output}")
list(GET expected 0 first_expected)
if(NOT first_error MATCHES "${first_expected}")
  message(FATAL_ERROR "the first error is not '${first_expected}':\n${output}")
endif()
foreach(regex IN LISTS expected)
  if(NOT output MATCHES "${regex}")
    message(FATAL_ERROR "the compiler's output does not match '${regex}':\n${output}")
  endif()
endforeach()
message(STATUS "failed as intended:\n${first_error}")
