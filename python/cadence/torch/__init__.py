"""PyTorch integration of Cadence: ElasticBSP and periodic model averaging over
``torch.distributed`` (usable with ``PostLocalSGDOptimizer`` or a hand-written loop), and a
parameter server that runs any Cadence policy over ``torch.distributed`` point-to-point calls.

``import cadence`` never imports torch; this subpackage does, and needs ``torch.distributed``.
"""
try:
    import torch as _torch  # noqa: F401  (absolute import: the real torch, not this package)
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("cadence.torch needs PyTorch (pip install torch, or Debian's python3-torch); "
                      f"import failed: {e}") from e
if not _dist.is_available():  # pragma: no cover
    raise ImportError("cadence.torch needs torch.distributed, which this PyTorch build lacks")

from ._averagers import MERGE_RULES, ElasticModelAverager, PeriodicModelAverager  # noqa: E402
from ._common import InvalidParameterError, TransportError, WorkerError  # noqa: E402
from ._ps import (SGD, Eviction, ParameterServer, PSStats, PSWorker, flatten,  # noqa: E402
                  flatten_grads, unflatten_into)

__all__ = [
    "ElasticModelAverager", "PeriodicModelAverager", "MERGE_RULES",
    "ParameterServer", "PSWorker", "PSStats", "Eviction", "SGD",
    "flatten", "flatten_grads", "unflatten_into",
    "TransportError", "WorkerError", "InvalidParameterError",
]
