"""Means over seeds with 95% Student-t intervals, and paired differences between methods (no SciPy)."""

from __future__ import annotations

import math

import numpy as np

# t(0.975, df) for df = 1..30 (standard tables); beyond 30 the normal 1.96 (within 2% of t from df 31 on)
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("t975: needs df >= 1")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values):
    """(mean, half-width) of the 95% interval mean +- t(0.975, n-1) sd / sqrt(n); half-width NaN for one value."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci: no values")
    m = float(x.mean())
    if x.size < 2:
        return m, float("nan")
    return m, t975(x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)


def paired_difference(a, b) -> dict:
    """Mean of a - b over paired runs (same seed), its 95% interval, and whether it excludes 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError("paired_difference: a and b differ in length")
    m, h = mean_ci(a - b)
    return {"diff": m, "half": h, "outside_noise": bool(h == h and (m - h > 0 or m + h < 0))}
