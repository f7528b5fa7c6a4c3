# cadence.OuterSchedule (the C++ outer_schedule): the bounded-lag and quorum plans against
# oracles written from their rules (ported from tests/exchange/local_sgd/schedule_test.cpp, with
# the `last` predictor: rank p's k-th step after a sync ends at k times its last duration) on
# seeded records, the warm-up, the elastic form against cadence.ElasticPlanner, the canonical
# configs and the errors.
import random

import numpy as np
import pytest

import cadence

S = cadence.OuterSchedule


def records_of(s, ranks, plan_hash=0):
    """ranks: dicts with steps, carried, contributes, durations; the (ranks, record_words) array."""
    out = np.zeros((len(ranks), s.record_words), dtype=np.int64)
    for p, r in enumerate(ranks):
        out[p, S.RECORD_STEPS] = r["steps"]
        out[p, S.RECORD_CARRIED] = r.get("carried", 0)
        out[p, S.RECORD_CONTRIBUTES] = r.get("contributes", 1)
        out[p, S.RECORD_HASH] = plan_hash
        out[p, S.RECORD_HAVE] = len(r["durations"])
        out[p, S.RECORD_HEAD:S.RECORD_HEAD + len(r["durations"])] = r["durations"]
    return out


def lag_oracle(h, extra, last):
    target = max(h * d for d in last)
    return [h + min(range(extra + 1), key=lambda r: (abs((h + r) * d - target), r)) for d in last]


def quorum_oracle(k, h, grace_milli, max_lag, ranks):
    n = len(ranks)
    rem, arr, forced = [], [], 0
    for r in ranks:
        progress = 0 if r["contributes"] else r["steps"]
        carried = 0 if r["contributes"] else r["carried"] + 1
        rem.append(max(1, h - progress))
        arr.append(rem[-1] * r["durations"][-1])
        if carried >= max_lag:
            forced = max(forced, arr[-1])
    close = max(sorted(arr)[min(k, n) - 1], forced)
    limit = close + close * grace_milli // 1000  # exact on Python integers
    close = max([close] + [a for a in arr if a <= limit])
    steps, contributes = [], []
    for p, r in enumerate(ranks):
        if arr[p] <= close or rem[p] == 1:
            steps.append(rem[p])
            contributes.append(1)
            continue
        d = r["durations"][-1]
        steps.append(min(range(1, rem[p]), key=lambda s: (abs(s * d - close), s)))
        contributes.append(0)
    return steps, contributes


def test_lag_plans_at_least_h_steps_a_faster_rank_up_to_h_plus_s_ending_nearest_the_slowest():
    rng = random.Random(11)
    for _ in range(200):
        n, h, extra = rng.randint(1, 6), rng.randint(1, 12), rng.randint(0, 9)
        s = S(f"lag:{h}:{extra}", n)
        ranks = [dict(steps=h, durations=[rng.randint(500, 5499)]) for _ in range(n)]
        p = s.plan(records_of(s, ranks), 1)
        assert not p.warmup
        assert list(p.steps) == lag_oracle(h, extra, [r["durations"][-1] for r in ranks]), (h, extra, ranks)
        assert list(p.contributes) == [1] * n


def test_quorum_plans_the_k_earliest_arrivals_and_the_grace_window_within_max_lag():
    rng = random.Random(5)
    for _ in range(300):
        n = rng.randint(1, 6)
        k, h, grace, lag = rng.randint(1, n), rng.randint(2, 16), rng.randrange(600), rng.randrange(4)
        s = S(f"quorum:{k}:{h}:{grace // 1000}.{grace % 1000:03d}:{lag}", n)
        assert s.grace_milli == grace and s.max_lag == lag and s.quorum == k and s.period == h
        ranks = []
        for _ in range(n):
            c = 0 if rng.randrange(3) == 0 else 1
            ranks.append(dict(contributes=c, steps=h if c else rng.randint(1, h - 1),
                              carried=0 if c else rng.randrange(max(lag, 1)),
                              durations=[rng.randint(1000, 4999), rng.randint(1000, 4999)]))
        p = s.plan(records_of(s, ranks), 3)
        steps, contributes = quorum_oracle(k, h, grace, lag, ranks)
        assert (list(p.steps), list(p.contributes)) == (steps, contributes), (s.config, ranks)
        assert sum(p.contributes) >= k
        assert p.round == 3


def test_a_timed_schedule_warms_up_with_h_steps_until_every_rank_has_step_times():
    s = S("quorum:1:8:0:2:mean:3", 2)
    assert s.config == "quorum:1:8:0:2:mean:3"
    first = s.first_plan()
    assert (list(first.steps), list(first.contributes), first.warmup) == ([8, 8], [1, 1], True)
    p = s.plan(records_of(s, [dict(steps=8, durations=[100]), dict(steps=8, durations=[])]), 1)
    assert p.warmup and list(p.steps) == [8, 8]
    q = s.plan(records_of(s, [dict(steps=8, durations=[100, 100]), dict(steps=8, durations=[300, 300])]), 2)
    assert not q.warmup
    assert list(q.steps) == [8, 3] and list(q.contributes) == [1, 0]  # rank 1 late: 3 x 300 nearest 800 us
    assert q.predicted_us == 800
    # every rank computes the same plan and hash from the same records
    again = S("quorum:1:8:0:2:mean:3", 2).plan(
        records_of(s, [dict(steps=8, durations=[100, 100]), dict(steps=8, durations=[300, 300])]), 2)
    assert again.hash == q.hash and q.hash != p.hash


def test_fixed_and_elastic_forms():
    f = S("fixed:20", 3)
    assert (f.kind, f.timed, f.period) == ("fixed", False, 20)
    assert list(f.first_plan().steps) == [20, 20, 20] and not f.first_plan().warmup
    # elastic: the same steps as cadence.ElasticPlanner on the same step times
    s, e = S("elastic:6", 3), cadence.ElasticPlanner("elastic:6", 3)
    durations = [[1000] * 4, [2000] * 4, [3000] * 4]
    ours = records_of(s, [dict(steps=1, durations=d) for d in durations])
    theirs = np.array([[1, 4] + d + [0] * (e.record_words - 6) for d in durations], dtype=np.int64)
    assert list(s.plan(ours, 1).steps) == list(e.plan(theirs, 1).steps)
    assert s.config == e.config and s.kind == "elastic" and s.timed


def test_canonical_configs_and_accessors():
    q = S("quorum:3:20", 4)
    assert q.config == "quorum:3:20:0.25:2:last"
    assert (q.kind, q.quorum, q.period, q.grace_milli, q.max_lag, q.ranks, q.history) == \
        ("quorum", 3, 20, 250, 2, 4, 16)
    assert q.record_words == S.RECORD_HEAD + 16 and q.most_steps == 20
    lag = S("lag:5:3:ewma:0.5", 2, history=8)
    assert lag.config == "lag:5:3:ewma:0.5" and lag.extra == 3 and lag.most_steps == 8
    assert lag.record_words == S.RECORD_HEAD + 8
    assert "OuterSchedule('lag:5:3:ewma:0.5', 2, history=8)" in repr(lag)
    assert "contributes=[1, 1]" in repr(lag.first_plan())


@pytest.mark.parametrize("args, error, text", [
    (("lag:4", 2), cadence.ParseError, "expected lag:<H>:<s>"),
    (("quorum:0:10", 2), cadence.InvalidParameterError, "K must be >= 1"),
    (("bogus:3", 2), cadence.ParseError, "unknown schedule 'bogus'"),
    (("fixed:4", 0), cadence.InvalidParameterError, "needs at least one rank"),
    (("fixed:4", -1), cadence.InvalidParameterError, "ranks must be >= 0, got -1"),
    (("fixed:4", 2, 1), cadence.InvalidParameterError, "history must be in [2, 1024]"),
])
def test_bad_configs_are_refused_naming_them(args, error, text):
    with pytest.raises(error) as e:
        S(*args)
    assert text in str(e.value)
    assert isinstance(e.value, ValueError)


def test_bad_records_are_refused_naming_what_is_wrong():
    s = S("lag:4:2", 2)
    with pytest.raises(cadence.InvalidParameterError, match=r"shape \(2, 3\), expected \(2, 21\)"):
        s.plan(np.zeros((2, 3), dtype=np.int64), 1)
    with pytest.raises(cadence.InvalidParameterError, match="10 record words, expected 42"):
        s.plan(np.zeros(10, dtype=np.int64), 1)
    with pytest.raises(cadence.ArrayTypeError, match="must be int64"):
        s.plan(np.zeros((2, 21)), 1)
    bad = records_of(s, [dict(steps=4, durations=[100]), dict(steps=-1, durations=[100])])
    with pytest.raises(cadence.InvalidParameterError, match="rank 1's record is malformed"):
        s.plan(bad, 1)
    zero = records_of(s, [dict(steps=4, durations=[100]), dict(steps=4, durations=[0])])
    with pytest.raises(cadence.InvalidParameterError, match="rank 1 recorded a duration <= 0"):
        s.plan(zero, 1)
