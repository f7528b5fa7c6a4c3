"""Cadence: synchronization policies for distributed deep-learning training.

Bindings over the Cadence C++ headers:

* controllers -- :func:`make_controller` and the policy classes :class:`BSP`, :class:`ASP`,
  :class:`SSP`, :class:`DSSP`, :class:`ElasticBSP` (all :class:`Controller` subclasses);
* predictors -- :class:`Predictor` ("last", "mean:K", "median:K", "ewma:ALPHA");
* ZipLine -- :func:`zipline` on NumPy rows of predicted push times;
* the simulator -- :func:`simulate`, :func:`simulate_collective`, :func:`scenarios`;
* ElasticBSP over collectives -- :class:`ElasticPlanner`, the plan every rank computes;
* local-SGD sync schedules -- :class:`OuterSchedule` (fixed, elastic, bounded lag, quorum), the
  :class:`OuterPlan` every rank of a DiLoCo job computes.

Every exception derives from :class:`cadence.Error` and from the built-in exception that fits
(``ValueError`` for bad config strings and parameters, ``IndexError`` for unknown workers,
``TypeError`` for arrays of the wrong dtype); messages are the C++ library's.

``cadence.torch`` (PyTorch integration) is imported on demand; this package works without torch.
"""

from __future__ import annotations

try:
    from . import _core
except ImportError as _e:  # the pure-Python tree without its compiled part
    raise ImportError(
        "cadence: the compiled extension cadence._core is missing or did not load "
        f"({_e}). This happens when the source tree's python/ directory is imported (for example "
        "with PYTHONPATH=python) instead of the installed package: run `pip install .` at the "
        "repository root (docs/python.md), and import cadence from outside python/.") from _e
from ._core import (
    ArrayTypeError,
    ASP,
    BSP,
    Controller,
    Decision,
    DeadlockError,
    DeviceError,
    DSSP,
    ElasticBSP,
    ElasticPlan,
    ElasticPlanner,
    ElasticRound,
    Error,
    InvalidParameterError,
    OuterPlan,
    OuterSchedule,
    ParseError,
    Predictor,
    SSP,
    SuperstepStatus,
    TimeError,
    TimeoutError,
    TransportError,
    WorkerError,
    ZiplineInputError,
    make_controller,
    policy_grammar,
)
from ._planner import make_record
from ._sim import scenarios, simulate, simulate_collective
from ._zipline import ZiplineResult, zipline, zipline_variants

__version__: str = _core.__version__

__all__ = [
    "ASP",
    "ArrayTypeError",
    "BSP",
    "Controller",
    "DSSP",
    "DeadlockError",
    "Decision",
    "DeviceError",
    "ElasticBSP",
    "ElasticPlan",
    "ElasticPlanner",
    "ElasticRound",
    "Error",
    "InvalidParameterError",
    "OuterPlan",
    "OuterSchedule",
    "ParseError",
    "Predictor",
    "SSP",
    "SuperstepStatus",
    "TimeError",
    "TimeoutError",
    "TransportError",
    "WorkerError",
    "ZiplineInputError",
    "ZiplineResult",
    "make_controller",
    "make_record",
    "policy_grammar",
    "scenarios",
    "simulate",
    "simulate_collective",
    "zipline",
    "zipline_variants",
    "__version__",
]
