# cadence::train — the training race (include/cadence/train/): IDX readers, a softmax
# regression and the race of policies on real data. Needs zlib to read the gzip-compressed
# datasets; without it there is no target and nothing fails.

find_package(ZLIB QUIET)
if(NOT ZLIB_FOUND)
  message(STATUS "cadence: zlib not found; cadence::train (the training race) not provided "
                 "(install zlib1g-dev)")
  return()
endif()
message(STATUS "cadence: cadence::train with zlib ${ZLIB_VERSION_STRING}")

add_library(cadence_train INTERFACE)
add_library(cadence::train ALIAS cadence_train)
set_target_properties(cadence_train PROPERTIES EXPORT_NAME train)
target_link_libraries(cadence_train INTERFACE cadence::cadence ZLIB::ZLIB)
file(GLOB _cadence_train_headers CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/../include/cadence/train/*.hpp)
target_sources(cadence_train INTERFACE
  FILE_SET HEADERS BASE_DIRS ${CMAKE_CURRENT_LIST_DIR}/../include FILES ${_cadence_train_headers})
if(CADENCE_BUILD_TESTS)
  # Each public train header compiles on its own.
  set_target_properties(cadence_train PROPERTIES VERIFY_INTERFACE_HEADER_SETS ON)
endif()
