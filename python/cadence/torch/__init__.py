"""PyTorch integration of Cadence: DiLoCo (local SGD with an outer optimizer, streaming
fragments), ElasticBSP and periodic model averaging over
``torch.distributed`` (a hand-written loop, ``PostLocalSGDOptimizer``, a DDP communication hook;
plain or DDP models, or across replica groups that run DDP or FSDP2 inside; CPU or CUDA;
checkpoints), a parameter server that runs any Cadence policy over ``torch.distributed`` point-to-point
calls, ``broadcast_parameters`` for the start of a job, and ``FaultTolerantAverager`` and
``FaultTolerantDiLoCo``: model averaging and DiLoCo over ``cadence.membership`` (ZeroMQ) that
survive a lost process and admit a replacement.

``import cadence`` never imports torch; this subpackage does, and needs ``torch.distributed``.
"""
try:
    import torch as _torch  # noqa: F401  (absolute import: the real torch, not this package)
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("cadence.torch needs PyTorch: pip install 'cadence-sync[torch]' (from a clone: "
                      "pip install '.[torch]'; on Debian, python3-torch seen from a venv made with "
                      f"--system-site-packages); import failed: {e}") from e
if not _dist.is_available():  # pragma: no cover
    raise ImportError("cadence.torch needs torch.distributed, which this PyTorch build lacks")

from ._averager_base import OPTIMIZER_STATE, ReplicaGroups, replica_groups  # noqa: E402
from ._broadcast import broadcast_parameters  # noqa: E402
from ._ddp import averager_hook, no_buffer_sync  # noqa: E402
from ._diloco import DiLoCo  # noqa: E402
from ._elastic import MERGE_RULES, ElasticModelAverager  # noqa: E402
from ._fault_tolerant import FaultTolerantAverager  # noqa: E402
from ._fault_tolerant_diloco import FaultTolerantDiLoCo  # noqa: E402
from ._periodic import PeriodicModelAverager  # noqa: E402
from ._common import InvalidParameterError, TransportError, WorkerError  # noqa: E402
from ._ps_core import Eviction, Join, PSStats  # noqa: E402
from ._ps_protocol import SGD, flatten, flatten_grads, unflatten_into  # noqa: E402
from ._ps_server import ParameterServer  # noqa: E402
from ._ps_worker import PSWorker  # noqa: E402

__all__ = [
    "ElasticModelAverager", "PeriodicModelAverager", "MERGE_RULES", "OPTIMIZER_STATE", "DiLoCo",
    "FaultTolerantAverager", "FaultTolerantDiLoCo",
    "replica_groups", "ReplicaGroups", "averager_hook", "no_buffer_sync",
    "broadcast_parameters",
    "ParameterServer", "PSWorker", "PSStats", "Eviction", "Join", "SGD",
    "flatten", "flatten_grads", "unflatten_into",
    "TransportError", "WorkerError", "InvalidParameterError",
]
