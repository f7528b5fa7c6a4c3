# Shared pieces of cadence.torch: the exception types, process-group facts read through public
# torch APIs (the one private fallback is for torch 1.13, which has no public store accessor),
# bounded waits on torch.distributed work that
# name the operation, its sequence number and the ranks that did not arrive, and what the
# classes over cadence.membership share (flat CPU staging, replica roles).
from __future__ import annotations

import atexit
import datetime
import io
import math
import queue
import threading
import time
import weakref
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from . import _device

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


# ---- process groups (public APIs first) ---------------------------------------------------------

def group_info(component: str, group) -> tuple:
    """(group, rank in group, group size); a clear error when torch.distributed is not ready."""
    if not dist.is_available():
        raise InvalidParameterError(f"cadence.torch.{component}: torch.distributed is not available "
                                    "in this build of PyTorch")
    if not dist.is_initialized():
        raise InvalidParameterError(f"cadence.torch.{component}: torch.distributed is not initialized: "
                                    "call torch.distributed.init_process_group() first")
    g = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(g)  # -1 (1.13 and 2.x) when this process is not a member
    if rank < 0:
        raise InvalidParameterError(f"cadence.torch.{component}: this process (global rank "
                                    f"{dist.get_rank()}) is not a member of the process group")
    return g, rank, dist.get_world_size(g)


def global_rank(group, rank: int) -> int:
    """The global rank of `rank` in `group` (torch's p2p calls take global ranks)."""
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)  # public since torch 1.13, the oldest supported


def default_store(group=None):
    """The store the process group was rendezvoused with, or None: the public
    ``ProcessGroup.get_group_store()`` where torch has it (2.x). A torch release without it
    (1.13) has only the private ``distributed_c10d._get_default_store``, read there alone: a
    released version never changes, so the private name cannot break it. Pass ``store=`` to the
    averagers to give one explicitly."""
    g = group if group is not None else dist.group.WORLD
    get = getattr(g, "get_group_store", None)
    if get is None:  # torch 1.13: no public accessor
        get = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get is None:  # pragma: no cover - a torch with neither
        return None
    try:
        return get()
    except Exception:  # pragma: no cover - a group initialized without a store
        return None


def _seconds(t) -> Optional[float]:
    if isinstance(t, datetime.timedelta):
        s = t.total_seconds()
        return s if s > 0 else None
    return None


def group_timeout(group) -> float:
    """The bound of a sync when none is given, through public APIs only: the timeout of the
    store the group was rendezvoused with (init_process_group gives the default group's store
    its own timeout), else torch's default (``dist.default_pg_timeout``; NCCL's
    ``default_pg_nccl_timeout``). torch exposes a process group's own timeout through no public
    API; where it is shorter (``new_group(timeout=)``), it still ends the collective first
    (gloo's context timeout, NCCL's watchdog), and the error says so."""
    store = default_store(group)
    try:
        s = _seconds(store.timeout) if store is not None else None
        if s:
            return s
    except Exception:  # pragma: no cover - a store without a timeout
        pass
    if "nccl" in _device.ops.backend(group):
        s = _seconds(getattr(dist, "default_pg_nccl_timeout", None))
        if s:
            return s
    return _seconds(dist.default_pg_timeout) or 1800.0


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


# ---- deadlines and waits ------------------------------------------------------------------------

class Deadline:
    """A point on the monotonic clock. `reserve` seconds at its end are kept for naming the ranks
    that did not arrive, so the whole failure, names included, fits in `seconds`."""

    def __init__(self, seconds: float, reserve: float = 0.0):
        self.seconds = seconds
        self.reserve = reserve
        self.start = time.monotonic()
        self.at = self.start + seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def work_left(self) -> float:
        """What a collective may still wait."""
        return self.left() - self.reserve

    def remaining(self) -> datetime.timedelta:
        # at least 1 ms: a zero timeout means "no timeout" to some torch versions
        return datetime.timedelta(seconds=max(self.work_left(), 0.001))


class WaitTimeout(RuntimeError):
    """A host-side poll of a work object passed its deadline."""


def wait_work(work, deadline: Deadline, poll: bool) -> None:
    """Waits for `work` within the deadline. poll=False: `work.wait(timeout)`, which gloo
    honours. poll=True: polls `work.is_completed()` on the host against the deadline, then
    `work.wait()` (which raises the work's error, and on NCCL makes the current stream wait for
    it). NCCL's `wait(timeout)` only orders streams and returns at once in most torch versions,
    so without the poll a stalled peer would hang the host until NCCL's watchdog."""
    if not poll:
        work.wait(timeout=deadline.remaining())
        return
    pause = 20e-6
    while not work.is_completed():
        if deadline.work_left() <= 0:
            raise WaitTimeout(f"not completed within the deadline (polled on the host for "
                              f"{deadline.elapsed():.3f} s)")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    work.wait()


# ---- straggler names ----------------------------------------------------------------------------

# Threads that make store calls for Stragglers are daemons, so that a stalled store cannot hold
# the process at exit. But a daemon thread that comes back from a store call (which releases the
# GIL) while the interpreter finalizes is ended by pthread_exit, and that unwinding through
# torch's noexcept C++ frames calls std::terminate: "terminate called without an active
# exception" and SIGABRT after a run that had finished. So at exit (atexit runs before the
# interpreter finalizes) each such thread is told to stop and waited for, at most
# _EXIT_WAIT_SECONDS in all; only a store that stalls longer than that leaves one behind.
_EXIT_WAIT_SECONDS = 2.0
_store_threads: dict = {}  # thread -> its queue (None: it ends on its own)
_store_threads_lock = threading.Lock()


def _store_thread(target, args, name: str, q: "Optional[queue.Queue]" = None) -> threading.Thread:
    """Starts a daemon thread running target(*args) that _stop_store_threads waits for at exit
    (q: the thread's queue, to which None is posted to stop it)."""

    def run():
        try:
            target(*args)
        finally:
            with _store_threads_lock:
                _store_threads.pop(threading.current_thread(), None)

    t = threading.Thread(target=run, daemon=True, name=name)
    with _store_threads_lock:
        _store_threads[t] = q
    t.start()
    return t


def _stop_store_threads() -> None:
    with _store_threads_lock:
        items = list(_store_threads.items())
    for _, q in items:
        if q is not None:
            q.put(None)
    end = time.monotonic() + _EXIT_WAIT_SECONDS
    for t, _ in items:
        t.join(max(0.0, end - time.monotonic()))


atexit.register(_stop_store_threads)


def _post_arrivals(store, q: "queue.Queue") -> None:
    """The poster: one store add per key posted, until None (at exit, or when its Stragglers is
    collected) or until the store fails (the query after a failure will say so)."""
    while True:
        key = q.get()
        if key is None:
            return
        try:
            store.add(key, 1)
        except Exception:
            return


class Stragglers:
    """Names the ranks that did not reach a collective: each rank counts its arrivals in a key of
    a store (one `add` per call, one key per rank, nothing to delete); after a failure at call
    `seq`, the ranks whose count is below `seq` are the ones the others waited for.

    Store calls never run on the caller's thread: an arrival is posted to a helper thread (the
    sync does not wait for it), and the query after a failure runs on a thread of its own that
    is waited for only until the deadline, so a store whose host is stalled cannot stretch a
    failure past its timeout. The helper thread ends when the Stragglers is collected, and at
    exit after what was posted (bounded, see _stop_store_threads). `enabled=False` or no store:
    the names are unknown."""

    def __init__(self, component: str, group, rank: int, size: int, instance: int,
                 enabled: bool = True, store=None):
        self._store = (store if store is not None else default_store(group)) if enabled else None
        self._prefix = f"cadence.torch/{component}/{instance}/"
        self._keys = [f"{self._prefix}{global_rank(group, r)}" for r in range(size)]
        self._rank = rank
        self._size = size
        self._posts: Optional[queue.Queue] = None

    @property
    def enabled(self) -> bool:
        return self._store is not None

    def arrive(self, seq: int) -> None:
        """This rank reached call `seq` (1, 2, ... in order)."""
        if self._store is None:
            return
        if self._posts is None:
            self._posts = queue.Queue()
            # the thread holds the store and the queue, not self: the finalizer can run
            _store_thread(_post_arrivals, (self._store, self._posts), "cadence-stragglers",
                          self._posts)
            weakref.finalize(self, self._posts.put, None)
        self._posts.put(self._keys[self._rank])

    def missing(self, seq: int, deadline: Optional[Deadline] = None) -> Optional[List[int]]:
        """Ranks (in the group) that did not arrive at `seq`; None when the store cannot say
        before the deadline (at least 0.1 s is given)."""
        if self._store is None:
            return None
        out: dict = {}
        store, keys, size = self._store, self._keys, self._size

        def query():
            try:
                # add(key, 0) reads a counter without waiting (every store has it; 0 if unset)
                out["v"] = [r for r in range(size) if store.add(keys[r], 0) < seq]
            except Exception:
                out["v"] = None

        t = _store_thread(query, (), "cadence-stragglers-query")
        t.join(max(deadline.left() if deadline is not None else 5.0, 0.1))
        return out.get("v")


def describe_missing(missing: Optional[Sequence[int]]) -> str:
    if missing is None:
        return "the ranks that did not arrive are unknown (no store, or it did not answer in time)"
    if not missing:
        return "every rank arrived (a peer failed inside the operation)"
    return "rank(s) " + ", ".join(str(r) for r in missing) + " did not arrive"


# ---- tensors ------------------------------------------------------------------------------------

def flatten_params(params) -> List[torch.Tensor]:
    """Parameters from model.parameters(), a module, a list of tensors or optimizer.param_groups
    (dicts with "params"), each tensor once, in order."""
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
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    for item in params:
        if isinstance(item, dict):
            for p in item["params"]:
                add(p)
        else:
            add(item)
    return out


def copy_slices(tensors, flat: torch.Tensor) -> None:
    """Writes consecutive slices of `flat` into `tensors`, in order (the inverse of a cat)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            k = t.numel()
            t.copy_(flat[offset:offset + k].view_as(t))
            offset += k


#: Most microseconds one step may take (about 12.7 days), as the C++ elastic_averager's
#: max_duration_us: keeps every sum of a history in range.
MAX_DURATION_US = 1 << 40


def step_microseconds(here: str, s: float, shown) -> int:
    """A step's duration ``s`` (seconds) as whole microseconds, rounded up and at least 1, for
    the ElasticBSP plans; InvalidParameterError (prefixed ``here``, naming ``shown``) when it is
    not finite, negative or above MAX_DURATION_US."""
    us = math.ceil(s * 1e6) if math.isfinite(s) else -1
    if not math.isfinite(s) or s < 0 or us > MAX_DURATION_US:
        raise InvalidParameterError(f"{here}step duration {shown!r} s is not in "
                                    f"[0, {MAX_DURATION_US / 1e6:g}] s")
    return max(us, 1)


# ---- over cadence.membership: staging and replica groups (the fault-tolerant classes) ----------

class FlatStaging:
    """Flat CPU copies of ``tensors`` (parameters on any device), which a
    ``cadence.membership.Member`` registers and syncs in place: one per dtype of the tensors
    (``dtype=None``, in order of first appearance), or one of ``dtype`` for all of them
    (converted on the way in and out). :meth:`to_flat` stages the tensors, :meth:`from_flat`
    writes the copies back (dtype and device converted)."""

    def __init__(self, tensors: Sequence[torch.Tensor], dtype: Optional[torch.dtype] = None):
        self.groups: dict = {}
        for t in tensors:
            self.groups.setdefault(dtype or t.dtype, []).append(t)
        self.flats: dict = {d: torch.zeros(sum(t.numel() for t in ts), dtype=d) for d, ts in self.groups.items()}

    @torch.no_grad()
    def to_flat(self) -> None:
        for d, ts in self.groups.items():
            flat = self.flats[d]
            if len({t.device for t in ts}) == 1:  # one transfer per device (a GPU's included)
                flat.copy_(torch.cat([t.detach().reshape(-1).to(d) for t in ts]))
                continue
            offset = 0
            for t in ts:
                k = t.numel()
                flat[offset:offset + k].copy_(t.detach().reshape(-1))
                offset += k

    def from_flat(self) -> None:
        for d, ts in self.groups.items():
            copy_slices(ts, self.flats[d])


def replica_roles(component: str, member, replica_group) -> tuple:
    """(whether this process holds the member, the global rank of the replica's first rank) for
    a fault-tolerant class: the replica's first rank holds ``member`` and every other rank of
    ``replica_group`` passes None; InvalidParameterError when that does not hold."""
    leader, src = True, 0
    if replica_group is not None:
        leader = dist.get_rank(replica_group) == 0
        src = global_rank(replica_group, 0)
    if leader and member is None:
        raise InvalidParameterError(f"cadence.torch.{component}: needs a member (on a replica's first rank when "
                                    "replica_group is given)")
    if not leader and member is not None:
        raise InvalidParameterError(f"cadence.torch.{component}: only the replica's first rank holds the member; "
                                    "pass member=None on its other ranks")
    return leader, src


def state_dict_bytes(obj) -> bytes:
    """``obj.state_dict()`` (an optimizer's) as bytes, for ``Member.add_blob``."""
    buf = io.BytesIO()
    torch.save(obj.state_dict(), buf)
    return buf.getvalue()


def load_state_dict_bytes(obj, data: bytes) -> None:
    """The inverse of :func:`state_dict_bytes`."""
    obj.load_state_dict(torch.load(io.BytesIO(data)))


def broadcast_state_dict(obj, leader: bool, src: int, group) -> None:
    """``obj``'s state dict (an optimizer's) from the replica's first rank (global rank
    ``src``) into ``obj`` on the others of ``group``."""
    box = [obj.state_dict() if leader else None]
    dist.broadcast_object_list(box, src, group=group)
    if not leader:
        obj.load_state_dict(box[0])


class Rejoin:
    """The ``rejoin=N`` policy of the fault-tolerant classes (FaultTolerantAverager,
    FaultTolerantDiLoCo): a sync that raised EvictedError or QuorumError on a member that may
    rejoin is answered by ``member.rejoin()``, at most ``limit`` calls in all (failed ones
    included). ``component`` names the class in the argument errors; ``limit`` > 0 is refused
    with a ``replica_group`` (the replica's other ranks cannot follow a new incarnation)."""

    def __init__(self, component: str, limit, replica_group):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidParameterError(f"cadence.torch.{component}: rejoin must be an integer >= 0, got {limit!r}")
        if limit > 0 and replica_group is not None:
            raise InvalidParameterError(f"cadence.torch.{component}: rejoin > 0 with a replica_group: the replica's "
                                        "other ranks cannot follow its first rank's new incarnation; restart the "
                                        "whole replica instead (torchrun --max-restarts, join())")
        self.limit = limit
        self.attempts = 0  # member.rejoin() calls so far, failed ones included
        self.rejoins = 0   # successful ones

    def answers(self, member, error: BaseException) -> bool:
        """Whether ``error``, raised by a sync of ``member``, is a drop this policy answers."""
        from .. import membership

        return (self.limit > 0 and member.may_rejoin
                and isinstance(error, (membership.EvictedError, membership.QuorumError)))

    def after(self, member, dropped: BaseException, take_up) -> dict:
        """``member.rejoin()`` after the sync raised ``dropped``, up to the attempts left, then
        ``take_up()`` (the state received into the module); the report of the sync it stands
        for: ``outcome`` "rejoined", ``committed`` (the quorum's count) and ``rejoin_attempts``
        (this call's). Raises the last error when no attempt is left or all failed, and an
        InvalidParameterError of ``rejoin()`` at once."""
        from .. import Error

        error = dropped
        tried = 0
        while self.attempts < self.limit:
            self.attempts += 1
            tried += 1
            try:
                member.rejoin()
            except (Error, TimeoutError) as e:  # not connected or not admitted: a failed attempt
                if isinstance(e, InvalidParameterError):
                    raise
                error = e
                continue
            self.rejoins += 1
            take_up()
            return {"outcome": "rejoined", "committed": member.committed, "attempts": 0, "reconfigurations": 0,
                    "rejoin_attempts": tried}
        raise error
