#!/usr/bin/env bash
# bench/gpu/run.sh's CPU-side behaviour, in a few seconds and without a GPU (ctest
# bench.gpu_run_script): the plan, the no-device path, a step's numbers and skip reason, a step
# killed at its limit while the run goes on, bad usage, --help; every summary must be valid JSON.
# A fake nvidia-smi (first in PATH) stands in for the driver where the run needs "a device":
# nothing here builds or touches a GPU, so the test gives the same answers on a GPU machine.
#   bash bench/gpu/run_test.sh
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
run=$here/run.sh
py=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=$((fails + 1))
}

# The fake driver: lists one GPU; from its third call on (the run's own two come first) a
# --query-gpu sleeps when FAKE_SMI_SLEEP is set, so the device step outlives its limit.
mkdir -p "$work/bin"
cat >"$work/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
n=$(cat "$FAKE_SMI_COUNT" 2>/dev/null || echo 0)
echo $((n + 1)) >"$FAKE_SMI_COUNT"
case "$*" in
  -L) echo "GPU 0: Fake GPU (UUID: GPU-0)" ;;
  --query-gpu*)
    ((n >= 2)) && [[ -n ${FAKE_SMI_SLEEP:-} ]] && exec sleep "$FAKE_SMI_SLEEP"
    echo "Fake GPU, 999.1, 1024 MiB" ;;
esac
EOF
chmod +x "$work/bin/nvidia-smi"
fake=(env PATH="$work/bin:$PATH" FAKE_SMI_COUNT="$work/count")

# check NAME SUMMARY PYTHON-ASSERTIONS: the summary is JSON and the assertions (on `d`, the
# document, and `st`, step name -> step) hold.
check() {
  "$py" - "$2" "$3" <<'EOF' || fail "$1: $(cat "$work/out" 2>/dev/null | tail -n 5)"
import json, sys
d = json.load(open(sys.argv[1]))
steps = [s["step"] for s in d["steps"]]
assert steps == ["device", "configure", "build", "thrust_parity", "thrust_bench", "nccl_communicator",
                 "nccl_adapters", "stream_order", "nccl_transport_bench", "nccl_exchange_bench",
                 "nccl_ps_bench", "torch_gpu"], steps
for s in d["steps"]:
    assert isinstance(s["seconds"], (int, float)) and isinstance(s["numbers"], dict), s
st = {s["step"]: s for s in d["steps"]}
exec(sys.argv[2])
EOF
}
expect_rc() {  # name, want, got
  [[ $2 == "$3" ]] || fail "$1: exit status $3, expected $2: $(tail -n 5 "$work/out")"
}

# 1. --plan: with a device, every step planned, nothing built (the build folder is not created).
"${fake[@]}" bash "$run" --plan --summary "$work/plan.json" "$work/build-plan" >"$work/out" 2>&1
expect_rc plan 0 $?
check plan "$work/plan.json" '
assert d["status"] == "planned", d["status"]
assert all(s["status"] == "planned" for s in d["steps"]), d["steps"]
assert d["device"].startswith("Fake GPU"), d["device"]'
[[ ! -e $work/build-plan ]] || fail "plan: created the build folder"

# 2. No CUDA device (CUDA_VISIBLE_DEVICES set and empty hides the fake one too): every step
# skipped at once, exit 3, the reason on stderr and in the summary.
"${fake[@]}" CUDA_VISIBLE_DEVICES= bash "$run" --summary "$work/none.json" "$work/build" >"$work/out" 2>&1
expect_rc no-device 3 $?
grep -q 'no CUDA device' "$work/out" || fail "no-device: the output does not say so"
check no-device "$work/none.json" '
assert d["status"] == "skipped: no CUDA device" and "CUDA_VISIBLE_DEVICES" in d["reason"], d
assert all(s["status"] == "skipped: no CUDA device" for s in d["steps"]), d["steps"]'
[[ ! -e $work/build ]] || fail "no-device: created the build folder"

# 3. Two steps run: the device's numbers, the PS bench skipped for want of a configured build
# (its reason kept), the rest not selected; exit 0; the summary under $OUT by default.
mkdir -p "$work/out-dir"
"${fake[@]}" OUT="$work/out-dir" bash "$run" --only device,nccl_ps_bench "$work/build" >"$work/out" 2>&1
expect_rc only 0 $?
check only "$work/out-dir/gpu-summary.json" '
assert d["status"] == "passed", d["status"]
dev = st["device"]
assert dev["status"] == "passed" and dev["numbers"]["gpu"] == "Fake GPU" and dev["numbers"]["gpus"] == 1, dev
assert dev["numbers"]["driver"] == 999.1, dev
assert st["nccl_ps_bench"]["status"].startswith("skipped: needs the configured build"), st["nccl_ps_bench"]
assert st["configure"]["status"] == "skipped: not selected (--only)", st["configure"]
assert open(dev["log"]).read().startswith("Fake GPU, 999.1")'

# 4. A step past its limit is killed and failed; the run goes on to the next and exits 1.
rm -f "$work/count"
"${fake[@]}" FAKE_SMI_SLEEP=60 bash "$run" --only device,nccl_ps_bench --step-timeout 1 \
  --summary "$work/slow.json" "$work/build" >"$work/out" 2>&1
expect_rc timeout 1 $?
check timeout "$work/slow.json" '
assert d["status"] == "failed", d["status"]
assert st["device"]["status"] == "failed: timed out after 1 s", st["device"]
assert st["device"]["seconds"] < 30, st["device"]
assert st["nccl_ps_bench"]["status"].startswith("skipped: needs"), st["nccl_ps_bench"]'

# 5. Bad usage: exit 2, naming the flag.
bash "$run" --timeout soon >"$work/out" 2>&1
expect_rc usage 2 $?
grep -q -- "--timeout wants a whole number of seconds, got 'soon'" "$work/out" || fail "usage: $(cat "$work/out")"
bash "$run" --only thrust,device >"$work/out" 2>&1
expect_rc usage-only 2 $?
grep -q -- "--only: no step 'thrust'" "$work/out" || fail "usage-only: $(cat "$work/out")"

bash "$run" --help >"$work/out" 2>&1
expect_rc help 0 $?
grep -q '^Steps, in order' "$work/out" && grep -q '^Exit status:' "$work/out" || fail "help: $(head -n 3 "$work/out")"

if ((fails)); then
  echo "bench/gpu/run.sh: $fails check(s) failed" >&2
  exit 1
fi
echo "bench/gpu/run.sh: all checks passed"
