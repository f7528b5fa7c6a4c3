"""The simulator as plain Python objects: each run is a dict with the keys and values that
``cadence-sim --json`` prints for it."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from . import _core


def scenarios() -> List[Dict[str, Any]]:
    """The named scenarios: dicts with ``name``, ``default_workers``, ``seconds`` (default run
    length) and ``description``."""
    return list(_core._scenarios())


def simulate(
    policy: str,
    scenario: str = "hetero16",
    *,
    workers: int = 0,
    seed: int = 1,
    seconds: Optional[float] = None,
    iterations: Optional[int] = None,
    push_cost: Optional[float] = None,
    pull_cost: Optional[float] = None,
) -> Dict[str, Any]:
    """Runs policy ``policy`` (a :func:`cadence.make_controller` config) on a simulated
    parameter-server cluster.

    Args:
        policy: e.g. ``"ssp:3"``, ``"dssp:3:15"``, ``"elastic:15"``.
        scenario: a name from :func:`scenarios` (default ``"hetero16"``).
        workers: cluster size (0: the scenario's own).
        seed: random seed; a seed gives the same run every time.
        seconds: simulated seconds to run (default: the scenario's own) ...
        iterations: ... or instead run until every worker made this many iterations.
        push_cost, pull_cost: seconds for a push to reach the server / for a pull (default:
            the scenario's).

    Returns:
        A dict with the keys of ``cadence-sim --json`` (policy, scenario, seed, workers,
        iterations_per_second, wait_fraction, start_staleness_p99, barriers, ...; None where a
        field does not apply) plus the histograms ``start_staleness_histogram`` and
        ``updates_behind_histogram`` (count per value). Everything but
        ``controller_ns_per_push`` is a pure function of the arguments.

    The GIL is released while the simulation runs (long runs cannot be interrupted with
    Ctrl-C). Raises ParseError / InvalidParameterError for a bad policy, scenario or
    parameter.
    """
    text, start_hist, behind_hist = _core._simulate(
        policy, scenario, workers, seed, seconds, iterations, push_cost, pull_cost
    )
    out: Dict[str, Any] = json.loads(text)[0]
    out["start_staleness_histogram"] = list(start_hist)
    out["updates_behind_histogram"] = list(behind_hist)
    return out


def simulate_collective(
    mode: str,
    scenario: str = "hetero16",
    *,
    workers: int = 0,
    seed: int = 1,
    seconds: Optional[float] = None,
    iterations: Optional[int] = None,
    push_cost: Optional[float] = None,
    pull_cost: Optional[float] = None,
    allreduce_cost: Optional[float] = None,
) -> Dict[str, Any]:
    """Runs a collective (all-reduce, no server) mode: ``"bsp"``, ``"periodic:<k>"`` or
    ``"elastic:<R>[:...]"`` (planned by :class:`cadence.ElasticPlanner`'s C++ planner).

    ``allreduce_cost`` is the seconds of one merge (default: push + pull cost). Returns a dict
    with the keys of ``cadence-sim --collective --json``. Other arguments as :func:`simulate`.
    """
    text = _core._simulate_collective(
        mode, scenario, workers, seed, seconds, iterations, push_cost, pull_cost, allreduce_cost
    )
    return json.loads(text)[0]
