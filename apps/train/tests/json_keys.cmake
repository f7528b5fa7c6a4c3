# What the end-to-end scripts (end_to_end.cmake over MPI, gloo_end_to_end.cmake over gloo)
# check of cadence-train --json's stdout: one JSON array, one object per policy, each with
# exactly the documented keys (train.hpp's to_json writes them for every transport). include()
# it, then check_train_json(JSON COUNT STDERR); STDERR goes into the failure message.
set(CADENCE_TRAIN_JSON_KEYS policy transport workers seconds iterations iterations_per_second
    wait_fraction max_staleness final_accuracy best_accuracy time_to_70 time_to_80 evicted
    simulated)

function(check_train_json json count stderr)
  string(JSON n ERROR_VARIABLE e LENGTH "${json}")
  if(e OR NOT n EQUAL count)
    message(FATAL_ERROR "expected a JSON array of ${count} policies, got ${n} ${e}:\n${json}\nstderr: ${stderr}")
  endif()
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
