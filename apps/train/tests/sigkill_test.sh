#!/usr/bin/env bash
# A worker killed with SIGKILL mid-run is evicted (--evict-after) and listed in "evicted"; the
# run still ends and reports. $CADENCE_TEST_FIRST_POLICY (asp, default, or bsp) is the policy
# that runs when the kill lands; under bsp the surviving worker waits at the barrier for the
# dead one until its eviction, and must then go on alone. Under MPI it needs mpirun --enable-recovery (Open MPI then keeps
# the job going when a process dies; without it mpirun aborts every rank); over gloo,
# launch-gloo.sh --survive-workers (without it the launcher stops everyone). The test kills
# worker 1 (rank 2) as soon as the first policy (a 4 s ASP run, a second policy queued) is
# running: the server evicts it for silence, rank 0 finds it gone after the policy (no record
# within 3 s, or its connection closed), skips the second policy, and reports the first. Usage:
#   sigkill_test.sh MPIRUN "FLAGS --enable-recovery" TRAIN [ARGS...]
#   sigkill_test.sh launch-gloo.sh --survive-workers TRAIN --transport zmq
set -u
mpirun=$1; flags=$2; train=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck source=worker_signal.sh
source "$(dirname "$0")/worker_signal.sh"
first=${CADENCE_TEST_FIRST_POLICY:-asp}
case $first in
  asp) second=bsp ;;
  bsp) second=asp ;;
  *) echo "sigkill_test.sh: CADENCE_TEST_FIRST_POLICY: expected asp or bsp, got '$first'" >&2; exit 2 ;;
esac
start_job --model softmax --policy "$first" --policy "$second" --profile homogeneous --seconds 4 \
  --evict-after 1 --train-limit 2000 --test-limit 200 --json "$@"
kill -KILL "$victim" || fail "cannot kill $victim"
wait_job 30  # the 4 s policy, then at most 3 s for the lost worker's record
grep -q "worker 1 evicted" "$dir/err" || fail "worker 1 was not evicted"
grep -q "gone (killed?); the remaining policies are skipped: $second" "$dir/err" || fail "no line naming the lost worker"
grep -q '"evicted": \[1\]' "$dir/out" || fail "worker 1 not listed in evicted"
grep -q "\"policy\": \"$first\"" "$dir/out" || fail "no report"
grep -q "\"policy\": \"$second\"" "$dir/out" && fail "the skipped policy was reported"
# The survivor went on after the eviction (a server or barrier that hung would leave it at the
# one or two iterations before the kill).
iterations=$(sed -n 's/.*"iterations": \([0-9]*\),.*/\1/p' "$dir/out" | head -n 1)
[ "${iterations:-0}" -ge 3 ] || fail "the surviving worker made ${iterations:-no} iterations: it did not go on after the eviction"
echo "PASS: worker 1 killed, evicted and listed; the run reported"
cat "$dir/out"
grep "cadence-train" "$dir/err"
