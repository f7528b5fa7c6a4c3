#!/usr/bin/env bash
# Builds and runs every test configuration Cadence promises:
#   build/       Release, tests at C++17 and C++20, Thrust tests on the OMP and CPP systems,
#                tools, benchmarks and examples built, install + consumer projects, and
#                every public header compiled on its own
#   build-clang/ the same with clang++ at C++20 (OpenMP from libomp)
#   build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, every test
#   build-tsan/  ThreadSanitizer, the concurrent tests
#   build-cuda/  the Thrust sources and GPU benchmark compiled with nvcc for sm_90 (compile
#                and link only; skipped with a message when no CUDA compiler is installed)
# Ends with one line "tests: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
jobs=${JOBS:-2}
passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

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

section() { printf '\n==== %s ====\n' "$*"; }

section "Release build (g++, C++17 and C++20)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
run_ctest build
# Every public header compiles on its own (CMake's VERIFY_INTERFACE_HEADER_SETS).
if cmake --build build -j"$jobs" --target all_verify_interface_header_sets; then
  passed=$((passed + 1))
  echo "header self-containment check: ok"
else
  failed=$((failed + 1))
  echo "header self-containment check: FAILED"
fi

section "clang (C++20)"
if command -v clang++ >/dev/null 2>&1; then
  CXX=clang++ cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release -DCADENCE_TEST_STANDARDS=20 \
    -DCADENCE_BUILD_BENCHMARKS=OFF
  cmake --build build-clang -j"$jobs"
  run_ctest build-clang
else
  echo "clang++ not installed: clang build skipped"
fi

section "AddressSanitizer + UndefinedBehaviorSanitizer"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCADENCE_SANITIZE=address,undefined -DCADENCE_TEST_STANDARDS=20 -DCADENCE_ENABLE_THRUST=OFF \
  -DCADENCE_BUILD_BENCHMARKS=OFF -DCADENCE_BUILD_EXAMPLES=OFF
cmake --build build-asan -j"$jobs"
run_ctest build-asan

section "ThreadSanitizer (concurrent parts)"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCADENCE_SANITIZE=thread -DCADENCE_TEST_STANDARDS=20 -DCADENCE_ENABLE_THRUST=OFF \
  -DCADENCE_BUILD_BENCHMARKS=OFF -DCADENCE_BUILD_EXAMPLES=OFF -DCADENCE_BUILD_TOOLS=OFF
cmake --build build-tsan -j"$jobs" --target cadence_tests_cxx20
run_ctest build-tsan -R 'blocking'

section "CUDA compile check (nvcc, sm_90)"
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  nvcc_bin=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc_bin" \
    -DCADENCE_THRUST_DEVICE_SYSTEM=CUDA -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCADENCE_BUILD_EXAMPLES=OFF
  if cmake --build build-cuda -j1 --target cadence_thrust_tests_cuda cadence-bench-thrust-gpu cadence-zipline; then
    passed=$((passed + 1))
    echo "CUDA compile check: ok (no GPU here: compiled and linked, not run)"
  else
    failed=$((failed + 1))
    echo "CUDA compile check: FAILED"
  fi
else
  echo "no CUDA compiler found: CUDA compile check skipped"
fi

printf '\ntests: %d passed, %d failed\n' "$passed" "$failed"
((failed == 0))
