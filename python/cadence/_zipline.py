"""cadence.zipline: the barrier-planning search on NumPy rows (typed front end of _core)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Union

import numpy as np

from . import _core

Rows = Union[Sequence[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ZiplineResult:
    """The answer of a ZipLine search (identical for every variant).

    Attributes:
        spread: the minimum over one-per-row selections of max - min (int for int64 rows,
            float for float64 rows).
        barrier: the largest element of the optimal selection with the smallest such maximum.
        choice: per row, the index of its latest element <= barrier.
        variant: the variant that ran.
    """

    spread: Union[int, float]
    barrier: Union[int, float]
    choice: List[int]
    variant: str


def _thrust_module():
    try:
        from . import _thrust  # type: ignore[attr-defined]
    except ImportError as e:
        raise _core.InvalidParameterError(
            "cadence.zipline: variant 'thrust' is not available: this build of the cadence "
            "package has no Thrust backend (reinstall where the CUDA toolkit's CCCL headers are "
            "found, with -Ccmake.define.CADENCE_PYTHON_THRUST=ON, the default)"
        ) from e
    return _thrust


def zipline_variants() -> List[str]:
    """The variant names :func:`zipline` accepts in this build: 'zipline' (the paper's
    Algorithm 2), 'opt', 'opt-bs', 'fast' (the default), and 'thrust' when the package was
    built with the Thrust backend (OpenMP or serial C++ on the CPU)."""
    names = list(_core._cpu_variants())
    try:
        from . import _thrust  # type: ignore[attr-defined]  # noqa: F401
    except ImportError:
        return names
    return names + ["thrust"]


def zipline(rows: Rows, variant: str = "fast") -> ZiplineResult:
    """Plans a barrier: picks one predicted push per row (worker) so that the spread (latest
    minus earliest pick) is minimal; among optimal sets the smallest barrier wins, and each
    row's choice is its latest element <= the barrier. The contract of ``cadence-zipline``.

    Args:
        rows: one strictly increasing row of predicted push times per worker: a list (or tuple)
            of 1-D NumPy arrays, or a 2-D array (one row per worker). int64 or float64 (all
            rows alike), C-contiguous. Rows are read in place, whether they share one buffer
            (a 2-D array, ``list(matrix)``) or are separate arrays.
        variant: 'fast' (default), 'opt-bs', 'opt', 'zipline', or 'thrust' (see
            :func:`zipline_variants`). All return the same answer.

    The GIL is released during the search; do not modify the rows from another thread
    meanwhile.

    Raises:
        ArrayTypeError: rows are not NumPy arrays, or not int64/float64 (``TypeError``).
        InvalidParameterError: wrong number of dimensions, or a non-contiguous array.
        ZiplineInputError: no rows, an empty row, a row not strictly increasing, a non-finite
            value (the message names the row and index).
        ParseError: an unknown variant name.
    """
    if variant == "thrust":
        spread, barrier, choice = _thrust_module()._zipline(rows)
    else:
        if variant not in ("zipline", "opt", "opt-bs", "fast"):
            raise _core.ParseError(
                f"cadence: unknown ZipLine variant '{variant}' (valid: "
                + ", ".join(zipline_variants())
                + ")"
            )
        spread, barrier, choice = _core._zipline(rows, variant)
    return ZiplineResult(spread, barrier, choice, variant)
