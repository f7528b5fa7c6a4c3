#!/usr/bin/env bash
# A worker killed in a start-up step of a zmq run costs that worker alone (issue 40): for each
# STEP named (the text after "start: " in a worker's start-up line: introduce, "policy 1
# connect", "policy 1 ready", "policy 1 first pull"), a 3-rank run (1 server + 2 workers, the
# policy $CADENCE_TEST_POLICY, default bsp) is started, and worker 1 (rank 2) gets SIGKILL as
# soon as it prints that step's line. The run must end (rank 0 drops it within --start-timeout,
# or at once when it is found lost), exit 0, report the policy with "evicted": [1], and worker 0
# must have gone on alone (under bsp a server that waited for the dead one would hold it at
# the first barrier). No sleep against a deadline: the kill waits for the line. Usage:
#   startup_fault_test.sh launch-gloo.sh TRAIN STEP...
set -u
launch=$1; train=$2
shift 2
policy=${CADENCE_TEST_POLICY:-bsp}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL ($step): $*"; echo "--- stdout"; cat "$out"; echo "--- stderr"; cat "$err"; exit 1; }

n=0
for step in "$@"; do
  n=$((n + 1))
  out=$dir/out.$n; err=$dir/err.$n  # fresh files: the job's redirections open them after `&` returns
  : >"$err"
  bash "$launch" -n 3 --survive-workers "$train" --transport zmq --model softmax --policy "$policy" \
    --profile homogeneous --seconds 1 --evict-after 1 --start-timeout 5 --train-limit 2000 --test-limit 100 --json \
    >"$out" 2>"$err" &
  job=$!
  victim=""
  for _ in $(seq 1 600); do  # 60 s: only catches a hang
    victim=$(sed -n "s/^cadence-train (rank 2, pid \([0-9]*\)): start: $step\$/\1/p" "$err" | head -n 1)
    [ -n "$victim" ] && break
    kill -0 "$job" 2>/dev/null || fail "the job ended before worker 1 began the step"
    sleep 0.1
  done
  [ -n "$victim" ] || fail "no start-up line 'start: $step' from rank 2 within 60 s"
  kill -KILL "$victim" || fail "cannot kill $victim"
  for _ in $(seq 1 600); do
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$job" 2>/dev/null; then kill "$job"; fail "the job did not end within 60 s of the kill"; fi
  wait "$job" || fail "launch-gloo.sh exit status $? (rank 0's)"
  grep -q "\"policy\": \"$policy\"" "$out" || fail "no report"
  grep -q '"evicted": \[1\]' "$out" || fail "worker 1 not listed in evicted"
  grep -q "worker 1 evicted" "$err" || fail "no line naming worker 1's eviction"
  iterations=$(sed -n 's/.*"iterations": \([0-9]*\),.*/\1/p' "$out" | head -n 1)
  [ "${iterations:-0}" -ge 3 ] || fail "worker 0 made ${iterations:-no} iterations: it did not go on alone"
  echo "PASS ($step): worker 1 killed at its start-up line, dropped ($(grep -o 'worker 1 evicted at [0-9.]* s: .*' "$err" | head -n 1 | cut -c1-160)); worker 0 made $iterations iterations"
done
