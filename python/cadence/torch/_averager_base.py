# What cadence.torch's two model averagers share (_elastic.py, _periodic.py): the groups they
# average over (one group, or the cross group of a hierarchy whose replica groups run DDP or FSDP
# inside), bounded and named collectives, what a merge covers (parameters, buffers, optimizer
# state; DTensor shards), the merge itself, the module checks (DDP, wrappers), the DDP
# communication hook, and the checks of a checkpoint.
#
# Map: helpers · _Averager: construction · modules and DDP · waits · what a merge covers · the
# merge · checkpoint checks · replica_groups (the groups of a hierarchy).
from __future__ import annotations

import contextlib
import itertools
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

from . import _ddp, _device
from ._common import (Deadline, InvalidParameterError, Stragglers, TransportError, check_seconds,
                      copy_slices, describe_missing, flatten_params, group_info, group_timeout,
                      wait_work, where)

#: What happens to the optimizer's state at a merge.
OPTIMIZER_STATE = ("local", "average", "reset")

_instances = itertools.count()


# ---- helpers ------------------------------------------------------------------------------------

def materialize(params):
    """A generator (model.parameters()) read once, so it can be read again."""
    if isinstance(params, (list, tuple, torch.Tensor, torch.nn.Module)):
        return params
    return list(params)


def first_tensor(params) -> Optional[torch.Tensor]:
    if isinstance(params, torch.Tensor):
        return params
    if isinstance(params, torch.nn.Module):
        return next(iter(params.parameters()), None)
    for item in params:
        if isinstance(item, dict):
            ps = item["params"]
            if len(ps):
                return ps[0]
        elif isinstance(item, torch.Tensor):
            return item
    return None


class _Averager(ModelAverager):
    """What both averagers share.

    State map: process_group/rank/world_size (the group merges run over) and replica_group
    (None, or the group this rank steps in lockstep with, DDP or FSDP inside it) are fixed at
    construction, as is timeout; _seq counts sync() calls (errors name it); _module/_optimizer
    say what a merge covers beyond the tensors passed; _device_hint is the accelerator the
    tensors were last seen on (step timing and, on NCCL, the small control tensors live there)."""

    _component = "averager"

    def __init__(self, process_group, replica_group, timeout, name_stragglers, module,
                 merge_buffers, optimizer, optimizer_state, store):
        group, rank, size = group_info(self._component, process_group)
        super().__init__(group)
        self.rank = rank
        self.world_size = size
        self.replica_group = None
        self.replica_size = 1
        if replica_group is not None:
            self.replica_group, _, self.replica_size = group_info(self._component, replica_group)
        self.timeout = (group_timeout(group) if timeout is None
                        else check_seconds(self._component, "timeout", timeout))
        self._seq = 0  # sync() calls, the sequence number errors name
        self._stragglers = Stragglers(self._component, group, rank, size, next(_instances),
                                      enabled=bool(name_stragglers), store=store)
        # Naming the missing ranks takes a store round trip after a failure: it gets the last
        # quarter of the timeout (at most 2 s), so the whole failure stays within `timeout`.
        self._reserve = min(0.25 * self.timeout, 2.0) if self._stragglers.enabled else 0.0
        self._backend = _device.ops.backend(group)
        # Backends that take CPU tensors carry the small control tensors (records, hash, stop
        # flag) from the host; NCCL alone takes only device tensors.
        self._host_control = any(b in self._backend for b in ("gloo", "mpi", "ucc"))
        self._device_hint: Optional[torch.device] = None
        self.merge_buffers = bool(merge_buffers)
        self._module = self._check_module(module) if module is not None else None
        if optimizer_state not in OPTIMIZER_STATE:
            raise InvalidParameterError(f"{self._here()}optimizer_state must be one of "
                                        f"{', '.join(OPTIMIZER_STATE)}; got {optimizer_state!r}")
        if optimizer_state != "local" and optimizer is None:
            raise InvalidParameterError(f"{self._here()}optimizer_state={optimizer_state!r} needs "
                                        "the optimizer: pass optimizer= (the inner optimizer, not "
                                        "PostLocalSGDOptimizer)")
        if optimizer is not None and not hasattr(optimizer, "state"):
            raise InvalidParameterError(f"{self._here()}optimizer must be a torch.optim.Optimizer, "
                                        f"got {type(optimizer).__name__}")
        self.optimizer_state = optimizer_state
        self._optimizer = optimizer

    def _here(self) -> str:
        return where(self._component, self.rank, self.world_size)

    # ---- modules and DDP --------------------------------------------------------------------
    def _check_module(self, module) -> torch.nn.Module:
        """The module whose buffers a merge covers (DDP's inner module), after checking that a
        DDP wrapper cannot issue collectives of its own behind the averager's back."""
        _ddp.check_wrapper(self._here(), module)
        if isinstance(module, _ddp.DDP):
            if self.replica_group is not None:
                if module.process_group is not self.replica_group:
                    raise InvalidParameterError(
                        f"{self._here()}with replica_group=, DistributedDataParallel must run over "
                        "that replica group (DistributedDataParallel(..., process_group="
                        "replica_group)): it all-reduces the gradients inside the group at every "
                        "step, and the averager merges across the groups")
            elif _ddp.forward_syncs_buffers(module) and any(True for _ in module.module.buffers()):
                raise InvalidParameterError(_ddp.buffer_sync_refusal(self._here()))
            return module.module
        if not isinstance(module, torch.nn.Module):
            raise InvalidParameterError(f"{self._here()}module must be a torch.nn.Module, got "
                                        f"{type(module).__name__}")
        return module

    def _ddp_syncs_step(self) -> bool:
        """Whether DDP's gradient all-reduce runs in the coming step (torch's warm-up)."""
        return False

    def local_step(self, model):
        """The context for one step's forward and backward: ``model.no_sync()`` when ``model``
        is DDP and the step is local (DDP then neither all-reduces the gradients nor reaches
        any collective), nothing for a plain model, nor in a hierarchy (``replica_group=``),
        where DDP all-reduces inside the replica group at every step. Checks the model."""
        if isinstance(model, torch.nn.Module):
            self._check_module(model)
        if isinstance(model, _ddp.DDP) and self.replica_group is None and not self._ddp_syncs_step():
            return model.no_sync()
        return contextlib.nullcontext()

    def register_comm_hook(self, ddp) -> None:
        """The communication-hook form of ``local_step()``: registers
        :func:`cadence.torch.averager_hook` on the DDP model, with this averager as its state,
        after the checks of ``module=``. Then no step needs ``local_step()``: DDP calls the hook
        instead of all-reducing, and the hook all-reduces only where the averager says that DDP
        should (``PeriodicModelAverager``'s warm-up). Not in a hierarchy (``replica_group=``),
        where DDP's own all-reduce inside the replica group is what every step needs; nor, for
        ``ElasticModelAverager``, on a DDP model built with ``find_unused_parameters=True``,
        whose reducer all-reduces a map of unused parameters at every step, which ranks
        running their own step counts would not match."""
        if not isinstance(ddp, _ddp.DDP):
            raise InvalidParameterError(f"{self._here()}register_comm_hook() takes a "
                                        f"DistributedDataParallel model, got {type(ddp).__name__}")
        if self.replica_group is not None:
            raise InvalidParameterError(f"{self._here()}no communication hook in a hierarchy "
                                        "(replica_group=): DDP's own all-reduce inside the replica "
                                        "group is what every step needs")
        self._check_module(ddp)
        if self._lockstep_only and getattr(ddp, "find_unused_parameters", False):
            raise InvalidParameterError(
                f"{self._here()}DistributedDataParallel(find_unused_parameters=True) all-reduces a "
                "map of unused parameters in every backward pass, a collective that ranks running "
                "their own step counts do not match: build it with find_unused_parameters=False, "
                "or use local_step(), whose no_sync() skips that collective")
        ddp.register_comm_hook(self, _ddp.averager_hook)

    #: whether the ranks may run different step counts (a hook may then make no collective)
    _lockstep_only = False

    # ---- waits ------------------------------------------------------------------------------
    def _wait(self, work, op: str, deadline: Deadline, device: torch.device) -> None:
        try:
            wait_work(work, deadline, poll=_device.ops.is_accelerator(device))
        except RuntimeError as e:
            missing = self._stragglers.missing(self._seq, deadline)
            raise TransportError(
                f"{self._here()}{op} in sync #{self._seq} failed after "
                f"{deadline.elapsed():.3f} s (timeout {deadline.seconds:g} s): "
                f"{describe_missing(missing)}: {e}") from e

    def _replica_max(self, values: list, device: torch.device, deadline: Deadline, op: str) -> list:
        """The element-wise maximum of `values` over the replica group (the values alone
        without one): how its members, which step together, agree on one record and one stop
        flag before anything crosses the groups."""
        if self.replica_group is None or self.replica_size == 1:
            return values
        t = _device.ops.tensor(values, torch.int64, device)
        self._wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.replica_group, async_op=True),
                   f"{op} (all_reduce in the replica group)", deadline, device)
        return [int(v) for v in t.cpu().tolist()]

    def _control_device(self) -> torch.device:
        """Where the small int64 tensors live: the host on gloo/MPI; on NCCL the device the
        tensors were seen on, else the device the group was bound to. Never the current
        device, which need not be the model's."""
        if self._host_control:
            return _device.CPU
        if self._device_hint is not None:
            return self._device_hint
        bound = _device.ops.bound_device(self.process_group)
        if bound is not None:
            return bound
        raise InvalidParameterError(
            f"{self._here()}the process group's backend ({self._backend}) takes device tensors "
            "only, and this averager has seen none yet: pass the parameters to sync(), or "
            "bind the group to a device (init_process_group(device_id=...))")

    def _begin(self) -> Deadline:
        self._seq += 1
        self._stragglers.arrive(self._seq)
        return Deadline(self.timeout, self._reserve)

    # ---- what a merge covers ----------------------------------------------------------------
    def _collect(self, params) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """(parameters, extras): the tensors passed, then the module's floating-point buffers
        (merge_buffers) and the optimizer's floating-point state (optimizer_state="average";
        not "step"), each once, in an order every rank shares; DTensors as their local shards."""
        if isinstance(params, torch.nn.Module):
            module = self._check_module(params)
            ps = list(module.parameters())
        else:
            ps = flatten_params(params)
            module = self._module
        seen = {id(t) for t in ps}
        extras: List[torch.Tensor] = []
        if self.merge_buffers and module is not None:
            for b in module.buffers():
                if b.is_floating_point() and id(b) not in seen:
                    seen.add(id(b))
                    extras.append(b)
        if self.optimizer_state == "average":
            for grp in self._optimizer.param_groups:
                for p in grp["params"]:
                    st = self._optimizer.state.get(p)
                    if not st:
                        continue
                    for k in sorted(st):
                        v = st[k]
                        if (k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()
                                and id(v) not in seen):
                            seen.add(id(v))
                            extras.append(v)
        for i, t in enumerate(ps + extras):
            what = f"tensor {i}" if i < len(ps) else f"buffer or optimizer state {i - len(ps)}"
            if _ddp.is_dtensor(t) and self.replica_group is None:
                raise InvalidParameterError(
                    f"{self._here()}{what} is a DTensor (FSDP2's fully_shard, or tensor "
                    "parallelism): its shards need their group to step together, so shard the "
                    "model inside each replica group and average across the groups "
                    "(replica_group=; cadence.torch.replica_groups)")
            if not t.is_floating_point():
                raise InvalidParameterError(f"{self._here()}{what} has dtype {t.dtype}; model "
                                            "averaging needs floating-point tensors")
            if t.is_sparse:
                raise InvalidParameterError(f"{self._here()}{what} is sparse; pass dense tensors")
        ps = [_ddp.local(t) for t in ps]
        extras = [_ddp.local(t) for t in extras]
        acc = _device.ops.first_accelerator(ps + extras)
        if acc is not None:
            self._device_hint = acc
        return ps, extras

    def _after_merge(self) -> None:
        if self.optimizer_state == "reset":
            self._optimizer.state.clear()

    # ---- the merge --------------------------------------------------------------------------
    def _merge(self, ps, extras, rule: str, deadline: Deadline, mine: int = 1, total: int = 1,
               anchors: Optional[list] = None) -> list:
        """One all-reduce per (dtype, device) bucket, all started before any is waited for.
        Returns each bucket's merged parameter slice (summed_deltas keeps them as the next
        anchors)."""
        buckets = self._buckets(ps, extras, rule, mine, anchors)
        return self._reduce(buckets, self._start(buckets), rule, deadline, total, anchors)

    def _buckets(self, ps, extras, rule: str, mine: int = 1, anchors: Optional[list] = None) -> list:
        """The merge's local half: the tensors grouped by (dtype, device) and each group
        flattened into one buffer, parameters first, with this rank's weight (step_weighted) or
        its delta from the anchor (summed_deltas) applied. Extras are averaged (or
        step-weighted) whatever the rule, since a sum of deltas has no meaning for running
        statistics."""
        ops = _device.ops
        groups: Dict[tuple, list] = {}
        for role, ts in ((0, ps), (1, extras)):
            for t in ts:
                b = groups.setdefault((t.dtype, ops.device_of(t)), [[], 0])
                b[0].append(t)
                if role == 0:
                    b[1] += t.numel()
        out = []
        for bi, ((_, device), (ts, np_)) in enumerate(groups.items()):
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            if rule == "step_weighted":
                flat.mul_(mine)
            elif rule == "summed_deltas":
                flat[:np_].sub_(anchors[bi])
            out.append((ts, np_, flat, device))
        return out

    def _start(self, buckets) -> list:
        """Every bucket's all-reduce, started (none waited for)."""
        return [dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group, async_op=True)
                for _, _, flat, _ in buckets]

    def _reduce(self, buckets, works, rule: str, deadline: Deadline, total: int = 1,
                anchors: Optional[list] = None) -> list:
        """The merge's last half: each bucket's all-reduce waited for, scaled and written back
        into its tensors."""
        n = self.world_size
        merged = []
        for bi, ((ts, np_, flat, device), work) in enumerate(zip(buckets, works)):
            self._wait(work, f"merge all_reduce ({rule})", deadline, device)
            if rule == "step_weighted":
                flat.div_(total)
            elif rule == "summed_deltas":
                flat[:np_].add_(anchors[bi])
                flat[np_:].div_(n)
            else:
                flat.div_(n)
            copy_slices(ts, flat)
            merged.append(flat[:np_])
        return merged

    # ---- checkpoint checks ------------------------------------------------------------------
    def _identity(self) -> dict:
        """What a checkpoint must match to be loaded here."""
        return dict(kind=self._component, ranks=self.world_size, rank=self.rank,
                    replica_size=self.replica_size)

    def _check_state(self, sd) -> None:
        here = f"{self._here()}load_state_dict: "
        if not isinstance(sd, dict) or sd.get("kind") != self._component:
            kind = sd.get("kind") if isinstance(sd, dict) else type(sd).__name__
            raise InvalidParameterError(f"{here}not a {self._component} state_dict (kind {kind!r})")
        for key, mine in self._identity().items():
            if sd.get(key) != mine:
                raise InvalidParameterError(f"{here}the checkpoint has {key} {sd.get(key)!r}, this "
                                            f"averager {mine!r} (every rank loads the state_dict "
                                            "it saved, with the same arguments)")


# ---- the groups of a hierarchy ------------------------------------------------------------------

class ReplicaGroups(NamedTuple):
    """This rank's groups in a hierarchy of ``replicas`` groups of ``size`` consecutive ranks."""
    #: the ranks this rank steps with (DDP's or FSDP's group)
    replica: object
    #: this rank and the ranks at its position in every other replica group (the averager's)
    cross: object
    #: which replica group this rank is in (0 .. replicas - 1)
    index: int
    replicas: int
    size: int


def replica_groups(size: int) -> ReplicaGroups:
    """Splits the world into replica groups of ``size`` consecutive ranks (a node's ranks under
    ``torchrun --nproc_per_node size``) and returns this rank's replica group and cross group:
    ``DistributedDataParallel(model, process_group=g.replica)`` (or FSDP2 over it) inside, and
    ``ElasticModelAverager(..., process_group=g.cross, replica_group=g.replica)`` across. Every
    rank calls it, in the same order as its other new_group() calls (group creation is
    collective). With torch's DeviceMesh, ``init_device_mesh(device, (replicas, size),
    mesh_dim_names=("replicate", "shard"))`` gives the same groups as ``mesh.get_group("shard")``
    and ``mesh.get_group("replicate")``."""
    group_info("replica_groups", None)
    world, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or world % size:
        raise InvalidParameterError(f"cadence.torch.replica_groups: size {size!r} must be an integer "
                                    f">= 1 that divides the world size {world}")
    replica = cross = None
    for k in range(world // size):
        g = dist.new_group(list(range(k * size, (k + 1) * size)))
        if k == rank // size:
            replica = g
    for j in range(size):
        g = dist.new_group(list(range(j, world, size)))
        if j == rank % size:
            cross = g
    return ReplicaGroups(replica, cross, rank // size, world // size, size)
