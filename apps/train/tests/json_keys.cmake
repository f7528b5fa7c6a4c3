# What the end-to-end scripts (end_to_end.cmake over MPI, gloo_end_to_end.cmake over gloo)
# check of cadence-train --json's stdout: one JSON array, one object per policy, each with
# exactly the documented keys (train.hpp's to_json writes them for every transport), and of each
# object that the run went as planned. include() it, then call check_train_json and
# check_train_run.
set(CADENCE_TRAIN_JSON_KEYS policy transport workers seconds iterations iterations_per_second
    wait_fraction max_staleness final_accuracy best_accuracy time_to_70 time_to_80 evicted
    worker_transfer_seconds simulated)

# Where those keys are documented: docs/tools.md's cadence-train section names each.
set(CADENCE_TRAIN_DOCS ${CMAKE_CURRENT_LIST_DIR}/../../../docs/tools.md)

# check_train_json(JSON COUNT STDERR): JSON is an array of COUNT objects, each with exactly the
# keys above, which the docs name. STDERR goes into the failure message.
function(check_train_json json count stderr)
  string(JSON n ERROR_VARIABLE e LENGTH "${json}")
  if(e OR NOT n EQUAL count)
    message(FATAL_ERROR "expected a JSON array of ${count} policies, got ${n} ${e}:\n${json}\nstderr: ${stderr}")
  endif()
  file(READ ${CADENCE_TRAIN_DOCS} docs)
  string(FIND "${docs}" "## `cadence-train`" from)
  string(SUBSTRING "${docs}" ${from} -1 section)
  string(FIND "${section}" "\n## " to)
  string(SUBSTRING "${section}" 0 ${to} section)
  foreach(k IN LISTS CADENCE_TRAIN_JSON_KEYS)
    string(FIND "${section}" "`${k}`" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "cadence-train's JSON key '${k}' is not named in ${CADENCE_TRAIN_DOCS}")
    endif()
  endforeach()
  list(LENGTH CADENCE_TRAIN_JSON_KEYS want)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON nkeys LENGTH "${json}" ${i})
    if(NOT nkeys EQUAL want)
      message(FATAL_ERROR "object ${i} has ${nkeys} keys, expected ${want}:\n${json}")
    endif()
    foreach(k IN LISTS CADENCE_TRAIN_JSON_KEYS)
      string(JSON v ERROR_VARIABLE e GET "${json}" ${i} ${k})
      if(e)
        message(FATAL_ERROR "object ${i}: no key '${k}': ${e}\n${json}")
      endif()
    endforeach()
  endforeach()
endfunction()

# check_train_run(JSON I POLICY TRANSPORT WORKERS MIN_ACCURACY): object I ran POLICY (a prefix:
# cadence-train writes the full form, elastic:3 as elastic:3:last:fast) over TRANSPORT with
# WORKERS workers, made at least 20 iterations, evicted nobody, measured a transfer cost for
# every worker (a number, not null), and ended at a final accuracy of at least MIN_ACCURACY (it
# learned).
function(check_train_run json i policy transport workers min_accuracy)
  string(JSON p GET "${json}" ${i} policy)
  string(JSON t GET "${json}" ${i} transport)
  string(JSON w GET "${json}" ${i} workers)
  string(JSON it GET "${json}" ${i} iterations)
  string(JSON nev LENGTH "${json}" ${i} evicted)
  string(JSON acc GET "${json}" ${i} final_accuracy)
  string(FIND "${p}" "${policy}" at)
  if(NOT at EQUAL 0 OR NOT t STREQUAL transport OR NOT w EQUAL workers OR it LESS 20 OR NOT nev EQUAL 0)
    message(FATAL_ERROR "object ${i}: policy ${p}, transport ${t}, workers ${w}, iterations ${it}, evicted ${nev}:\n${json}")
  endif()
  string(JSON nlinks LENGTH "${json}" ${i} worker_transfer_seconds)
  if(NOT nlinks EQUAL workers)
    message(FATAL_ERROR "object ${i}: ${nlinks} worker_transfer_seconds for ${workers} workers:\n${json}")
  endif()
  math(EXPR last "${workers} - 1")
  foreach(p RANGE ${last})
    string(JSON type TYPE "${json}" ${i} worker_transfer_seconds ${p})
    if(NOT type STREQUAL "NUMBER")
      message(FATAL_ERROR "object ${i}: worker ${p} measured no transfer (${type}):\n${json}")
    endif()
  endforeach()
  if(acc LESS min_accuracy)
    message(FATAL_ERROR "object ${i}: final accuracy ${acc}, expected at least ${min_accuracy}: it did not learn\n${json}")
  endif()
endfunction()
