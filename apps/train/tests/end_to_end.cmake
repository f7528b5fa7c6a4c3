# cadence-train end to end under mpirun: 1 server and 2 workers, three policies of 3 s each
# (two over the parameter server, one over the collective adapter's all-reduce) on
# a small shard of Fashion-MNIST (a 784-64-10 MLP: it learns in seconds). Checks that only the
# JSON array is on stdout, that every policy's object has exactly the documented keys
# (json_keys.cmake), and that the model learned (final accuracy well above chance). With --trace
# it writes one iteration trace per parameter-server policy, which cadence-sim --trace replays.
# -DMPIRUN= -DMPIFLAGS= -DTRAIN= -DSIM= -DTRACE=
include(${CMAKE_CURRENT_LIST_DIR}/json_keys.cmake)
separate_arguments(_flags UNIX_COMMAND "${MPIFLAGS}")
string(REGEX REPLACE "\\.csv$" "" _trace_base "${TRACE}")
file(REMOVE "${_trace_base}-bsp.csv" "${_trace_base}-dssp_1_4.csv" "${_trace_base}-periodic_2.csv")
execute_process(COMMAND ${MPIRUN} ${_flags} -np 3 ${TRAIN} --model mlp --hidden 64 --lr 0.1 --batch 64 --policy bsp
                        --policy dssp:1:4 --policy periodic:2 --profile hetero16 --seconds 3 --eval-every 0.5
                        --train-limit 3000 --test-limit 500 --seed 2 --json --trace ${TRACE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
check_train_json("${out}" 3 "${err}")
set(_policies bsp dssp:1:4 periodic:2)
set(_transports mpi-ps mpi-ps mpi-allreduce)
foreach(i 0 1 2)
  list(GET _policies ${i} want_policy)
  list(GET _transports ${i} want_transport)
  # Chance is 10% (and where the initial weights start); 3 s of training gets past 60%.
  check_train_run("${out}" ${i} ${want_policy} ${want_transport} 2 0.5)
  string(JSON best GET "${out}" ${i} best_accuracy)
  string(JSON sim GET "${out}" ${i} simulated iterations_per_second)
  if(best LESS 0.5 OR sim LESS 1)
    message(FATAL_ERROR "object ${i}: best accuracy ${best}, simulated it/s ${sim}: it did not learn\n${out}")
  endif()
endforeach()
string(JSON p0 GET "${out}" 0 policy)
string(JSON s0 GET "${out}" 0 max_staleness)
if(NOT p0 STREQUAL "bsp" OR NOT s0 EQUAL 0)
  message(FATAL_ERROR "bsp: policy ${p0}, max_staleness ${s0} (BSP starts every iteration at gap 0)")
endif()
if(NOT err MATCHES "cadence-train: bsp: .* it/s .simulated .*error")
  message(FATAL_ERROR "no per-policy simulated-vs-measured line on stderr:\n${err}")
endif()
message(STATUS "${out}")

# The traces: one per parameter-server policy, none for the collective mode. Replayed under
# the policy that recorded it, BSP's trace gives about the measured iterations/s (loosely:
# the replay ends at the first worker to run out, the measurement at the run's end).
if(NOT EXISTS "${_trace_base}-bsp.csv" OR NOT EXISTS "${_trace_base}-dssp_1_4.csv" OR EXISTS "${_trace_base}-periodic_2.csv")
  message(FATAL_ERROR "expected traces ${_trace_base}-bsp.csv and -dssp_1_4.csv and none for periodic:2")
endif()
execute_process(COMMAND ${SIM} --trace "${_trace_base}-bsp.csv" --policy bsp --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE replay ERROR_VARIABLE err TIMEOUT 30)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cadence-sim --trace: exit ${rc}\n${err}")
endif()
string(JSON measured GET "${out}" 0 iterations_per_second)
string(JSON replayed GET "${replay}" 0 iterations_per_second)
# CMake compares decimals but cannot multiply them: compare in thousandths.
function(_milli value out)
  if(NOT value MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "not a plain decimal: ${value}")
  endif()
  string(SUBSTRING "${CMAKE_MATCH_3}000" 0 3 frac)
  math(EXPR v "${CMAKE_MATCH_1} * 1000 + 1${frac} - 1000")
  set(${out} ${v} PARENT_SCOPE)
endfunction()
_milli("${measured}" m)
_milli("${replayed}" r)
math(EXPR lo "${m} * 3 / 4")
math(EXPR hi "${m} * 4 / 3")
if(r LESS lo OR r GREATER hi)
  message(FATAL_ERROR "bsp: replaying its trace gives ${replayed} it/s, measured ${measured} (outside 0.75x-1.33x)\n${replay}")
endif()
message(STATUS "bsp: measured ${measured} it/s, its trace replayed ${replayed} it/s")
