#!/usr/bin/env bash
# Builds and installs the Python package (pip install . at the repository root) into a virtual
# environment that sees Debian's numpy, pytest and torch (--system-site-packages), then runs
# every Python test under tests/python/ (bindings, cadence.torch, ...). Ends with one line
# "python tests: N passed, M failed"; exits non-zero when anything failed, the install included.
#
#   PYTHON              interpreter to build for (default /usr/bin/python3, Debian's)
#   CADENCE_PYTHON_DIR  where the venv and the extension's CMake build live (default
#                       build-python-test/ here; reused, so a rerun rebuilds only what changed)
#   CADENCE_BUILD_DIR   a C++ build whose bin/cadence-zipline and bin/cadence-sim the tests
#                       also compare against (default: build/, else the newest build*/bin in the
#                       repository)
#   CADENCE_PYTHON_THRUST  ON/OFF: build cadence._thrust (default: the package's default, ON
#                       when the CCCL headers are found; OFF saves about 30 s of compiling)
#   JOBS                parallel compile jobs (default 2)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-/usr/bin/python3}
dir=${CADENCE_PYTHON_DIR:-$root/build-python-test}
jobs=${JOBS:-2}
passed=0
failed=0
finish() { printf 'python tests: %d passed, %d failed\n' "$passed" "$failed"; }
trap finish EXIT
mkdir -p "$dir"
log=$dir/install.log

# 1. The venv, with the build requirements (pinned as in pyproject.toml) from PyPI.
if [[ ! -x $dir/venv/bin/python ]] && ! "$python" -m venv --system-site-packages "$dir/venv" >"$log" 2>&1; then
  cat "$log"
  echo "python: creating the virtual environment FAILED (Debian: apt-get install python3-venv)"
  failed=1
  exit 1
fi
venv_python=$dir/venv/bin/python
# 2. pip install . without build isolation, so the CMake build directory persists between runs.
start=$(date +%s)
if ! "$venv_python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.11" "nanobind>=2.2" >"$log" 2>&1 ||
   ! CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv_python" -m pip install -q --disable-pip-version-check \
       --no-build-isolation --config-settings=build-dir="$dir/cmake" \
       ${CADENCE_PYTHON_THRUST:+--config-settings=cmake.define.CADENCE_PYTHON_THRUST=$CADENCE_PYTHON_THRUST} \
       "$root" >>"$log" 2>&1; then
  tail -n 60 "$log"
  echo "python: pip install . FAILED (log: $log)"
  failed=1
  exit 1
fi
echo "python: package built and installed in $(($(date +%s) - start)) s ($dir/venv)"

# 3. pytest (its rootdir conftest puts tests/python, not python/, on sys.path, so `import
#    cadence` is the installed package).
junit=$dir/pytest.xml
rm -f "$junit"
timeout 900 "$venv_python" -m pytest -q -p no:cacheprovider --junitxml="$junit" "$root/tests/python"
rc=$?
if [[ -f $junit ]]; then
  read -r total bad skipped < <("$venv_python" - "$junit" <<'PY'
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
  passed=$((total - bad - skipped))
  failed=$bad
fi
if ((rc != 0 && failed == 0)); then
  failed=1  # pytest itself failed (collection error, timeout) without a failing test
fi
((failed == 0))
