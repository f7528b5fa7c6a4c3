# The wire protocol of cadence.torch's parameter server, and what both of its ends share: message
# kinds and reply statuses, the 6-word header, the element-type codes, the four tags, who serves
# and who works in a group, the tensor helpers of the public API, the default update rule.
#
# A second implementation of the C++ protocol (include/cadence/exchange/ps/detail/protocol.hpp,
# used by cadence::exchange::parameter_server), over torch.distributed point-to-point calls
# instead of a Cadence communicator. It keeps the C++ names, and the C++ numbers where the two
# mean the same thing; the two never talk to each other. Where they differ:
#   - kinds PUSH 1, PULL 2, FINISH 3, REPLY 4 are the C++ values; JOIN (a worker the server
#     evicted asks to take part again) is this adapter's own, numbered 10, outside the C++ range
#     (C++ 5-9 are release, evicted, heartbeat, joined, shutdown: notices between servers, a
#     liveness beat, and the shutdown of a multi-server job, none of which exist here);
#   - statuses OK 0, EVICTED 1, ERROR 2 are the C++ values; CLOSED 3 (the server stopped) is
#     this adapter's own;
#   - the header's sixth word is the payload's element-type code here (1 float32, 2 float64,
#     3 float16, 4 bfloat16; 0 unknown), where the C++ header carries the worker's request
#     number: a torch.distributed stream between two ranks and one tag is in order, so a reply
#     needs no request number, and one model may be any of four dtypes.
#
# Map: constants and codes · tensor helpers (flatten, flatten_grads, unflatten_into) · SGD ·
# model and group checks (_model_info, _Roles) · tagged sends and receives.
from __future__ import annotations

import datetime
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import _device
from ._common import (InvalidParameterError, copy_slices, flatten_params, global_rank,
                      group_info)

# ---- constants and codes ------------------------------------------------------------------------

PUSH, PULL, FINISH, REPLY, JOIN = 1, 2, 3, 4, 10
OK, EVICTED, ERROR, CLOSED = 0, 1, 2, 3
HEADER_WORDS = 6  # kind, worker, iteration, count, status, dtype code

#: The adapter's four tags on the process group: control, data, reply, reply data.
DEFAULT_TAG_BASE = 0x0CAD0

# Element types a model may have, by the code the header carries (0: unknown).
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# How long the server's own threads wait on one receive or send: unbounded in practice. A gloo
# wait that times out signals the timeout to every connection of the group's context, so a
# timeout there would end the server for every worker; liveness is evict_after's job, not gloo's.
FOREVER = datetime.timedelta(days=3650)


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) + 1 if dtype in DTYPES else 0


def dtype_of(code: int) -> Optional[torch.dtype]:
    return DTYPES[code - 1] if 1 <= code <= len(DTYPES) else None


def header(kind=0, worker=0, iteration=0, count=0, status=0, dtype=0) -> torch.Tensor:
    return torch.tensor([kind, worker, iteration, count, status, dtype], dtype=torch.int64)


def tags(tag_base: int):
    if isinstance(tag_base, bool) or not isinstance(tag_base, int) or tag_base < 0:
        raise InvalidParameterError(f"cadence.torch: tag_base must be an integer >= 0, got {tag_base!r}")
    return tag_base, tag_base + 1, tag_base + 2, tag_base + 3


# ---- tensor helpers (public) --------------------------------------------------------------------

def flatten(params) -> torch.Tensor:
    """The parameters (model.parameters(), a list of tensors) as one flat tensor (a copy, on
    their device)."""
    ts = flatten_params(params)
    return torch.cat([t.detach().reshape(-1) for t in ts]) if ts else torch.zeros(0)


def flatten_grads(params) -> torch.Tensor:
    """The parameters' gradients as one flat tensor (zeros where a gradient is None)."""
    ts = flatten_params(params)
    return torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).detach().reshape(-1)
                      for t in ts]) if ts else torch.zeros(0)


def unflatten_into(params, flat: torch.Tensor) -> None:
    """Copies a flat tensor back into the parameters, in order (across devices if need be)."""
    params = flatten_params(params)
    if sum(t.numel() for t in params) != flat.numel():
        raise InvalidParameterError(f"cadence.torch.unflatten_into: {flat.numel()} values for "
                                    f"parameters of {sum(t.numel() for t in params)} elements")
    copy_slices(params, flat)



class SGD:
    """The default update rule: ``weights -= lr * gradient``. An update rule is any callable
    ``update(weights, gradient, worker)`` that changes ``weights`` (the server's flat tensor, on
    the model's device) in place."""

    def __init__(self, lr: float = 0.01):
        self.lr = float(lr)

    def __call__(self, weights: torch.Tensor, gradient: torch.Tensor, worker: int) -> None:
        weights.add_(gradient, alpha=-self.lr)


# ---- model and group checks ---------------------------------------------------------------------

def model_info(component: str, model) -> Tuple[int, torch.dtype, torch.device]:
    """(elements, dtype, device) of a model given as a size or as its parameters."""
    if isinstance(model, int) and not isinstance(model, bool):
        if model < 0:
            raise InvalidParameterError(f"cadence.torch.{component}: model size must be >= 0, got {model}")
        return model, torch.float32, _device.CPU
    ts = flatten_params(model)
    if not ts:
        return 0, torch.float32, _device.CPU
    ops = _device.ops
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1 or not ts[0].is_floating_point() or ts[0].dtype not in DTYPES:
        raise InvalidParameterError(f"cadence.torch.{component}: the model's tensors must share one "
                                    f"floating-point dtype ({', '.join(str(d) for d in DTYPES)}), "
                                    f"got {sorted(str(d) for d in dtypes)}")
    devices = {ops.device_of(t) for t in ts}
    if len(devices) != 1:
        raise InvalidParameterError(f"cadence.torch.{component}: the model's tensors must live on "
                                    f"one device, got {sorted(str(d) for d in devices)}")
    if any(t.is_sparse for t in ts):
        raise InvalidParameterError(f"cadence.torch.{component}: sparse tensors are not supported")
    return sum(t.numel() for t in ts), ts[0].dtype, ops.device_of(ts[0])


def _check_p2p_backend(component: str, group) -> None:
    be = _device.ops.backend(group)
    if not any(b in be for b in ("gloo", "mpi")):
        raise InvalidParameterError(
            f"cadence.torch.{component}: the process group's backend is {be!r}; the parameter "
            "server needs gloo (or MPI) for its point-to-point traffic (tagged messages, receives "
            "on threads). Create one beside your NCCL group with "
            "torch.distributed.new_group(backend='gloo') and pass it as group=; CUDA models are "
            "staged through pinned host buffers")


class Roles:
    """Who serves and who works in a group: the server's group rank and the workers' group
    ranks in order (a rank's slot = its position; its first worker id = its slot)."""

    def __init__(self, component: str, group, server_rank: int):
        self.group, self.rank, self.size = group_info(component, group)
        if self.size < 2:
            raise InvalidParameterError(
                f"cadence.torch.{component}: the process group has {self.size} rank; a parameter "
                "server needs at least 2 (one server and one worker)")
        if isinstance(server_rank, bool) or not isinstance(server_rank, int) \
                or not 0 <= server_rank < self.size:
            raise InvalidParameterError(f"cadence.torch.{component}: server_rank {server_rank!r} is "
                                        f"out of range [0, {self.size})")
        _check_p2p_backend(component, self.group)
        self.server = server_rank
        self.workers = [r for r in range(self.size) if r != server_rank]
        self.server_global = global_rank(self.group, server_rank)

    def slot_global(self, slot: int) -> int:
        return global_rank(self.group, self.workers[slot])

    def slot_of_rank(self, rank: int) -> int:
        return self.workers.index(rank)


# ---- tagged sends and receives ------------------------------------------------------------------

def send(t: torch.Tensor, dst: int, group, tag: int, what: str):
    _device.ops.check_host(t, what)
    return dist.isend(t, dst, group=group, tag=tag)


def recv(t: torch.Tensor, src: int, group, tag: int, what: str):
    _device.ops.check_host(t, what)
    return dist.irecv(t, src=src, group=group, tag=tag)

