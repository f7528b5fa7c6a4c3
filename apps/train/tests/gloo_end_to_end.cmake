# cadence-train end to end over gloo: launch-gloo.sh starts 5 processes (1 server and 4
# workers) that meet through a fresh rendezvous folder; three policies of 1.5 s each (two over the
# parameter server, one over the collective adapter's all-reduce among the workers) on a small
# shard of Fashion-MNIST with softmax regression. Checks that only the JSON array is on stdout,
# that every object has exactly the documented keys (json_keys.cmake) and says gloo, and that
# the model learned.
# -DLAUNCH= -DTRAIN=
include(${CMAKE_CURRENT_LIST_DIR}/json_keys.cmake)
execute_process(COMMAND ${LAUNCH} -n 5 --timeout 90 ${TRAIN} --transport gloo --model softmax --batch 64
                        --policy bsp --policy elastic:3 --policy elastic-avg:3 --profile hetero16 --seconds 1.5
                        --eval-every 0.5 --train-limit 4000 --test-limit 500 --seed 2 --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
check_train_json("${out}" 3 "${err}")
set(_policies bsp elastic:3 elastic-avg:3)
set(_transports gloo-ps gloo-ps gloo-allreduce)
foreach(i 0 1 2)
  list(GET _policies ${i} want_policy)
  list(GET _transports ${i} want_transport)
  # Chance is 10% (and where the initial weights start); 1.5 s of training gets past 40%.
  check_train_run("${out}" ${i} ${want_policy} ${want_transport} 4 0.4)
endforeach()
string(JSON s0 GET "${out}" 0 max_staleness)
if(NOT s0 EQUAL 0)
  message(FATAL_ERROR "bsp: max_staleness ${s0} (BSP starts every iteration at gap 0)")
endif()
message(STATUS "${out}")
