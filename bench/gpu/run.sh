#!/usr/bin/env bash
# Builds the CUDA flavour of cadence::thrust for sm_90 (H100/H200), runs the CUDA test suite
# for parity, then prints the GPU ZipLine table (n = 1e3 .. 1e6 workers, R = 100).
# Usage: bench/gpu/run.sh [build-dir] [-- extra args for cadence-bench-thrust-gpu]
# Env: CUDA_ARCH (default 90), JOBS (default: number of cores).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-$src/build-gpu}
shift $(( $# > 0 ? 1 : 0 ))
[[ "${1:-}" == "--" ]] && shift
arch=${CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
export PATH=/usr/local/cuda/bin:$PATH

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

configure() {
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCADENCE_THRUST_DEVICE_SYSTEM=CUDA \
        -DCMAKE_CUDA_ARCHITECTURES="$arch" -DCADENCE_BUILD_TOOLS=OFF -DCADENCE_BUILD_EXAMPLES=OFF \
        -DCADENCE_INSTALL=OFF "$@"
}

bench_exe=$build/bin/cadence-bench-thrust-gpu
if configure -DCADENCE_BUILD_TESTS=ON -DCADENCE_BUILD_BENCHMARKS=ON; then
  cmake --build "$build" -j "$jobs" --target cadence_thrust_tests_cuda cadence-bench-thrust-gpu
  echo "== CUDA test suite (parity with the brute force on the GPU) =="
  "$build/bin/cadence_thrust_tests_cuda" --no-version
else
  # No doctest or Google Benchmark here: compile the GPU program alone with nvcc.
  echo "cmake configure failed; building the GPU benchmark directly with nvcc" >&2
  mkdir -p "$build/bin"
  nvcc -O3 -std=c++17 -arch=sm_"$arch" -I"$src/include" -I"$src/bench/thrust" \
       -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CUDA \
       "$src/bench/thrust/zipline_gpu_bench.cu" -o "$bench_exe"
fi
echo "== GPU ZipLine table =="
"$bench_exe" "$@"
