"""The bindings give the C++ library's answers: ZipLine (every variant), the predictors and
the simulator against what cadence-zipline and cadence-sim printed on the same inputs
(checked in as data/expected.json by data/make_expected.py), and, when a build's tools are
present, against the tools run now on fresh inputs."""

import json
import subprocess

import numpy as np
import pytest

import cadence
from binding_support import DATA, find_tool, read_history


def rows_for(args):
    """The rows cadence-zipline searched for `args`: the file's rows, or their predictions."""
    source = args[1]
    rows = read_history(DATA / source)
    if args[0] == "--predicted":
        return rows
    opts = dict(zip(args[2::2], args[3::2]))
    predictor = cadence.Predictor(opts.get("--predictor", "last"))
    r = int(opts.get("--lookahead", "15"))
    return [predictor.predict(row, r) for row in rows]


def test_expected_covers_every_cpu_variant(expected):
    for case in expected["zipline"].values():
        assert {r["variant"] for r in case["runs"]} == {"zipline", "opt", "opt-bs", "fast"}


@pytest.mark.parametrize("variant", ["zipline", "opt", "opt-bs", "fast", "thrust"])
def test_zipline_matches_cadence_zipline(expected, variant):
    if variant not in cadence.zipline_variants():
        pytest.skip("this build has no Thrust backend")
    for name, case in expected["zipline"].items():
        want = case["runs"][0]
        rows = rows_for(case["args"])
        got = cadence.zipline(rows, variant=variant)
        assert (got.spread, got.barrier, got.choice) == (want["spread"], want["barrier"], want["choice"]), name
        assert len(got.choice) == want["n"]
        # The same answer from a 2-D array when the rows have one length.
        if len({len(r) for r in rows}) == 1:
            again = cadence.zipline(np.stack(rows), variant=variant)
            assert (again.spread, again.barrier, again.choice) == (got.spread, got.barrier, got.choice)


def test_zipline_result_types_follow_the_dtype(expected):
    case = expected["zipline"]["predicted_int"]
    r = cadence.zipline(rows_for(case["args"]))
    assert isinstance(r.spread, int) and isinstance(r.barrier, int)
    case = expected["zipline"]["predicted_decimal"]
    r = cadence.zipline(rows_for(case["args"]))
    assert isinstance(r.spread, float) and isinstance(r.barrier, float)


# What a simulation measures on the wall clock (the controllers' cost, the simulator's speed):
# the only parts of a result that differ between two runs of the same scenario.
WALL_CLOCK_KEYS = ("controller_ns_per_push", "events_per_second")


def test_simulate_matches_cadence_sim(expected):
    for case in expected["sim"]:
        want = case["result"]
        got = cadence.simulate(case["policy"], want["scenario"], seed=want["seed"],
                               seconds=case["seconds"])
        for key in WALL_CLOCK_KEYS:  # measured, not simulated: they differ run to run
            got.pop(key, None)
        # Histograms (count per value) are extra; the largest non-empty value is the max.
        hist = got.pop("start_staleness_histogram")
        assert max(v for v, count in enumerate(hist) if count) == want["start_staleness_max"]
        got.pop("updates_behind_histogram")
        assert got == want, case["policy"]


def test_simulate_collective_matches_cadence_sim(expected):
    for case in expected["collective"]:
        want = case["result"]
        got = cadence.simulate_collective(case["mode"], want["scenario"], seed=want["seed"],
                                          seconds=case["seconds"])
        assert got == want, case["mode"]


# ---- against the tools of a build, on inputs made now (skipped without a build) ----

zipline_tool = find_tool("cadence-zipline")
sim_tool = find_tool("cadence-sim")


def write_rows(path, rows):
    with open(path, "w") as f:
        for p, row in enumerate(rows):
            if row.dtype == np.int64:
                f.write(f"{p}:" + ",".join(str(int(v)) for v in row) + ",\n")
            else:
                f.write(f"{p}:" + ",".join(repr(float(v)) for v in row) + ",\n")


@pytest.mark.skipif(zipline_tool is None, reason="no build with cadence-zipline (set CADENCE_BUILD_DIR)")
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_zipline_matches_live_tool_on_random_rows(tmp_path, seed, dtype):
    rng = np.random.default_rng(seed)
    n, r = int(rng.integers(2, 60)), int(rng.integers(1, 20))
    if dtype == np.int64:
        rows = [np.cumsum(rng.integers(1, 50, size=r)).astype(np.int64) for _ in range(n)]
    else:
        rows = [np.cumsum(rng.uniform(0.01, 2.0, size=r)) for _ in range(n)]
    path = tmp_path / "rows.txt"
    write_rows(path, rows)
    out = subprocess.run([str(zipline_tool), "--predicted", str(path), "--variant", "all", "--json"],
                         check=True, capture_output=True, text=True).stdout
    for want in json.loads(out):
        got = cadence.zipline(rows, variant=want["variant"])
        assert (got.spread, got.barrier, got.choice) == (want["spread"], want["barrier"], want["choice"])


@pytest.mark.skipif(zipline_tool is None, reason="no build with cadence-zipline (set CADENCE_BUILD_DIR)")
@pytest.mark.parametrize("predictor", ["last", "mean:3", "median:4", "ewma:0.3"])
def test_predictors_match_live_tool(tmp_path, predictor):
    rng = np.random.default_rng(7)
    rows = [np.cumsum(rng.integers(500, 1500, size=6)).astype(np.int64) for _ in range(12)]
    path = tmp_path / "history.txt"
    write_rows(path, rows)
    out = subprocess.run([str(zipline_tool), "--input", str(path), "--lookahead", "9", "--predictor",
                          predictor, "--json"], check=True, capture_output=True, text=True).stdout
    want = json.loads(out)
    p = cadence.Predictor(predictor)
    got = cadence.zipline([p.predict(row, 9) for row in rows])
    assert (got.spread, got.barrier, got.choice) == (want["spread"], want["barrier"], want["choice"])


@pytest.mark.skipif(sim_tool is None, reason="no build with cadence-sim (set CADENCE_BUILD_DIR)")
def test_simulate_matches_live_tool_with_every_option():
    cmd = [str(sim_tool), "--scenario", "hetero2", "--workers", "5", "--seed", "9", "--iterations", "40",
           "--push-cost", "0.003", "--pull-cost", "0.002", "--policy", "dssp:1:6", "--json"]
    want = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[0]
    got = cadence.simulate("dssp:1:6", "hetero2", workers=5, seed=9, iterations=40, push_cost=0.003,
                           pull_cost=0.002)
    for key in ("start_staleness_histogram", "updates_behind_histogram"):
        got.pop(key)
    for key in WALL_CLOCK_KEYS:
        got.pop(key, None)
        want.pop(key, None)
    assert got == want
