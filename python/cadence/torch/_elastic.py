# ElasticBSP model averaging over torch.distributed: barriers placed by a plan every rank computes
# from exchanged step times through cadence.ElasticPlanner (the C++ predictor and ZipLine), over
# one group or across the replica groups of a hierarchy; with its checkpoint.
#
# Map: ElasticModelAverager: construction · the plan · steps · the barrier (sync) · checkpoint.
from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from . import _device
from ._averager_base import _Averager, first_tensor, materialize
from ._common import InvalidParameterError, TransportError, step_microseconds

#: Merge rules, with the C++ merge_rule values (they salt the plan hash, as in C++).
MERGE_RULES = {"average": 0, "summed_deltas": 1, "step_weighted": 2}


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
        process_group: the group to average over (default: the world); in a hierarchy, the
            cross group (``cadence.torch.replica_groups``).
        replica_group: in a hierarchy, the group this rank steps in lockstep with (DDP, or
            FSDP2's ``fully_shard``, runs inside it): its members agree on one timing record
            (the slowest member's durations) and one stop flag at every barrier, so every
            cross group computes the same plan and each replica group runs as one rank of the
            plan. None (default): no hierarchy.
        timeout: seconds one ``sync()`` may take, all its collectives and the naming of
            missing ranks together; None (default): the timeout of the group's store, else
            ``torch.distributed.default_pg_timeout`` (the group's own timeout also applies).
        name_stragglers: count arrivals in the process group's store (one ``add`` per sync, off
            the caller's thread) so that a failed sync names the ranks that did not arrive.
        module: the model (plain or DDP); its floating-point buffers are merged with the
            parameters, and a DDP wrapper is checked for ``forward_sync_buffers=False``
            (``broadcast_buffers=False`` before torch 2.13; ``no_buffer_sync()``).
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
    _lockstep_only = True

    def __init__(self, config: str = "elastic:15", *, merge: str = "average", history: int = 16,
                 warmup_steps: int = 0, process_group=None, replica_group=None,
                 timeout: Optional[float] = None, name_stragglers: bool = True, module=None,
                 merge_buffers: bool = True, optimizer=None, optimizer_state: str = "local",
                 store=None):
        super().__init__(process_group, replica_group, timeout, name_stragglers, module,
                         merge_buffers, optimizer, optimizer_state, store)
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
        self._records: Optional[list] = None  # the last barrier's gathered records (checkpoint)
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
        return step_microseconds(self._here(), s, shown)

    def average_parameters(self, params) -> bool:
        """The ``ModelAverager`` entry point, called once per optimizer step (as
        ``PostLocalSGDOptimizer.step()`` does). Unless ``step_done()`` was called since the last
        call, it records one step timed from the previous call's return (from construction for
        the first), with CUDA events when the parameters are on a GPU. Merges when the plan says
        so; returns whether it did."""
        params = materialize(params)
        if not self._step_marked:
            first = first_tensor(params)
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
        ps, extras = self._collect(materialize(params))
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
        #    before any merged value is written back (the collectives of a sync are the same
        #    whatever the plan, so a divergent plan cannot mismatch them; it only moves where
        #    ranks sync).
        #    In a hierarchy, the members of a replica group first agree on one record and one
        #    stop flag (element-wise maximum: the slowest member's durations), so that the
        #    cross groups, which all-gather the same records, compute the same plan.
        w = self._words
        have = min(self._recorded, self._history)
        row = [0] * (w + 3)  # built as a list: one tensor from it, moved once
        row[0] = self.local_steps
        row[1] = have
        for i in range(have):
            row[2 + i] = self._ring[(self._recorded - have + i) % self._history]
        row[w + 1] = 1 if stop else 0
        agreed = self._replica_max(row[:w] + [row[w + 1]], device, deadline, "the timing record")
        row[:w], row[w + 1] = agreed[:w], agreed[w]
        row[w] = int(self._round.hash) >> 2
        row[w + 2] = sum(t.numel() for t in ps) + sum(t.numel() for t in extras)
        ops = _device.ops
        mine = ops.tensor(row, torch.int64, device)
        gathered = [ops.empty(w + 3, torch.int64, device) for _ in range(self.world_size)]
        work = dist.all_gather(gathered, mine, group=self.process_group, async_op=True)
        # The merge starts while the records travel, so a barrier blocks once, not twice (each
        # blocking wait costs a wake-up, milliseconds on a loaded machine); nothing merged is
        # written back before the checks below, and the collectives are the same whatever the
        # plan, so ranks that disagree still post matching ones.
        rule = self.merge
        if rule == "summed_deltas" and self._anchor is None:
            rule = "average"
        buckets = self._buckets(ps, extras, rule, mine=row[0], anchors=self._anchor)
        works = self._start(buckets)
        self._wait(work, "all_gather of the timing records", deadline, device)
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
        merged = self._reduce(buckets, works, rule, deadline, total=int(records[0::w].sum()),
                              anchors=self._anchor)
        if self.merge == "summed_deltas":
            self._anchor = merged
            self._anchor_sig = [(t.shape, t.dtype, t.device) for t in ps]
        self._after_merge()

        # 3. The next plan, from the records alone (checked at the next sync).
        nxt = self._planner.plan(records, self._barrier + 1, self._salt)
        self._records = [int(x) for x in records]
        steps = records[0::w]
        self.max_local_steps = max(self.max_local_steps, int(steps.max()))
        self.global_steps += int(steps.sum())
        self._round = nxt
        self._barrier += 1
        self.local_steps = 0
        self._mark = ops.mark(self._device_hint)  # the next step starts now
        return any_stop

    # ---- checkpoint ---------------------------------------------------------------------------
    def _identity(self) -> dict:
        return dict(super()._identity(), config=self.config, merge=self.merge,
                    history=self._history, warmup_steps=int(self._attr(self._planner, "warmup_steps")))

    def state_dict(self) -> dict:
        """This rank's averager, as plain data (ints, lists; the summed-deltas anchors as
        tensors), for ``torch.save`` and ``torch.load(weights_only=True)``: its step counters,
        its latest step durations, the barriers done and the last barrier's gathered records,
        from which ``load_state_dict`` recomputes the plan in force. Each rank saves its own;
        take it between steps (right after a ``sync()`` is simplest: every rank is then at the
        same barrier)."""
        self._resolve_ring()
        return dict(self._identity(), version=1, step=self.step, total_steps=self.total_steps,
                    local_steps=self.local_steps, max_local_steps=self.max_local_steps,
                    global_steps=self.global_steps, barriers=self._barrier,
                    ring=[int(x) for x in self._ring], recorded=self._recorded,
                    records=self._records, plan_hash=int(self._round.hash),
                    step_marked=self._step_marked,
                    anchor=None if self._anchor is None else [t.detach().clone() for t in self._anchor],
                    anchor_sig=None if self._anchor_sig is None else
                    [[list(sh), str(dt), str(dev)] for sh, dt, dev in self._anchor_sig])

    def load_state_dict(self, sd: dict) -> None:
        """Resumes from ``state_dict()``, on the same rank with the same arguments (config,
        merge rule, history, warm-up, group sizes; InvalidParameterError naming the first that
        differs). The plan in force is recomputed from the saved records and must hash as it
        did (else the planner changed between versions: TransportError). The ranks must load
        checkpoints of the same barrier; if they do not, the next ``sync()`` fails on every rank
        with the plan-hash check, before merging. The next step is timed from here."""
        self._check_state(sd)
        barriers, records = int(sd["barriers"]), sd["records"]
        if barriers == 0:
            plan = self._planner.bsp_round(0, self._salt)
        else:
            plan = self._planner.plan(np.asarray(records, dtype=np.int64), barriers, self._salt)
        if int(plan.hash) != int(sd["plan_hash"]):
            raise TransportError(f"{self._here()}load_state_dict: the plan recomputed from the "
                                 f"checkpoint's records hashes {int(plan.hash)}, the saved one "
                                 f"{int(sd['plan_hash'])}: the planner differs from the one that "
                                 "saved it (another cadence version?)")
        self._round, self._barrier, self._records = plan, barriers, records
        self.step = int(sd["step"])
        self.total_steps = int(sd["total_steps"])
        self.local_steps = int(sd["local_steps"])
        self.max_local_steps = int(sd["max_local_steps"])
        self.global_steps = int(sd["global_steps"])
        self._ring = [int(x) for x in sd["ring"]]
        self._recorded = int(sd["recorded"])
        self._step_marked = bool(sd["step_marked"])
        self._anchor = None if sd["anchor"] is None else [t.clone() for t in sd["anchor"]]
        self._anchor_sig = None if sd["anchor_sig"] is None else [
            (torch.Size(sh), getattr(torch, dt.split(".")[-1]), torch.device(dev))
            for sh, dt, dev in sd["anchor_sig"]]
        self._mark = _device.ops.mark(self._device_hint)
