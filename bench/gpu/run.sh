#!/usr/bin/env bash
# Builds the CUDA flavour of cadence::thrust for sm_90 (H100/H200), runs the CUDA test suite
# for parity, then prints the GPU ZipLine table (n = 1e3 .. 1e6 workers, R = 100). Then the NCCL
# backend on the real GPU: its tests (a 1-rank communicator over the in-process bootstrap, every
# dtype and op checked exactly; an init whose second rank never joins aborts within its
# deadline) and one all-reduce bandwidth table against raw ncclAllReduce; then the collective
# adapters' NCCL form (bucketed all-reduce, periodic and elastic averaging on device buffers and
# a stream of the caller's: ncclAvg, PreMulSum, async copies and cudaMalloc through the real
# table; two-rank merges when the machine has two GPUs); then the adapters' stream ordering (a
# slow kernel writes the gradients on the caller's stream, the adapter must wait for it:
# bench/gpu/stream_order_check.cu, built with nvcc alone, so it runs even where CMake cannot
# configure); then the exchange benchmark's NCCL rows.
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

# NCCL: the CUDA toolkit's, NCCL_ROOT's, or else the one PyTorch's wheels bring (nvidia-nccl-cu*),
# which ships libnccl.so.2 without the libnccl.so a linker looks for: a folder in the build
# directory gives it one.
if [[ -z ${NCCL_ROOT:-} && ! -f /usr/local/cuda/include/nccl.h ]]; then
  wheel=$("${PYTHON:-python3}" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [[ -n $wheel && -f $wheel/include/nccl.h ]]; then
    mkdir -p "$build/nccl/lib"
    ln -sfn "$wheel/include" "$build/nccl/include"
    ln -sf "$(ls "$wheel"/lib/libnccl.so* | head -n 1)" "$build/nccl/lib/libnccl.so"
    export NCCL_ROOT=$build/nccl LD_LIBRARY_PATH=$wheel/lib:${LD_LIBRARY_PATH:-}
    echo "NCCL from the Python wheel at $wheel"
  fi
fi

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

# ---- NCCL backend (host code: g++ builds it, no nvcc) ----
if [[ -d "$build/CMakeFiles" ]] && grep -qE '^CADENCE_NCCL_LIBRARY:[A-Z]+=/' "$build/CMakeCache.txt" 2>/dev/null; then
  cmake --build "$build" -j "$jobs" --target cadence_transport_nccl_tests_cxx17 cadence-bench-transport
  echo "== NCCL backend tests (real NCCL, one GPU) =="
  # -s shows the MESSAGE lines (the init abort's time against its deadline). Without a GPU the
  # test passes on the clean-error path; here that would test nothing, so it fails the script.
  nccl_log=$("$build/bin/cadence_transport_nccl_tests_cxx17" --no-version -s \
               --source-file='*/nccl/communicator_test.cpp' 2>&1) || {
    echo "$nccl_log"
    exit 1
  }
  grep -E 'MESSAGE|test cases|assertions|Status' <<<"$nccl_log"
  if grep -q 'no GPU' <<<"$nccl_log"; then
    echo "the NCCL tests found no GPU: nothing was tested on the device" >&2
    exit 1
  fi
  echo "== NCCL all-reduce: ours against raw ncclAllReduce, 1 GPU (busbw is 0 on one rank: read us) =="
  "$build/bin/cadence-bench-transport" --backend nccl --ranks 1
  echo "== Collective adapters over NCCL (device buffers, the caller's stream, real GPU) =="
  # The same executable: tests/transport/nccl/exchange_gpu_test.cpp. A case that finds no GPU
  # (or fewer than two for the two-rank merges) says so in a MESSAGE; "no GPU" fails the script.
  adapters_log=$("$build/bin/cadence_transport_nccl_tests_cxx17" --no-version -s \
                   --source-file='*/nccl/exchange_gpu_test.cpp' 2>&1) || {
    echo "$adapters_log"
    exit 1
  }
  grep -E 'MESSAGE|skipped|test cases|assertions|Status' <<<"$adapters_log"
  if grep -q 'no GPU' <<<"$adapters_log"; then
    echo "the adapters' NCCL tests found no GPU: nothing was tested on the device" >&2
    exit 1
  fi
else
  echo "NCCL not found at configure time: NCCL backend skipped" >&2
fi

# ---- The adapters on the caller's stream: nvcc alone (the CUDA toolkit's NCCL) ----
echo "== NCCL adapters after the caller's stream (a slow kernel writes the gradients first) =="
mkdir -p "$build/bin"
nccl_flags=()
if [[ -f $build/CMakeCache.txt ]]; then
  nccl_inc=$(sed -n 's/^CADENCE_NCCL_INCLUDE_DIR:[A-Z]*=//p' "$build/CMakeCache.txt")
  nccl_lib=$(sed -n 's/^CADENCE_NCCL_LIBRARY:[A-Z]*=//p' "$build/CMakeCache.txt")
  [[ -n $nccl_inc && $nccl_inc != *NOTFOUND ]] && nccl_flags+=(-I"$nccl_inc")
  [[ -n $nccl_lib && $nccl_lib != *NOTFOUND ]] && nccl_flags+=(-L"$(dirname "$nccl_lib")")
fi
nvcc -std=c++17 -O2 -arch=sm_"$arch" -I"$src/include" "${nccl_flags[@]}" "$src/bench/gpu/stream_order_check.cu" \
     -lnccl -o "$build/bin/stream_order_check"
"$build/bin/stream_order_check"
if [[ -x "$build/bin/cadence-bench-exchange" ]] || { [[ -d "$build/CMakeFiles" ]] &&
     cmake --build "$build" -j "$jobs" --target cadence-bench-exchange 2>/dev/null; }; then
  echo "== Collective adapters against N back-to-back ncclAllReduce, 1 GPU (read us) =="
  "$build/bin/cadence-bench-exchange" --backend nccl --min-bytes 1048576 --no-overlap || true
fi

# ---- cadence.torch on the GPU (python/bench/torch_gpu.sh: skips, saying why, without torch/CUDA) ----
# The CUDA branches the CPU tests run through a fake device, checked on the hardware, and the
# torchrun example's time to 80% on the GPU (gloo with CUDA tensors, and an NCCL group of 1).
if command -v "${PYTHON:-python3}" >/dev/null 2>&1; then
  echo "== cadence.torch on the GPU =="
  bash "$src/python/bench/torch_gpu.sh" "$build"
else
  echo "cadence.torch GPU checks skipped: no ${PYTHON:-python3}" >&2
fi
