# How the averagers meet torch's module wrappers: DDP (its forward buffer sync, spelled two ways
# across torch versions; no_sync; its communication hook), FSDP2's DTensor parameters (averaged
# shard by shard across replica groups), and the wrappers they refuse by name (torch.compile's,
# which hides the module it wraps; FSDP1's FullyShardedDataParallel).
#
# Map: DDP's buffer sync (no_buffer_sync, forward_syncs_buffers) · module checks (check_wrapper)
# · DTensor shards (is_dtensor, local) · the communication hook (averager_hook).
# (No `from __future__ import annotations` here: DDP checks the hook's return annotation, which
# must then be the object torch.futures.Future[torch.Tensor], not a string.)
import inspect

import torch
import torch.distributed as dist

from ._common import InvalidParameterError

DDP = torch.nn.parallel.DistributedDataParallel

# ---- DDP's buffer sync --------------------------------------------------------------------------

# torch 2.13 renamed DDP's broadcast_buffers (deprecated, with a FutureWarning) to
# forward_sync_buffers; 1.13 to 2.12 know only the old name.
_NEW_NAME = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters


def no_buffer_sync() -> dict:
    """The keyword arguments that stop ``DistributedDataParallel`` from broadcasting rank 0's
    buffers at every forward pass, as the running torch spells them:
    ``{"forward_sync_buffers": False}`` from torch 2.13 (where ``broadcast_buffers`` is
    deprecated), ``{"broadcast_buffers": False}`` before. Build a DDP model for the averagers
    with ``DistributedDataParallel(model, **cadence.torch.no_buffer_sync())``. (The new flag
    still broadcasts the buffers once, at construction: every rank then starts from rank 0's.)"""
    return {"forward_sync_buffers": False} if _NEW_NAME else {"broadcast_buffers": False}


def forward_syncs_buffers(ddp) -> bool:
    """Whether a DDP model broadcasts its buffers in forward passes."""
    v = getattr(ddp, "forward_sync_buffers", None)  # torch >= 2.13
    return bool(ddp.broadcast_buffers if v is None else v)


def buffer_sync_refusal(here: str) -> str:
    spelled = ", ".join(f"{k}={v}" for k, v in no_buffer_sync().items())
    return (f"{here}DistributedDataParallel syncs buffers in forward passes (forward_sync_buffers, "
            "broadcast_buffers before torch 2.13, is True): it then broadcasts rank 0's buffers "
            "(BatchNorm statistics) at every forward pass, a collective every rank must join at "
            "the same step, which ranks that run their own number of local steps do not, and it "
            "overwrites every rank's statistics with rank 0's. Build it with "
            f"DistributedDataParallel(..., {spelled}) (cadence.torch.no_buffer_sync() gives the "
            "spelling of the running torch): this averager merges the buffers at each barrier "
            "(merge_buffers=True)")


# ---- module checks ------------------------------------------------------------------------------

def check_wrapper(here: str, module) -> None:
    """Refuses, by name, the wrappers an averager cannot see through."""
    name = type(module).__name__
    if name == "OptimizedModule":  # what torch.compile(m) returns
        raise InvalidParameterError(
            f"{here}got the wrapper torch.compile() returned (OptimizedModule): pass the module "
            "you compiled (the DDP model, or the plain one) to the averager (module=, sync(), "
            "local_step(), register_comm_hook()) and call the compiled one in your step; they "
            "share their parameters")
    fsdp1 = getattr(getattr(torch.distributed, "fsdp", None), "FullyShardedDataParallel", None)
    if fsdp1 is not None and isinstance(module, fsdp1):
        raise InvalidParameterError(
            f"{here}FullyShardedDataParallel (FSDP1) is not supported: shard the model with "
            "FSDP2's fully_shard() inside each replica group (replica_group=) instead; its DTensor "
            "shards are averaged shard by shard across the groups")


# ---- DTensor shards -----------------------------------------------------------------------------

def is_dtensor(t) -> bool:
    """A DTensor (FSDP2's parameters, tensor parallelism), by class name: its module moved from
    torch.distributed._tensor to torch.distributed.tensor across torch 2.x."""
    return any(c.__name__ == "DTensor" for c in type(t).__mro__)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor a merge reads and writes: a DTensor's local shard (``to_local()``, which
    shares its storage), else the tensor."""
    return t.to_local() if is_dtensor(t) else t


# ---- the communication hook ---------------------------------------------------------------------

def averager_hook(averager, bucket) -> torch.futures.Future[torch.Tensor]:
    """The averagers as a DDP communication hook:
    ``ddp.register_comm_hook(averager, cadence.torch.averager_hook)`` (or
    ``averager.register_comm_hook(ddp)``, which checks the model first). DDP then calls it for
    each gradient bucket instead of all-reducing: during ``PeriodicModelAverager``'s warm-up it
    all-reduces the bucket (the mean over the averager's group, as DDP would), afterwards it
    hands back the local gradient, with no collective, so ranks may run their own numbers of
    steps between merges (what ``local_step()`` does with ``no_sync()``). torch's
    ``post_localSGD_hook`` with ``post_local_gradient_allreduce=False`` is the same idea."""
    buf = bucket.buffer()
    if averager._ddp_syncs_step():
        work = dist.all_reduce(buf.div_(averager.world_size), group=averager.process_group,
                               async_op=True)
        return work.get_future().then(lambda f: f.value()[0])
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut
