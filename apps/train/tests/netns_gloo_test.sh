#!/usr/bin/env bash
# cadence-train over gloo across hosts that share no folder: 3 network namespaces
# (scripts/netns-cluster.sh, each link capped at 1 Gbit/s), the server on host 0 and a worker on
# hosts 1 and 2. Rank 0 serves the run's TCP store on host 0 (--rendezvous {host0}:29400), each
# process binds its own host's address (--address), and there is no --store: every communicator
# (the world, the control one, each policy's, the workers' own for the collective mode) meets
# through the store. Runs a parameter-server policy and a collective one and checks both were
# reported with iterations. Waits for the processes to end; its limit only catches a hang.
# Needs root and network namespaces; without them it prints SKIP and exits 77. Usage:
#   netns_gloo_test.sh scripts/netns-cluster.sh build/bin/cadence-train
set -u
# One job secret for the run's processes in every namespace (as launch-gloo.sh does on one host).
export CADENCE_JOB_SECRET=${CADENCE_JOB_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
# shellcheck source=netns_support.sh
. "$(dirname "$0")/netns_support.sh"
netns_args netns_gloo_test.sh "$@"

netns_probe

dir=$(mktemp -d "${TMPDIR:-/tmp}/cadence-netns-gloo-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
export CADENCE_TEST_DIR=$dir
# shellcheck disable=SC2016  # expanded by each host's shell
host_cmd='"$@" >"$CADENCE_TEST_DIR/out.$CADENCE_HOST" 2>"$CADENCE_TEST_DIR/err.$CADENCE_HOST"
echo $? >"$CADENCE_TEST_DIR/rc.$CADENCE_HOST"'
# timeout: a hang only (the run takes about 10 s); netns-cluster cleans up on TERM.
timeout -s TERM 90 bash "$cluster" -n 3 --rate 1gbit --keep-going -- \
  bash -c "$host_cmd" host "$train" --transport gloo --rank '{host}' --size 3 --rendezvous '{host0}:29400' \
  --address '{addr}' --model softmax --train-limit 2000 --test-limit 200 --seconds 2 --profile homogeneous \
  --policy bsp --policy periodic:4 --json >"$dir/cluster" 2>&1
status=$?

[ "$status" = 124 ] && fail "the run did not end within 90 s"
for h in 0 1 2; do [ "$(cat "$dir/rc.$h" 2>/dev/null)" = 0 ] || fail "host $h's process failed"; done
for p in bsp periodic:4; do
  line=$(grep "\"policy\": \"$p\"" "$dir/out.0") || fail "no report of $p"
  its=$(sed -n 's/.*"iterations": \([0-9]*\),.*/\1/p' <<<"$line")
  [ "${its:-0}" -ge 10 ] || fail "$p made ${its:-no} iterations"
  grep -q '"transport": "gloo-' <<<"$line" || fail "$p did not run over gloo"
done
echo "PASS: gloo across 3 namespaces, no shared folder (rank 0's TCP store on host 0)"
cat "$dir/out.0"
