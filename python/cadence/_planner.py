"""Helpers around :class:`cadence.ElasticPlanner`."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def make_record(history: int, local_steps: int, durations_us: Sequence[int]) -> np.ndarray:
    """One rank's timing record for :meth:`cadence.ElasticPlanner.plan`: an int64 array of
    ``history + 2`` values, [local steps since the last barrier, number of durations kept, the
    latest ``history`` step durations in integer microseconds (oldest first), zero-padded].
    This is the layout the C++ elastic_averager all-gathers; pass ``planner.history``.
    """
    if history < 2:
        raise ValueError(f"cadence.make_record: history must be >= 2, got {history}")
    if local_steps < 0:
        raise ValueError(f"cadence.make_record: local_steps must be >= 0, got {local_steps}")
    d = np.asarray(durations_us, dtype=np.int64).reshape(-1)[-history:]
    if d.size and int(d.min()) < 0:
        raise ValueError("cadence.make_record: step durations must be >= 0 microseconds")
    out = np.zeros(history + 2, dtype=np.int64)
    out[0] = local_steps
    out[1] = d.size
    out[2 : 2 + d.size] = d
    return out
