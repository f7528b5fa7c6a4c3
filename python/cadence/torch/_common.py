# Shared pieces of cadence.torch: the exception types, process-group checks, and bounded waits on
# torch.distributed work objects whose failures name the operation, its sequence number and rank.
from __future__ import annotations

import datetime
import math
import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

try:  # the bindings' exception types, so one `except cadence.TransportError` catches both
    import cadence as _cadence

    TransportError = _cadence.TransportError
    WorkerError = _cadence.WorkerError
    InvalidParameterError = _cadence.InvalidParameterError
except (ImportError, AttributeError):  # pragma: no cover - only without the bindings

    class _Error(RuntimeError):
        pass

    class TransportError(_Error):  # type: ignore[no-redef]
        pass

    class WorkerError(_Error, IndexError):  # type: ignore[no-redef]
        pass

    class InvalidParameterError(_Error, ValueError):  # type: ignore[no-redef]
        pass


def where(component: str, rank: int, size: int) -> str:
    """The prefix every message of `component` starts with, as the C++ adapters write it."""
    return f"cadence.torch.{component} (rank {rank} of {size}): "


def group_info(component: str, group) -> tuple:
    """(group, rank in group, group size); a clear error when torch.distributed is not ready."""
    if not dist.is_available():
        raise InvalidParameterError(f"cadence.torch.{component}: torch.distributed is not available "
                                    "in this build of PyTorch")
    if not dist.is_initialized():
        raise InvalidParameterError(f"cadence.torch.{component}: torch.distributed is not initialized: "
                                    "call torch.distributed.init_process_group() first")
    g = group if group is not None else dist.group.WORLD
    if dist.distributed_c10d._rank_not_in_group(g):
        raise InvalidParameterError(f"cadence.torch.{component}: this process (global rank "
                                    f"{dist.get_rank()}) is not a member of the process group")
    return g, dist.get_rank(g), dist.get_world_size(g)


def global_rank(group, rank: int) -> int:
    """The global rank of `rank` in `group` (torch's p2p calls take global ranks)."""
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.distributed_c10d._get_global_rank(group, rank)


def check_seconds(component: str, name: str, value, allow_none: bool = False) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"cadence.torch.{component}: {name} must be a number of seconds "
                                    f"or a datetime.timedelta, got {value!r}") from None
    if not (v > 0) or math.isinf(v):
        raise InvalidParameterError(f"cadence.torch.{component}: {name} must be > 0 and finite, "
                                    f"got {value!r}")
    return v


class Deadline:
    """A point on the monotonic clock; remaining() as a timedelta for Work.wait()."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def remaining(self) -> datetime.timedelta:
        # at least 1 ms: a zero timeout means "no timeout" to some torch versions
        return datetime.timedelta(seconds=max(self.left(), 0.001))


class Stragglers:
    """Names the ranks that did not reach a collective: each rank counts its arrivals in a key of
    the process group's store (one `add` per call, one key per rank, nothing to delete); after a
    failure at call `seq`, the ranks whose count is below `seq` are the ones the others waited
    for. `enabled=False` skips the store entirely (the names are then unknown)."""

    def __init__(self, component: str, group, rank: int, size: int, instance: int,
                 enabled: bool = True):
        self._store = None
        if enabled:
            try:
                self._store = dist.distributed_c10d._get_default_store()
            except Exception:  # pragma: no cover - a group without a store: the names are unknown
                self._store = None
        self._prefix = f"cadence.torch/{component}/{instance}/"
        self._group = group
        self._rank = rank
        self._size = size

    def _key(self, r: int) -> str:
        return f"{self._prefix}{global_rank(self._group, r)}"

    def arrive(self, seq: int) -> None:
        """This rank reached call `seq` (1, 2, ... in order)."""
        if self._store is not None:
            self._store.add(self._key(self._rank), 1)

    def missing(self, seq: int) -> Optional[List[int]]:
        """Ranks (in the group) that did not arrive at `seq`; None when the store cannot say."""
        if self._store is None:
            return None
        try:
            # add(key, 0) reads a counter without waiting (every store has it; 0 if unset)
            return [r for r in range(self._size) if self._store.add(self._key(r), 0) < seq]
        except Exception:
            return None


def describe_missing(missing: Optional[Sequence[int]]) -> str:
    if missing is None:
        return "the ranks that did not arrive are unknown (no store, or it did not answer)"
    if not missing:
        return "every rank arrived (a peer failed inside the operation)"
    return "rank(s) " + ", ".join(str(r) for r in missing) + " did not arrive"


def flatten_params(params) -> List[torch.Tensor]:
    """Parameters from model.parameters(), a list of tensors or optimizer.param_groups (dicts
    with "params"), each tensor once, in order."""
    out: List[torch.Tensor] = []
    seen = set()

    def add(p):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"expected tensors or parameter groups, got {type(p).__name__}")
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)

    if isinstance(params, torch.Tensor):
        add(params)
        return out
    for item in params:
        if isinstance(item, dict):
            for p in item["params"]:
                add(p)
        else:
            add(item)
    return out
