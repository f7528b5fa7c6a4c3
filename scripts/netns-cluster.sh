#!/usr/bin/env bash
# A cluster of N "hosts" on this machine, each a network namespace with its own network stack,
# joined by veth pairs to a bridge (a "switch" namespace), each host's link capped with tbf;
# runs one command per host and removes everything on exit (also after Ctrl-C or a failure),
# the processes a host's command left in its namespace included.
# Needs root (ip netns, veth, tc); without it, it says so and exits 2: it never falls back to
# loopback.
#
# Usage: scripts/netns-cluster.sh [options] -- COMMAND [ARGS...]
#   -n N              hosts (default 3); host i has address 10.77.0.(i+1)
#   --rate R          every host link's rate, as tc spells it (default 1gbit)
#   --host-rate I=R   host I's link rate instead (repeatable), e.g. 2=100mbit
#   --down I@S        take host I's link down S seconds after the hosts start (repeatable)
#   --up I@S          bring host I's link back S seconds after the hosts start (repeatable)
#   --down-on I=FILE  take host I's link down once FILE exists (polled every 0.1 s; repeatable):
#                     a test creates FILE when the run reaches the state it wants to cut
#   --up-on I=FILE    bring host I's link back once FILE exists (repeatable)
#   --keep-going      wait for every host's command even after one fails
#   --on I            run COMMAND on host I only (repeatable; default: on every host); the
#                     other hosts exist, idle, for a launcher on host I to reach
#                     (scripts/netns-mpirun.sh starts MPI ranks in them)
# COMMAND runs once per host, in its namespace, with these in its environment:
#   CADENCE_HOST (i), CADENCE_HOSTS (N), CADENCE_HOST_ADDR (its address),
#   CADENCE_HOST0_ADDR (host 0's address: a rendezvous), CADENCE_NETNS (the namespace's name),
#   CADENCE_HOST_NETNS (every host's namespace, in host order, separated by spaces),
#   CADENCE_JOB_SECRET (the caller's, else one generated for this run: every host's the same,
#   as a job's processes need it; docs/transports.md, "Security")
# and with "{host}", "{addr}" and "{host0}" in ARGS replaced by i, its address and host 0's
# address. Each host's stdout and stderr go to the terminal prefixed with "[host i]". The exit
# status is the first non-zero status of a host's command (0 if all succeed).
set -uo pipefail

hosts=3
rate=1gbit
declare -A host_rate=()
events=()
keep_going=0
declare -A run_on=()
need_value() { (($# >= 2)) || { echo "netns-cluster: $1 needs a value (see --help)" >&2; exit 2; }; }
while (($#)); do
  case $1 in
    -n) need_value "$@"; hosts=$2; shift 2 ;;
    --rate) need_value "$@"; rate=$2; shift 2 ;;
    --host-rate)
      need_value "$@"
      [[ $2 == *=?* ]] || { echo "netns-cluster: --host-rate $2: expected I=RATE, e.g. 2=100mbit" >&2; exit 2; }
      host_rate[${2%%=*}]=${2#*=}; shift 2 ;;
    --down|--up)
      need_value "$@"
      [[ $2 =~ ^[0-9]+@[0-9]+(\.[0-9]+)?$ ]] ||
        { echo "netns-cluster: $1 $2: expected I@SECONDS, e.g. 2@5 or 2@0.5" >&2; exit 2; }
      events+=("${1#--} ${2%%@*} at ${2#*@}"); shift 2 ;;
    --down-on|--up-on)
      need_value "$@"
      [[ $2 =~ ^[0-9]+=.+$ ]] || { echo "netns-cluster: $1 $2: expected I=FILE, e.g. 2=/tmp/run/cut" >&2; exit 2; }
      what=${1#--}; events+=("${what%-on} ${2%%=*} on ${2#*=}"); shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --on)
      need_value "$@"
      [[ $2 =~ ^[0-9]+$ ]] || { echo "netns-cluster: --on $2: expected a host index" >&2; exit 2; }
      run_on[$2]=1; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "netns-cluster: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if (($# == 0)); then
  echo "netns-cluster: no command (usage: netns-cluster.sh [options] -- COMMAND [ARGS...])" >&2
  exit 2
fi
if ! [[ $hosts =~ ^[0-9]+$ ]] || ((hosts < 1 || hosts > 200)); then
  echo "netns-cluster: -n $hosts: expected 1 to 200 hosts" >&2
  exit 2
fi
for i in "${!host_rate[@]}"; do
  if ! [[ $i =~ ^[0-9]+$ ]] || ((i >= hosts)); then
    echo "netns-cluster: --host-rate $i=${host_rate[$i]}: no host $i (hosts are 0..$((hosts - 1)))" >&2
    exit 2
  fi
done
for i in "${!run_on[@]}"; do
  ((i < hosts)) || { echo "netns-cluster: --on $i: no host $i (hosts are 0..$((hosts - 1)))" >&2; exit 2; }
done
for e in "${events[@]}"; do
  read -r what host how _ <<<"$e"
  flag=--$what; [[ $how == on ]] && flag+=-on
  ((host < hosts)) || { echo "netns-cluster: $flag $host: no host $host (hosts are 0..$((hosts - 1)))" >&2; exit 2; }
done
if [[ $(id -u) -ne 0 ]]; then
  echo "netns-cluster: needs root (ip netns, veth pairs, tc); refusing to fall back to loopback" >&2
  exit 2
fi
for tool in ip tc; do
  command -v "$tool" >/dev/null || { echo "netns-cluster: '$tool' not found (Debian: iproute2)" >&2; exit 2; }
done

# Unique per run: two runs never collide (names are at most 15 characters for interfaces).
id=$(printf '%x' $(( ($$ ^ RANDOM) & 0xffff )))
prefix="cdc${id}"
switch="${prefix}sw"
created=()
pids=()
timers=()

# shellcheck disable=SC2317  # run by the trap
cleanup() {
  local p
  for p in "${timers[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  # Whatever a host's command started and left behind (a shell's children survive its TERM)
  # still lives in the namespace: TERM it, and KILL what is left after 2 s.
  local ns tries
  local -a left
  signal_left() {
    left=()
    for ns in "${created[@]}"; do mapfile -t -O "${#left[@]}" left < <(ip netns pids "$ns" 2>/dev/null); done
    ((${#left[@]} == 0)) || kill "-$1" "${left[@]}" 2>/dev/null
  }
  signal_left TERM
  for ((tries = 0; tries < 20 && ${#left[@]} > 0; tries++)); do
    sleep 0.1
    signal_left 0
  done
  ((${#left[@]} == 0)) || signal_left KILL
  for ns in "${created[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "netns-cluster: $*" >&2; exit 2; }

ip netns add "$switch" || fail "ip netns add failed (is this a container without CAP_SYS_ADMIN?)"
created+=("$switch")
ip -n "$switch" link add br0 type bridge || fail "cannot create a bridge"
ip -n "$switch" link set br0 up
ip -n "$switch" link set lo up

# host_link I: host I's interface name inside its namespace is eth0; the switch side is sI.
for ((i = 0; i < hosts; i++)); do
  ns="${prefix}h$i"
  ip netns add "$ns" || fail "ip netns add $ns failed"
  created+=("$ns")
  ip link add "${prefix}a$i" netns "$ns" type veth peer name "s$i" netns "$switch" ||
    fail "cannot create the veth pair of host $i"
  ip -n "$ns" link set "${prefix}a$i" name eth0
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$switch" link set "s$i" master br0
  ip -n "$switch" link set "s$i" up
  r=${host_rate[$i]:-$rate}
  # Both directions: the host's egress on its side, its ingress as the switch port's egress.
  tc -n "$ns" qdisc add dev eth0 root tbf rate "$r" burst 256kb latency 50ms ||
    fail "tc tbf on host $i failed (rate '$r')"
  tc -n "$switch" qdisc add dev "s$i" root tbf rate "$r" burst 256kb latency 50ms ||
    fail "tc tbf on the switch port of host $i failed (rate '$r')"
done

all_ns=""
for ((i = 0; i < hosts; i++)); do all_ns+="${all_ns:+ }${prefix}h$i"; done
export CADENCE_HOSTS=$hosts CADENCE_HOST0_ADDR=10.77.0.1 CADENCE_HOST_NETNS=$all_ns
if [[ -z ${CADENCE_JOB_SECRET:-} ]]; then
  CADENCE_JOB_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n') || fail "no random bytes for the job secret"
fi
export CADENCE_JOB_SECRET
pid_host=()
for ((i = 0; i < hosts; i++)); do
  ((${#run_on[@]} == 0)) || [[ -n ${run_on[$i]:-} ]] || continue
  ns="${prefix}h$i"
  args=()
  for a in "$@"; do
    a=${a//\{host\}/$i}
    a=${a//\{addr\}/10.77.0.$((i + 1))}
    args+=("${a//\{host0\}/10.77.0.1}")
  done
  (
    export CADENCE_HOST=$i CADENCE_HOST_ADDR="10.77.0.$((i + 1))" CADENCE_NETNS=$ns
    exec ip netns exec "$ns" "${args[@]}"
  ) > >(sed -u "s/^/[host $i] /") 2> >(sed -u "s/^/[host $i] /" >&2) &
  pids+=($!)
  pid_host+=("$i")
done

# Link faults at chosen times, or once a file exists: the switch port of host I goes down or up.
for e in "${events[@]}"; do
  read -r what host how when <<<"$e"
  (
    if [[ $how == at ]]; then
      sleep "$when"
    else
      while [[ ! -e $when ]]; do sleep 0.1; done
    fi
    ip -n "$switch" link set "s$host" "$what" && echo "netns-cluster: host $host link $what" >&2
  ) &
  timers+=($!)
done

status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  if ((rc != 0)); then
    ((status == 0)) && status=$rc
    echo "netns-cluster: host ${pid_host[$i]} exited with status $rc" >&2
    ((keep_going)) || break
  fi
done
exit "$status"
