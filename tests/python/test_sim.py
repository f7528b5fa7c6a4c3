"""The simulator through the bindings: plain Python results, determinism, and bad arguments."""

import pytest

import cadence


def test_scenarios_are_plain_dicts():
    s = cadence.scenarios()
    names = [x["name"] for x in s]
    assert "hetero16" in names and "failure8" in names
    assert all(set(x) == {"name", "default_workers", "seconds", "description"} for x in s)


def test_simulate_returns_plain_values_and_is_deterministic():
    a = cadence.simulate("elastic:6", "hetero2", seconds=10)
    b = cadence.simulate("elastic:6", "hetero2", seconds=10)
    for key in ("controller_ns_per_push", "events_per_second"):  # wall-clock measurements
        a.pop(key), b.pop(key)
    assert a == b
    assert a["policy"] == "elastic:6:last:fast" and a["workers"] == 2
    assert isinstance(a["barriers"], int) and isinstance(a["wait_fraction"], float)
    assert all(isinstance(v, (int, float, str, list, type(None))) for v in a.values())
    assert cadence.simulate("ssp:2", "hetero2", seconds=10)["barriers"] is None


def test_iterations_and_workers():
    r = cadence.simulate("asp", "hetero2", workers=3, iterations=20)
    assert r["workers"] == 3 and r["iterations"] == 60


def test_collective_modes():
    r = cadence.simulate_collective("periodic:4", "hetero2", seconds=10, allreduce_cost=0.01)
    assert r["mode"] == "periodic:4" and r["max_local_steps"] == 4


@pytest.mark.parametrize("call, error, message", [
    (lambda: cadence.simulate("ssp:x"), cadence.ParseError, "bad staleness s 'x'"),
    (lambda: cadence.simulate("bsp", "nowhere"), cadence.InvalidParameterError, "unknown scenario 'nowhere'"),
    (lambda: cadence.simulate("bsp", seconds=1, iterations=1), cadence.InvalidParameterError, "not both"),
    (lambda: cadence.simulate("bsp", seconds=0), cadence.InvalidParameterError, "seconds must be finite and > 0"),
    (lambda: cadence.simulate("bsp", iterations=0), cadence.InvalidParameterError, "iterations must be >= 1"),
    (lambda: cadence.simulate("bsp", workers=-2), cadence.InvalidParameterError, "workers must be >= 0"),
    (lambda: cadence.simulate("bsp", seed=-1), cadence.InvalidParameterError, "seed must be >= 0"),
    (lambda: cadence.simulate("bsp", push_cost=-1.0, seconds=1), cadence.InvalidParameterError, "push_seconds"),
    (lambda: cadence.simulate_collective("ssp:3", seconds=1), cadence.Error, "unknown collective mode 'ssp:3'"),
])
def test_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()
