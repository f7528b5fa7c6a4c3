# Builds tests/consumer's programs against Cadence one way a user takes it in, and runs them.
# tests/consumer/tests.cmake registers one ctest entry per MODE (docs/install.md lists them):
#   install           cmake --install into PREFIX (the fixture of the installed ways)
#   headers           PREFIX holds every header under include/ and nothing else
#   find_package      find_package(cadence CONFIG) from PREFIX
#   add_subdirectory  add_subdirectory(<cadence source>)
#   fetchcontent      FetchContent_Declare(SOURCE_DIR <cadence source>) + FetchContent_MakeAvailable
#   pkg_config        c++ main.cpp $(pkg-config --cflags --libs cadence), and cadence-<backend>
#   meson_subproject  a Meson project with Cadence in subprojects/ (its root meson.build)
#   meson_pkg_config  the same Meson project against PREFIX's cadence.pc
#   conan             conan create (Conan 2, from a venv under CONAN_VENV) with test_package/
#   bazel             a Bazel workspace with local_repository(cadence) (its BUILD.bazel)
#   versions          VERSION, version.hpp and pyproject.toml's version agree
# BACKENDS: the optional targets this build of Cadence has (comma-separated); each way in must
# build the consumer program of those it offers, so a backend cannot drop out unnoticed.
cmake_minimum_required(VERSION 3.24)
string(REPLACE "," ";" BACKENDS "${BACKENDS}")
set(consumer_src ${CADENCE_SOURCE_DIR}/tests/consumer)
file(STRINGS ${CADENCE_SOURCE_DIR}/VERSION version LIMIT_COUNT 1)
if(NOT MODE STREQUAL "install")
  file(REMOVE_RECURSE ${WORK_DIR})
  file(MAKE_DIRECTORY ${WORK_DIR})
endif()

# run_step(COMMAND...): runs it in step_dir (WORK_DIR unless set); fails the test with its output
# when it fails.
set(step_dir ${WORK_DIR})
function(run_step)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${step_dir} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer.${MODE}: step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

# run_programs(DIR OFFERED...): runs DIR/consumer and every DIR/consumer_<backend> there; each
# backend both OFFERED by this way in and in BACKENDS must have been built.
function(run_programs dir)
  run_step(${dir}/consumer)
  set(ran consumer)
  foreach(backend thrust mpi nccl gloo zmq)
    if(NOT EXISTS ${dir}/consumer_${backend})
      if(backend IN_LIST ARGN AND backend IN_LIST BACKENDS)
        message(FATAL_ERROR "consumer.${MODE}: no consumer_${backend} was built, though this "
                            "build of Cadence has cadence::${backend} and this way in offers it")
      endif()
      continue()
    endif()
    # A singleton MPI job: MPI_Init without mpirun. Open MPI asks for these to run as root.
    # Without a GPU consumer_nccl reports the clean construction error and exits 0.
    set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
    set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
    run_step(${dir}/consumer_${backend})
    list(APPEND ran consumer_${backend})
  endforeach()
  message(STATUS "consumer.${MODE}: ran ${ran}")
endfunction()

function(cmake_consumer)  # [cmake configure args...]
  run_step(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/build -G ${GENERATOR}
           -DCMAKE_CXX_COMPILER=${CXX} ${ARGN})
endfunction()

if(MODE STREQUAL "install")
  # Its own folder beside PREFIX: the installed ways read PREFIX while they run.
  file(REMOVE_RECURSE ${WORK_DIR} ${PREFIX})
  file(MAKE_DIRECTORY ${WORK_DIR})
  run_step(${CMAKE_COMMAND} -S ${CADENCE_SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR}
           -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_INSTALL_PREFIX=${PREFIX}
           -DCADENCE_BUILD_TESTS=OFF -DCADENCE_BUILD_BENCHMARKS=OFF -DCADENCE_BUILD_TOOLS=OFF
           -DCADENCE_BUILD_EXAMPLES=OFF -DCADENCE_INSTALL=ON)
  run_step(${CMAKE_COMMAND} --install ${WORK_DIR})
  # A .pc for the core and for each communicator this build has (Thrust has none).
  foreach(pc cadence mpi gloo nccl zmq)
    if(NOT pc STREQUAL "cadence")
      if(NOT pc IN_LIST BACKENDS)
        continue()
      endif()
      set(pc cadence-${pc})
    endif()
    if(NOT EXISTS ${PREFIX}/share/pkgconfig/${pc}.pc)
      message(FATAL_ERROR "consumer.install: no share/pkgconfig/${pc}.pc in the installed package")
    endif()
  endforeach()

elseif(MODE STREQUAL "headers")
  # Conan, Meson and Bazel take every header under include/; CMake installs the ones it lists.
  # The two sets must be the same, but for a backend this build lacks (and gloo's stand-in
  # header, installed only for a gloo that lacks the original).
  file(GLOB_RECURSE source_headers RELATIVE ${CADENCE_SOURCE_DIR} ${CADENCE_SOURCE_DIR}/include/*)
  file(GLOB_RECURSE installed RELATIVE ${PREFIX} ${PREFIX}/include/*)
  set(left_out "")
  foreach(header IN LISTS source_headers)
    set(excused OFF)
    foreach(backend thrust mpi nccl gloo zmq)
      if(NOT backend IN_LIST BACKENDS
         AND header MATCHES "^include/cadence/(transport/|membership/)?${backend}/")
        set(excused ON)
      endif()
    endforeach()
    if(NOT header IN_LIST installed AND NOT excused
       AND NOT header MATCHES "^include/cadence/transport/gloo/compat/")
      list(APPEND left_out ${header})
    endif()
  endforeach()
  if(left_out)
    list(JOIN left_out "\n  " left_out)
    message(FATAL_ERROR "consumer.headers: cmake --install leaves out\n  ${left_out}\nbut Conan, "
                        "Meson and Bazel ship every header under include/: list them in "
                        "CMakeLists.txt (or the backend's cmake/Cadence*.cmake), or move them "
                        "out of include/ if they are not the library's")
  endif()
  list(REMOVE_ITEM installed ${source_headers})
  if(installed)
    message(FATAL_ERROR "consumer.headers: the package installs ${installed}, not under include/")
  endif()

elseif(MODE STREQUAL "find_package")
  cmake_consumer(-DCMAKE_PREFIX_PATH=${PREFIX} -DCONSUMER_MODE=find_package)
  run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
  # gloo is exported only when it came from gloo's own package config.
  set(offered thrust mpi nccl zmq)
  if(GLOO_EXPORTED)
    list(APPEND offered gloo)
  endif()
  run_programs(${WORK_DIR}/build ${offered})

elseif(MODE STREQUAL "add_subdirectory" OR MODE STREQUAL "fetchcontent")
  cmake_consumer(-DCONSUMER_MODE=${MODE} -DCADENCE_SOURCE_DIR=${CADENCE_SOURCE_DIR})
  # The core program is built and run. The backends' targets must exist (the consumer defines
  # consumer_<backend> only where cadence::<backend> is, and lists them at configure time),
  # checked without compiling them: the main build's own tests compile and run every backend
  # target in-tree, and find_package and pkg_config compile and run each program.
  run_step(${CMAKE_COMMAND} --build ${WORK_DIR}/build --target consumer)
  run_programs(${WORK_DIR}/build)
  file(READ ${WORK_DIR}/build/offered-backends.txt offered)
  foreach(backend IN LISTS BACKENDS)
    if(NOT backend IN_LIST offered)
      message(FATAL_ERROR "consumer.${MODE}: no cadence::${backend} came in, though this build of "
                          "Cadence has it (the consumer saw: '${offered}')")
    endif()
  endforeach()

elseif(MODE STREQUAL "pkg_config")
  # What a Makefile or a shell does: nothing but the compiler and pkg-config's flags.
  set(ENV{PKG_CONFIG_PATH} ${PREFIX}/share/pkgconfig)
  run_step(${PKG_CONFIG} --modversion cadence)
  string(STRIP "${step_output}" pc_version)
  if(NOT pc_version STREQUAL version)
    message(FATAL_ERROR "consumer.pkg_config: cadence.pc says version '${pc_version}', "
                        "VERSION '${version}'")
  endif()
  file(MAKE_DIRECTORY ${WORK_DIR}/bin)
  foreach(program consumer mpi gloo nccl zmq)
    set(pc cadence-${program})
    set(source ${program}_main.cpp)
    set(out consumer_${program})
    if(program STREQUAL "consumer")
      set(pc cadence)
      set(source main.cpp)
      set(out consumer)
    elseif(NOT EXISTS ${PREFIX}/share/pkgconfig/${pc}.pc)
      continue()
    endif()
    run_step(sh -c "'${CXX}' -DCONSUMER_EXPECTED_VERSION='\"${version}\"' \
                    '${consumer_src}/${source}' -o bin/${out} \
                    $('${PKG_CONFIG}' --cflags --libs ${pc})")
  endforeach()
  run_programs(${WORK_DIR}/bin mpi gloo nccl zmq)

elseif(MODE MATCHES "^meson_")
  # The consumer project outside the source tree, so it can have a subprojects/ folder.
  file(COPY ${consumer_src}/ DESTINATION ${WORK_DIR}/src FILES_MATCHING PATTERN "*.cpp"
       PATTERN "meson.build")
  set(ENV{CXX} ${CXX})
  if(MODE STREQUAL "meson_subproject")
    # As a user's wrap file would declare it; the folder exists, so Meson fetches nothing.
    file(MAKE_DIRECTORY ${WORK_DIR}/src/subprojects)
    file(CREATE_LINK ${CADENCE_SOURCE_DIR} ${WORK_DIR}/src/subprojects/cadence SYMBOLIC)
    file(WRITE ${WORK_DIR}/src/subprojects/cadence.wrap
         "[wrap-git]\nurl = ${CADENCE_SOURCE_DIR}\nrevision = HEAD\n\n"
         "[provide]\ndependency_names = cadence, cadence-mpi, cadence-zmq\n")
    set(wrap_mode forcefallback)  # never a cadence.pc installed on this machine
    set(offered mpi zmq)
  else()
    set(ENV{PKG_CONFIG_PATH} ${PREFIX}/share/pkgconfig)
    set(wrap_mode nofallback)
    set(offered mpi gloo nccl zmq)
  endif()
  run_step(${MESON} setup --wrap-mode=${wrap_mode} ${WORK_DIR}/build ${WORK_DIR}/src)
  if(MODE STREQUAL "meson_subproject")
    run_step(${MESON} compile -C ${WORK_DIR}/build)
    run_programs(${WORK_DIR}/build ${offered})
  else()
    # The backends' .pc files are compiled and run against by consumer.pkg_config: here the core
    # program is built and run, and Meson must have found every backend's dependency (it defines
    # consumer_<backend> only then), read from its target list without compiling them again.
    run_step(${MESON} compile -C ${WORK_DIR}/build consumer)
    run_programs(${WORK_DIR}/build)
    run_step(${MESON} introspect --targets ${WORK_DIR}/build)
    foreach(backend IN LISTS offered)
      if(backend IN_LIST BACKENDS AND NOT step_output MATCHES "\"name\": *\"consumer_${backend}\"")
        message(FATAL_ERROR "consumer.${MODE}: dependency('cadence-${backend}') was not found, though "
                            "this build of Cadence has cadence::${backend}")
      endif()
    endforeach()
  endif()

elseif(MODE STREQUAL "conan")
  # Conan from PyPI in a venv kept between runs (created here when missing, which needs PyPI);
  # its home (profile, cache) under WORK_DIR, so the user's ~/.conan2 is never read or written.
  get_filename_component(venv_parent ${CONAN_VENV} DIRECTORY)
  file(MAKE_DIRECTORY ${venv_parent})
  file(LOCK ${CONAN_VENV}.lock GUARD PROCESS TIMEOUT 600)
  set(conan ${CONAN_VENV}/bin/conan)
  set(have "")
  if(EXISTS ${conan})
    execute_process(COMMAND ${conan} --version OUTPUT_VARIABLE have ERROR_QUIET)
  endif()
  if(NOT have MATCHES "Conan version ${CONAN_VERSION}")
    message(STATUS "consumer.conan: installing conan ${CONAN_VERSION} into ${CONAN_VENV}")
    run_step(${PYTHON} -m venv --clear ${CONAN_VENV})
    execute_process(COMMAND ${CONAN_VENV}/bin/pip install -q --disable-pip-version-check
                            conan==${CONAN_VERSION}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "consumer.conan: could not install conan ${CONAN_VERSION} from PyPI into "
                          "${CONAN_VENV} (configure with -DCADENCE_TEST_CONAN=OFF to leave Conan "
                          "out):\n${out}\n${err}")
    endif()
  endif()
  file(LOCK ${CONAN_VENV}.lock RELEASE)
  set(ENV{CONAN_HOME} ${WORK_DIR}/conan-home)
  set(ENV{CXX} ${CXX})
  run_step(${conan} profile detect)
  # test_package/ builds ../tests/consumer; both are copied so their build trees land here.
  file(COPY ${CADENCE_SOURCE_DIR}/test_package DESTINATION ${WORK_DIR}
       PATTERN build EXCLUDE PATTERN CMakeUserPresets.json EXCLUDE)
  file(COPY ${consumer_src} DESTINATION ${WORK_DIR}/tests)
  set(options "")
  set(expected "consumer ok")
  foreach(backend zmq mpi)
    if(backend IN_LIST BACKENDS)
      list(APPEND options -o "cadence/*:with_${backend}=True")
      list(APPEND expected "consumer ${backend} ok")
    endif()
  endforeach()
  # A Debug test_package: -O0 compiles the consumer in two thirds of -O3's time (the package is
  # headers only, the same for every build type).
  run_step(${conan} create ${CADENCE_SOURCE_DIR} --test-folder ${WORK_DIR}/test_package
           -s build_type=Debug -c tools.cmake.cmaketoolchain:generator=${GENERATOR} ${options})
  foreach(line IN LISTS expected)
    if(NOT step_output MATCHES "${line}")
      message(FATAL_ERROR "consumer.conan: test_package never printed '${line}':\n${step_output}")
    endif()
  endforeach()
  message(STATUS "consumer.conan: test_package printed '${expected}'")

elseif(MODE STREQUAL "bazel")
  # A workspace that takes Cadence with local_repository; a user's names it with http_archive.
  # Offline, the two rule sets Bazel's own C++ and Java tools load are tests/consumer/bazel's
  # stand-ins (online Bazel downloads rules_cc and rules_java).
  file(COPY ${consumer_src}/main.cpp DESTINATION ${WORK_DIR}/ws)
  file(WRITE ${WORK_DIR}/ws/WORKSPACE
       "local_repository(name = \"cadence\", path = \"${CADENCE_SOURCE_DIR}\")\n")
  file(WRITE ${WORK_DIR}/ws/BUILD.bazel
       "cc_binary(\n    name = \"consumer\",\n    srcs = [\"main.cpp\"],\n"
       "    local_defines = ['CONSUMER_EXPECTED_VERSION=\\\\\"${version}\\\\\"'],\n"
       "    deps = [\"@cadence//:cadence\"],\n)\n")
  # Bazel 4 compiles C++ as C++11 unless told: every project that uses a C++17 library says so.
  file(WRITE ${WORK_DIR}/ws/.bazelrc
       "build --cxxopt=-std=c++17\n"
       "build --override_repository=rules_cc=${consumer_src}/bazel/rules_cc\n"
       "build --override_repository=rules_java=${consumer_src}/bazel/rules_java\n")
  # --batch: no server left behind; the output base under WORK_DIR, not ~/.cache/bazel.
  set(step_dir ${WORK_DIR}/ws)
  run_step(${BAZEL} --batch --output_user_root=${WORK_DIR}/bazel-root build //:consumer)
  run_step(${WORK_DIR}/ws/bazel-bin/consumer)
  message(STATUS "consumer.bazel: ran consumer")

elseif(MODE STREQUAL "versions")
  # CMake reads VERSION (tests/version_test.cpp checks the header against it too); Meson and
  # Conan read it; the installed ways check their package's version against the header.
  file(STRINGS ${CADENCE_SOURCE_DIR}/include/cadence/version.hpp lines
       REGEX "^#define CADENCE_VERSION_(MAJOR|MINOR|PATCH) [0-9]+$")
  set(header "")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "[0-9]+$" n "${line}")
    list(APPEND header ${n})
  endforeach()
  list(JOIN header "." header)
  if(NOT header STREQUAL version)
    message(FATAL_ERROR "consumer.versions: include/cadence/version.hpp says ${header}, VERSION "
                        "says ${version}")
  endif()
  # pyproject.toml's version, as scikit-build-core's regex provider computes it.
  run_step(${PYTHON} -c [=[
import re, sys, tomllib
root = sys.argv[1]
with open(f"{root}/pyproject.toml", "rb") as f:
    meta = tomllib.load(f)
assert "version" in meta["project"]["dynamic"], "pyproject.toml: the version must be dynamic"
s = meta["tool"]["scikit-build"]["metadata"]["version"]
assert s["provider"] == "scikit_build_core.metadata.regex", s
with open(f"{root}/{s['input']}", encoding="utf-8") as f:
    m = re.search(s["regex"], f.read(), re.MULTILINE)
assert m, f"pyproject.toml: {s['regex']!r} does not match {s['input']}"
print(s.get("result", "{value}").format(*m.groups(), **m.groupdict()))
]=] ${CADENCE_SOURCE_DIR})
  string(STRIP "${step_output}" py_version)
  if(NOT py_version STREQUAL version)
    message(FATAL_ERROR "consumer.versions: pyproject.toml gives ${py_version}, VERSION says "
                        "${version}")
  endif()
  message(STATUS "consumer.versions: VERSION, version.hpp and pyproject.toml all say ${version}")

else()
  message(FATAL_ERROR "run.cmake: unknown MODE '${MODE}'")
endif()
