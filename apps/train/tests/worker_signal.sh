# Sourced by sigstop_test.sh and sigkill_test.sh: starts a 3-rank cadence-train job in the
# background, finds the process of worker 1 (rank 2) to signal, and waits for the job's end. The
# caller sets mpirun, flags, train and dir (a temporary folder for the job's stdout and stderr)
# first.

# fail MESSAGE: prints it with the job's output and exits 1.
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$dir/out"; echo "--- stderr"; cat "$dir/err"; exit 1; }

# wait_line PATTERN [SECONDS]: waits until the job's stderr has a line matching PATTERN (grep -E);
# fails naming it after SECONDS (default 60), which only catches a hang.
wait_line() {
  local limit=$(( ${2:-60} * 10 ))
  for _ in $(seq 1 "$limit"); do
    grep -qE "$1" "$dir/err" && return 0
    kill -0 "$job" 2>/dev/null || { grep -qE "$1" "$dir/err" && return 0; fail "the job ended before: $1"; }
    sleep 0.1
  done
  fail "no line matching '$1' within ${2:-60} s"
}

# wait_job SECONDS: waits for the job to end and for its exit status 0; fails if it has not
# ended after SECONDS (which only catches a hang) or failed.
wait_job() {
  for _ in $(seq 1 $(( $1 * 10 ))); do
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$job" 2>/dev/null; then kill "$job"; fail "the job did not end within $1 s"; fi
  wait "$job" || fail "$(basename "$mpirun") exit status $?"
}

# start_job ARGS...: cadence-train with ARGS on 3 ranks; sets job (its pid) and victim (worker
# 1's pid) once the first policy is running (the server prints "<policy> [1/N]: running").
start_job() {
  # shellcheck disable=SC2086
  "$mpirun" $flags -np 3 "$train" "$@" >"$dir/out" 2>"$dir/err" &
  job=$!
  wait_line "rank pids:"
  wait_line ": running$"
  local pids
  pids=$(sed -n 's/.*rank pids: \([0-9 ]*\) (rank 0.*/\1/p' "$dir/err")
  victim=$(echo "$pids" | awk '{print $3}')
  [ -n "$victim" ] || fail "no pid line"
}
