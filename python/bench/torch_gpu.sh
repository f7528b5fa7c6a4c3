#!/usr/bin/env bash
# cadence.torch on a GPU machine, in about 3 minutes: builds the Python package (without the
# Thrust module, which nothing here needs), runs python/bench/torch_gpu_check.py (the CUDA
# branches the CPU tests cover through a fake device: CUDA-event step timing, control tensors on
# the device for NCCL, the parameter server staging a CUDA model through pinned buffers, a
# stalled NCCL rank named within the bound when there are 2 GPUs), then the torchrun example's
# time to 80% on the GPU: 4 ranks sharing GPU 0 over gloo (CUDA tensors), without and with a
# straggler, and 1 rank over NCCL (an NCCL group of 1). Skips, saying why, without torch or CUDA.
# bench/gpu/run.sh calls it at its end; it also runs alone:
#
#   bash python/bench/torch_gpu.sh [build-dir]      # default build-gpu/
#
# Env: PYTHON (default python3, the one with torch), NPROC (ranks sharing the GPU, default 4),
# FASHION_MNIST (the data set's directory; default /usr/share/datasets/fashion-mnist, then
# .data/fashion-mnist in the repository; without it the example runs on generated data and says
# so).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-$src/build-gpu}
py=${PYTHON:-python3}
nproc=${NPROC:-4}

if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "cadence.torch GPU checks skipped: $py has no torch with a CUDA device" >&2
  exit 0
fi
mkdir -p "$build"
site=$build/python-site
echo "== cadence.torch: building the Python package into $site =="
# No build isolation: scikit-build-core, nanobind and cmake come from this Python (nothing can be
# fetched on a machine without a network).
if ! "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps --upgrade \
       --target "$site" --config-settings=build-dir="$build/python-cmake" \
       --config-settings=cmake.define.CADENCE_PYTHON_THRUST=OFF "$src" >"$build/python-install.log" 2>&1; then
  tail -n 40 "$build/python-install.log"
  echo "cadence.torch: pip install FAILED (needs scikit-build-core and nanobind in $py)" >&2
  exit 1
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
status=0

echo "== cadence.torch on the GPU: CUDA branches =="
"$py" "$src/python/bench/torch_gpu_check.py" || status=1

data=()
for d in "${FASHION_MNIST:-}" /usr/share/datasets/fashion-mnist "$src/.data/fashion-mnist"; do
  if [[ -n $d && -f $d/train-images-idx3-ubyte.gz ]]; then
    data=(--data "$d")
    break
  fi
done
if ((${#data[@]} == 0)); then
  echo "Fashion-MNIST not found (set FASHION_MNIST): the example runs on generated data" >&2
  data=(--synthetic)
fi
example=$src/examples/python/torchrun_fashion_mnist.py
run_example() {  # ranks, then the example's own arguments
  local n=$1
  shift
  echo "== torchrun --nproc_per_node $n torchrun_fashion_mnist.py $* =="
  timeout 300 "$py" -m torch.distributed.run --standalone --nproc_per_node "$n" "$example" \
    --device cuda "${data[@]}" "$@" 2>"$build/torchrun.err" || { tail -n 30 "$build/torchrun.err"; status=1; }
}
run_example "$nproc"
run_example "$nproc" --straggle 0.02
run_example 1 --backend nccl
exit $status
