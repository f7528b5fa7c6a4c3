#!/usr/bin/env bash
# Runs the fault-prone tests many times in a row under load, to find the ones that fail one run
# in N: the transport, parameter-server, exchange and cadence-train ctests of a build, and the
# torch tests of the Python package, with a busy loop on every core beside them (stress-ng when
# installed, else one shell loop per core). Prints one line per failure and a summary; exits 1
# when anything failed.
#
# Usage: scripts/stress-tests.sh [ROUNDS] [BUILD_DIR]   (default 20 rounds, build/)
# A failing round's whole output is kept as stress-round-<N>.log in a temporary folder, named in
# the summary, so a failure that happens one run in N can be read afterwards.
# Env:   CTEST_REGEX  which ctests (default: transport|exchange|tool.train|example.mpi)
#        PYTHON_TESTS pytest paths (default tests/python/torch; empty: none); the venv of
#                     scripts/test-python.sh (build-python-test/venv) runs them
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
build=${2:-build}
regex=${CTEST_REGEX:-transport|exchange|tool.train|example.mpi}
python_tests=${PYTHON_TESTS-tests/python/torch}
venv_python=build-python-test/venv/bin/python
[[ -f $build/CTestTestfile.cmake ]] || { echo "stress: no build in $build (run scripts/test.sh --quick first)" >&2; exit 2; }

load=()
if command -v stress-ng >/dev/null 2>&1; then
  stress-ng --cpu "$(nproc)" --quiet &
  load+=($!)
else
  for _ in $(seq 1 "$(nproc)"); do
    (while :; do :; done) &
    load+=($!)
  done
fi
trap 'kill "${load[@]}" 2>/dev/null' EXIT

failures=0
log=$(mktemp)
kept=$(mktemp -d "${TMPDIR:-/tmp}/cadence-stress-XXXXXX")
for round in $(seq 1 "$rounds"); do
  if ! ctest --test-dir "$build" -R "$regex" -j2 --output-on-failure >"$log" 2>&1; then
    grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Not Run)' "$log" | sed "s/^/round $round: /"
    cp "$log" "$kept/stress-round-$round.log"
    failures=$((failures + 1))
  fi
  if [[ -n $python_tests && -x $venv_python ]]; then
    if ! "$venv_python" -m pytest -q -p no:cacheprovider $python_tests >"$log" 2>&1; then
      grep -E '^(FAILED|ERROR) ' "$log" | sed "s/^/round $round: /"
      cp "$log" "$kept/stress-round-$round-python.log"
      failures=$((failures + 1))
    fi
  fi
  echo "round $round of $rounds done ($failures failing rounds so far)"
done
rm -f "$log"
if ((failures == 0)); then rmdir "$kept"; else echo "stress: the failing rounds' output is in $kept"; fi
echo "stress: $rounds rounds, $failures failing under load"
((failures == 0))
