#!/usr/bin/env bash
# Starts N processes of a program as one gloo job on this host: a fresh rendezvous folder
# (gloo's file store) in a temporary directory, CADENCE_TRAIN_RANK/SIZE/STORE set for each
# process, the same arguments to all, and one job secret for all of them in CADENCE_JOB_SECRET
# (32 random bytes, in hex) unless the caller set one. Rank 0's stdout is this script's stdout (for
# cadence-train --json: the one JSON array); every rank's stderr is passed through. When one
# process fails, the others are stopped; the exit status is the first failure's (or 0). With
# --survive-workers, a process other than rank 0 that fails or is killed is only reported and
# the others go on (cadence-train --evict-after then evicts it); rank 0's failure still stops
# everyone, and the exit status is rank 0's.
#
#   apps/train/launch-gloo.sh -n 5 build/bin/cadence-train --transport gloo --policy bsp --json
#
# Options (before the program): -n N (processes, at least 1), --timeout S (stop everything
# after S seconds, exit 124; default: none), --keep-store (leave the folder, for debugging),
# --survive-workers (see above).
set -u
usage() {
  echo "usage: launch-gloo.sh -n N [--timeout S] [--keep-store] [--survive-workers] PROGRAM [ARGS...]" >&2
  exit 2
}
n=""; limit=""; keep=0; survive=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-np|--np) [ $# -ge 2 ] || usage; n=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] || usage; limit=$2; shift 2 ;;
    --keep-store) keep=1; shift ;;
    --survive-workers) survive=1; shift ;;
    --) shift; break ;;
    -*) echo "launch-gloo.sh: unknown option '$1'" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage
case "$n" in
  ''|*[!0-9]*) echo "launch-gloo.sh: -n: expected a number of processes >= 1, got '$n'" >&2; exit 2 ;;
esac
[ "$n" -ge 1 ] || { echo "launch-gloo.sh: -n: expected a number of processes >= 1, got '$n'" >&2; exit 2; }
case "$limit" in
  ''|*[!0-9]*) [ -z "$limit" ] || { echo "launch-gloo.sh: --timeout: expected whole seconds, got '$limit'" >&2; exit 2; } ;;
esac

store=$(mktemp -d "${TMPDIR:-/tmp}/cadence-gloo-XXXXXX") || exit 1
if [ -z "${CADENCE_JOB_SECRET:-}" ]; then
  CADENCE_JOB_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n') || exit 1
fi
export CADENCE_JOB_SECRET
out0="$store/rank0.out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -f "$out0" ] && cat "$out0"
  [ "$keep" = 1 ] || rm -rf "$store"
}
trap 'cleanup; exit 130' INT TERM

for ((r = 0; r < n; r++)); do
  if [ "$r" = 0 ]; then
    CADENCE_TRAIN_RANK=$r CADENCE_TRAIN_SIZE=$n CADENCE_TRAIN_STORE=$store "$@" >"$out0" &
  else
    CADENCE_TRAIN_RANK=$r CADENCE_TRAIN_SIZE=$n CADENCE_TRAIN_STORE=$store "$@" >/dev/null &
  fi
  pids+=($!)
done

# Wait for all; on the first failure stop the rest.
start=$SECONDS
status=0
left=$n
declare -A done_=()
while [ "$left" -gt 0 ]; do
  for ((r = 0; r < n; r++)); do
    [ -n "${done_[$r]:-}" ] && continue
    p=${pids[$r]}
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p"; rc=$?
      done_[$r]=1; left=$((left - 1))
      if [ "$survive" = 1 ] && [ "$r" != 0 ]; then
        if [ "$rc" != 0 ]; then
          how="status $rc"
          [ "$rc" -gt 128 ] && how="$how (signal $((rc - 128)))"
          echo "launch-gloo.sh: rank $r exited with $how; the others go on (--survive-workers)" >&2
        fi
      elif [ "$survive" = 1 ]; then
        status=$rc
        if [ "$rc" != 0 ]; then
          echo "launch-gloo.sh: rank 0 exited with status $rc; stopping the others" >&2
          for q in "${pids[@]}"; do kill -TERM "$q" 2>/dev/null; done
        fi
      elif [ "$rc" != 0 ] && [ "$status" = 0 ]; then
        status=$rc
        echo "launch-gloo.sh: rank $r exited with status $rc; stopping the others" >&2
        for q in "${pids[@]}"; do kill -TERM "$q" 2>/dev/null; done
      fi
    fi
  done
  if [ -n "$limit" ] && [ $((SECONDS - start)) -ge "$limit" ] && [ "$left" -gt 0 ]; then
    echo "launch-gloo.sh: still running after $limit s; stopping every rank" >&2
    status=124
    break
  fi
  [ "$left" -gt 0 ] && sleep 0.05
done
cleanup
exit "$status"
