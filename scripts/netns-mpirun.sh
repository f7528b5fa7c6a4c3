#!/usr/bin/env bash
# mpirun across the hosts of scripts/netns-cluster.sh: one MPI rank per host (namespace), so
# MPI traffic crosses the capped links. Run it on host 0 only, as netns-cluster's command:
#
#   sudo scripts/netns-cluster.sh -n 2 --rate 1gbit --on 0 -- \
#       scripts/netns-mpirun.sh build/bin/cadence-bench-transport --backend mpi
#
# Open MPI starts its daemons through an "rsh agent"; here the agent is this script again
# (--agent NAMESPACE COMMAND...), which runs the command with `ip netns exec` instead of ssh.
# Ranks are not bound to cores (every "host" is this machine: Open MPI would otherwise pin each
# host's rank to core 0, all on the same core). TCP only, on eth0 (each host's link). Options
# for mpirun go before "--": netns-mpirun.sh --mca btl_tcp_eager_limit 65536 -- PROGRAM ...
# Open MPI only; needs $CADENCE_HOST_NETNS (netns-cluster sets it).
set -u
if [[ ${1:-} == --agent ]]; then
  (($# >= 3)) || { echo "netns-mpirun: --agent NAMESPACE COMMAND..." >&2; exit 2; }
  ns=$2
  shift 2
  exec ip netns exec "$ns" sh -c "$*"
fi
if (($# == 0)); then
  echo "usage: netns-mpirun.sh [MPIRUN_OPTIONS... --] PROGRAM [ARGS...] (as netns-cluster.sh --on 0's command)" >&2
  exit 2
fi
if [[ -z ${CADENCE_HOST_NETNS:-} ]]; then
  echo "netns-mpirun: \$CADENCE_HOST_NETNS is not set: run it under scripts/netns-cluster.sh --on 0" >&2
  exit 2
fi
mpirun_options=()
for a in "$@"; do
  if [[ $a == -- ]]; then
    while [[ $1 != -- ]]; do mpirun_options+=("$1"); shift; done
    shift
    break
  fi
done
(($# > 0)) || { echo "netns-mpirun: no program after --" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "netns-mpirun: mpirun not found" >&2; exit 2; }

read -r -a namespaces <<<"$CADENCE_HOST_NETNS"
hostfile=$(mktemp "${TMPDIR:-/tmp}/netns-mpirun-XXXXXX") || exit 1
trap 'rm -f "$hostfile"' EXIT
for ns in "${namespaces[@]}"; do echo "$ns slots=1"; done >"$hostfile"
self=$(readlink -f "$0")
mpirun --allow-run-as-root --hostfile "$hostfile" -np "${#namespaces[@]}" --map-by node --bind-to none \
  --mca plm_rsh_agent "$self --agent" --mca btl tcp,self --mca btl_tcp_if_include eth0 \
  --mca oob_tcp_if_include eth0 --mca rtc_hwloc_vmhole none "${mpirun_options[@]}" "$@"
