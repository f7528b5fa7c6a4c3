#!/usr/bin/env bash
# Builds the Python package once (a wheel, from pyproject.toml at the repository root) and runs
# the Python tests under tests/python/ against both ends of the supported torch range:
#   1. Debian's torch (1.13, the oldest supported): a venv over Debian's Python that sees
#      Debian's numpy, pytest and torch (--system-site-packages); every test but the torchrun
#      recipes' stop-and-resume test and torchrun DiLoCo (run 2 runs the latter);
#   2. the newest torch on PyPI: a venv cached between runs on this machine (created when
#      missing: about 3 GB from PyPI on x86-64, since PyPI's wheel carries CUDA's libraries;
#      reused while it imports torch, numpy and pytest); every test that imports torch
#      (tests/python/torch, lstm_node2vec, test_warnings.py; the bindings' tests do not depend
#      on torch's version), but the recipes' stop-and-resume, which only CADENCE_PYTHON_LONG=1
#      runs (both runs then run everything);
#   3. no torch at all: a plain venv with numpy and pytest only; the tests that check what the
#      package says when torch is missing (tests/python/test_without_torch.py).
# The same wheel goes into the three venvs (pip install --no-deps), so the extension is compiled
# once. Ends with one line "python tests: N passed, M failed" over the three runs; exits
# non-zero when anything failed, the build or a venv included.
#
#   PYTHON              interpreter to build for (default /usr/bin/python3, Debian's)
#   CADENCE_PYTHON_DIR  where the venvs, the wheel and the extension's CMake build live (default
#                       build-python-test/ here; reused, so a rerun rebuilds only what changed)
#   CADENCE_TORCH_VENV  the newest-torch venv (default ~/.cache/cadence/torch-venv)
#   CADENCE_TORCH_SPEC  what pip installs into it when creating it (default "torch": the newest);
#                       delete the venv (or point CADENCE_TORCH_VENV elsewhere) to take a newer one
#   CADENCE_TORCH_NEWEST  0: skip run 2 (it then says so; CI runs it)
#   CADENCE_BUILD_DIR   a C++ build whose bin/cadence-zipline and bin/cadence-sim the tests
#                       also compare against (default: build/, else the newest build*/bin in the
#                       repository)
#   CADENCE_PYTHON_THRUST  ON/OFF: build cadence._thrust (default: the package's default, ON
#                       when the CCCL headers are found; OFF saves about 30 s of compiling)
#   JOBS                parallel compile jobs (default 2)
#
#   scripts/test-python.sh --prepare-newest-torch   only makes (or checks) the newest-torch venv
#       and exits: scripts/test.sh starts it in the background at its beginning, so the
#       download (about 3 GB, minutes) overlaps the C++ builds; the later full run waits for it
#       under the venv's lock.
set -uo pipefail
prepare_only=0
case ${1:-} in
  --prepare-newest-torch) prepare_only=1 ;;
  "") ;;
  *) echo "usage: scripts/test-python.sh [--prepare-newest-torch]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-/usr/bin/python3}
dir=${CADENCE_PYTHON_DIR:-$root/build-python-test}
torch_venv=${CADENCE_TORCH_VENV:-$HOME/.cache/cadence/torch-venv}
torch_spec=${CADENCE_TORCH_SPEC:-torch}
jobs=${JOBS:-2}
passed=0
failed=0
finish() { printf 'python tests: %d passed, %d failed\n' "$passed" "$failed"; }
trap finish EXIT
mkdir -p "$dir"
log=$dir/install.log
pip_quiet=(-q --disable-pip-version-check)

# fail WHAT: one failure that is not a test's (a venv, the build), with the log's tail.
fail() {
  tail -n 60 "$log"
  echo "python: $1 FAILED (log: $log)"
  failed=$((failed + 1))
}

# make_venv DIR [venv options...]: DIR/bin/python, created unless there.
make_venv() {
  local d=$1
  shift
  [[ -x $d/bin/python ]] || "$python" -m venv "$@" "$d" >>"$log" 2>&1
}

# run_pytest SLUG NAME VENV_PYTHON PYTEST_ARGS...: pytest from the repository root (its rootdir
# conftest puts tests/python, not python/, on sys.path, so `import cadence` is the installed
# package; pyproject.toml's filterwarnings make a FutureWarning or DeprecationWarning raised
# from cadence code an error); adds its counts to the totals and prints them.
run_pytest() {
  local slug=$1 name=$2 vpy=$3
  shift 3
  local junit=$dir/pytest-$slug.xml t0 rc total=0 bad=0 skipped=0 ok
  rm -f "$junit"
  t0=$(date +%s)
  # One intra-op thread per process, as Debian's torch has by default: PyPI's takes one per core,
  # and on a busy 2-core machine its OpenMP threads spin against the spawned ranks (the LSTM
  # tests took 110 s instead of 4 at a load of 6).
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
    timeout 900 "$vpy" -m pytest -q -p no:cacheprovider --junitxml="$junit" "$@"
  rc=$?
  if [[ -f $junit ]]; then
    read -r total bad skipped < <("$vpy" - "$junit" <<'PY'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
total = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(total, bad, skipped)
PY
)
  fi
  ok=$((total - bad - skipped))
  if ((rc != 0 && rc != 5 && bad == 0)); then
    bad=1  # pytest itself failed (collection error, timeout) without a failing test
  fi
  passed=$((passed + ok))
  failed=$((failed + bad))
  echo "python tests ($name): $ok passed, $bad failed, $skipped skipped in $(($(date +%s) - t0)) s"
}

# ensure_torch_venv: the newest-torch venv, cached between runs: reused when its marker says it
# was completed and it imports what the tests need; otherwise made again from PyPI (under a lock,
# so two runs on one machine, or the background preparation and the run, do not both make it).
# Returns non-zero when it is still not usable.
tpy=$torch_venv/bin/python
torch_valid() { [[ -f $torch_venv/.cadence-complete ]] && "$tpy" -c 'import torch, numpy, pytest' >/dev/null 2>&1; }
ensure_torch_venv() {
  mkdir -p "$(dirname "$torch_venv")"
  exec 9>"$torch_venv.lock"
  flock 9
  if ! torch_valid; then
    echo "python: creating $torch_venv with $torch_spec from PyPI (about 3 GB; once per machine)"
    local t0
    t0=$(date +%s)
    rm -rf "$torch_venv"
    if make_venv "$torch_venv" &&
       "$tpy" -m pip install "${pip_quiet[@]}" "$torch_spec" numpy pytest >>"$torch_log" 2>&1; then
      "$tpy" -c 'import torch; print(torch.__version__)' >"$torch_venv/.cadence-complete"
      echo "python: $torch_venv ready in $(($(date +%s) - t0)) s"
    fi
  fi
  flock -u 9
  torch_valid
}
torch_log=$dir/torch-venv.log
if ((prepare_only)); then
  trap - EXIT
  : >"$torch_log"
  log=$torch_log  # make_venv's output
  if ensure_torch_venv; then
    echo "python: newest-torch venv ready: $torch_venv (torch $(cat "$torch_venv/.cadence-complete"))"
    exit 0
  fi
  tail -n 30 "$torch_log"
  echo "python: creating the newest-torch venv $torch_venv FAILED (log: $torch_log)"
  exit 1
fi

# 1. The build venv (Debian's Python, numpy, pytest and torch), with the build requirements
#    (pinned as in pyproject.toml) from PyPI.
: >"$log"
if ! make_venv "$dir/venv" --system-site-packages; then
  fail "creating the virtual environment (Debian: apt-get install python3-venv)"
  exit 1
fi
venv_python=$dir/venv/bin/python

# 2. The wheel, built once without build isolation, so the CMake build directory persists
#    between runs; then installed into each venv as `pip install` would.
start=$(date +%s)
rm -rf "$dir/wheel"
if ! "$venv_python" -m pip install "${pip_quiet[@]}" "scikit-build-core>=0.11" "nanobind>=2.2" >>"$log" 2>&1 ||
   ! CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv_python" -m pip wheel "${pip_quiet[@]}" --no-deps \
       --no-build-isolation --config-settings=build-dir="$dir/cmake" \
       ${CADENCE_PYTHON_THRUST:+--config-settings=cmake.define.CADENCE_PYTHON_THRUST=$CADENCE_PYTHON_THRUST} \
       -w "$dir/wheel" "$root" >>"$log" 2>&1; then
  fail "building the wheel (pip wheel .)"
  exit 1
fi
wheel=$(ls "$dir"/wheel/cadence_sync-*.whl)
install_wheel() { "$1" -m pip install "${pip_quiet[@]}" --no-deps --force-reinstall "$wheel" >>"$log" 2>&1; }
if ! install_wheel "$venv_python"; then
  fail "pip install $wheel (Debian's torch)"
  exit 1
fi
echo "python: package built and installed in $(($(date +%s) - start)) s ($wheel)"

# 3. Debian's torch: every test but the recipes' stop-and-resume (run 4 has it; CI time).
# The two longest process tests run once each, with the newest torch, and only in the long form
# (CADENCE_PYTHON_LONG=1, by hand: docs/testing.md): the recipes' stop-and-resume (30 s of
# processes) and torchrun DiLoCo with DDP inside replicas (4 ranks; ~10 s), which the newest
# torch runs in CI. CI time.
long=${CADENCE_PYTHON_LONG:-0}
resume_test="tests/python/torch/test_torchrun_recipes.py::test_the_recipes_run_and_a_stopped_job_resumes_from_its_checkpoints"
debian_deselect=(--deselect "$resume_test" --deselect "tests/python/torch/test_torchrun_diloco.py")
# FaultTolerantDiLoCo's fault cases test the membership under it, the same with either torch:
# Debian's torch runs them, the newest torch the case without a fault (its torch calls); so
# for the agreed stop's SIGTERM through the example (its stop is the binding's). CI time.
ft_diloco="tests/python/torch/test_torch_fault_tolerant_diloco.py"
ft_stop="tests/python/torch/test_torch_diloco_stop.py"
# A DiLoCo process's rejoin is the membership's (Debian's torch runs it; 7 s with the newest):
# the newest torch runs the averager's rejoin, and FaultTolerantDiLoCo's start and join, whose
# code (_take_up) a rejoin runs too. CI time.
ft_rejoin="tests/python/torch/test_torch_fault_tolerant_rejoin.py"
newest_deselect=(--deselect "$resume_test"
                 --deselect "$ft_diloco::test_the_others_go_on_without_a_killed_process_rank_0_included"
                 --deselect "$ft_diloco::test_a_replacement_joins_with_the_global_weights_and_ends_equal"
                 --deselect "$ft_stop::test_the_example_stops_every_process_after_the_same_outer_step_on_one_sigterm"
                 --deselect "$ft_rejoin::test_a_dropped_diloco_process_rejoins_with_the_global_weights")
if [[ $long == 1 ]]; then
  debian_deselect=()
  newest_deselect=()
fi
run_pytest debian "Debian torch $("$venv_python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)" \
  "$venv_python" "$root/tests/python" "${debian_deselect[@]}"

# 4. The newest torch from PyPI, in a venv cached between runs (ensure_torch_venv above; waits
#    for a background preparation still making it).
if [[ ${CADENCE_TORCH_NEWEST:-1} == 0 ]]; then
  echo "python tests (newest torch): skipped (CADENCE_TORCH_NEWEST=0)"
else
  [[ -f $torch_log ]] || : >"$torch_log"
  if ! ensure_torch_venv; then
    tail -n 30 "$torch_log"
    fail "creating the newest-torch venv $torch_venv ($torch_spec from PyPI)"
  elif ! install_wheel "$tpy"; then
    fail "pip install $wheel (newest torch)"
  else
    run_pytest newest "PyPI torch $(cat "$torch_venv/.cadence-complete")" "$tpy" \
      "$root/tests/python/torch" "$root/tests/python/lstm_node2vec" "$root/tests/python/test_warnings.py" \
      "${newest_deselect[@]}"
  fi
fi

# 5. No torch: a plain venv (no system site packages) with numpy and pytest from PyPI, kept
#    between runs; only the tests of what the package says without torch.
notorch=$dir/venv-notorch
if ! { make_venv "$notorch" &&
       { "$notorch/bin/python" -c 'import numpy, pytest' >/dev/null 2>&1 ||
         "$notorch/bin/python" -m pip install "${pip_quiet[@]}" numpy pytest >>"$log" 2>&1; }; }; then
  fail "creating the venv without torch ($notorch)"
elif ! install_wheel "$notorch/bin/python"; then
  fail "pip install $wheel (no torch)"
else
  CADENCE_EXPECT_NO_TORCH=1 run_pytest notorch "no torch" "$notorch/bin/python" \
    "$root/tests/python/test_without_torch.py"
fi
((failed == 0))
