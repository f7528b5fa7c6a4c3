# broadcast_parameters: one rank's parameters (and a module's buffers) to every rank of a group,
# bucketed by dtype and device, with a bounded wait; the start of every torchrun job that does not
# build DDP (which broadcasts at construction) or that loaded a checkpoint on one rank.
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from . import _device
from ._common import (Deadline, InvalidParameterError, TransportError, check_seconds, copy_slices,
                      flatten_params, global_rank, group_info, group_timeout, wait_work, where)

_DDP = torch.nn.parallel.DistributedDataParallel


def broadcast_parameters(module_or_params, src: int = 0, *, process_group=None,
                         buffers: bool = True, timeout: Optional[float] = None) -> None:
    """Copies rank ``src``'s parameters to every rank of ``process_group`` (default: the world),
    in place: a module's parameters and, with ``buffers``, its buffers (all dtypes: BatchNorm's
    ``num_batches_tracked`` too), or a list of tensors / ``optimizer.param_groups``. Every rank
    calls it with the same tensors in the same order. One broadcast per (dtype, device); on
    NCCL the tensors must be on the rank's GPU. ``src`` is a rank in the group (Horovod's
    ``root_rank``). Raises TransportError when it does not complete within ``timeout`` seconds
    (default: the process group's timeout), InvalidParameterError for a bad ``src``."""
    component = "broadcast_parameters"
    group, rank, size = group_info(component, process_group)
    here = where(component, rank, size)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < size:
        raise InvalidParameterError(f"{here}src {src!r} is not a rank of the group [0, {size})")
    seconds = group_timeout(group) if timeout is None else check_seconds(component, "timeout", timeout)
    if isinstance(module_or_params, torch.nn.Module):
        module = module_or_params.module if isinstance(module_or_params, _DDP) else module_or_params
        tensors = list(module.parameters())
        if buffers:
            seen = {id(t) for t in tensors}
            tensors += [b for b in module.buffers() if id(b) not in seen]
    else:
        tensors = flatten_params(module_or_params)
    if size == 1 or not tensors:
        return
    ops = _device.ops
    buckets: Dict[tuple, List[torch.Tensor]] = {}
    for t in tensors:
        buckets.setdefault((t.dtype, ops.device_of(t)), []).append(t)
    deadline = Deadline(seconds)
    started = []
    for (dtype, device), ts in buckets.items():
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        wire = flat.view(torch.uint8) if dtype == torch.bool else flat  # gloo has no bool
        work = dist.broadcast(wire, global_rank(group, src), group=group, async_op=True)
        started.append((ts, flat, work, device, dtype))
    for ts, flat, work, device, dtype in started:
        try:
            wait_work(work, deadline, poll=ops.is_accelerator(device))
        except RuntimeError as e:
            raise TransportError(f"{here}broadcast of the {dtype} tensors on {device} from rank "
                                 f"{src} failed after {deadline.elapsed():.3f} s (timeout "
                                 f"{seconds:g} s): {e}") from e
        if rank != src:
            copy_slices(ts, flat)
