#!/usr/bin/env python3
"""Two builds of a Cadence bench program, run in turns on this machine: the time of "ours" per
size in each, and their ratio (issue 34: "the transport bench shows no slowdown, before and
after, in one run"). Each round runs the old build, then the new one (then the next round in
the other order), so a drift of the machine's load falls on both; the median over rounds is
reported per size. The programs must print --json rows with "bytes", "raw_us" and "ours_us"
(cadence-bench-transport, -exchange and -ps do).

    bench/compare_builds.py --old /tmp/before/bin/cadence-bench-transport \\
        --new build/bin/cadence-bench-transport --rounds 5 -- --backend gloo --ranks 2 --max-bytes 16777216

    bench/compare_builds.py ... --mpi 2 -- --backend mpi     # under mpirun -np 2

Prints a table (op, bytes, the old and new medians of ours_us and of raw_us, new/old of ours and of
raw) and, with --json, one object with the rows. A ratio of ours within the ratio of raw (the
native call timed in the same runs) means the difference is the machine's, not the code's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary: str, args: list[str], mpi: int, op: str | None) -> dict[tuple[str, int], tuple[float, float]]:
    cmd = [binary, *args, "--json"]
    if mpi:
        cmd = ["mpirun", "--oversubscribe", "-np", str(mpi), *cmd]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    rows = json.loads(out.stdout[out.stdout.index("["):])
    return {(r.get("op", ""), int(r["bytes"])): (float(r["ours_us"]), float(r["raw_us"])) for r in rows
            if op is None or r.get("op") == op}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, help="the bench program of the old build")
    p.add_argument("--new", required=True, help="the same program of the new build")
    p.add_argument("--rounds", type=int, default=5, help="runs of each (default 5)")
    p.add_argument("--mpi", type=int, default=0, help="run under mpirun -np N")
    p.add_argument("--op", help="only the rows whose \"op\" is this")
    p.add_argument("--min-bytes", type=int, default=0, help="leave out smaller sizes")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.add_argument("args", nargs="*", help="the programs' arguments (after --)")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be >= 1")
    runs: dict[str, list[dict[tuple[str, int], tuple[float, float]]]] = {"old": [], "new": []}
    for i in range(a.rounds):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for which in order:
            runs[which].append(run(getattr(a, which), a.args, a.mpi, a.op))
    sizes = sorted(set.intersection(*(set(r) for rs in runs.values() for r in rs)))
    rows = []
    for key in sizes:
        op, b = key
        if b < a.min_bytes:
            continue
        med = {w: (statistics.median(r[key][0] for r in runs[w]), statistics.median(r[key][1] for r in runs[w]))
               for w in runs}
        rows.append({"op": op, "bytes": b, "old_ours_us": med["old"][0], "new_ours_us": med["new"][0],
                     "old_raw_us": med["old"][1], "new_raw_us": med["new"][1],
                     "ours_new_over_old": med["new"][0] / med["old"][0],
                     "raw_new_over_old": med["new"][1] / med["old"][1]})
    if a.json:
        print(json.dumps({"old": a.old, "new": a.new, "rounds": a.rounds, "args": a.args, "rows": rows}))
        return 0
    print(f"{'op':<20} {'bytes':>10} {'old ours us':>12} {'new ours us':>12} {'old raw us':>11} {'new raw us':>11} "
          f"{'ours new/old':>13} {'raw new/old':>12}")
    for r in rows:
        print(f"{r['op']:<20} {r['bytes']:>10} {r['old_ours_us']:>12.1f} {r['new_ours_us']:>12.1f} {r['old_raw_us']:>11.1f} "
              f"{r['new_raw_us']:>11.1f} {r['ours_new_over_old']:>13.3f} {r['raw_new_over_old']:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
