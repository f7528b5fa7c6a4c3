"""Writes the inputs under tests/python/data/ and the C++ tools' answers on them, which the
Python tests compare the bindings with (tests/python/test_against_cli.py). The expected
numbers come only from the C++ command-line tools; rerun this after changing what they print:

    python tests/python/data/make_expected.py BUILD_DIR   # BUILD_DIR/bin/cadence-{zipline,sim}

Inputs are written only when missing, so the checked-in ones stay fixed.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent

# (file, kind, rows, pushes, decimal): rows of strictly increasing times per worker.
INPUTS = [
    ("predicted_int.txt", 40, 12, False),
    ("predicted_decimal.txt", 25, 8, True),
    ("history_int.txt", 30, 6, False),
    ("history_decimal.txt", 20, 5, True),
]

# Runs compared with the bindings: (name, cadence-zipline arguments after the source).
ZIPLINE_RUNS = [
    ("predicted_int", ["--predicted", "predicted_int.txt"]),
    ("predicted_decimal", ["--predicted", "predicted_decimal.txt"]),
    ("history_int_last_r7", ["--input", "history_int.txt", "--lookahead", "7"]),
    ("history_int_median3_r15", ["--input", "history_int.txt", "--lookahead", "15", "--predictor", "median:3"]),
    ("history_int_mean2_r4", ["--input", "history_int.txt", "--lookahead", "4", "--predictor", "mean:2"]),
    ("history_decimal_ewma_r9", ["--input", "history_decimal.txt", "--lookahead", "9", "--predictor", "ewma:0.5"]),
    ("history_decimal_last_r3", ["--input", "history_decimal.txt", "--lookahead", "3"]),
]

SIM_RUNS = [
    # (scenario, seconds, policies)
    ("hetero16", 20, ["bsp", "asp", "ssp:3", "dssp:3:15", "dssp:2:8:median:5", "elastic:15", "elastic:8:median:3:opt-bs"]),
    ("failure8", 60, ["bsp", "ssp:2", "elastic:10"]),
]
COLLECTIVE_RUNS = [("hetero16", 30, ["bsp", "periodic:4", "elastic:8", "elastic:6:median:3"])]


def write_inputs():
    rng = np.random.default_rng(20261203)
    for name, n, t, decimal in INPUTS:
        path = HERE / name
        if path.exists():
            continue
        lines = []
        for p in rng.permutation(n):  # ids out of order on purpose: the tools sort them
            if decimal:
                steps = np.round(rng.uniform(0.8, 1.6, size=t), 3)
                times = np.round(np.cumsum(steps) + rng.uniform(0, 1), 3)
                text = ",".join(f"{v:.3f}" for v in times)
            else:
                steps = rng.integers(900, 1600, size=t)
                times = np.cumsum(steps) + int(rng.integers(0, 1000))
                text = ",".join(str(int(v)) for v in times)
            lines.append(f"{p}:{text},")
        path.write_text("\n".join(lines) + "\n")


def main(build: pathlib.Path):
    write_inputs()
    zipline, sim = build / "bin" / "cadence-zipline", build / "bin" / "cadence-sim"
    expected = {"zipline": {}, "sim": [], "collective": []}
    for name, args in ZIPLINE_RUNS:
        args = [str(HERE / a) if a.endswith(".txt") else a for a in args]
        out = subprocess.run([str(zipline), *args, "--variant", "all", "--json"], check=True,
                             capture_output=True, text=True).stdout
        runs = json.loads(out)
        for r in runs:
            r.pop("seconds")
        expected["zipline"][name] = {"args": [a.rsplit("/", 1)[-1] for a in args], "runs": runs}
    for scenario, seconds, policies in SIM_RUNS:
        cmd = [str(sim), "--scenario", scenario, "--seconds", str(seconds), "--json"]
        for p in policies:
            cmd += ["--policy", p]
        runs = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        for p, r in zip(policies, runs):
            r.pop("controller_ns_per_push")
            expected["sim"].append({"policy": p, "seconds": seconds, "result": r})
    for scenario, seconds, modes in COLLECTIVE_RUNS:
        cmd = [str(sim), "--collective", "--scenario", scenario, "--seconds", str(seconds), "--json"]
        for m in modes:
            cmd += ["--policy", m]
        runs = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        for m, r in zip(modes, runs):
            expected["collective"].append({"mode": m, "seconds": seconds, "result": r})
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {HERE / 'expected.json'}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(pathlib.Path(sys.argv[1]))
