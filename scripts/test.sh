#!/usr/bin/env bash
# Builds and runs every test configuration Cadence promises:
#   build/       Release, every test suite at C++17 (the sanitizer builds compile them at
#                C++20; everything of ours at -O1), Thrust tests on the OMP and CPP systems,
#                tools, apps, benchmarks and examples built, install + consumer projects,
#                every public header compiled on its own, and the API reference (Doxygen,
#                warnings as errors)
#   build-python-test/  the Python package installed into a venv by scripts/test-python.sh, and
#                pytest over tests/python (bindings, cadence.torch, lstm_node2vec)
#   build-asan/  clang++ with AddressSanitizer + UndefinedBehaviorSanitizer at C++20: every
#                test executable, the Thrust tests on the OMP system (libomp) and the examples
#                (the tools' command-line and process tests run in the Release build)
#   build-fuzz/  libFuzzer targets (tests/fuzz: clang, ASan + UBSan), each decoder fuzzed 2 s
#                from its committed corpus (skipped with a message without libFuzzer)
#   build-tsan/  ThreadSanitizer, the concurrent tests (blocking runtime, liveness, the
#                in-process transport and exchange adapters, the NCCL protocol over its fake)
#   build-cuda/  the Thrust sources and GPU benchmark compiled with nvcc for sm_90 (compile
#                and link only; skipped with a message when no CUDA compiler is installed)
# A configuration whose build fails counts as one failure and the others still run. The sanitizer,
# fuzz and CUDA builds compile in the background at the lowest CPU priority from the end of the
# Release build on, one after the other (they take the time the tests leave idle). Each section
# header says how long the run has taken so far. Always ends with one line
# "tests: N passed, M failed".
#
#   scripts/test.sh --quick   the Release build and its tests only (the edit-test loop)
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
quick=0
case ${1:-} in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
started=$(date +%s)
passed=0
failed=0
log=$(mktemp)
finish() {
  rm -f "$log"
  printf '\ntests: %d passed, %d failed (%d s)\n' "$passed" "$failed" "$(($(date +%s) - started))"
}
trap finish EXIT

if ! scripts/install-deps.sh test; then
  failed=$((failed + 1))
  echo "installing the test dependencies FAILED"
  exit 1
fi

section() { printf '\n==== %s (at %d s) ====\n' "$*" "$(($(date +%s) - started))"; }

# Ninja when installed (install-deps.sh test installs it): it schedules the two cores better
# than make's recursive builds. Build directories made with another generator are remade.
generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

# build DIR WHAT [cmake --build args...]: builds; a failure counts once and returns non-zero.
build() {
  local dir=$1 what=$2
  shift 2
  if cmake --build "$dir" -j"$jobs" "$@"; then
    return 0
  fi
  failed=$((failed + 1))
  echo "$what: build FAILED"
  return 1
}

# configure DIR WHAT [cmake args...]
configure() {
  local dir=$1 what=$2
  shift 2
  # A build directory made with another generator or compiler is remade (CMake refuses both).
  if [[ -f $dir/CMakeCache.txt ]] &&
     ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}\$" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"
  fi
  local arg want=c++ have
  for arg in "$@"; do
    [[ $arg == -DCMAKE_CXX_COMPILER=* ]] && want=${arg#-DCMAKE_CXX_COMPILER=}
  done
  have=$(sed -n 's|^CMAKE_CXX_COMPILER:[A-Z]*=\(.*/\)\{0,1\}||p' "$dir/CMakeCache.txt" 2>/dev/null)
  if [[ -n $have && $have != "$want" ]]; then
    rm -rf "$dir"
  fi
  if cmake -S . -B "$dir" "${generator[@]}" "$@"; then
    return 0
  fi
  failed=$((failed + 1))
  echo "$what: configure FAILED"
  return 1
}

run_ctest() {  # build-dir [ctest args...]
  local dir=$1
  shift
  local rc=0
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@" 2>&1 | tee "$log" || rc=$?
  local line
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -n 1 || true)
  if [[ -n $line ]]; then
    local bad total
    bad=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
    passed=$((passed + total - bad))
    failed=$((failed + bad))
  elif ((rc != 0)); then
    failed=$((failed + 1))
  fi
  return 0
}

# The newest torch from PyPI (about 3 GB, minutes of download and unpacking) for the Python
# section, fetched in the background while the C++ builds use the cores; the Python section
# waits for it. Cached between runs (scripts/test-python.sh says where), so later runs only check it.
prefetch_pid=
prefetch_log=$PWD/build-python-test/torch-prefetch.log
if ((!quick)) && [[ ${CADENCE_TORCH_NEWEST:-1} != 0 ]]; then
  mkdir -p build-python-test
  nice -n 10 bash scripts/test-python.sh --prepare-newest-torch >"$prefetch_log" 2>&1 &
  prefetch_pid=$!
  echo "preparing the newest torch's venv in the background (log: $prefetch_log)"
fi

# ---- builds in the background ----
# While one configuration's tests run, the next configurations compile at the lowest CPU
# priority (nice 19): the tests keep the cores they ask for, and the builds take what the tests
# leave idle (the process-level fault tests, the namespaces' rate-limited links, the Python
# tests' process starts all wait more than they compute). A build's output goes to its log,
# printed in its section; its failures count there.
bg_dir=$(mktemp -d)
trap 'rm -rf "$bg_dir"; finish' EXIT
declare -A bg_pid=()
# in_background NAME FUNC: runs FUNC (configure and build calls) in the background.
in_background() {
  local name=$1 fn=$2
  (
    trap - EXIT  # the script's summary and clean-up are the parent's
    renice -n 19 -p "$BASHPID" >/dev/null 2>&1
    before=$failed
    "$fn"
    echo $((failed - before)) >"$bg_dir/$name.failed"
  ) >"$bg_dir/$name.log" 2>&1 &
  bg_pid[$name]=$!
}
# collect NAME: waits for it, prints its log and counts its failures; true when it had none.
collect() {
  local name=$1 bad
  wait "${bg_pid[$name]}"
  cat "$bg_dir/$name.log"
  bad=$(cat "$bg_dir/$name.failed" 2>/dev/null || echo 1)
  failed=$((failed + bad))
  ((bad == 0))
}

# clang++ when installed (install-deps.sh test installs it and its sanitizer runtime), so one
# build checks the second compiler and the sanitizers: every test executable at C++20, the
# Thrust tests on the OMP system (libomp) and the examples. The g++ Release build covers the
# other compiler at C++17.
asan_cxx=()
if command -v clang++ >/dev/null 2>&1; then
  asan_cxx=(-DCMAKE_CXX_COMPILER=clang++)
fi
# -O0 with line tables: a unity batch compiles 4x faster than at -O1 -g (7 s against 29 s for
# the transport tests' first batch), which makes the whole section about 6 min instead of 14 on
# two cores, while the tests run about 1.5x slower; reports still name file and line.
# Every executable but the tools' own programs (cadence-train, -zipline, -sim, -race,
# -chaos-rank): their command-line and process tests (tool.*) run in the Release build, so here
# they would be compiled (about 90 s of clang) for no test; their libraries and test executables
# are built and run.
asan_build() {
  ((${#asan_cxx[@]})) || echo "clang++ not installed: the sanitizer build uses the default compiler"
  configure build-asan asan "${asan_cxx[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -gline-tables-only" \
    -DCADENCE_SANITIZE=address,undefined -DCADENCE_TEST_STANDARDS=20 \
    -DCADENCE_SECONDARY_TEST_STANDARDS=20 -DCADENCE_THRUST_TEST_SYSTEMS=OMP \
    -DCADENCE_BUILD_BENCHMARKS=OFF || return
  local targets=()
  if [[ ${generator[1]:-} == Ninja ]]; then
    mapfile -t targets < <(ninja -C build-asan -t targets all | sed -n 's|^\(bin/[^/:]*\): .*|\1|p' |
                             grep -vxE 'bin/cadence-(train|zipline|sim|race|chaos-rank)')
  fi
  build build-asan asan ${targets[@]:+--target "${targets[@]}"}
}

# nvcc on PATH, else CUDA's default place; empty when neither has it.
nvcc_bin=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; } || true)

# The libFuzzer targets, ThreadSanitizer's concurrent parts and the CUDA compile check, built one
# after the other (their sections say what each is). Each leaves a mark when it built.
later_builds() {
  rm -f "$bg_dir"/{fuzz,tsan,cuda}.ok
  if command -v clang++ >/dev/null 2>&1; then
    if [[ -f build-fuzz/CMakeCache.txt ]] &&
       ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}\$" build-fuzz/CMakeCache.txt; then
      rm -rf build-fuzz
    fi
    if cmake -S tests/fuzz -B build-fuzz "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DCADENCE_FUZZ_SECONDS=2 \
         -DCADENCE_FUZZ_OPTIMIZE=-O0; then
      build build-fuzz fuzz && touch "$bg_dir/fuzz.ok"
    else
      failed=$((failed + 1))
      echo "fuzz: configure FAILED"
    fi
  fi
  # -g1 (line tables and function names, enough for ThreadSanitizer's stacks): a third less to
  # compile than -g.
  configure build-tsan tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
      -DCADENCE_SANITIZE=thread -DCADENCE_TEST_STANDARDS=20 -DCADENCE_CORE_TEST_DIRS=runtime \
      -DCADENCE_SECONDARY_TEST_STANDARDS=20 -DCADENCE_ENABLE_THRUST=OFF \
      -DCADENCE_BUILD_BENCHMARKS=OFF -DCADENCE_BUILD_EXAMPLES=OFF -DCADENCE_BUILD_TOOLS=OFF &&
    build build-tsan tsan --target cadence_tests_cxx20 cadence_transport_tests_cxx20 cadence_exchange_tests_cxx20 \
      cadence_transport_nccl_fake_tests_cxx20 &&
    touch "$bg_dir/tsan.ok"
  # The Thrust tests and the GPU bench through nvcc; cadence-zipline's CUDA form (the same Thrust
  # code under the tool's command line, 76 s of nvcc) is built by bench/gpu/run.sh on a GPU
  # machine, not here (CI time).
  if [[ -n $nvcc_bin ]]; then
    configure build-cuda cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc_bin" \
        -DCADENCE_THRUST_DEVICE_SYSTEM=CUDA -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCADENCE_BUILD_EXAMPLES=OFF &&
      build build-cuda "CUDA compile check" \
        --target cadence_thrust_tests_cuda cadence-bench-thrust-gpu &&
      touch "$bg_dir/cuda.ok"
  fi
}

# The later builds start when the ASan build has ended (its job leaves its .failed mark then), so
# they take the idle time of the Python tests and of the ASan tests in turn.
later_builds_after_asan() {
  while [[ ! -f $bg_dir/asan.failed ]]; do sleep 1; done
  later_builds
}
start_background_builds() {
  in_background asan asan_build
  in_background later later_builds_after_asan
}

section "Release build (g++, C++17)"
# Everything of ours at -O1 (CADENCE_TEST_OPTIMIZATION for the test executables and examples,
# CADENCE_TOOL_OPTIMIZATION for the tools, apps and benchmarks): half the compile time of -O3;
# here they are only run by tests (a user's Release build keeps -O3).
if configure build release -DCMAKE_BUILD_TYPE=Release -DCADENCE_TEST_STANDARDS=17 \
     -DCADENCE_SECONDARY_TEST_STANDARDS=17 -DCADENCE_TEST_OPTIMIZATION=-O1 \
     -DCADENCE_TOOL_OPTIMIZATION=-O1 &&
   build build release; then
  ((quick)) || start_background_builds
  run_ctest build
  # Every public header compiles on its own (CMake's VERIFY_INTERFACE_HEADER_SETS).
  if build build "header self-containment check" --target all_verify_interface_header_sets; then
    passed=$((passed + 1))
    echo "header self-containment check: ok"
  fi
  # The API reference (docs/README.md): Doxygen fails on any warning (an undocumented public
  # name), then docs/api/check_params.py on a comment that leaves a parameter unnamed.
  if command -v doxygen >/dev/null 2>&1; then
    if build build "API reference check" --target cadence_docs; then
      passed=$((passed + 1))
      echo "API reference check: ok (build/docs/api/html/index.html)"
    fi
  else
    echo "doxygen not found: API reference check skipped"
  fi
fi

if ((quick)); then
  ((failed == 0))
  exit
fi
[[ -n ${bg_pid[asan]:-} ]] || start_background_builds  # the Release build failed: start them now

section "Python package (pip install . into a venv; pytest tests/python)"
# The package's own script; it compares the bindings against build/bin's tools.
if [[ -n $prefetch_pid ]]; then
  wait "$prefetch_pid" || true  # a failure shows again, and counts, in the run below
  cat "$prefetch_log"
fi
CADENCE_BUILD_DIR=$PWD/build JOBS=$jobs bash scripts/test-python.sh 2>&1 | tee "$log"
line=$(grep -E '^python tests: [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
if [[ -n $line ]]; then
  passed=$((passed + $(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")))
  failed=$((failed + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")))
else
  failed=$((failed + 1))
  echo "python tests: no summary line"
fi

section "clang, AddressSanitizer + UndefinedBehaviorSanitizer (C++20)"
asan_ok=0
collect asan && asan_ok=1
# The tools' command-line and process-level tests (tool.*) run in the Release build; here the
# unit tests, the apps' and tools' own test executables and the examples (CI time: the tool.*
# entries took 66 s of test time under ASan, and the decoders they feed are fuzzed below).
((asan_ok)) && run_ctest build-asan -E '^tool\.'

section "libFuzzer: the decoders, 2 s each (tests/fuzz)"
# Every decoder of bytes or text from outside a process, fuzzed briefly from its committed corpus
# with clang's -fsanitize=fuzzer,address,undefined (docs/testing.md, "Fuzzing", has the long
# command). A project of its own; it says so and builds nothing where libFuzzer is missing.
# (The builds of this section and the next two ran in the background after the ASan build.)
collect later || true
if ! command -v clang++ >/dev/null 2>&1; then
  echo "clang++ not installed: fuzzing skipped"
elif [[ -f $bg_dir/fuzz.ok ]]; then
  if [[ -n $(ctest --test-dir build-fuzz -N | grep -E '^ *Test +#') ]]; then
    run_ctest build-fuzz
  else
    echo "clang++ cannot link -fsanitize=fuzzer (install libclang-rt-14-dev): fuzzing skipped"
  fi
fi

section "ThreadSanitizer (concurrent parts)"
if [[ -f $bg_dir/tsan.ok ]]; then
  run_ctest build-tsan -R 'blocking|liveness|transport_|exchange_'
fi

section "CUDA compile check (nvcc, sm_90)"
if [[ -z $nvcc_bin ]]; then
  echo "no CUDA compiler found: CUDA compile check skipped"
elif [[ -f $bg_dir/cuda.ok ]]; then
  passed=$((passed + 1))
  echo "CUDA compile check: ok (no GPU here: compiled and linked, not run)"
fi

((failed == 0))
