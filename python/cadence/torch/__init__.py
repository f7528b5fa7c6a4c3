"""PyTorch integration of Cadence: ElasticBSP and periodic model averaging over
``torch.distributed`` (a hand-written loop, ``PostLocalSGDOptimizer``, plain or DDP models, CPU or
CUDA), a parameter server that runs any Cadence policy over ``torch.distributed`` point-to-point
calls, and ``broadcast_parameters`` for the start of a job.

``import cadence`` never imports torch; this subpackage does, and needs ``torch.distributed``.
"""
try:
    import torch as _torch  # noqa: F401  (absolute import: the real torch, not this package)
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("cadence.torch needs PyTorch (pip install 'cadence-sync[torch]', or Debian's "
                      f"python3-torch); import failed: {e}") from e
if not _dist.is_available():  # pragma: no cover
    raise ImportError("cadence.torch needs torch.distributed, which this PyTorch build lacks")

from ._averagers import (MERGE_RULES, OPTIMIZER_STATE, ElasticModelAverager,  # noqa: E402
                         PeriodicModelAverager)
from ._broadcast import broadcast_parameters  # noqa: E402
from ._common import InvalidParameterError, TransportError, WorkerError  # noqa: E402
from ._ps import (SGD, Eviction, Join, ParameterServer, PSStats, PSWorker, flatten,  # noqa: E402
                  flatten_grads, unflatten_into)

__all__ = [
    "ElasticModelAverager", "PeriodicModelAverager", "MERGE_RULES", "OPTIMIZER_STATE",
    "broadcast_parameters",
    "ParameterServer", "PSWorker", "PSStats", "Eviction", "Join", "SGD",
    "flatten", "flatten_grads", "unflatten_into",
    "TransportError", "WorkerError", "InvalidParameterError",
]
