#!/usr/bin/env bash
# Everything GPU-side in one call, under one overall timeout, with one JSON summary: what a lent
# GPU machine checks in a single run of under 8 minutes (issue 39).
#
#   bench/gpu/run.sh [options] [build-dir] [-- extra args for cadence-bench-thrust-gpu]
#
# Steps, in order (each under its own timeout, capped by the time left; a failed step does not
# stop the ones after it, which say so when they needed it):
#   device               nvidia-smi: the GPUs and the driver. Without a CUDA device every step is
#                        "skipped: no CUDA device" and the script exits 3 at once.
#   configure            cmake: the CUDA flavour of cadence::thrust for sm_$CUDA_ARCH, the tests,
#                        the benchmarks; NCCL from the CUDA toolkit, NCCL_ROOT or PyTorch's wheel.
#   build                every target below in one parallel build (keeps going past a failure).
#   thrust_parity        the CUDA test suite: the Thrust ZipLine against the brute force.
#   thrust_bench         the GPU ZipLine table (n = 1e3 .. 1e6, R = 100) and batches of plans;
#                        without a configured build, the program compiled by nvcc alone.
#   nccl_communicator    the NCCL backend's tests on the real GPU (every dtype and op checked
#                        exactly; an init whose second rank never joins aborts within its deadline).
#   nccl_adapters        the collective adapters over NCCL (device buffers, the caller's stream).
#   stream_order         bench/gpu/stream_order_check.cu (nvcc alone): the adapters wait for a slow
#                        kernel that writes the gradients on the caller's stream.
#   nccl_transport_bench cadence-bench-transport --backend nccl: ours against raw ncclAllReduce.
#   nccl_exchange_bench  cadence-bench-exchange --backend nccl from 1 MiB: the adapters' rows.
#   nccl_ps_bench        cadence-bench-ps over NCCL, where the program has that backend (today it
#                        has not: the parameter server moves host buffers over MPI and ZeroMQ).
#   torch_gpu            python/bench/torch_gpu.sh: cadence.torch's CUDA branches and the torchrun
#                        example on the GPU (skipped, saying why, without torch or CUDA in Python).
#
# Options:
#   --summary PATH      the JSON summary (default: $OUT/gpu-summary.json when OUT is set, else
#                       <build-dir>/gpu-summary.json); each step's log goes beside it, in
#                       gpu-logs/<step>.log, and the benchmarks' JSON rows in gpu-logs/<step>.json
#   --timeout S         the whole run's limit (default 450); steps left when it is spent are
#                       "skipped: overall timeout"
#   --step-timeout S    a cap on every step's own limit (default: each step's, listed by --plan)
#   --only a,b,...      run only these steps (the others are "skipped: not selected")
#   --plan              run nothing: detect the device and the tools, print the plan and write the
#                       summary with each step "planned" or the reason it would be skipped (exit 0)
# Env: CUDA_ARCH (default 90), JOBS (default: number of cores), PYTHON (default python3),
#   CUDA_VISIBLE_DEVICES (set and empty, or -1: no CUDA device, as CUDA programs read it).
# Exit status: 0 every step passed or was skipped for a reason outside the GPU (no torch, no NCCL
# rows in the PS bench); 1 a step failed or timed out; 2 bad usage; 3 no CUDA device.
# The summary: {"status", "seconds", "timeout_s", "device", "steps": [{"step", "status",
# "seconds", "timeout_s", "log", "numbers": {key numbers of the step}}]}; docs/testing.md shows it.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
self=$here/$(basename "$0")
export PATH=/usr/local/cuda/bin:$PATH LC_NUMERIC=C

steps=(device configure build thrust_parity thrust_bench nccl_communicator nccl_adapters stream_order
       nccl_transport_bench nccl_exchange_bench nccl_ps_bench torch_gpu)
declare -A limit=([device]=15 [configure]=90 [build]=240 [thrust_parity]=60 [thrust_bench]=90
                  [nccl_communicator]=60 [nccl_adapters]=60 [stream_order]=90
                  [nccl_transport_bench]=60 [nccl_exchange_bench]=90 [nccl_ps_bench]=60 [torch_gpu]=240)
declare -A what=(
  [device]="nvidia-smi: GPUs, driver, memory"
  [configure]="cmake: CUDA Thrust, tests, benchmarks, NCCL"
  [build]="cadence_thrust_tests_cuda cadence-bench-thrust-gpu cadence_transport_nccl_tests_cxx17 cadence-bench-transport cadence-bench-exchange cadence-bench-ps"
  [thrust_parity]="cadence_thrust_tests_cuda (parity with the brute force on the GPU)"
  [thrust_bench]="cadence-bench-thrust-gpu (the GPU ZipLine table, batches of plans)"
  [nccl_communicator]="cadence_transport_nccl_tests_cxx17 --source-file=*/nccl/communicator_test.cpp"
  [nccl_adapters]="cadence_transport_nccl_tests_cxx17 --source-file=*/nccl/exchange_gpu_test.cpp"
  [stream_order]="nvcc bench/gpu/stream_order_check.cu, run"
  [nccl_transport_bench]="cadence-bench-transport --backend nccl --ranks 1 --json"
  [nccl_exchange_bench]="cadence-bench-exchange --backend nccl --min-bytes 1048576 --no-overlap --json"
  [nccl_ps_bench]="cadence-bench-ps --backend nccl --json (where it has that backend)"
  [torch_gpu]="bash python/bench/torch_gpu.sh <build-dir>")

usage() { sed -n '2,/^set -uo/p' "$self" | sed '$d; s/^# \{0,1\}//'; }
die_usage() {
  echo "bench/gpu/run.sh: $1" >&2
  echo "usage: bench/gpu/run.sh [--plan] [--summary PATH] [--timeout S] [--step-timeout S] [--only a,b] [build-dir] [-- thrust-bench args]" >&2
  exit 2
}
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die_usage "$1 wants a whole number of seconds, got '$2'"; }

# ---------------------------------------------------------------------------------------------
# One step, run by the driver below as `run.sh --internal-step NAME -- thrust-args` under
# timeout(1) (which signals the step's whole process group). The driver exports RUN_BUILD,
# RUN_LOGS, RUN_ARCH, RUN_JOBS, RUN_PY. A step's exit status: 0 passed, 1 failed, 77 skipped
# (its reason on the last line of its output, "skipped: ...").
# ---------------------------------------------------------------------------------------------
skip() {
  echo "skipped: $1"
  exit 77
}
status_of() { cat "$RUN_LOGS/$1.status" 2>/dev/null || echo "not run"; }
configured() {  # configure passed, or was not selected (--only) and the build folder has a cache
  local c
  c=$(status_of configure)
  [[ $c == passed || ( $c == "not run" && -f $RUN_BUILD/CMakeCache.txt ) ]]
}
needs_configure() { configured || skip "needs the configured build (configure: $(status_of configure))"; }
nccl_found() { grep -qE '^CADENCE_NCCL_LIBRARY:[A-Z]+=/' "$RUN_BUILD/CMakeCache.txt" 2>/dev/null; }
exe() {  # the built program, or fail naming the build log
  [[ -x $RUN_BUILD/bin/$1 ]] || { echo "$1 was not built (see $RUN_LOGS/build.log)"; exit 1; }
  echo "$RUN_BUILD/bin/$1"
}
doctest_run() {  # program, source-file glob: doctest with -s; "no GPU" in its output fails it
  local bin log args=(--no-version -s)
  bin=$(exe "$1") || { echo "$bin"; exit 1; }
  [[ -n $2 ]] && args+=("--source-file=$2")
  log=$("$bin" "${args[@]}" 2>&1)
  local rc=$?
  echo "$log"
  ((rc == 0)) || exit 1
  if grep -q 'no GPU' <<<"$log"; then
    echo "the tests found no GPU: nothing was tested on the device"
    exit 1
  fi
}

step_device() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader && nvidia-smi -L
}

step_configure() {
  command -v cmake >/dev/null || { echo "cmake not found"; exit 1; }
  command -v nvcc >/dev/null || { echo "nvcc not found (no CUDA toolkit in PATH or /usr/local/cuda/bin)"; exit 1; }
  [[ -n ${NCCL_WHEEL:-} ]] && echo "NCCL from the Python wheel at $NCCL_WHEEL (NCCL_ROOT=$NCCL_ROOT)"
  local gen=()
  [[ ! -f $RUN_BUILD/CMakeCache.txt ]] && command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S "$src" -B "$RUN_BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCADENCE_THRUST_DEVICE_SYSTEM=CUDA \
        -DCMAKE_CUDA_ARCHITECTURES="$RUN_ARCH" -DCADENCE_BUILD_TOOLS=OFF -DCADENCE_BUILD_EXAMPLES=OFF \
        -DCADENCE_INSTALL=OFF -DCADENCE_BUILD_TESTS=ON -DCADENCE_BUILD_BENCHMARKS=ON \
        -DCADENCE_TEST_STANDARDS=17 -DCADENCE_SECONDARY_TEST_STANDARDS=17 || exit 1
  if nccl_found; then echo "NCCL: found"; else echo "NCCL: not found"; fi
}

step_build() {
  needs_configure
  local want=() have t
  # The targets this configuration has (a missing one, say NCCL's, is not an error).
  have=$(cmake --build "$RUN_BUILD" --target help 2>/dev/null)
  for t in cadence_thrust_tests_cuda cadence-bench-thrust-gpu cadence_transport_nccl_tests_cxx17 \
           cadence-bench-transport cadence-bench-exchange cadence-bench-ps; do
    if grep -qE "(^|[ :.])$t([ :]|$)" <<<"$have"; then want+=("$t"); else echo "target $t: not in this configuration"; fi
  done
  ((${#want[@]})) || { echo "no target to build"; exit 1; }
  local keep=(-k)
  [[ -f $RUN_BUILD/build.ninja ]] && keep=(-k 0)
  cmake --build "$RUN_BUILD" -j "$RUN_JOBS" --target "${want[@]}" -- "${keep[@]}"
}

step_thrust_parity() {
  needs_configure
  doctest_run cadence_thrust_tests_cuda ""
}

step_thrust_bench() {
  local bin=$RUN_BUILD/bin/cadence-bench-thrust-gpu
  if ! configured; then
    # No doctest or Google Benchmark here: the GPU program compiled by nvcc alone.
    echo "configure: $(status_of configure); building the GPU benchmark with nvcc alone"
    mkdir -p "$RUN_BUILD/bin"
    nvcc -O3 -std=c++17 -arch=sm_"$RUN_ARCH" -I"$src/include" -I"$src/bench/thrust" \
         -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CUDA \
         "$src/bench/thrust/zipline_gpu_bench.cu" -o "$bin" || exit 1
  fi
  bin=$(exe cadence-bench-thrust-gpu) || { echo "$bin"; exit 1; }
  local out
  out=$("$bin" "$@" 2>&1)
  local rc=$?
  echo "$out"
  ((rc == 0)) || exit 1
  ! grep -q MISMATCH <<<"$out" || { echo "a GPU answer differs from the CPU's"; exit 1; }
}

step_nccl_communicator() {
  needs_configure
  nccl_found || skip "NCCL not found at configure time"
  doctest_run cadence_transport_nccl_tests_cxx17 '*/nccl/communicator_test.cpp'
}

step_nccl_adapters() {
  needs_configure
  nccl_found || skip "NCCL not found at configure time"
  doctest_run cadence_transport_nccl_tests_cxx17 '*/nccl/exchange_gpu_test.cpp,*/nccl/quorum_group_gpu_test.cpp'
}

step_stream_order() {
  local flags=(-I"$src/include") inc lib
  if [[ -f $RUN_BUILD/CMakeCache.txt ]]; then
    inc=$(sed -n 's/^CADENCE_NCCL_INCLUDE_DIR:[A-Z]*=//p' "$RUN_BUILD/CMakeCache.txt")
    lib=$(sed -n 's/^CADENCE_NCCL_LIBRARY:[A-Z]*=//p' "$RUN_BUILD/CMakeCache.txt")
    [[ -n $inc && $inc != *NOTFOUND ]] && flags+=(-I"$inc")
    [[ -n $lib && $lib != *NOTFOUND ]] && flags+=(-L"$(dirname "$lib")" -Xlinker -rpath -Xlinker "$(dirname "$lib")")
  fi
  [[ -n ${NCCL_ROOT:-} ]] && flags+=(-I"$NCCL_ROOT/include" -L"$NCCL_ROOT/lib")
  mkdir -p "$RUN_BUILD/bin"
  nvcc -std=c++17 -O2 -arch=sm_"$RUN_ARCH" "${flags[@]}" "$src/bench/gpu/stream_order_check.cu" -lnccl \
       -o "$RUN_BUILD/bin/stream_order_check" || exit 1
  "$RUN_BUILD/bin/stream_order_check"
}

bench_json() {  # step, program, args...: the rows on stdout into gpu-logs/<step>.json
  local step=$1 bin
  shift
  bin=$(exe "$1") || { echo "$bin"; exit 1; }
  shift
  "$bin" "$@" >"$RUN_LOGS/$step.json" || { cat "$RUN_LOGS/$step.json"; exit 1; }
  cat "$RUN_LOGS/$step.json"
}

step_nccl_transport_bench() {
  needs_configure
  nccl_found || skip "NCCL not found at configure time"
  bench_json nccl_transport_bench cadence-bench-transport --backend nccl --ranks 1 --json
}

step_nccl_exchange_bench() {
  needs_configure
  nccl_found || skip "NCCL not found at configure time"
  bench_json nccl_exchange_bench cadence-bench-exchange --backend nccl --min-bytes 1048576 --no-overlap --json
}

step_nccl_ps_bench() {
  needs_configure
  nccl_found || skip "NCCL not found at configure time"
  local bin
  bin=$(exe cadence-bench-ps) || { echo "$bin"; exit 1; }
  "$bin" --help 2>&1 | grep -q nccl ||
    skip "cadence-bench-ps has no NCCL backend (the parameter server moves host buffers: mpi, zmq)"
  bench_json nccl_ps_bench cadence-bench-ps --backend nccl --json
}

step_torch_gpu() {
  command -v "$RUN_PY" >/dev/null || skip "no $RUN_PY"
  local out
  out=$(bash "$src/python/bench/torch_gpu.sh" "$RUN_BUILD" 2>&1)
  local rc=$?
  echo "$out"
  ((rc == 0)) || exit 1
  local why
  why=$(grep -m1 -o 'skipped: .*' <<<"$out")
  [[ -z $why ]] || skip "${why#skipped: }"
}

if [[ ${1:-} == --internal-step ]]; then
  name=$2
  shift 2
  [[ ${1:-} == -- ]] && shift
  cd "$src" || exit 1
  "step_$name" "$@"
  exit $?
fi

# ---------------------------------------------------------------------------------------------
# The driver.
# ---------------------------------------------------------------------------------------------
build=$src/build-gpu
summary=""
total=450
step_cap=0
plan=0
only=""
thrust_args=()
build_given=0
while (($#)); do
  case $1 in
    --plan | --dry-run) plan=1 ;;
    --summary) (($# > 1)) || die_usage "--summary wants a path"; summary=$2; shift ;;
    --timeout) (($# > 1)) || die_usage "--timeout wants seconds"; positive --timeout "$2"; total=$2; shift ;;
    --step-timeout) (($# > 1)) || die_usage "--step-timeout wants seconds"; positive --step-timeout "$2"; step_cap=$2; shift ;;
    --only) (($# > 1)) || die_usage "--only wants step names"; only=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; thrust_args=("$@"); break ;;
    -*) die_usage "unknown option '$1'" ;;
    *) ((build_given == 0)) || die_usage "one build directory, got '$build' and '$1'"; build=$1; build_given=1 ;;
  esac
  shift
done
if [[ -n $only ]]; then
  IFS=, read -r -a picked <<<"$only"
  for s in "${picked[@]}"; do
    [[ -n ${limit[$s]:-} ]] || die_usage "--only: no step '$s' (steps: ${steps[*]})"
  done
fi
selected() { [[ -z $only || ,$only, == *,$1,* ]]; }

# The build directory is made when a step needs it (not for --plan, nor without a device).
[[ $build == /* ]] || build=$PWD/$build
[[ -n $summary ]] || summary=${OUT:+$OUT/gpu-summary.json}
[[ -n $summary ]] || summary=$build/gpu-summary.json
mkdir -p "$(dirname "$summary")" || die_usage "cannot create the folder of '$summary'"
logs=$(cd "$(dirname "$summary")" && pwd)/gpu-logs
rm -rf "$logs"
mkdir -p "$logs"
export RUN_BUILD=$build RUN_LOGS=$logs RUN_ARCH=${CUDA_ARCH:-90} RUN_JOBS=${JOBS:-$(nproc)} RUN_PY=${PYTHON:-python3}

now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
start=$(now)

# Is there a CUDA device? As CUDA programs see it: CUDA_VISIBLE_DEVICES set and empty (or -1)
# hides every GPU; otherwise nvidia-smi must list one.
device=""
no_device=""
if [[ -n ${CUDA_VISIBLE_DEVICES+set} && ( -z $CUDA_VISIBLE_DEVICES || $CUDA_VISIBLE_DEVICES == -1* ) ]]; then
  no_device="CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides every GPU"
elif ! command -v nvidia-smi >/dev/null; then
  no_device="nvidia-smi not found (no NVIDIA driver)"
elif ! smi=$(timeout 15 nvidia-smi -L 2>&1); then
  no_device="nvidia-smi failed: $(head -n 1 <<<"$smi")"
elif ! grep -q '^GPU ' <<<"$smi"; then
  no_device="nvidia-smi lists no GPU"
else
  device=$(timeout 15 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
           paste -sd ';' -)
fi

# NCCL: the CUDA toolkit's, NCCL_ROOT's, or else the one PyTorch's wheels bring (nvidia-nccl-cu*),
# which ships libnccl.so.2 without the libnccl.so a linker looks for: a folder in the build
# directory gives it one, and every step's NCCL_ROOT and LD_LIBRARY_PATH name it.
if [[ -z $no_device && $plan == 0 ]]; then
  mkdir -p "$build" || die_usage "cannot create the build directory '$build'"
fi
if [[ -z $no_device && $plan == 0 && -z ${NCCL_ROOT:-} && ! -f /usr/local/cuda/include/nccl.h ]]; then
  wheel=$("$RUN_PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [[ -n $wheel && -f $wheel/include/nccl.h ]]; then
    mkdir -p "$build/nccl/lib"
    ln -sfn "$wheel/include" "$build/nccl/include"
    ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -n 1)" "$build/nccl/lib/libnccl.so"
    export NCCL_WHEEL=$wheel NCCL_ROOT=$build/nccl LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
tool() { command -v "$1" >/dev/null && "$@" 2>&1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n 1 || echo missing; }
tools="cmake $(tool cmake --version), nvcc $(tool nvcc --version), ninja $(tool ninja --version), $RUN_PY $(tool "$RUN_PY" --version)"
((plan)) && echo "tools: $tools"

# JSON text: a string with its escapes; a number, true, false or null as they are.
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/}
  printf '"%s"' "$(tr -d '\000-\010\013\014\016-\037' <<<"$s")"
}
json_val() {
  if [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ || $1 == true || $1 == false || $1 == null ]]; then
    printf '%s' "$1"
  else
    json_str "$1"
  fi
}

# A step's key numbers from its log, "key<TAB>value" a line.
numbers_doctest() {  # doctest's summary lines
  sed -nE 's/^\[doctest\] test cases: *([0-9]+) \| *([0-9]+) passed \| *([0-9]+) failed.*/test_cases\t\1\ntest_cases_passed\t\2\ntest_cases_failed\t\3/p;
           s/^\[doctest\] assertions: *([0-9]+) \| *([0-9]+) passed \| *([0-9]+) failed.*/assertions\t\1\nassertions_failed\t\3/p' "$1"
}
numbers_bench() {  # the benchmark's JSON rows: the lowest of_native and of_limit per op from 1 MiB
  [[ -s $1 ]] && command -v "$RUN_PY" >/dev/null || return 0
  "$RUN_PY" - "$1" <<'EOF' 2>/dev/null
import json, sys
rows = json.load(open(sys.argv[1]))
for key in ("of_native", "of_limit"):
    low = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and r.get("bytes", 0) >= 1 << 20:
            op = r.get("op", "row")
            low[op] = min(low.get(op, v), v)
    for op, v in sorted(low.items()):
        print(f"min_{key}_from_1MiB.{op}\t{v:.4f}")
print(f"rows\t{len(rows)}")
EOF
}
numbers() {  # step, log
  case $1 in
    device) sed -n '1p' "$2" | awk -F', ' '{ printf "gpu\t%s\ndriver\t%s\nmemory\t%s\n", $1, $2, $3 }'
            printf 'gpus\t%s\n' "$(grep -c '^GPU ' "$2")" ;;
    configure) grep -q '^NCCL: found' "$2" && printf 'nccl\ttrue\n' || printf 'nccl\tfalse\n' ;;
    build) printf 'errors\t%s\n' "$(grep -c 'error:' "$2")" ;;
    thrust_parity | nccl_communicator | nccl_adapters) numbers_doctest "$2" ;;
    thrust_bench)
      # The table's rows: n, points, cpu ms, gpu resident ms, predicted, host input, speedup, parity.
      awk '$1 ~ /^[0-9]+$/ && NF == 8 && !seen[$1]++ { printf "gpu_resident_ms.n%s\t%s\nspeedup.n%s\t%s\n", $1, $4, $1, $7 }' "$2" | tr -d x
      grep -q MISMATCH "$2" && printf 'parity\tfalse\n' || printf 'parity\ttrue\n' ;;
    stream_order)
      printf 'checks_ok\t%s\nchecks_wrong\t%s\n' "$(grep -c ' ok$' "$2")" "$(grep -c 'WRONG' "$2")" ;;
    nccl_transport_bench | nccl_exchange_bench | nccl_ps_bench) numbers_bench "$logs/$1.json" ;;
    torch_gpu)
      sed -nE 's/^torch GPU checks: ([0-9]+) passed, ([0-9]+) failed.*/checks_passed\t\1\nchecks_failed\t\2/p' "$2" ;;
  esac
}

# Run (or plan) every step; collect the summary's entries.
entries=()
failed=0
for s in "${steps[@]}"; do
  t=${limit[$s]}
  ((step_cap > 0 && step_cap < t)) && t=$step_cap
  log=$logs/$s.log
  secs=0
  status=""
  if ! selected "$s"; then
    status="skipped: not selected (--only)"
  elif [[ -n $no_device ]]; then
    status="skipped: no CUDA device"
  elif ((plan)); then
    status=planned
  else
    left=$(awk -v a="$start" -v b="$(now)" -v T="$total" 'BEGIN { printf "%d", T - (b - a) }')
    if ((left < 5)); then
      status="skipped: overall timeout (${total} s) reached"
    else
      ((t > left)) && t=$left
      echo "== $s: ${what[$s]} (limit $t s) =="
      t0=$(now)
      timeout -k 5 "$t" bash "$self" --internal-step "$s" -- "${thrust_args[@]}" >"$log" 2>&1 </dev/null
      rc=$?
      secs=$(since "$t0")
      case $rc in
        0) status=passed ;;
        77) status=$(grep -m1 '^skipped: ' "$log" || echo "skipped") ;;
        124 | 137) status="failed: timed out after $t s" ;;
        *) status="failed: exit $rc" ;;
      esac
      [[ $status == failed* ]] && failed=1
      echo "$status" >"$logs/$s.status"
      tail -n 25 "$log"
      echo "-- $s: $status ($secs s)"
    fi
  fi
  ((plan)) && printf '%-21s limit %3s s  %-24s %s\n' "$s" "$t" "$status" "${what[$s]}"
  fields=("\"step\": $(json_str "$s")" "\"status\": $(json_str "$status")" "\"seconds\": $secs"
          "\"timeout_s\": $t" "\"what\": $(json_str "${what[$s]}")")
  if [[ -f $log ]]; then
    fields+=("\"log\": $(json_str "$log")")
    nums=""
    while IFS=$'\t' read -r k v; do
      [[ -n $k ]] && nums+="${nums:+, }$(json_str "$k"): $(json_val "$v")"
    done < <(numbers "$s" "$log")
    fields+=("\"numbers\": {$nums}")
  else
    fields+=("\"numbers\": {}")
  fi
  line=""
  for f in "${fields[@]}"; do line+="${line:+, }$f"; done
  entries+=("    {$line}")
done

if [[ -n $no_device ]]; then
  overall="skipped: no CUDA device"
  echo "bench/gpu/run.sh: no CUDA device: $no_device; every step skipped" >&2
elif ((plan)); then
  overall=planned
elif ((failed)); then
  overall=failed
else
  overall=passed
fi
{
  echo "{"
  echo "  \"script\": \"bench/gpu/run.sh\","
  echo "  \"status\": $(json_str "$overall"),"
  [[ -n $no_device ]] && echo "  \"reason\": $(json_str "$no_device"),"
  echo "  \"device\": $(if [[ -n $device ]]; then json_str "$device"; else echo null; fi),"
  echo "  \"started\": $(json_str "$(date -u -d "@${start%.*}" +%Y-%m-%dT%H:%M:%SZ)"),"
  echo "  \"seconds\": $(since "$start"),"
  echo "  \"timeout_s\": $total,"
  echo "  \"tools\": $(json_str "$tools"),"
  echo "  \"build\": $(json_str "$build"),"
  echo "  \"steps\": ["
  for ((i = 0; i < ${#entries[@]}; ++i)); do
    printf '%s%s\n' "${entries[i]}" "$( ((i + 1 < ${#entries[@]})) && echo ,)"
  done
  echo "  ]"
  echo "}"
} >"$summary"
echo "summary: $summary ($overall)"
((plan)) && exit 0
[[ -n $no_device ]] && exit 3
exit $failed
