"""Predictors and the ElasticBSP planner through the bindings: the predictor contract, exact
integer predictions, and the planner's determinism, its agreement with ZipLine on the same
predictions, and its bad inputs."""

import numpy as np
import pytest

import cadence


def test_last_interval_is_exact_on_integers():
    p = cadence.Predictor("last")
    out = p.predict(np.array([100, 250, 400], dtype=np.int64), 4)
    assert out.dtype == np.int64 and out.tolist() == [550, 700, 850, 1000]
    assert (p.name, p.min_history) == ("last", 2)


def test_float_histories_give_float_predictions():
    out = cadence.Predictor("mean:2").predict(np.array([0.0, 1.0, 3.0]), 3)
    assert out.dtype == np.float64 and out.tolist() == [4.5, 6.0, 7.5]


@pytest.mark.parametrize("spec", ["last", "mean:3", "median:5", "ewma:0.4"])
def test_predictions_are_strictly_increasing_and_after_the_history(spec):
    rng = np.random.default_rng(1)
    h = np.cumsum(rng.uniform(0.0, 2.0, size=12))
    out = cadence.Predictor(spec).predict(h, 20)
    assert out.shape == (20,) and out[0] > h[-1] and np.all(np.diff(out) > 0)
    assert cadence.Predictor(spec).name == spec
    assert repr(cadence.Predictor(spec)) == f"cadence.Predictor('{spec}')"


def test_predict_zero_and_repeated_times():
    p = cadence.Predictor()
    assert p.predict(np.array([1.0, 2.0]), 0).shape == (0,)
    # Equal push times predict the next representable values (strictly increasing).
    out = p.predict(np.array([5, 5], dtype=np.int64), 3)
    assert out.tolist() == [6, 7, 8]


@pytest.mark.parametrize("spec, error, message", [
    ("lasst", cadence.ParseError, "unknown predictor"),
    ("mean", cadence.ParseError, "missing ':K'"),
    ("mean:x", cadence.ParseError, "K must be a decimal integer"),
    ("mean:0", cadence.InvalidParameterError, "k must be >= 1"),
    ("median:65", cadence.InvalidParameterError, "64"),
    ("ewma:1.5", cadence.InvalidParameterError, "alpha"),
    ("last:3", cadence.ParseError, "takes no value"),
])
def test_bad_predictor_specs(spec, error, message):
    with pytest.raises(error, match=message):
        cadence.Predictor(spec)


def test_bad_histories():
    p = cadence.Predictor("last")
    with pytest.raises(cadence.InvalidParameterError, match="needs at least 2 push timestamps, got 1"):
        p.predict(np.array([1.0]), 3)
    with pytest.raises(cadence.TimeError, match="back in time at index 2"):
        p.predict(np.array([1.0, 3.0, 2.0]), 3)
    with pytest.raises(cadence.TimeError, match="not finite"):
        p.predict(np.array([1.0, np.nan]), 3)
    with pytest.raises(cadence.TimeError, match="does not fit"):
        p.predict(np.array([0, 2**62], dtype=np.int64), 3)
    with pytest.raises(cadence.InvalidParameterError, match="r must be >= 0"):
        p.predict(np.array([1.0, 2.0]), -1)
    with pytest.raises(cadence.ArrayTypeError, match="got int32"):
        p.predict(np.array([1, 2], dtype=np.int32), 3)
    with pytest.raises(cadence.ArrayTypeError, match="got list"):
        p.predict([1.0, 2.0], 3)
    with pytest.raises(cadence.InvalidParameterError, match="not C-contiguous"):
        p.predict(np.arange(10.0)[::3], 3)
    with pytest.raises(cadence.InvalidParameterError, match="expected a 1-D array"):
        p.predict(np.zeros((2, 2)), 3)


# ---- ElasticPlanner ----

def records(planner, durations, steps=None):
    """One record per rank from each rank's step durations (microseconds)."""
    steps = steps or [len(d) for d in durations]
    return np.stack([cadence.make_record(planner.history, s, d) for s, d in zip(steps, durations)])


def test_planner_properties():
    p = cadence.ElasticPlanner("elastic:6:median:3", 4, history=8, warmup_steps=2)
    assert (p.config, p.ranks, p.history, p.record_words, p.lookahead, p.warmup_steps, p.fallbacks) == (
        "elastic:6:median:3:fast", 4, 8, 10, 6, 2, 0)
    assert "elastic:6:median:3:fast" in repr(p)
    # warmup_steps=0 means what the predictor needs: one duration for "last".
    assert cadence.ElasticPlanner("elastic:4", 2).warmup_steps == 1


def test_warmup_plans_one_step_per_rank():
    p = cadence.ElasticPlanner("elastic:5", 3, warmup_steps=3)
    r = p.plan(records(p, [[100], [200], [300]]), 0)
    assert r.warmup and r.steps == [1, 1, 1] and r.barrier == 0
    assert r.hash == p.bsp_round(0).hash and p.bsp_round(0, salt=1).hash != r.hash


def test_plan_agrees_with_zipline_on_the_same_predictions():
    p = cadence.ElasticPlanner("elastic:8:mean:2", 5)
    rng = np.random.default_rng(11)
    durations = [list(rng.integers(800, 3000, size=4)) for _ in range(5)]
    plan = p.plan(records(p, durations), 3)
    assert not plan.warmup and plan.barrier == 3
    # What the planner does, rebuilt from the bindings: times on a clock from 0, predict R
    # steps, subtract the last time, ZipLine; steps = choice + 1.
    pred = cadence.Predictor("mean:2")
    rows = []
    for d in durations:
        times = np.concatenate([[0], np.cumsum(d)]).astype(np.int64)
        rows.append(pred.predict(times, 8) - times[-1])
    z = cadence.zipline(rows)
    assert plan.steps == [c + 1 for c in z.choice]
    assert (plan.predicted_barrier_us, plan.predicted_spread_us) == (z.barrier, z.spread)
    assert all(1 <= s <= 8 for s in plan.steps)


def test_every_rank_computes_the_same_plan():
    rng = np.random.default_rng(2)
    durations = [list(rng.integers(500, 900, size=16)) for _ in range(6)]
    planners = [cadence.ElasticPlanner("elastic:10:ewma:0.5", 6) for _ in range(6)]
    recs = records(planners[0], durations)
    plans = [p.plan(recs.copy(), 7, salt=2) for p in planners]
    assert len({(tuple(x.steps), x.hash) for x in plans}) == 1
    assert planners[0].plan(recs.reshape(-1), 7, salt=2).hash == plans[0].hash  # flat records too
    assert planners[0].plan(recs, 7, salt=3).hash != plans[0].hash


def test_make_record_layout():
    r = cadence.make_record(4, 7, [10, 20, 30, 40, 50, 60])
    assert r.dtype == np.int64 and r.tolist() == [7, 4, 30, 40, 50, 60]
    assert cadence.make_record(4, 0, []).tolist() == [0, 0, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="history must be >= 2"):
        cadence.make_record(1, 0, [])
    with pytest.raises(ValueError, match=">= 0"):
        cadence.make_record(4, 1, [-5])


@pytest.mark.parametrize("args, error, message", [
    (("elastic", 2), cadence.ParseError, "must look like 'elastic:<R>"),
    (("ssp:3", 2), cadence.ParseError, "elastic"),
    (("elastic:0", 2), cadence.InvalidParameterError, "lookahead R must be >= 1"),
    (("elastic:4:slow", 2), cadence.ParseError, "unknown ZipLine variant 'slow'"),
    (("elastic:4", 0), cadence.InvalidParameterError, "needs at least one rank"),
    (("elastic:4", -1), cadence.InvalidParameterError, "ranks must be >= 0"),
    (("elastic:4", 2, 1), cadence.InvalidParameterError, "history must be in"),
])
def test_bad_planner_arguments(args, error, message):
    with pytest.raises(error, match=message):
        cadence.ElasticPlanner(*args)


def test_bad_records():
    p = cadence.ElasticPlanner("elastic:4", 3, history=4)
    good = records(p, [[1, 2], [3, 4], [5, 6]])
    with pytest.raises(cadence.InvalidParameterError, match=r"shape \(2, 6\), expected \(3, 6\)"):
        p.plan(good[:2], 0)
    with pytest.raises(cadence.InvalidParameterError, match="12 record words, expected 18"):
        p.plan(good.reshape(-1)[:12], 0)
    with pytest.raises(cadence.ArrayTypeError, match="records must be int64"):
        p.plan(good.astype(np.float64), 0)
    with pytest.raises(cadence.ArrayTypeError, match="got int32"):
        p.plan(good.astype(np.int32), 0)
    with pytest.raises(cadence.InvalidParameterError, match="not C-contiguous"):
        p.plan(np.asfortranarray(good), 0)
    with pytest.raises(cadence.ArrayTypeError, match="got list"):
        p.plan(good.tolist(), 0)
