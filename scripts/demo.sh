#!/usr/bin/env bash
# The main job: builds cadence-sim and compares every synchronization policy on the default
# heterogeneous cluster. Extra arguments go to cadence-sim (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target cadence-sim >/dev/null
exec build/bin/cadence-sim "$@"
