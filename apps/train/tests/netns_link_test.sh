#!/usr/bin/env bash
# cadence-train over ZeroMQ across hosts: 3 network namespaces (scripts/netns-cluster.sh: a
# bridge, each link capped at 1 Gbit/s), the server on host 0 and a worker on hosts 1 and 2, each
# process binding its host's address and meeting the others through a store folder under /tmp
# (the namespaces share the filesystem). Once the first policy is running (the server prints
# "<policy> [1/2]: running"), host 2's switch port goes down: worker 1 is cut off, its
# process still alive. The server must evict it for silence (--evict-after 1), find it gone
# after the policy (it sends no record), skip the second policy and report the first with
# "evicted": [1]; the surviving worker must go on and end cleanly; and the cut-off worker must
# exit by itself (an error is fine: it loses the server after ZeroMQ's heartbeat timeout), not
# hang. $CADENCE_TEST_FIRST_POLICY (asp, default, or bsp) is the policy that runs when the link
# goes down; under bsp the survivor waits at the barrier for the cut-off worker until the server
# evicts it. With CADENCE_TEST_LINK_BACK=1 the link comes back as soon as the server has evicted
# the worker (well within ZeroMQ's heartbeat timeout, so its connection survives): the worker's
# next push is refused (it was evicted), it sends its record after the policy like any worker,
# and the second policy (periodic:4, over an all-reduce among the workers) runs with both. With
# CADENCE_TEST_RENDEZVOUS=tcp the processes share no folder: rank 0 serves the run's TCP store on
# host 0 (cadence-train --rendezvous).
# Nothing here races a deadline: the test waits for lines and exits, and its limits
# only catch a hang. Needs root and network namespaces; without them it prints SKIP and exits
# 77 (ctest SKIP_RETURN_CODE). Usage:
#   netns_link_test.sh scripts/netns-cluster.sh build/bin/cadence-train
set -u
# One job secret for the run's processes in every namespace (as launch-gloo.sh does on one host).
export CADENCE_JOB_SECRET=${CADENCE_JOB_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
# shellcheck source=netns_support.sh
. "$(dirname "$0")/netns_support.sh"
netns_args netns_link_test.sh "$@"
first=${CADENCE_TEST_FIRST_POLICY:-asp}
case $first in
  asp) second=bsp ;;
  bsp) second=asp ;;
  *) echo "netns_link_test.sh: CADENCE_TEST_FIRST_POLICY: expected asp or bsp, got '$first'" >&2; exit 2 ;;
esac
back=${CADENCE_TEST_LINK_BACK:-0}
case $back in 0|1) ;; *) echo "netns_link_test.sh: CADENCE_TEST_LINK_BACK: expected 0 or 1, got '$back'" >&2; exit 2 ;; esac
# The returning worker's second policy is a collective mode: it all-reduces with the other
# worker over ZeroMQ (ranks that finish the ring first leave while the other still receives).
[ "$back" = 1 ] && second=periodic:4
meet=${CADENCE_TEST_RENDEZVOUS:-folder}
case $meet in folder|tcp) ;; *) echo "netns_link_test.sh: CADENCE_TEST_RENDEZVOUS: expected folder or tcp, got '$meet'" >&2; exit 2 ;; esac

netns_probe

dir=$(mktemp -d "${TMPDIR:-/tmp}/cadence-netns-XXXXXX") || exit 1
mkdir "$dir/store"
cluster_pid=""
cleanup() {
  # netns-cluster removes its namespaces and stops its hosts on TERM.
  if [ -n "$cluster_pid" ] && kill -0 "$cluster_pid" 2>/dev/null; then
    kill -TERM "$cluster_pid"
    wait "$cluster_pid" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_for DESCRIPTION SECONDS COMMAND...: until COMMAND succeeds; fails after SECONDS (a hang).
wait_for() {
  local what=$1 limit=$(($2 * 10))
  shift 2
  for _ in $(seq 1 "$limit"); do
    "$@" && return 0
    sleep 0.1
  done
  "$@" || fail "$what: not within $((limit / 10)) s"
}
cluster_running() { kill -0 "$cluster_pid" 2>/dev/null; }
cluster_ended() { ! cluster_running; }
server_running_or_done() { grep -q ": $first \[1/2\]: running$" "$dir/err.0" 2>/dev/null || ! cluster_running; }

# Each host runs cadence-train with its rank (the host's index) and its host's address, and
# leaves its stdout, stderr and exit status in the run's folder.
export CADENCE_TEST_DIR=$dir
# shellcheck disable=SC2016  # expanded by each host's shell
host_cmd='"$@" --address "$CADENCE_HOST_ADDR" >"$CADENCE_TEST_DIR/out.$CADENCE_HOST" 2>"$CADENCE_TEST_DIR/err.$CADENCE_HOST"
echo $? >"$CADENCE_TEST_DIR/rc.$CADENCE_HOST"'
if [ "$meet" = tcp ]; then
  where=(--rendezvous '{host0}:29400')  # each run has namespaces of its own: no port is taken
else
  where=(--store "$dir/store")
fi
back_on=()
seconds=4
# The returning worker's push waits out TCP's retransmission backoff (up to about 3 s after the
# cut) and must reach the server while the policy still runs: a longer policy.
[ "$back" = 1 ] && back_on=(--up-on "2=$dir/back") && seconds=7
bash "$cluster" -n 3 --rate 1gbit --keep-going --down-on "2=$dir/cut" "${back_on[@]}" -- \
  bash -c "$host_cmd" host "$train" --transport zmq --rank '{host}' --size 3 "${where[@]}" \
  --model softmax --train-limit 2000 --test-limit 200 --seconds "$seconds" --evict-after 1 \
  --policy "$first" --policy "$second" --json --profile homogeneous >"$dir/cluster" 2>&1 &
cluster_pid=$!

# Cut worker 1's link once the first policy runs (data loading and the rendezvous are done).
wait_for "the server running $first" 45 server_running_or_done
cluster_running || fail "the cluster ended before the server ran $first"
touch "$dir/cut"
wait_for "host 2's link down" 10 grep -q "host 2 link down" "$dir/cluster"
if [ "$back" = 1 ]; then
  wait_for "the server evicting worker 1" 20 grep -q "worker 1 evicted" "$dir/err.0"
  touch "$dir/back"
  wait_for "host 2's link up" 10 grep -q "host 2 link up" "$dir/cluster"
fi
# The run: the 4 s policy, the eviction, at most 3 s for the cut-off worker's record; the
# cut-off worker: ZeroMQ's 5 s heartbeat timeout. 40 s only catches a hang (the limits add up to
# less than the ctest TIMEOUT, so this script, not ctest, stops a hung run and cleans up).
wait_for "every host's process to end" 40 cluster_ended
wait "$cluster_pid"
cluster_pid=""

for h in 0 1 2; do [ -s "$dir/rc.$h" ] || fail "host $h's process left no exit status"; done
[ "$(cat "$dir/rc.0")" = 0 ] || fail "the server (host 0) failed"
[ "$(cat "$dir/rc.1")" = 0 ] || fail "the surviving worker (host 1) failed"
grep -q "worker 1 evicted" "$dir/err.0" || fail "worker 1 was not evicted"
grep -q "\"policy\": \"$first\"" "$dir/out.0" || fail "no report"
# The survivor went on after the cut: at 10 it/s for 4 s it makes about 40 iterations; the
# cut-off worker made at most a few before the link went down.
iterations=$(sed -n 's/.*"iterations": \([0-9]*\),.*/\1/p' "$dir/out.0" | head -n 1)
[ "${iterations:-0}" -ge 10 ] || fail "the workers made ${iterations:-no} iterations: the survivor did not go on after the cut"
if [ "$back" = 1 ]; then
  # Back in time: refused as evicted, then in the second policy again.
  [ "$(cat "$dir/rc.2")" = 0 ] || fail "the worker whose link came back failed"
  grep -q "cadence-train: worker 1: .*evicted" "$dir/err.2" || fail "the returning worker was not told it was evicted"
  grep -q "gone (killed?)" "$dir/err.0" && fail "the server counted the returning worker gone"
  grep -q "\"policy\": \"$second\"" "$dir/out.0" || fail "the second policy did not run"
  evicted=$(sed -n 's/.*"evicted": \(\[[0-9, ]*\]\).*/\1/p' "$dir/out.0" | tr -d ' ' | paste -sd' ')
  [ "$evicted" = "[1] []" ] || fail "evicted per policy: '$evicted', expected [1] in the first and [] in the second"
  echo "PASS: host 2's link cut under $first and back after the eviction; worker 1 refused, then in $second again ($meet rendezvous)"
else
  grep -q "gone (killed?); the remaining policies are skipped: $second" "$dir/err.0" || fail "no line naming the lost worker"
  grep -q '"evicted": \[1\]' "$dir/out.0" || fail "worker 1 not listed in evicted"
  grep -q "\"policy\": \"$second\"" "$dir/out.0" && fail "the skipped policy was reported"
  # The cut-off worker ended by itself rather than hang; if it failed, it said why.
  [ "$(cat "$dir/rc.2")" = 0 ] || grep -q "cadence-train (rank 2): error: " "$dir/err.2" ||
    fail "the cut-off worker failed without an error message"
  echo "PASS: host 2's link cut under $first; worker 1 evicted and listed; the run reported; the cut-off worker exited with status $(cat "$dir/rc.2") ($meet rendezvous)"
fi
cat "$dir/out.0"
grep -h "cadence-train" "$dir/err.0" "$dir/err.2"
