"""Controllers through the bindings: the policies' guarantees on driven schedules, the
introspection, add/remove, and every kind of bad argument raising an exception that names it."""

import copy
import math

import numpy as np
import pytest

import cadence


def test_make_controller_returns_the_policy_class():
    cases = {
        "bsp": cadence.BSP, "asp": cadence.ASP, "ssp:3": cadence.SSP, "dssp:3:15": cadence.DSSP,
        "dssp:2:9:median:5": cadence.DSSP, "elastic:15": cadence.ElasticBSP,
        "elastic:8:ewma:0.5:opt-bs": cadence.ElasticBSP,
    }
    for config, cls in cases.items():
        c = cadence.make_controller(config, 4)
        assert type(c) is cls and isinstance(c, cadence.Controller)
        assert c.config.split(":")[0] == config.split(":")[0] == c.name
        assert cadence.make_controller(c.config, 4).config == c.config  # config round-trips


def test_policy_classes_build_what_make_controller_builds():
    assert cadence.SSP(4, 3).config == cadence.make_controller("ssp:3", 4).config == "ssp:3"
    assert cadence.DSSP(4, 3, 15).config == "dssp:3:15"
    assert cadence.DSSP(4, 3, 15, predictor="median:5").config == "dssp:3:15:median:5"
    assert cadence.ElasticBSP(4, 15).config == "elastic:15:last:fast"
    assert cadence.BSP(2).config == "bsp" and cadence.ASP(2).config == "asp"


def test_bsp_releases_everyone_on_the_last_push():
    c = cadence.BSP(3)
    d = c.push(0, 1.0)
    assert (d.proceed, d.released) == (False, [])
    assert c.is_waiting(0) and c.waiting_for(0) == [1, 2]
    assert c.push(2, 1.5).proceed is False
    d = c.push(1, 2.0)
    assert d.proceed is True and sorted(d.released) == [0, 2]
    assert c.clocks == [1, 1, 1] and c.min_clock == 1 and c.max_staleness == 0
    assert c.staleness_bound == 0


def test_ssp_never_lets_a_worker_start_more_than_s_ahead():
    s, n = 2, 4
    c = cadence.SSP(n, s)
    rng = np.random.default_rng(5)
    t = 0.0
    waiting = set()
    for _ in range(2000):
        runnable = [p for p in range(n) if p not in waiting]
        p = int(rng.choice(runnable))
        t += 1.0
        d = c.push(p, t)
        waiting.difference_update(d.released)
        if not d.proceed:
            waiting.add(p)
        for q in range(n):
            if q not in waiting:
                assert c.staleness(q) <= s
        assert {q for q in range(n) if c.is_waiting(q)} == waiting
    assert c.staleness_bound == s


def test_asp_never_waits_and_has_no_bound():
    c = cadence.ASP(3)
    for k in range(50):
        assert c.push(0, float(k)).proceed
    assert c.staleness(0) == 50 and c.staleness_bound is None and c.max_staleness == 50


def test_dssp_stays_within_the_upper_bound():
    c = cadence.DSSP(3, 1, 4)
    assert (c.lower_bound, c.upper_bound, c.staleness_bound, c.predictor) == (1, 4, 4, "last")
    rng = np.random.default_rng(3)
    pace = [0.3, 1.0, 1.7]
    next_t = list(pace)
    waiting = set()
    for _ in range(600):
        p = min((q for q in range(3) if q not in waiting), key=lambda q: next_t[q])
        d = c.push(p, next_t[p])
        now = next_t[p]
        for q in d.released:
            waiting.discard(q)
            next_t[q] = now + pace[q] * rng.uniform(0.9, 1.1)
        if d.proceed:
            next_t[p] = now + pace[p] * rng.uniform(0.9, 1.1)
        else:
            waiting.add(p)
        for q in range(3):
            if q not in waiting:
                assert c.staleness(q) <= 4
    assert c.grants >= 0 and c.extra_iterations(0) >= 0


def test_elastic_bsp_plans_barriers():
    c = cadence.ElasticBSP(3, 5)
    assert c.is_monitoring and c.plan().planned is False and c.supersteps.monitoring
    assert (c.lookahead, c.predictor, c.variant) == (5, "last", "fast")
    pace = [1.0, 1.3, 2.1]
    t = [0.0, 0.0, 0.0]
    waiting = set()
    for _ in range(300):
        p = min((q for q in range(3) if q not in waiting), key=lambda q: t[q] + pace[q])
        t[p] += pace[p]
        d = c.push(p, t[p])
        for q in d.released:
            waiting.discard(q)
            t[q] = t[p]
        if not d.proceed:
            waiting.add(p)
        if c.plan().planned:
            remaining = c.plan().remaining
            assert all(-1 <= r <= 5 for r in remaining)
    assert c.barriers > 0 and c.supersteps.barriers == c.barriers
    assert 1 <= c.max_superstep_iterations and len(c.last_superstep_iterations) == 3
    assert c.fallbacks >= 0


def test_add_and_remove_workers():
    c = cadence.make_controller("bsp", 2)
    assert c.push(0, 1.0).proceed is False
    assert c.remove_worker(1) == [0]  # 0 waited only for 1
    assert c.workers == [0] and c.active_workers == 1 and not c.is_active(1)
    assert c.clocks == [1, None]
    new = c.add_worker()
    assert new == 2 and c.worker_capacity == 3 and c.workers == [0, 2]
    assert c.clock(2) == 1  # joins at the slowest clock


def test_copies_are_independent():
    c = cadence.make_controller("ssp:1", 2)
    c.push(0, 1.0)
    d = copy.deepcopy(c)
    assert type(d) is cadence.SSP and d.clocks == c.clocks
    d.push(0, 2.0)
    assert c.clock(0) == 1 and d.clock(0) == 2
    assert copy.copy(c).clocks == [1, 0]


def test_repr_and_decision_repr():
    c = cadence.make_controller("ssp:3", 4)
    assert repr(c) == "cadence.make_controller('ssp:3', 4)"
    assert repr(c.push(1, 0.5)) == "Decision(proceed=True, released=[])"


@pytest.mark.parametrize("config, message", [
    ("sssp:3", "unknown policy 'sssp:3'"),
    ("ssp", "must look like 'ssp:<s>'"),
    ("ssp:x", "bad staleness s 'x'"),
    ("ssp:-1", "bad staleness s '-1'"),
    ("dssp:3", "dssp:<s_L>:<s_U>"),
    ("dssp:5:3", "must be >= lower bound"),
    ("dssp:3:15:median", "median"),
    ("elastic:0", "lookahead R must be >= 1"),
    ("elastic:15:fastest", "unknown ZipLine variant 'fastest'"),
    ("elastic:15:mean:0", "k must be >= 1"),
    ("bsp:1", "must look like 'bsp'"),
    ("", "unknown policy ''"),
])
def test_typo_config_strings_raise_value_errors_naming_the_string(config, message):
    with pytest.raises(ValueError, match=message) as info:
        cadence.make_controller(config, 4)
    assert isinstance(info.value, cadence.Error)
    assert isinstance(info.value, (cadence.ParseError, cadence.InvalidParameterError))


def test_parse_and_range_errors_have_their_own_classes():
    with pytest.raises(cadence.ParseError):
        cadence.make_controller("ssp:x", 4)
    with pytest.raises(cadence.InvalidParameterError, match="policy 'dssp:5:3' for 4 workers"):
        cadence.make_controller("dssp:5:3", 4)


@pytest.mark.parametrize("worker", [-1, 4, 2**32, 2**40])
def test_worker_out_of_range_raises_index_error_naming_the_id(worker):
    c = cadence.make_controller("ssp:3", 4)
    with pytest.raises(IndexError, match=str(worker)) as info:
        c.push(worker, 1.0)
    assert isinstance(info.value, cadence.WorkerError)
    for call in (c.remove_worker, c.clock, c.is_waiting, c.staleness, c.waiting_for):
        with pytest.raises(cadence.WorkerError, match=str(worker)):
            call(worker)
    assert c.is_active(worker) is False


def test_protocol_errors_change_nothing():
    c = cadence.make_controller("bsp", 2)
    c.push(0, 1.0)
    with pytest.raises(cadence.WorkerError, match="wait"):
        c.push(0, 2.0)  # still waiting to be released
    with pytest.raises(cadence.TimeError):
        c.push(1, 0.5)  # earlier than the last push
    with pytest.raises(cadence.TimeError):
        c.push(1, math.nan)
    with pytest.raises(cadence.TimeError):
        c.push(1, math.inf)
    assert c.clocks == [1, 0] and c.is_waiting(0)
    c.remove_worker(1)
    with pytest.raises(cadence.WorkerError, match="1"):
        c.remove_worker(1)


def test_wrong_argument_types_and_counts():
    with pytest.raises(cadence.InvalidParameterError, match="workers must be >= 0, got -3"):
        cadence.make_controller("bsp", -3)
    with pytest.raises(cadence.InvalidParameterError, match="workers"):
        cadence.SSP(-1, 2)
    with pytest.raises(cadence.InvalidParameterError, match="staleness bound s must be >= 0"):
        cadence.SSP(4, -2)
    with pytest.raises(cadence.InvalidParameterError, match="max_workers"):
        cadence.make_controller("bsp", 2**30)
    with pytest.raises(cadence.InvalidParameterError, match="history"):
        cadence.DSSP(4, 1, 3, predictor="mean:3", history=1)
    with pytest.raises(cadence.ParseError, match="unknown predictor"):
        cadence.ElasticBSP(4, 5, predictor="fancy")
    with pytest.raises(cadence.ParseError, match="unknown ZipLine variant"):
        cadence.ElasticBSP(4, 5, variant="slow")
    with pytest.raises(TypeError):
        cadence.make_controller(3, 4)
    with pytest.raises(TypeError):
        cadence.make_controller("bsp", 4).push(0, "soon")


def test_policy_grammar_lists_every_policy():
    g = cadence.policy_grammar()
    for name in ("bsp", "asp", "ssp", "dssp", "elastic"):
        assert name in g
