# ---- cadence_docs: the API reference (Doxygen over include/cadence/) ----
# `cmake --build <dir> --target cadence_docs` writes <dir>/docs/api/html/index.html. Not part of
# `all`: it fails on any Doxygen warning (an undocumented public name, a \param that names no
# parameter) and on a public function whose comment leaves a parameter unnamed, which should
# stop a docs build, not a compile. Only when Cadence is the top-level
# project, and only when Doxygen is installed (scripts/test.sh skips the check without it).
if(NOT PROJECT_IS_TOP_LEVEL)
  return()
endif()
find_package(Doxygen QUIET)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT DOXYGEN_FOUND OR NOT Python3_Interpreter_FOUND)
  message(STATUS "Doxygen or Python 3 not found: no cadence_docs target (apt-get install doxygen)")
  return()
endif()

set(CADENCE_DOCS_DIR ${PROJECT_BINARY_DIR}/docs/api)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${CADENCE_DOCS_DIR}/Doxyfile @ONLY)
# The old output goes first: Doxygen does not delete the page of a name that was removed.
# Then every public function's comment must name its parameters (docs/api/check_params.py,
# on Doxygen's XML).
add_custom_target(cadence_docs
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${CADENCE_DOCS_DIR}/html ${CADENCE_DOCS_DIR}/xml
  COMMAND Doxygen::doxygen ${CADENCE_DOCS_DIR}/Doxyfile
  COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/docs/api/check_params.py
          ${CADENCE_DOCS_DIR}/xml
  WORKING_DIRECTORY ${CADENCE_DOCS_DIR}
  COMMENT "API reference: ${CADENCE_DOCS_DIR}/html/index.html"
  VERBATIM)
