# Sourced by sigstop_test.sh and sigkill_test.sh: starts a 3-rank cadence-train job in the
# background and finds the process of worker 1 (rank 2) to signal. The caller sets mpirun, flags,
# train and dir (a temporary folder for the job's stdout and stderr) first.

# fail MESSAGE: prints it with the job's output and exits 1.
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$dir/out"; echo "--- stderr"; cat "$dir/err"; exit 1; }

# start_job ARGS...: cadence-train with ARGS on 3 ranks; sets job (its pid) and victim (worker
# 1's pid) once training has started (up to 30 s for the data load).
start_job() {
  # shellcheck disable=SC2086
  "$mpirun" $flags -np 3 "$train" "$@" >"$dir/out" 2>"$dir/err" &
  job=$!
  for _ in $(seq 1 300); do
    grep -q "rank pids:" "$dir/err" && break
    kill -0 "$job" 2>/dev/null || fail "the job ended before it started training"
    sleep 0.1
  done
  local pids
  pids=$(sed -n 's/.*rank pids: \([0-9 ]*\) (rank 0.*/\1/p' "$dir/err")
  victim=$(echo "$pids" | awk '{print $3}')
  [ -n "$victim" ] || fail "no pid line"
}
