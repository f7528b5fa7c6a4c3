# ---- cadence_docs: the API reference (Doxygen over include/cadence/) ----
# `cmake --build <dir> --target cadence_docs` writes <dir>/docs/api/html/index.html. Not part of
# `all`: it fails on any Doxygen warning (an undocumented public name, a \param that names no
# parameter), which should stop a docs build, not a compile. Only when Cadence is the top-level
# project, and only when Doxygen is installed (scripts/test.sh skips the check without it).
if(NOT PROJECT_IS_TOP_LEVEL)
  return()
endif()
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "Doxygen not found: no cadence_docs target (apt-get install doxygen)")
  return()
endif()

set(CADENCE_DOCS_DIR ${PROJECT_BINARY_DIR}/docs/api)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${CADENCE_DOCS_DIR}/Doxyfile @ONLY)
# The old html/ goes first: Doxygen does not delete the page of a name that was removed.
add_custom_target(cadence_docs
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${CADENCE_DOCS_DIR}/html
  COMMAND Doxygen::doxygen ${CADENCE_DOCS_DIR}/Doxyfile
  WORKING_DIRECTORY ${CADENCE_DOCS_DIR}
  COMMENT "API reference: ${CADENCE_DOCS_DIR}/html/index.html"
  VERBATIM)
