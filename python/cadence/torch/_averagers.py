# Model averagers over torch.distributed: ElasticBSP (barriers placed by a plan every rank computes
# from exchanged step times through cadence.ElasticPlanner) and the periodic baseline.
from __future__ import annotations

import itertools
import math
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

from ._common import (Deadline, InvalidParameterError, Stragglers, TransportError, check_seconds,
                      describe_missing, flatten_params, group_info, where)

#: Merge rules, with the C++ merge_rule values (they salt the plan hash, as in C++).
MERGE_RULES = {"average": 0, "summed_deltas": 1, "step_weighted": 2}

#: The longest step duration step_done() accepts, as elastic_averager::max_duration_us.
MAX_DURATION_US = 1 << 40

_instances = itertools.count()


def _merge_buckets(tensors: List[torch.Tensor]) -> List[Tuple[List[torch.Tensor], torch.Tensor]]:
    """Tensors grouped by (dtype, device), each group flattened into one buffer (one all-reduce
    per group instead of one per tensor), in first-appearance order (the same on every rank)."""
    groups: Dict[tuple, List[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    out = []
    for ts in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in ts]) if ts else None
        out.append((ts, flat))
    return out


def _scatter_back(ts: List[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n


class _Averager(ModelAverager):
    """What both averagers share: the group, the bounded collectives, the parameter checks."""

    _component = "averager"

    def __init__(self, process_group, timeout, name_stragglers=True):
        group, rank, size = group_info(self._component, process_group)
        super().__init__(group)
        self.rank = rank
        self.world_size = size
        self.timeout = check_seconds(self._component, "timeout", timeout)
        self._seq = 0  # sync() calls, the sequence number errors name
        # The small int64 tensors (records, hash, stop flag) live where the backend reads:
        # NCCL takes only CUDA tensors, gloo CPU ones.
        self._device = torch.device("cpu")
        if str(dist.get_backend(group)).lower() == "nccl":
            self._device = torch.device("cuda", torch.cuda.current_device())
        self._stragglers = Stragglers(self._component, group, rank, size, next(_instances),
                                      enabled=bool(name_stragglers))

    def _here(self) -> str:
        return where(self._component, self.rank, self.world_size)

    def _wait(self, work, op: str, deadline: Deadline) -> None:
        try:
            work.wait(timeout=deadline.remaining())
        except RuntimeError as e:
            missing = self._stragglers.missing(self._seq)
            raise TransportError(
                f"{self._here()}{op} in sync #{self._seq} failed after "
                f"{deadline.seconds - deadline.left():.3f} s (timeout {deadline.seconds:g} s): "
                f"{describe_missing(missing)}: {e}") from e

    def _tensors(self, params) -> List[torch.Tensor]:
        ts = flatten_params(params)
        for i, t in enumerate(ts):
            if not t.is_floating_point():
                raise InvalidParameterError(f"{self._here()}tensor {i} has dtype {t.dtype}; model "
                                            "averaging needs floating-point tensors")
            if t.is_sparse:
                raise InvalidParameterError(f"{self._here()}tensor {i} is sparse; pass dense tensors")
        return ts

    def _allreduce_sum(self, flat: torch.Tensor, op: str, deadline: Deadline) -> None:
        self._wait(dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group,
                                   async_op=True), op, deadline)


class ElasticModelAverager(_Averager):
    r"""ElasticBSP model averaging over ``torch.distributed``, the Python twin of the C++
    ``cadence::exchange::elastic_averager``.

    Between barriers each rank runs local optimizer steps; at a barrier every rank merges the
    parameters (one all-reduce per dtype). How many local steps rank *p* runs before the next
    barrier comes from a plan that every rank computes from identical inputs: each rank reports
    its own step durations, ``sync()`` all-gathers a fixed-size int64 record of them, and every
    rank runs ``cadence.ElasticPlanner`` (the C++ predictor and ZipLine, integers throughout) on
    the same records; the plan hash, sent with the next records, turns divergence into
    ``TransportError`` before the next merge.
    BSP (one step per barrier) until the predictor has enough history.

    Hand-written loop::

        avg = ElasticModelAverager("elastic:8")
        for batch in data:
            t0 = time.perf_counter()
            loss_fn(model(batch)).backward(); opt.step(); opt.zero_grad()
            if avg.step_done(time.perf_counter() - t0):
                avg.sync(model.parameters())

    With PyTorch's post-local SGD optimizer (the step time is measured between calls)::

        opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    ElasticModelAverager("elastic:8"))

    Args:
        config: ``"elastic:<R>[:<predictor>][:<variant>]"``, the controller's config string.
        merge: ``"average"`` (default), ``"summed_deltas"`` (x = a + sum of (x_r - a), a the
            previous merged model; the first barrier averages) or ``"step_weighted"`` (weights
            are the local steps each rank ran since the previous barrier).
        history: step durations each rank keeps and sends (record = history + 2 int64 words).
        warmup_steps: BSP steps before the first plan (0: what the predictor needs).
        process_group: the group to average over (default: the world).
        timeout: seconds one ``sync()`` may take, all its collectives together.
        name_stragglers: count arrivals in the process group's store (one ``add`` per sync) so
            that a failed sync names the ranks that did not arrive; False saves that round trip.
    """

    _component = "ElasticModelAverager"

    def __init__(self, config: str = "elastic:15", *, merge: str = "average", history: int = 16,
                 warmup_steps: int = 0, process_group=None, timeout: float = 60.0,
                 name_stragglers: bool = True):
        super().__init__(process_group, timeout, name_stragglers)
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
        self._ring = [0] * self._history
        self._recorded = 0
        self.local_steps = 0
        self.total_steps = 0
        self.max_local_steps = 0
        self.global_steps = 0  # every rank's steps up to the last barrier, summed (same everywhere)
        self._anchor: Optional[List[torch.Tensor]] = None  # summed_deltas: per bucket
        self._anchor_sig: Optional[list] = None
        self._round = self._planner.bsp_round(0, self._salt)
        self._barrier = 0
        self._step_marked = False  # step_done() ran since the last average_parameters()
        self._mark: Optional[float] = None
        self._created = time.perf_counter()

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
    def step_done(self, seconds: float) -> bool:
        """This rank finished a local step that took ``seconds`` (its own clock, compute only).
        Returns True when this rank must call ``sync()`` now. Durations are rounded up to whole
        microseconds (0 counts as 1 us). Raises InvalidParameterError for a negative or
        non-finite duration, or when ``sync()`` is already due."""
        if self.due():
            raise InvalidParameterError(
                f"{self._here()}step_done() after the step that made sync() due: call sync() "
                f"first (barrier {self._barrier + 1} after {self.local_steps} local steps)")
        try:
            s = float(seconds)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"{self._here()}step duration must be a number of seconds, "
                                        f"got {seconds!r}") from None
        us = math.ceil(s * 1e6) if math.isfinite(s) else -1
        if not math.isfinite(s) or s < 0 or us > MAX_DURATION_US:
            raise InvalidParameterError(f"{self._here()}step duration {seconds!r} s is not in "
                                        f"[0, {MAX_DURATION_US / 1e6:g}] s")
        self._ring[self._recorded % self._history] = max(us, 1)
        self._recorded += 1
        self.local_steps += 1
        self.total_steps += 1
        self._step_marked = True
        return self.due()

    def average_parameters(self, params) -> bool:
        """The ``ModelAverager`` entry point, called once per optimizer step (as
        ``PostLocalSGDOptimizer.step()`` does). Unless ``step_done()`` was called since the last
        call, it records one step whose duration is the time since the previous call returned
        (since construction for the first). Merges when the plan says so; returns whether it
        did."""
        now = time.perf_counter()
        if not self._step_marked:
            if self._mark is None:
                self._mark = self._created
            self.step_done(now - self._mark)
        self._step_marked = False
        self.step += 1
        merged = False
        if self.due():
            self.sync(params)
            merged = True
        self._mark = time.perf_counter()
        return merged

    # ---- the barrier ----------------------------------------------------------------------
    def sync(self, params=(), stop: bool = False) -> bool:
        """The barrier: all-gathers the timing records, merges ``params`` (every rank passes the
        same tensors, in the same order), computes the next plan and checks that every rank
        computed the same. Returns True when any rank passed ``stop=True``: ranks run different
        numbers of steps under ElasticBSP, so a loop ends on this agreement (it rides on the
        record all-gather, at no extra cost), not on a step count. Raises InvalidParameterError before communicating when the plan does
        not call for a barrier yet or a tensor is bad; TransportError when a peer fails or stalls
        past the timeout (naming the ranks that did not arrive) or the plans differ. After a
        TransportError the process group is not usable: the job ends (fail-stop)."""
        if not self.due():
            raise InvalidParameterError(f"{self._here()}sync() before the plan calls for it: "
                                        f"{self.local_steps} of {self.planned} local steps done")
        tensors = self._tensors(params)
        if self.merge == "summed_deltas" and self._anchor_sig is not None:
            # The deltas are against the last merged tensors: the same tensors must come back.
            if len(self._anchor_sig) != len(tensors):
                raise InvalidParameterError(f"{self._here()}summed_deltas: sync() got {len(tensors)} "
                                            f"tensors, the last had {len(self._anchor_sig)}")
            for i, (sig, t) in enumerate(zip(self._anchor_sig, tensors)):
                if sig != (t.shape, t.dtype, t.device):
                    raise InvalidParameterError(f"{self._here()}summed_deltas: tensor {i} changed "
                                                "shape, dtype or device since the last sync()")
        self._seq += 1
        deadline = Deadline(self.timeout)
        self._stragglers.arrive(self._seq)

        # 1. Every rank's row: the planner's record [local steps, durations recorded, the
        #    latest durations...], then the hash of the plan it followed and its stop flag.
        #    The hash check rides on this all-gather instead of an all-reduce of its own: the
        #    plan made at barrier b is checked at barrier b + 1, before anything is merged (the
        #    collectives of a sync are the same whatever the plan, so a divergent plan cannot
        #    mismatch them; it only moves where the ranks sync).
        w = self._words
        have = min(self._recorded, self._history)
        row = [0] * (w + 2)  # built as a list: one tensor from it, moved once
        row[0] = self.local_steps
        row[1] = have
        for i in range(have):
            row[2 + i] = self._ring[(self._recorded - have + i) % self._history]
        row[w] = int(self._round.hash) >> 2
        row[w + 1] = 1 if stop else 0
        mine = torch.tensor(row, dtype=torch.int64)
        gathered = [torch.zeros(w + 2, dtype=torch.int64, device=self._device)
                    for _ in range(self.world_size)]
        self._wait(dist.all_gather(gathered, mine.to(self._device), group=self.process_group,
                                   async_op=True), "all_gather of the timing records", deadline)
        rows = torch.stack(gathered).cpu().numpy()
        hashes = rows[:, w]
        if (hashes != hashes[0]).any():
            h = row[w]
            raise TransportError(
                f"{self._here()}the ranks computed different plans for barrier "
                f"{self._barrier + 1} (plan hashes by rank: {', '.join(str(int(x)) for x in hashes)}; "
                f"this rank {h}): every rank must use the same config string, history, warm-up "
                f"and merge rule (this rank: {self._config_arg}, merge {self.merge})")
        any_stop = bool(rows[:, w + 1].any())
        records = np.ascontiguousarray(rows[:, :w], dtype=np.int64).reshape(-1)

        # 2. The merge.
        self._merge(tensors, records, deadline)

        # 3. The next plan, from the records alone (checked at the next sync).
        nxt = self._planner.plan(records, self._barrier + 1, self._salt)
        steps = records[0::w]
        self.max_local_steps = max(self.max_local_steps, int(steps.max()))
        self.global_steps += int(steps.sum())
        self._round = nxt
        self._barrier += 1
        self.local_steps = 0
        return any_stop

    def _merge(self, tensors, records, deadline) -> None:
        n = self.world_size
        w = self._words
        rule = self.merge
        if rule == "summed_deltas" and self._anchor is None:
            rule = "average"
        total = int(records[0::w].sum())
        mine = int(records[self.rank * w])
        anchors = []
        for b, (ts, flat) in enumerate(_merge_buckets(tensors)):
            if rule == "average":
                self._allreduce_sum(flat, "merge all_reduce (average)", deadline)
                flat.div_(n)
            elif rule == "step_weighted":
                flat.mul_(mine)
                self._allreduce_sum(flat, "merge all_reduce (step_weighted)", deadline)
                flat.div_(total)
            else:  # summed_deltas: sum the deltas x_r - a, then add a back
                anchor = self._anchor[b]
                flat.sub_(anchor)
                self._allreduce_sum(flat, "merge all_reduce (summed_deltas)", deadline)
                flat.add_(anchor)
            _scatter_back(ts, flat)
            if self.merge == "summed_deltas":
                anchors.append(flat)  # the merged values, as written back
        if self.merge == "summed_deltas":
            self._anchor = anchors
            self._anchor_sig = [(t.shape, t.dtype, t.device) for t in tensors]


class PeriodicModelAverager(_Averager):
    r"""Periodic model averaging (local SGD with a fixed period), the baseline for
    :class:`ElasticModelAverager` and the Python twin of ``cadence::exchange::periodic_averager``:
    every rank averages its parameters after every ``period`` local steps.

    Ours rather than ``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager``
    because it has the same interface as :class:`ElasticModelAverager` (``step_done`` /
    ``sync``), bounds every sync by ``timeout`` and names the ranks that did not arrive. One
    difference from torch's: torch averages at its first call and then every ``period`` calls
    (after ``warmup_steps`` calls without averaging); this one averages after every ``period``
    steps (after ``warmup_steps`` steps that average every step, BSP, like the elastic warm-up).
    """

    _component = "PeriodicModelAverager"

    def __init__(self, period: int, *, warmup_steps: int = 0, process_group=None,
                 timeout: float = 60.0, name_stragglers: bool = True):
        super().__init__(process_group, timeout, name_stragglers)
        if not isinstance(period, int) or period < 1:
            raise InvalidParameterError(f"{self._here()}period k must be an integer >= 1, got {period!r}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise InvalidParameterError(f"{self._here()}warmup_steps must be an integer >= 0, "
                                        f"got {warmup_steps!r}")
        self.period = period
        self.warmup_steps = warmup_steps
        self.local_steps = 0
        self.total_steps = 0
        self.barriers = 0
        self.global_steps = 0  # every rank's steps up to the last barrier, summed
        self._step_marked = False

    @property
    def planned(self) -> int:
        return 1 if self.total_steps - self.local_steps < self.warmup_steps else self.period

    def due(self) -> bool:
        return self.local_steps >= self.planned

    def step_done(self, seconds: Optional[float] = None) -> bool:
        """A local step finished (the duration is accepted for symmetry and ignored); True when
        ``sync()`` is due."""
        if self.due():
            raise InvalidParameterError(f"{self._here()}step_done() after the step that made sync() "
                                        "due: call sync() first")
        self.local_steps += 1
        self.total_steps += 1
        self._step_marked = True
        return self.due()

    def average_parameters(self, params) -> bool:
        """The ``ModelAverager`` entry point, once per optimizer step; returns whether it merged."""
        if not self._step_marked:
            self.step_done()
        self._step_marked = False
        self.step += 1
        if self.due():
            self.sync(params)
            return True
        return False

    def sync(self, params=(), stop: Optional[bool] = None) -> bool:
        """Averages ``params`` across the ranks (the same tensors, in the same order, on every
        rank). With ``stop`` (True or False, on every rank alike) one more small all-reduce
        tells whether any rank passed True, the return value; None: no extra collective, returns
        False. Errors as :meth:`ElasticModelAverager.sync`."""
        if not self.due():
            raise InvalidParameterError(f"{self._here()}sync() before it is due: {self.local_steps} "
                                        f"of {self.planned} local steps done")
        tensors = self._tensors(params)
        self._seq += 1
        deadline = Deadline(self.timeout)
        self._stragglers.arrive(self._seq)
        for ts, flat in _merge_buckets(tensors):
            self._allreduce_sum(flat, "merge all_reduce (average)", deadline)
            flat.div_(self.world_size)
            _scatter_back(ts, flat)
        any_stop = False
        if stop is not None:
            flag = torch.tensor([1 if stop else 0], dtype=torch.int64, device=self._device)
            self._wait(dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group,
                                       async_op=True), "all_reduce of the stop flag", deadline)
            any_stop = bool(flag[0])
        self.global_steps += self.local_steps * self.world_size  # every rank ran as many
        self.local_steps = 0
        self.barriers += 1
        return any_stop
