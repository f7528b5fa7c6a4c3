#!/usr/bin/env bash
# A worker stopped with SIGSTOP mid-run is evicted (--evict-after) and listed in "evicted";
# the run still ends and reports. The test stops worker 1 (rank 2) as soon as the 6 s ASP run
# is running, waits until the server reports the eviction, then lets it go on (SIGCONT): its
# next push is refused, it leaves, and the job ends. The stopped process is always resumed
# (trap), so mpirun can exit whatever happens. Usage: sigstop_test.sh MPIRUN "FLAGS" TRAIN
# [ARGS...]; over gloo: sigstop_test.sh launch-gloo.sh "" TRAIN --transport gloo.
set -u
mpirun=$1; flags=$2; train=$3
shift 3
dir=$(mktemp -d)
victim=""
cleanup() { [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
# shellcheck source=worker_signal.sh
source "$(dirname "$0")/worker_signal.sh"
start_job --model softmax --policy asp --profile homogeneous --seconds 6 \
  --evict-after 1 --train-limit 2000 --test-limit 200 --json "$@"
kill -STOP "$victim" || fail "cannot stop $victim"
wait_line "worker 1 evicted"  # 1 s of silence, then the server's line
kill -CONT "$victim"
victim=""
wait_job 60
grep -q '"evicted": \[1\]' "$dir/out" || fail "worker 1 not listed in evicted"
grep -q '"policy": "asp"' "$dir/out" || fail "no report"
echo "PASS: worker 1 stopped, evicted and listed; the run reported"
cat "$dir/out"
