# Sourced by the network-namespace tests (netns_link_test.sh, netns_gloo_test.sh): can this
# machine make namespaces, veth pairs and tbf qdiscs? Root in a container often cannot. If not,
# prints "SKIP: <why>" and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
{ command -v ip && command -v tc; } >/dev/null || skip "needs ip and tc (Debian: iproute2)"
probe="cdcprobe$$"
if ! ip netns add "$probe" 2>/dev/null; then skip "ip netns add fails here"; fi
probe_ok=0
if ip -n "$probe" link add pa type veth peer name pb 2>/dev/null &&
  tc -n "$probe" qdisc add dev pa root tbf rate 1gbit burst 256kb latency 50ms 2>/dev/null; then
  probe_ok=1
fi
ip netns del "$probe"
[ "$probe_ok" = 1 ] || skip "veth pairs or tc tbf do not work in a namespace here"
