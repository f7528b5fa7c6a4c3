# Model averagers over torch.distributed: ElasticBSP (barriers placed by a plan every rank computes
# from exchanged step times through cadence.ElasticPlanner) and the periodic baseline with torch's
# schedule. Both merge the parameters, the module's floating-point buffers and, on request, the
# optimizer's state; both work with a plain model or a DDP one (local steps under no_sync()).
from __future__ import annotations

import contextlib
import itertools
import math
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

from . import _device
from ._common import (Deadline, InvalidParameterError, Stragglers, TransportError, check_seconds,
                      describe_missing, flatten_params, group_info, group_timeout, wait_work, where)

#: Merge rules, with the C++ merge_rule values (they salt the plan hash, as in C++).
MERGE_RULES = {"average": 0, "summed_deltas": 1, "step_weighted": 2}

#: What happens to the optimizer's state at a merge.
OPTIMIZER_STATE = ("local", "average", "reset")

#: The longest step duration step_done() accepts, as elastic_averager::max_duration_us.
MAX_DURATION_US = 1 << 40

_instances = itertools.count()

_DDP = torch.nn.parallel.DistributedDataParallel


def _materialize(params):
    """A generator (model.parameters()) read once, so it can be read again."""
    if isinstance(params, (list, tuple, torch.Tensor, torch.nn.Module)):
        return params
    return list(params)


def _first_tensor(params) -> Optional[torch.Tensor]:
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
    """What both averagers share: the group, the bounded collectives, what a merge covers
    (parameters, buffers, optimizer state), the DDP checks.

    State map: process_group/rank/world_size/timeout are fixed at construction; _seq counts
    sync() calls (errors name it); _module/_optimizer say what a merge covers beyond the
    tensors passed; _device_hint is the accelerator the tensors were last seen on (step timing
    and, on NCCL, the small control tensors live there)."""

    _component = "averager"

    def __init__(self, process_group, timeout, name_stragglers, module, merge_buffers, optimizer,
                 optimizer_state, store):
        group, rank, size = group_info(self._component, process_group)
        super().__init__(group)
        self.rank = rank
        self.world_size = size
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

    # ---- DDP --------------------------------------------------------------------------------
    def _check_module(self, module) -> torch.nn.Module:
        """The module whose buffers a merge covers (DDP's inner module), after checking that a
        DDP wrapper cannot issue collectives of its own behind the averager's back."""
        if isinstance(module, _DDP):
            if module.broadcast_buffers and any(True for _ in module.module.buffers()):
                raise InvalidParameterError(
                    f"{self._here()}DistributedDataParallel was built with broadcast_buffers=True: "
                    "it then broadcasts rank 0's buffers (BatchNorm statistics) on forward passes, "
                    "a collective every rank must join at the same step, which ranks that run "
                    "their own number of local steps do not, and it overwrites every rank's "
                    "statistics with rank 0's. Build it with DistributedDataParallel(..., "
                    "broadcast_buffers=False): this averager merges the buffers at each barrier "
                    "(merge_buffers=True)")
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
        any collective), nothing for a plain model. Checks DDP's ``broadcast_buffers``."""
        if isinstance(model, _DDP):
            self._check_module(model)
            if not self._ddp_syncs_step():
                return model.no_sync()
        return contextlib.nullcontext()

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
        not "step"), each once, in an order every rank shares."""
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
            if not t.is_floating_point():
                raise InvalidParameterError(f"{self._here()}{what} has dtype {t.dtype}; model "
                                            "averaging needs floating-point tensors")
            if t.is_sparse:
                raise InvalidParameterError(f"{self._here()}{what} is sparse; pass dense tensors")
        acc = _device.ops.first_accelerator(ps + extras)
        if acc is not None:
            self._device_hint = acc
        return ps, extras

    def _after_merge(self) -> None:
        if self.optimizer_state == "reset":
            self._optimizer.state.clear()

    def _merge(self, ps, extras, rule: str, deadline: Deadline, mine: int = 1, total: int = 1,
               anchors: Optional[list] = None) -> list:
        """One all-reduce per (dtype, device) bucket, all started before any is waited for.
        Parameters come first in each bucket; extras are averaged (or step-weighted) whatever
        the rule, since a sum of deltas has no meaning for running statistics. Returns each
        bucket's merged parameter slice (summed_deltas keeps them as the next anchors)."""
        ops = _device.ops
        n = self.world_size
        buckets: Dict[tuple, list] = {}
        for role, ts in ((0, ps), (1, extras)):
            for t in ts:
                b = buckets.setdefault((t.dtype, ops.device_of(t)), [[], 0])
                b[0].append(t)
                if role == 0:
                    b[1] += t.numel()
        started = []
        for bi, ((_, device), (ts, np_)) in enumerate(buckets.items()):
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            if rule == "step_weighted":
                flat.mul_(mine)
            elif rule == "summed_deltas":
                flat[:np_].sub_(anchors[bi])
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group,
                                   async_op=True)
            started.append((ts, np_, flat, work, device, bi))
        merged = []
        for ts, np_, flat, work, device, bi in started:
            self._wait(work, f"merge all_reduce ({rule})", deadline, device)
            if rule == "step_weighted":
                flat.div_(total)
            elif rule == "summed_deltas":
                flat[:np_].add_(anchors[bi])
                flat[np_:].div_(n)
            else:
                flat.div_(n)
            offset = 0
            with torch.no_grad():
                for t in ts:
                    k = t.numel()
                    t.copy_(flat[offset:offset + k].view_as(t))
                    offset += k
            merged.append(flat[:np_])
        return merged


class ElasticModelAverager(_Averager):
    r"""ElasticBSP model averaging over ``torch.distributed``, the Python twin of the C++
    ``cadence::exchange::elastic_averager``.

    Between barriers each rank runs local optimizer steps; at a barrier every rank merges the
    parameters (one all-reduce per dtype and device). How many local steps rank *p* runs before
    the next barrier comes from a plan that every rank computes from identical inputs: each rank
    reports its own step durations, ``sync()`` all-gathers a fixed-size int64 record of them,
    and every rank runs ``cadence.ElasticPlanner`` (the C++ predictor and ZipLine, integers
    throughout) on the same records; the plan hash, sent with the next records, turns divergence
    into ``TransportError`` before the next merge. BSP (one step per barrier) until the predictor
    has enough history.

    Hand-written loop (``step_done()`` without an argument times the step itself, with CUDA
    events when the parameters are on a GPU)::

        avg = ElasticModelAverager("elastic:8", module=model)
        for x, y in data:
            with avg.local_step(model):          # model.no_sync() for a DDP model
                loss_fn(model(x), y).backward()
            opt.step(); opt.zero_grad()
            if avg.step_done():
                avg.sync(model)                  # parameters and BatchNorm buffers

    With PyTorch's post-local SGD optimizer (the step time is measured between calls)::

        opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    ElasticModelAverager("elastic:8", module=model))

    Args:
        config: ``"elastic:<R>[:<predictor>][:<variant>]"``, the controller's config string.
        merge: ``"average"`` (default), ``"summed_deltas"`` (x = a + sum of (x_r - a), a the
            previous merged model; the first barrier averages) or ``"step_weighted"`` (weights
            are the local steps each rank ran since the previous barrier).
        history: step durations each rank keeps and sends (record = history + 2 int64 words).
        warmup_steps: BSP steps before the first plan (0: what the predictor needs).
        process_group: the group to average over (default: the world).
        timeout: seconds one ``sync()`` may take, all its collectives and the naming of
            missing ranks together; None (default): the process group's own timeout.
        name_stragglers: count arrivals in the process group's store (one ``add`` per sync, off
            the caller's thread) so that a failed sync names the ranks that did not arrive.
        module: the model (plain or DDP); its floating-point buffers are merged with the
            parameters, and a DDP wrapper is checked for ``broadcast_buffers=False``.
        merge_buffers: merge the module's floating-point buffers (BatchNorm running statistics)
            at each barrier (default True). Integer buffers (``num_batches_tracked``) stay local.
        optimizer: the optimizer whose state ``optimizer_state`` acts on.
        optimizer_state: ``"local"`` (default, as torch's post-local SGD: momentum and Adam's
            moments stay each rank's own), ``"average"`` (merged with the parameters; ``step``
            counters stay local) or ``"reset"`` (cleared at each barrier).
        store: a ``torch.distributed.Store`` for the arrival counts (default: the process
            group's).
    """

    _component = "ElasticModelAverager"

    def __init__(self, config: str = "elastic:15", *, merge: str = "average", history: int = 16,
                 warmup_steps: int = 0, process_group=None, timeout: Optional[float] = None,
                 name_stragglers: bool = True, module=None, merge_buffers: bool = True,
                 optimizer=None, optimizer_state: str = "local", store=None):
        super().__init__(process_group, timeout, name_stragglers, module, merge_buffers,
                         optimizer, optimizer_state, store)
        if merge not in MERGE_RULES:
            raise InvalidParameterError(f"{self._here()}merge must be one of "
                                        f"{', '.join(MERGE_RULES)}; got {merge!r}")
        import cadence

        try:
            self._planner = cadence.ElasticPlanner(config, self.world_size, history, warmup_steps)
        except cadence.Error as e:
            raise type(e)(self._here() + str(e)) from None
        self.merge = merge
        self._config_arg = config
        self._salt = MERGE_RULES[merge]
        self._words = int(self._attr(self._planner, "record_words"))
        self._history = int(history)
        # The latest durations: whole microseconds, or (start, end) marks resolved at sync()
        # (CUDA events are read only there, where the barrier waits for the device anyway).
        self._ring: list = [0] * self._history
        self._recorded = 0
        self.local_steps = 0
        self.total_steps = 0
        self.max_local_steps = 0
        self.global_steps = 0  # every rank's steps up to the last barrier, summed (same everywhere)
        self._anchor: Optional[list] = None  # summed_deltas: per bucket
        self._anchor_sig: Optional[list] = None
        self._round = self._planner.bsp_round(0, self._salt)
        self._barrier = 0
        self._step_marked = False  # a step was recorded since the last average_parameters()
        self._mark = time.perf_counter()  # where the next self-timed step starts

    @staticmethod
    def _attr(obj, name):
        v = getattr(obj, name)
        return v() if callable(v) else v

    # ---- the plan -------------------------------------------------------------------------
    @property
    def round(self):
        """The plan in force (a ``cadence`` round: ``steps`` per rank, ``hash``, ...)."""
        return self._round

    @property
    def planned(self) -> int:
        """Local steps this rank runs before its next barrier."""
        return int(self._round.steps[self.rank])

    @property
    def barriers(self) -> int:
        """Barriers completed."""
        return self._barrier

    @property
    def config(self) -> str:
        """The canonical config string ("elastic:<R>:<predictor>:<variant>")."""
        return str(self._attr(self._planner, "config"))

    def due(self) -> bool:
        """Whether the plan says this rank must sync now."""
        return self.local_steps >= self.planned

    # ---- steps ----------------------------------------------------------------------------
    def _check_not_due(self) -> None:
        if self.due():
            raise InvalidParameterError(
                f"{self._here()}step_done() after the step that made sync() due: call sync() "
                f"first (barrier {self._barrier + 1} after {self.local_steps} local steps)")

    def _record(self, entry) -> bool:
        self._ring[self._recorded % self._history] = entry
        self._recorded += 1
        self.local_steps += 1
        self.total_steps += 1
        self._step_marked = True
        return self.due()

    def step_done(self, seconds: Optional[float] = None) -> bool:
        """This rank finished a local step. Returns True when it must call ``sync()`` now.

        ``seconds``: the step's duration on this rank's own clock (compute only), rounded up to
        whole microseconds (0 counts as 1 us). Around GPU work, time it after
        ``torch.cuda.synchronize()``, or pass nothing: None (default) times the step from the
        end of the previous one (or of the last sync) with CUDA events on the parameters'
        device once ``sync()`` has seen them, else on the host clock. Raises
        InvalidParameterError for a negative or non-finite duration, or when ``sync()`` is
        already due."""
        self._check_not_due()
        if seconds is None:
            now = _device.ops.mark(self._device_hint)
            start, self._mark = self._mark, now
            return self._record((start, now))
        try:
            s = float(seconds)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"{self._here()}step duration must be a number of seconds, "
                                        f"got {seconds!r}") from None
        self._mark = time.perf_counter()  # a self-timed step after this one starts now
        return self._record(self._microseconds(s, seconds))

    def _microseconds(self, s: float, shown) -> int:
        us = math.ceil(s * 1e6) if math.isfinite(s) else -1
        if not math.isfinite(s) or s < 0 or us > MAX_DURATION_US:
            raise InvalidParameterError(f"{self._here()}step duration {shown!r} s is not in "
                                        f"[0, {MAX_DURATION_US / 1e6:g}] s")
        return max(us, 1)

    def average_parameters(self, params) -> bool:
        """The ``ModelAverager`` entry point, called once per optimizer step (as
        ``PostLocalSGDOptimizer.step()`` does). Unless ``step_done()`` was called since the last
        call, it records one step timed from the previous call's return (from construction for
        the first), with CUDA events when the parameters are on a GPU. Merges when the plan says
        so; returns whether it did."""
        params = _materialize(params)
        if not self._step_marked:
            first = _first_tensor(params)
            if first is not None:
                d = _device.ops.device_of(first)
                if _device.ops.is_accelerator(d):
                    self._device_hint = d
            self.step_done()
        self._step_marked = False
        self.step += 1
        if self.due():
            self.sync(params)
            return True
        return False

    # ---- the barrier ----------------------------------------------------------------------
    def _resolve_ring(self) -> None:
        ops = _device.ops
        for i, e in enumerate(self._ring):
            if isinstance(e, tuple):
                s = ops.seconds_between(e[0], e[1])
                self._ring[i] = self._microseconds(max(s, 0.0), s)

    def sync(self, params=(), stop: bool = False) -> bool:
        """The barrier: all-gathers the timing records, merges ``params`` (a module, or the
        same tensors in the same order on every rank; plus buffers and optimizer state as
        configured), computes the next plan and checks that every rank computed the same.
        Returns True when any rank passed ``stop=True``: ranks run different numbers of steps
        under ElasticBSP, so a loop ends on this agreement (it rides on the record all-gather,
        at no extra cost), not on a step count. Raises InvalidParameterError before
        communicating when the plan does not call for a barrier yet or a tensor is bad;
        TransportError when a peer fails or stalls past the timeout (naming the ranks that did
        not arrive), or the ranks' plans or tensors differ. After a TransportError the process
        group is not usable: the job ends (fail-stop)."""
        if not self.due():
            raise InvalidParameterError(f"{self._here()}sync() before the plan calls for it: "
                                        f"{self.local_steps} of {self.planned} local steps done")
        ps, extras = self._collect(_materialize(params))
        if self.merge == "summed_deltas" and self._anchor_sig is not None:
            # The deltas are against the last merged tensors: the same tensors must come back.
            if len(self._anchor_sig) != len(ps):
                raise InvalidParameterError(f"{self._here()}summed_deltas: sync() got {len(ps)} "
                                            f"tensors, the last had {len(self._anchor_sig)}")
            for i, (sig, t) in enumerate(zip(self._anchor_sig, ps)):
                if sig != (t.shape, t.dtype, t.device):
                    raise InvalidParameterError(f"{self._here()}summed_deltas: tensor {i} changed "
                                                "shape, dtype or device since the last sync()")
        self._resolve_ring()
        device = self._control_device()
        deadline = self._begin()

        # 1. Every rank's row: the planner's record [local steps, durations recorded, the
        #    latest durations...], then the hash of the plan it followed, its stop flag and the
        #    number of elements it merges. The hash check rides on this all-gather instead of
        #    an all-reduce of its own: the plan made at barrier b is checked at barrier b + 1,
        #    before anything is merged (the collectives of a sync are the same whatever the
        #    plan, so a divergent plan cannot mismatch them; it only moves where ranks sync).
        w = self._words
        have = min(self._recorded, self._history)
        row = [0] * (w + 3)  # built as a list: one tensor from it, moved once
        row[0] = self.local_steps
        row[1] = have
        for i in range(have):
            row[2 + i] = self._ring[(self._recorded - have + i) % self._history]
        row[w] = int(self._round.hash) >> 2
        row[w + 1] = 1 if stop else 0
        row[w + 2] = sum(t.numel() for t in ps) + sum(t.numel() for t in extras)
        ops = _device.ops
        mine = ops.tensor(row, torch.int64, device)
        gathered = [ops.empty(w + 3, torch.int64, device) for _ in range(self.world_size)]
        self._wait(dist.all_gather(gathered, mine, group=self.process_group, async_op=True),
                   "all_gather of the timing records", deadline, device)
        rows = torch.stack(gathered).cpu().numpy()
        hashes = rows[:, w]
        if (hashes != hashes[0]).any():
            raise TransportError(
                f"{self._here()}the ranks computed different plans for barrier "
                f"{self._barrier + 1} (plan hashes by rank: {', '.join(str(int(x)) for x in hashes)}; "
                f"this rank {row[w]}): every rank must use the same config string, history, warm-up "
                f"and merge rule (this rank: {self._config_arg}, merge {self.merge})")
        sizes = rows[:, w + 2]
        if (sizes != sizes[0]).any():
            raise TransportError(
                f"{self._here()}the ranks would merge different numbers of elements at barrier "
                f"{self._barrier + 1} (by rank: {', '.join(str(int(x)) for x in sizes)}): every "
                "rank must pass the same model, buffers and optimizer state (with "
                "optimizer_state='average', every parameter needs a gradient on every rank)")
        any_stop = bool(rows[:, w + 1].any())
        records = np.ascontiguousarray(rows[:, :w], dtype=np.int64).reshape(-1)

        # 2. The merge.
        rule = self.merge
        if rule == "summed_deltas" and self._anchor is None:
            rule = "average"
        merged = self._merge(ps, extras, rule, deadline, mine=int(records[self.rank * w]),
                             total=int(records[0::w].sum()), anchors=self._anchor)
        if self.merge == "summed_deltas":
            self._anchor = merged
            self._anchor_sig = [(t.shape, t.dtype, t.device) for t in ps]
        self._after_merge()

        # 3. The next plan, from the records alone (checked at the next sync).
        nxt = self._planner.plan(records, self._barrier + 1, self._salt)
        steps = records[0::w]
        self.max_local_steps = max(self.max_local_steps, int(steps.max()))
        self.global_steps += int(steps.sum())
        self._round = nxt
        self._barrier += 1
        self.local_steps = 0
        self._mark = ops.mark(self._device_hint)  # the next step starts now
        return any_stop


class PeriodicModelAverager(_Averager):
    r"""Periodic model averaging (post-local SGD), with the arguments and the schedule of
    ``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager``:
    ``PeriodicModelAverager(period, warmup_steps)`` averages at step ``warmup_steps`` (counting
    from 0) and then every ``period`` steps; during the ``warmup_steps`` steps before, it does
    not average (torch's recipe runs DDP's gradient all-reduce then, which ``local_step()``
    leaves on). What it adds to torch's: a ``timeout`` on every sync that names the ranks that
    did not arrive, the module's buffers and the optimizer's state in the merge, the
    ``step_done()`` / ``sync()`` interface of :class:`ElasticModelAverager`, and
    ``global_steps`` / ``barriers`` counters.

    The C++ ``cadence::exchange::periodic_averager`` has another warm-up (it averages every step
    during it); this class follows torch, whose name it shares.
    """

    _component = "PeriodicModelAverager"

    def __init__(self, period: int = 1, warmup_steps: int = 0, process_group=None, *,
                 timeout: Optional[float] = None, name_stragglers: bool = True, module=None,
                 merge_buffers: bool = True, optimizer=None, optimizer_state: str = "local",
                 store=None):
        super().__init__(process_group, timeout, name_stragglers, module, merge_buffers,
                         optimizer, optimizer_state, store)
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise InvalidParameterError(f"{self._here()}period k must be an integer >= 1, got {period!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise InvalidParameterError(f"{self._here()}warmup_steps must be an integer >= 0, "
                                        f"got {warmup_steps!r}")
        self.period = period
        self.warmup_steps = warmup_steps
        self.local_steps = 0
        self.barriers = 0
        self.global_steps = 0  # every rank's steps up to the last barrier, summed
        self._due = False
        self._step_marked = False

    @property
    def total_steps(self) -> int:
        """Steps recorded (torch's ``step`` counter, restored by
        ``PostLocalSGDOptimizer.load_state_dict``)."""
        return self.step

    def _averages_at(self, s: int) -> bool:
        return s >= self.warmup_steps and (s - self.warmup_steps) % self.period == 0

    @property
    def planned(self) -> int:
        """Local steps between the previous merge (or the start) and the next one."""
        s = self.step - self.local_steps  # the first step since the last merge
        k = 1
        while not self._averages_at(s + k - 1):
            k += 1
        return k

    def _ddp_syncs_step(self) -> bool:
        return self.step < self.warmup_steps  # torch's warm-up: DDP averages the gradients

    def due(self) -> bool:
        return self._due

    def step_done(self, seconds: Optional[float] = None) -> bool:
        """A local step finished (the duration is accepted for symmetry and ignored); True when
        ``sync()`` is due."""
        if self._due:
            raise InvalidParameterError(f"{self._here()}step_done() after the step that made sync() "
                                        "due: call sync() first")
        self._due = self._averages_at(self.step)
        self.step += 1
        self.local_steps += 1
        self._step_marked = True
        return self._due

    def average_parameters(self, params) -> bool:
        """The ``ModelAverager`` entry point, once per optimizer step; returns whether it merged
        (at the same steps as torch's class)."""
        if not self._step_marked:
            self.step_done()
        self._step_marked = False
        if self._due:
            self.sync(params)
            return True
        return False

    def sync(self, params=(), stop: Optional[bool] = None) -> bool:
        """Averages ``params`` across the ranks (a module, or the same tensors in the same order
        on every rank; plus buffers and optimizer state as configured). With ``stop`` (True or
        False, on every rank alike) one more small all-reduce tells whether any rank passed
        True, the return value; None: no extra collective, returns False. Errors as
        :meth:`ElasticModelAverager.sync`."""
        if not self._due:
            raise InvalidParameterError(f"{self._here()}sync() before it is due: {self.local_steps} "
                                        f"of {self.planned} local steps done")
        ps, extras = self._collect(_materialize(params))
        device = self._control_device() if stop is not None else None
        deadline = self._begin()
        self._merge(ps, extras, "average", deadline)
        any_stop = False
        if stop is not None:
            flag = _device.ops.tensor([1 if stop else 0], torch.int64, device)
            self._wait(dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group,
                                       async_op=True), "all_reduce of the stop flag", deadline, device)
            any_stop = bool(flag[0])
        self._after_merge()
        self.global_steps += self.local_steps * self.world_size  # every rank ran as many
        self.local_steps = 0
        self.barriers += 1
        self._due = False
        return any_stop
