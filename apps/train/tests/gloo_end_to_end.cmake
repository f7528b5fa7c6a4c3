# cadence-train end to end over gloo: launch-gloo.sh starts 5 processes (1 server and 4
# workers) that meet through a fresh rendezvous folder; three policies of 1.5 s each (two over the
# parameter server, one over the collective adapter's all-reduce among the workers) on a small
# shard of Fashion-MNIST with softmax regression. Checks that only the JSON array is on stdout,
# that every object has the documented keys and says gloo, and that the model learned.
# -DLAUNCH= -DTRAIN=
execute_process(COMMAND ${LAUNCH} -n 5 --timeout 90 ${TRAIN} --transport gloo --model softmax --batch 64
                        --policy bsp --policy elastic:3 --policy elastic-avg:3 --profile hetero16 --seconds 1.5
                        --eval-every 0.5 --train-limit 4000 --test-limit 500 --seed 2 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
string(JSON n ERROR_VARIABLE e LENGTH "${out}")
if(e OR NOT n EQUAL 3)
  message(FATAL_ERROR "expected a JSON array of 3 policies, got ${n} ${e}:\n${out}\nstderr: ${err}")
endif()
set(_keys policy transport workers seconds iterations iterations_per_second wait_fraction
          max_staleness final_accuracy best_accuracy time_to_70 time_to_80 evicted simulated)
set(_policies bsp elastic:3 elastic-avg:3)
set(_transports gloo-ps gloo-ps gloo-allreduce)
foreach(i 0 1 2)
  list(GET _policies ${i} want_policy)
  list(GET _transports ${i} want_transport)
  foreach(k IN LISTS _keys)
    string(JSON v ERROR_VARIABLE e GET "${out}" ${i} ${k})
    if(e)
      message(FATAL_ERROR "object ${i}: no key '${k}': ${e}\n${out}")
    endif()
  endforeach()
  string(JSON p GET "${out}" ${i} policy)
  string(JSON t GET "${out}" ${i} transport)
  string(JSON w GET "${out}" ${i} workers)
  string(JSON it GET "${out}" ${i} iterations)
  string(JSON acc GET "${out}" ${i} final_accuracy)
  string(JSON nev LENGTH "${out}" ${i} evicted)
  if(NOT p MATCHES "^${want_policy}" OR NOT t STREQUAL want_transport OR NOT w EQUAL 4 OR it LESS 20 OR NOT nev EQUAL 0)
    message(FATAL_ERROR "object ${i}: policy ${p}, transport ${t}, workers ${w}, iterations ${it}, evicted ${nev}:\n${out}")
  endif()
  # Chance is 10% (and where the initial weights start); 1.5 s of training gets past 40%.
  if(acc LESS 0.4)
    message(FATAL_ERROR "object ${i}: final accuracy ${acc}: it did not learn\n${out}")
  endif()
endforeach()
string(JSON s0 GET "${out}" 0 max_staleness)
if(NOT s0 EQUAL 0)
  message(FATAL_ERROR "bsp: max_staleness ${s0} (BSP starts every iteration at gap 0)")
endif()
message(STATUS "${out}")
