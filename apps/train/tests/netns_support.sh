# Sourced by the network-namespace tests (netns_link_test.sh, netns_gloo_test.sh).
# netns_args NAME "$@": the two arguments every such test takes, NETNS_CLUSTER and TRAIN, into
# $cluster and $train; a wrong command line exits 2 with NAME's usage.
# netns_probe: can this machine make namespaces, veth pairs and tbf qdiscs? Root in a container
# often cannot. If not, prints "SKIP: <why>" and exits 77, which ctest reports as skipped
# (SKIP_RETURN_CODE).
# fail MESSAGE: prints it with what each of the 3 hosts left in $dir (exit status, stderr; host
# 0's stdout) and netns-cluster's output ($dir/cluster), and exits 1.
netns_args() {
  local name=$1
  shift
  if [ $# -ne 2 ]; then
    echo "usage: $name NETNS_CLUSTER TRAIN" >&2
    exit 2
  fi
  cluster=$1; train=$2
  [ -x "$train" ] || { echo "$name: '$train' is not an executable" >&2; exit 2; }
  [ -f "$cluster" ] || { echo "$name: no netns-cluster script at '$cluster'" >&2; exit 2; }
}

skip() { echo "SKIP: $*"; exit 77; }

netns_probe() {
  [ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
  { command -v ip && command -v tc; } >/dev/null || skip "needs ip and tc (Debian: iproute2)"
  local probe="cdcprobe$$" probe_ok=0
  if ! ip netns add "$probe" 2>/dev/null; then skip "ip netns add fails here"; fi
  if ip -n "$probe" link add pa type veth peer name pb 2>/dev/null &&
    tc -n "$probe" qdisc add dev pa root tbf rate 1gbit burst 256kb latency 50ms 2>/dev/null; then
    probe_ok=1
  fi
  ip netns del "$probe"
  [ "$probe_ok" = 1 ] || skip "veth pairs or tc tbf do not work in a namespace here"
}

fail() {
  echo "FAIL: $*"
  local h
  for h in 0 1 2; do
    echo "--- host $h: exit status $(cat "$dir/rc.$h" 2>/dev/null || echo '(still running or not started)')"
    echo "--- host $h stderr"; cat "$dir/err.$h" 2>/dev/null
  done
  echo "--- host 0 stdout"; cat "$dir/out.0" 2>/dev/null
  echo "--- netns-cluster${status:+ (status $status)}"; cat "$dir/cluster" 2>/dev/null
  exit 1
}
