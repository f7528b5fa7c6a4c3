# DiLoCo over torch.distributed: inner steps by the user's optimizer, an outer optimizer on the
# averaged pseudo-gradient (global minus local weights), streaming fragments whose exchange
# overlaps the next inner steps, a mixing factor, compressed outer gradients (bf16, fp16, int8,
# int4, with error feedback), weighting by inner steps, the sync schedule fixed, ElasticBSP's
# (cadence.ElasticPlanner), a bounded lag or a quorum with a grace window (cadence.OuterSchedule),
# DDP or FSDP inside replica groups, and a checkpoint. The Python face
# of cadence::exchange::diloco (docs/local-sgd.md).
#
# Map: codecs (encode/decode, as local_sgd/codec.hpp) · DiLoCo: construction · exchanges (begin,
# complete) · the fixed schedule · the elastic schedule (records, plan) · the bounded-lag and
# quorum schedules (records, plan) · checkpoint.
from __future__ import annotations

import itertools
import math
from typing import Callable, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from . import _device
from ._common import (Deadline, InvalidParameterError, TransportError, WaitTimeout, check_seconds,
                      global_rank, group_info, group_timeout, step_microseconds, wait_work, where)


def _nesterov(params):
    """DiLoCo's outer optimizer (arXiv 2311.08105): SGD, lr 0.7, Nesterov momentum 0.9."""
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


# ---- codecs: the rules of cadence/exchange/local_sgd/codec.hpp ------------------------------------

#: The outer-gradient codecs, as the C++ adapter names them ("none" is f32).
CODECS = ("f32", "bf16", "fp16", "int8", "int4")

#: Elements that share one f32 scale in the int8 and int4 formats (codec_block in C++).
CODEC_BLOCK = 128

_QMAX = {"int8": 127, "int4": 7}


def encoded_bytes(codec: str, n: int) -> int:
    """Bytes ``n`` elements take in ``codec`` (the C++ ``encoded_bytes``)."""
    blocks = -(-n // CODEC_BLOCK)
    return {"f32": 4 * n, "bf16": 2 * n, "fp16": 2 * n, "int8": n + 4 * blocks,
            "int4": 4 * blocks + (n + 1) // 2}[codec]


def encode(codec: str, x: torch.Tensor) -> torch.Tensor:
    """``x`` (1-D float32) in ``codec``, as a 1-D uint8 tensor of ``encoded_bytes`` bytes.
    bf16 and fp16 round to nearest even (fp16 overflows to infinity above 65504); int8 and int4
    take one f32 scale per block of 128 elements, max |x| / 127 (int4: / 7), and round
    x * (1 / scale) to the nearest integer, ties to even, as the C++ codec; a block of zeros
    encodes as zeros, one holding a NaN or an infinity decodes as NaNs. The layout (the scales,
    then the codes; int4 two per byte, low nibble first, each code + 8) is this package's: the
    bytes go between Python ranks only."""
    if codec == "f32":
        return x.contiguous().view(torch.uint8)
    if codec == "bf16":
        return x.to(torch.bfloat16).view(torch.uint8)
    if codec == "fp16":
        return x.half().view(torch.uint8)
    qmax = _QMAX[codec]
    n = x.numel()
    blocks = -(-n // CODEC_BLOCK)
    xb = torch.zeros(blocks * CODEC_BLOCK, dtype=torch.float32, device=x.device)
    xb[:n] = x
    xb = xb.view(blocks, CODEC_BLOCK)
    finite = torch.isfinite(xb).all(dim=1)
    amax = torch.where(finite, xb.abs().amax(dim=1), torch.full_like(finite, math.nan, dtype=torch.float32))
    scale = amax / float(qmax)
    ok = torch.isfinite(scale) & (scale > 0)
    inv = torch.where(ok, 1.0 / torch.where(ok, scale, torch.ones_like(scale)), torch.zeros_like(scale))
    q = torch.round(xb * inv[:, None]).clamp_(-qmax, qmax)
    q = torch.where(ok[:, None], q, torch.zeros_like(q)).reshape(-1)[:n].to(torch.int8)
    if codec == "int8":
        codes = q.view(torch.uint8)
    else:
        c = (q.to(torch.int16) + 8).to(torch.uint8)
        if n % 2:
            c = torch.cat([c, torch.full((1,), 8, dtype=torch.uint8, device=x.device)])
        codes = c[0::2] | (c[1::2] << 4)
    return torch.cat([scale.view(torch.uint8), codes])


def decode(codec: str, b: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` float32 values from ``encode(codec, ...)``'s bytes ``b``."""
    if codec == "f32":
        return b.view(torch.float32)
    if codec == "bf16":
        return b.view(torch.bfloat16).float()
    if codec == "fp16":
        return b.view(torch.float16).float()
    blocks = -(-n // CODEC_BLOCK)
    scale = b[:4 * blocks].clone().view(torch.float32)
    raw = b[4 * blocks:]
    if codec == "int8":
        codes = raw.view(torch.int8).to(torch.float32)
    else:
        codes = torch.stack([(raw & 0x0F), (raw >> 4)], dim=1).reshape(-1)[:n].to(torch.float32) - 8.0
    full = torch.zeros(blocks * CODEC_BLOCK, dtype=torch.float32, device=b.device)
    full[:n] = codes
    return (full.view(blocks, CODEC_BLOCK) * scale[:, None]).reshape(-1)[:n]


def _encode_piece(codec: str, x: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
    """``x`` encoded once, with error feedback when ``residual`` (as ``x``) is given: the
    residual is added to ``x`` (in place) before encoding and replaced by what the encoding
    lost (encode_with_feedback in coded_allreduce.hpp). An empty ``x`` encodes as no bytes."""
    if x.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=x.device)
    if residual is None:
        return encode(codec, x)
    x.add_(residual)
    e = encode(codec, x)
    residual.copy_(x - decode(codec, e, x.numel()))
    return e


def _decode_piece(codec: str, b: torch.Tensor, n: int) -> torch.Tensor:
    """``decode`` that also takes an empty piece (``n`` 0, no bytes)."""
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=b.device)
    return decode(codec, b, n)


class _Coded:
    """A lossy codec's exchange in flight (DiLoCo._begin_coded): ``x``, the float32 pseudo-
    gradient (the pieces sent with their residuals added), ``cuts``, the segment bounds
    (segment s, elements ``cuts[s]:cuts[s + 1]``, owned by rank s), ``phase`` (1: the
    reduce-scatter's all_to_all_single in flight; 2: the all-gather's), ``recv`` and
    ``splits``, the bytes the phase in flight receives and how many from each rank, ``own``,
    this rank's reduced segment as every rank decodes it (phase 2)."""

    __slots__ = ("x", "cuts", "phase", "recv", "splits", "own")

    def __init__(self, x: torch.Tensor, cuts: List[int], recv: torch.Tensor, splits: List[int]):
        self.x, self.cuts, self.phase, self.recv, self.splits, self.own = x, cuts, 1, recv, splits, None

    def pieces(self, codec: str, me: int, mine: torch.Tensor, size) -> List[torch.Tensor]:
        """What the phase in flight received, decoded, one piece per rank in rank order
        (``size(r)`` elements from rank r), with ``mine`` in this rank's place."""
        out, at = [], 0
        for r, k in enumerate(self.splits):
            out.append(mine if r == me else _decode_piece(codec, self.recv[at:at + k], size(r)))
            at += k
        return out


def _ring_bytes(nbytes: int, n: int) -> int:
    """What a ring all-reduce of ``nbytes`` sends from each of ``n`` ranks (C++ ring_bytes)."""
    return 0 if n <= 1 else 2 * (n - 1) * nbytes // n


#: Salt of the elastic plan hash (it only has to be the same on every rank of one job).
_SALT = 0x44


class DiLoCo:
    r"""DiLoCo (arXiv 2311.08105) with Streaming DiLoCo's fragments, overlap and mixing
    (2501.18512), compressed outer gradients and a policy-timed schedule over
    ``torch.distributed``, the Python face of the C++ ``cadence::exchange::diloco``::

        diloco = cadence.torch.DiLoCo(model, inner_opt, sync_every=50)
        for batch in data:
            loss(model, batch).backward()
            inner_opt.step(); inner_opt.zero_grad()
            diloco.step()          # the outer step every sync_every steps (per fragment)
        diloco.finish()            # fragments still in flight

    Every rank keeps the global weights (identical on every rank) and the outer optimizer over
    them; between syncs it runs inner steps on ``model`` without communicating. Fragment ``f``
    (of ``fragments`` contiguous groups of the model's parameters, balanced by size) starts the
    average of its pseudo-gradients (global minus local) after step ``(f + 1) * H // F`` (mod
    H) and, ``delay`` steps later (the exchange running meanwhile), applies the outer step
    to its global weights and sets the local ones to ``alpha * local + (1 - alpha) * global``.

    ``outer_optimizer`` builds the outer optimizer from a list of parameters (one per fragment,
    so each keeps its own step count); default SGD with Nesterov momentum, lr 0.7, momentum
    0.9. ``process_group``: the ranks that average (under DDP or FSDP inside replica groups,
    the cross group of ``cadence.torch.replica_groups``, every replica's ranks holding the same
    weights). ``timeout`` bounds each wait (default: the group's). The constructor broadcasts
    rank 0's weights into every rank's model (load a checkpoint's model state after it).

    ``schedule``: ``"fixed:<H>"`` (the same as ``sync_every=H``, the default 50) or ElasticBSP's
    ``"elastic:<R>[:<predictor>][:<variant>]"``: each rank runs the inner steps a plan gives it
    (at most R), computed on every rank by ``cadence.ElasticPlanner`` from the step durations
    the ranks exchange at each sync (a small int64 all-gather riding before the pseudo-gradients),
    so a slow rank runs fewer steps and nobody waits long; the plan's hash is checked across
    ranks (TransportError before anything is applied). ``step(seconds)`` gives a step's
    duration (default: timed from the previous call, with CUDA events on a GPU). Ranks then run
    different numbers of steps: end the loop on ``step(stop=...)`` and ``stopped``. Under DDP
    inside replica groups pass ``replica_group``: its members agree on one record (the slowest
    member's durations) and one stop flag, so every cross group computes the same plan.
    ``history`` and ``warmup_steps`` are the planner's (durations per record; BSP steps before
    the first plan, 0: what the predictor needs); ``sync_every`` then reads R.

    The bounded lag ``"lag:<H>:<s>[:<predictor>]"`` (DSSP's rule on inner steps: every rank runs
    at least H steps, a faster one up to H + s, ending nearest the slowest rank's H-th) and the
    quorum ``"quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>]"`` (the outer step when K ranks
    have finished H steps, waiting up to the grace window for more) run as the C++ adapter's
    timed path, planned by ``cadence.OuterSchedule`` (the C++ ``outer_schedule``): each rank's
    record (steps behind its pseudo-gradient, syncs it was carried, whether it contributes, the
    plan hash, its latest durations) is all-gathered at every sync and every rank computes the
    same next plan (``plan``: ``steps`` and ``contributes`` per rank). Under a quorum a late rank
    joins the sync without a pseudo-gradient (its local weights untouched) and carries its work
    to a later sync, where it counts with weight steps / (1 + staleness) (docs/contract.md);
    ``progress``, ``carried``, ``stale_contributions`` and ``max_staleness`` say what happened.
    ``history`` applies (``warmup_steps`` does not: the warm-up is H steps for every rank until
    the predictor has step times); ``sync_every`` reads H. ``stop`` and ``replica_group`` work as
    under the elastic schedule.

    ``codec``: how pseudo-gradients travel: ``"f32"`` (the backend's all-reduce), ``"bf16"``,
    ``"fp16"``, ``"int8"`` or ``"int4"`` (one f32 scale per 128 elements), with the C++ codecs'
    rounding rules. A lossy codec's exchange is a reduce-scatter then an all-gather of encoded
    segments, as the C++ coded ring, moving 2 (n - 1) / n of the encoded bytes per rank (an
    all-gather of whole contributions would move n - 1 times them): the pseudo-gradient is cut
    into one segment per rank; each rank encodes the segment each other rank owns and sends it
    to its owner, which decodes the pieces, sums them with its own in rank order, encodes the
    sum once and sends those bytes to every rank; every rank, the owner included, decodes the
    same bytes, so the global weights stay bit for bit identical on every rank. With ``delay``
    >= 2 the reduce-scatter runs over the first ``delay // 2`` inner steps and the all-gather
    over the rest (each half overlapping inner steps); otherwise both at completion. A single
    rank sends nothing and encodes nothing (as C++). ``error_feedback`` (lossy codecs, default
    True) adds, per element, what the previous encoding of that element lost before the next
    one: each rank encodes every element once per exchange (the others' segments as its
    contribution, its own segment as the reduced sum), so the loss of every encoding is fed
    back. ``weight_by_steps`` (default True; the
    timed schedules run unequal steps) weights each rank's pseudo-gradient by the inner
    steps behind it: the outer gradient is the sum of steps_r * (global - local_r) over the sum
    of steps_r, as the C++ adapter (a quorum's carried contribution divided by 1 + its
    staleness, the sum still over the undiscounted steps).

    ``state_dict()`` holds the global weights, the outer optimizers' state, the counters, the
    error-feedback residuals and (elastic) what recomputes the plan in force; a fragment in
    flight is completed first.
    """

    _component = "DiLoCo"

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer,
                 outer_optimizer: Optional[Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer]] = None,
                 sync_every: Optional[int] = None, fragments: int = 1, delay: int = 0, alpha: float = 0.0,
                 process_group=None, timeout: Optional[float] = None, *, schedule: Optional[str] = None,
                 codec: str = "f32", error_feedback: bool = True, weight_by_steps: bool = True,
                 replica_group=None, history: int = 16, warmup_steps: int = 0):
        self.process_group, self.rank, self.world_size = group_info(self._component, process_group)
        here = self._here()
        if not isinstance(model, torch.nn.Module):
            raise InvalidParameterError(f"{here}model must be a torch.nn.Module, got {type(model).__name__}")
        self._elastic = None  # the elastic config (cadence.ElasticPlanner's)
        self._lagq = None  # the bounded-lag or quorum config (cadence.OuterSchedule's)
        if schedule is not None:
            if not isinstance(schedule, str):
                raise InvalidParameterError(f"{here}schedule must be a string, got {schedule!r}")
            kind, _, rest = schedule.partition(":")
            if kind == "fixed":
                try:
                    h = int(rest)
                except ValueError:
                    raise InvalidParameterError(f"{here}schedule {schedule!r}: expected fixed:<H>") from None
                if sync_every is not None and sync_every != h:
                    raise InvalidParameterError(f"{here}schedule {schedule!r} and sync_every = {sync_every} "
                                                "disagree: give one of them")
                sync_every = h
            elif kind == "elastic":
                if sync_every is not None:
                    raise InvalidParameterError(f"{here}sync_every = {sync_every} is the fixed schedule's; the "
                                                f"elastic schedule {schedule!r} sets the steps by its plan")
                self._elastic = schedule
            elif kind in ("lag", "quorum"):
                if sync_every is not None:
                    raise InvalidParameterError(f"{here}sync_every = {sync_every} is the fixed schedule's; the "
                                                f"{kind} schedule {schedule!r} sets the steps by its plan")
                self._lagq = schedule
            else:
                raise InvalidParameterError(f"{here}unknown schedule {schedule!r} (valid: fixed:<H>, "
                                            "elastic:<R>[:<predictor>][:<variant>], lag:<H>:<s>[:<predictor>], "
                                            "quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>])")
        timed = self._elastic or self._lagq
        if sync_every is None:
            sync_every = 50
        for name, value, least in (("sync_every", sync_every, 1), ("fragments", fragments, 1), ("delay", delay, 0),
                                   ("history", history, 2), ("warmup_steps", warmup_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidParameterError(f"{here}{name} must be an integer >= {least}, got {value!r}")
        if timed is None and (history != 16 or warmup_steps != 0):
            raise InvalidParameterError(f"{here}history and warmup_steps are the timed schedules' (got history "
                                        f"{history}, warmup_steps {warmup_steps} with fixed:{sync_every})")
        if self._lagq is not None and warmup_steps != 0:
            raise InvalidParameterError(f"{here}warmup_steps is the elastic schedule's; {self._lagq!r} warms up "
                                        f"with H steps until the predictor has step times (got {warmup_steps})")
        if timed is not None and (fragments != 1 or delay != 0):
            raise InvalidParameterError(f"{here}fragments and delay need the fixed schedule (got fragments "
                                        f"{fragments}, delay {delay} with {timed!r})")
        if fragments > sync_every:
            raise InvalidParameterError(f"{here}fragments {fragments} exceed sync_every = {sync_every} (each "
                                        "fragment needs a step of its own)")
        if delay >= sync_every:
            raise InvalidParameterError(f"{here}delay {delay} must be less than sync_every = {sync_every} (a "
                                        "fragment's exchange ends before its next one starts)")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) < 1.0:
            raise InvalidParameterError(f"{here}alpha must be a number in [0, 1), got {alpha!r}")
        if codec == "none":
            codec = "f32"
        if codec not in CODECS:
            raise InvalidParameterError(f"{here}unknown codec {codec!r} (valid: f32, none, bf16, fp16, int8, int4)")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.sync_every = sync_every
        self.fragments = fragments
        self.delay = delay
        self.alpha = float(alpha)
        self.codec = codec
        self.error_feedback = bool(error_feedback)
        self.weight_by_steps = bool(weight_by_steps)
        self.timeout = (group_timeout(self.process_group) if timeout is None
                        else check_seconds(self._component, "timeout", timeout))
        params = [p for p in model.parameters()]
        if not params:
            raise InvalidParameterError(f"{here}the model has no parameters")
        for i, p in enumerate(params):
            if not p.is_floating_point():
                raise InvalidParameterError(f"{here}parameter {i} is {p.dtype}; DiLoCo needs floating point")
        self._local = params
        # Fragments: contiguous parameter groups, cut where the running size passes k / F.
        if len(params) < fragments:
            raise InvalidParameterError(f"{here}{fragments} fragments need at least {fragments} parameter "
                                        f"tensors, the model has {len(params)}")
        total = sum(p.numel() for p in params)
        cum = list(itertools.accumulate(p.numel() for p in params))
        cuts = [0]
        for k in range(1, fragments):
            i = next(j + 1 for j, c in enumerate(cum) if c * fragments >= k * total)
            cuts.append(min(max(i, cuts[-1] + 1), len(params) - (fragments - k)))
        cuts.append(len(params))
        self._frag = [(cuts[k], cuts[k + 1]) for k in range(fragments)]
        # The timed schedule's planner, and the replica group whose members step together.
        self.replica_group, self.replica_size = None, 1
        if replica_group is not None:
            if timed is None:
                raise InvalidParameterError(f"{here}replica_group is for the timed schedules (its members "
                                            "agree on one timing record); the fixed one needs none")
            _, _, self.replica_size = group_info(self._component, replica_group)
            self.replica_group = replica_group
        if self._elastic is not None:
            import cadence

            try:
                self._planner = cadence.ElasticPlanner(self._elastic, self.world_size, history, warmup_steps)
            except cadence.Error as e:
                raise type(e)(here + str(e)) from None
            self._history = history
            self._words = int(self._planner.record_words)
            self._round = self._planner.bsp_round(0, _SALT)
            self.sync_every = int(self._planner.lookahead)  # R, as the C++ schedule's period()
        if self._lagq is not None:
            import cadence

            try:
                self._planner = cadence.OuterSchedule(self._lagq, self.world_size, history)
            except cadence.Error as e:
                raise type(e)(here + str(e)) from None
            self._history = history
            self._words = int(self._planner.record_words)
            self._round = self._planner.first_plan()
            self.sync_every = int(self._planner.period)  # H
        backend = _device.ops.backend(self.process_group)
        dev = _device.ops.device_of(params[0])
        self._ctrl = _device.CPU if ("gloo" in backend or "mpi" in backend) else dev  # the records' tensors
        self._device_hint = dev if _device.ops.is_accelerator(dev) else None  # CUDA events time the steps
        deadline = Deadline(self.timeout)
        with torch.no_grad():
            for p in params:
                self._wait(dist.broadcast(p.data, global_rank(self.process_group, 0), group=self.process_group,
                                          async_op=True),
                           "broadcast of rank 0's weights", deadline)
        self._global = [torch.nn.Parameter(p.detach().clone()) for p in params]
        make = outer_optimizer if outer_optimizer is not None else _nesterov
        self.outer_optimizers = [make(self._global[a:b]) for a, b in self._frag]
        # Error feedback: per fragment, what the last encoding of each element lost.
        self._residual = [None] * fragments
        self.step_count = 0  # inner steps since the start
        self.outer_steps = 0  # fragment outer steps applied
        self.bytes_sent = 0  # pseudo-gradients (f32: as a ring all-reduce; coded: what both halves send) and records
        self._flight = [None] * fragments  # (work, buffers, started, divisor) per fragment
        # The timed schedules: steps since the last sync, the latest durations, the syncs done.
        self.local_steps = 0
        self.syncs = 0
        self.stopped = False
        self._stop = False
        self._ring: list = [0] * (history if timed is not None else 0)
        self._recorded = 0
        self._records: Optional[list] = None
        # The bounded-lag and quorum schedules (as the C++ adapter): inner steps behind this
        # rank's next pseudo-gradient, syncs it has been carried over, and (quorum) the global
        # weights its local work started from; the stale contributions seen, over all ranks.
        self.progress = 0
        self.carried = 0
        self._anchor = ([g.detach().clone() for g in self._global]
                        if self._lagq is not None and self._planner.kind == "quorum" else None)
        self.stale_contributions = 0
        self.max_staleness = 0
        self._mark = _device.ops.mark(self._device_hint)

    # ---- helpers ---------------------------------------------------------------------------------
    def _here(self) -> str:
        return where(self._component, self.rank, self.world_size)

    def _wait(self, work, what: str, deadline: Deadline) -> None:
        try:
            wait_work(work, deadline, poll=self._device_hint is not None)
        except (RuntimeError, WaitTimeout) as e:
            raise TransportError(f"{self._here()}{what} at step {self.step_count} failed or did not complete "
                                 f"within {self.timeout:g} s: {e}") from e

    def _latest_durations(self, have: int) -> List[int]:
        """The latest ``have`` step durations recorded, oldest first."""
        return [self._ring[(self._recorded - have + i) % self._history] for i in range(have)]

    def _replica_max(self, record: List[int], deadline: Deadline) -> List[int]:
        """``record``, each value the largest of the replica group's (one record per replica: its
        members follow one plan; the slowest member's durations); as it is without replicas."""
        if self.replica_group is None or self.replica_size <= 1:
            return record
        t = _device.ops.tensor(record, torch.int64, self._ctrl)
        self._wait(dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.replica_group, async_op=True),
                   "the timing record (all_reduce in the replica group)", deadline)
        return [int(v) for v in t.cpu().tolist()]

    def _all_gather_rows(self, row: List[int], what: str, deadline: Deadline):
        """Every rank's ``row`` (int64 values), gathered: a NumPy array with a row per rank."""
        ops = _device.ops
        mine = ops.tensor(row, torch.int64, self._ctrl)
        gathered = [ops.empty(len(row), torch.int64, self._ctrl) for _ in range(self.world_size)]
        work = dist.all_gather(gathered, mine, group=self.process_group, async_op=True)
        self.bytes_sent += _ring_bytes(self.world_size * len(row) * 8, self.world_size)
        self._wait(work, what, deadline)
        return torch.stack(gathered).cpu().numpy()

    @property
    def schedule(self) -> str:
        """The schedule in force: ``"fixed:<H>"`` or the planner's canonical elastic config."""
        return f"fixed:{self.sync_every}" if not self._timed else str(self._planner.config)

    @property
    def _timed(self) -> bool:
        return self._elastic is not None or self._lagq is not None

    def _sends_at(self, f: int, t: int) -> bool:
        h = self.sync_every
        return t % h == (f + 1) * h // self.fragments % h

    # ---- exchanges -------------------------------------------------------------------------------
    def _begin(self, f: int, scale: float = 1.0, divisor: Optional[float] = None) -> None:
        """Starts fragment f's exchange: its pseudo-gradient times `scale`, summed over the
        ranks (f32: all-reduce; a lossy codec: the coded reduce-scatter, _begin_coded); the
        sum will be divided by `divisor` (default: the group's size)."""
        a, b = self._frag[f]
        base = self._global if self._anchor is None else self._anchor  # where the local work started
        with torch.no_grad():
            flat = torch.cat([(g.detach() - p.detach()).reshape(-1)
                              for g, p in zip(base[a:b], self._local[a:b])])
            if scale == 0.0:
                flat.zero_()  # a rank joining a quorum's sync without a pseudo-gradient
            elif scale != 1.0:
                flat.mul_(scale)
            if self.codec == "f32":
                work = dist.all_reduce(flat, group=self.process_group, async_op=True)
                self.bytes_sent += _ring_bytes(flat.numel() * flat.element_size(), self.world_size)
                bufs = (flat, None)
            elif self.world_size == 1:
                work, bufs = None, (flat, None)  # nothing to send, nothing to encode (as C++)
            else:
                work, coded = self._begin_coded(f, flat)
                bufs = (flat, coded)
        self._flight[f] = (work, bufs, self.step_count, float(self.world_size if divisor is None else divisor))

    # The lossy codecs' exchange: the C++ coded ring's reduce-scatter and all-gather
    # (coded_allreduce.hpp), each half one all_to_all_single instead of n - 1 ring hops. Each
    # rank still encodes every element once per exchange and sends 2 (n - 1) / n of the encoded
    # bytes; the sums differ from the ring's only in where the partial sums are rounded (here
    # the owner adds decoded pieces in rank order in f32, the ring re-encodes at every hop).
    # all_to_all_single, not per-peer isend/irecv or all_gather: gloo has it in torch 1.13 and
    # 2.x (CPU and CUDA tensors; NCCL and MPI too), with uneven and empty splits, as one
    # collective that the group orders with the others, where per-peer isend/irecv would post
    # 2 (n - 1) operations; and the all-gather half sends each owner's bytes unpadded, where
    # all_gather needs equal sizes (segments differ by one element, int8/int4 blocks by a scale).
    def _begin_coded(self, f: int, flat: torch.Tensor):
        """The reduce-scatter's send: segment s of the pseudo-gradient (elements numel * s // n
        to numel * (s + 1) // n) for each other rank s, encoded once with error feedback, in one
        all_to_all_single; this rank's own segment stays exact until its sum is encoded."""
        n, ranks, me = flat.numel(), self.world_size, self.rank
        cuts = [n * s // ranks for s in range(ranks + 1)]
        x = flat.to(torch.float32)
        res = None
        if self.error_feedback:
            if self._residual[f] is None:
                self._residual[f] = torch.zeros_like(x)
            res = self._residual[f]
        pieces, send = [], [0] * ranks
        for o in range(ranks):
            if o != me:
                lo, hi = cuts[o], cuts[o + 1]
                e = _encode_piece(self.codec, x[lo:hi], None if res is None else res[lo:hi])
                pieces.append(e)
                send[o] = e.numel()
        mine = encoded_bytes(self.codec, cuts[me + 1] - cuts[me])
        splits = [0 if r == me else mine for r in range(ranks)]
        recv = torch.empty(sum(splits), dtype=torch.uint8, device=x.device)
        work = dist.all_to_all_single(recv, torch.cat(pieces), splits, send, group=self.process_group,
                                      async_op=True)
        self.bytes_sent += sum(send)
        return work, _Coded(x, cuts, recv, splits)

    def _gather_coded(self, f: int, deadline: Deadline) -> None:
        """The reduce-scatter's end and the all-gather's start: waits for the pieces of this
        rank's segment, sums them with its own in rank order (the same order, so the same floats,
        in every run), encodes the sum once (error feedback on this rank's segment) and sends
        those bytes to every other rank in one all_to_all_single."""
        work, (flat, c), started, divisor = self._flight[f]
        self._wait(work, f"exchange of fragment {f}'s pseudo-gradient (the coded reduce-scatter, "
                         "all_to_all_single)", deadline)
        ranks, me, codec = self.world_size, self.rank, self.codec
        with torch.no_grad():
            lo, hi = c.cuts[me], c.cuts[me + 1]
            total = None
            for part in c.pieces(codec, me, c.x[lo:hi], lambda r: hi - lo):
                total = part.clone() if total is None else total.add_(part)
            res = self._residual[f]
            e = _encode_piece(codec, total, None if res is None else res[lo:hi])
            c.own = _decode_piece(codec, e, hi - lo)
            send = [0 if r == me else e.numel() for r in range(ranks)]
            c.splits = [0 if r == me else encoded_bytes(codec, c.cuts[r + 1] - c.cuts[r]) for r in range(ranks)]
            c.recv = torch.empty(sum(c.splits), dtype=torch.uint8, device=e.device)
            c.phase = 2
            work = dist.all_to_all_single(c.recv, e.repeat(ranks - 1), c.splits, send, group=self.process_group,
                                          async_op=True)
        self.bytes_sent += sum(send)
        self._flight[f] = (work, (flat, c), started, divisor)

    def _complete(self, f: int, deadline: Deadline, adopt: bool = True) -> None:
        if self._flight[f][1][1] is not None and self._flight[f][1][1].phase == 1:
            self._gather_coded(f, deadline)
        work, (flat, c), _, divisor = self._flight[f]
        self._flight[f] = None
        if work is not None:
            what = "" if c is None else " (the coded all-gather, all_to_all_single)"
            self._wait(work, f"exchange of fragment {f}'s pseudo-gradient{what}", deadline)
        if c is not None:  # every rank decodes the same bytes: each owner's encoded sum
            flat = torch.cat(c.pieces(self.codec, self.rank, c.own, lambda r: c.cuts[r + 1] - c.cuts[r]))
        flat.div_(divisor)
        a, b = self._frag[f]
        at = 0
        for g in self._global[a:b]:
            n = g.numel()
            g.grad = flat[at:at + n].view_as(g).to(g.dtype)
            at += n
        self.outer_optimizers[f].step()
        self.outer_optimizers[f].zero_grad(set_to_none=True)
        if adopt:
            with torch.no_grad():
                for g, p in zip(self._global[a:b], self._local[a:b]):
                    if self.alpha == 0.0:
                        p.copy_(g)
                    else:
                        p.mul_(self.alpha).add_(g, alpha=1.0 - self.alpha)
                if self._anchor is not None:
                    for g, h in zip(self._global[a:b], self._anchor[a:b]):
                        h.copy_(g)
        self.outer_steps += 1

    # ---- the loop --------------------------------------------------------------------------------
    def step(self, seconds: Optional[float] = None, stop: bool = False) -> bool:
        """One inner step finished (after ``inner_optimizer.step()``). Fixed schedule: completes
        the fragments whose delay ends now and starts those whose turn it is (with delay 0 at
        once, blocking); returns True when it applied or started an outer step. Timed
        schedules (elastic, lag, quorum): records the step's duration (``seconds`` on this rank's clock, compute only;
        None: since the previous call, with CUDA events on a GPU) and syncs when the plan says
        so, returning True then; ``stop=True`` asks every rank to stop at the next sync (then
        ``stopped`` is True on all of them; the fixed schedule refuses it, its loops end on a
        step count, and ignores ``seconds``). TransportError names the collective and the step
        when a peer fails or stalls past the timeout; InvalidParameterError, before anything
        moves, for a bad duration."""
        if self._timed:
            return self._step_timed(seconds, stop)
        if stop:
            raise InvalidParameterError(f"{self._here()}step(stop=True) is the timed schedules' agreement; "
                                        f"under {self.schedule} every rank runs the same steps: end the loop on "
                                        "a step count")
        self.step_count += 1
        t = self.step_count
        deadline = Deadline(self.timeout)
        acted = False
        for f in range(self.fragments):
            fl = self._flight[f]
            if fl is not None and fl[2] + self.delay == t:
                self._complete(f, deadline)
                acted = True
        if self.delay >= 2:  # a coded exchange's all-gather half starts halfway through its delay
            for f in range(self.fragments):
                fl = self._flight[f]
                if fl is not None and fl[1][1] is not None and fl[1][1].phase == 1 and fl[2] + self.delay // 2 == t:
                    self._gather_coded(f, deadline)
        for f in range(self.fragments):
            if self._sends_at(f, t):
                if self._flight[f] is not None:
                    self._complete(f, deadline)
                self._begin(f)
                if self.delay == 0:
                    self._complete(f, deadline)
                acted = True
        return acted

    def finish(self) -> None:
        """Completes every fragment in flight and applies its outer step (the end of training,
        or before a checkpoint); on every rank after the same step."""
        deadline = Deadline(self.timeout)
        for f in range(self.fragments):
            if self._flight[f] is not None:
                self._complete(f, deadline)

    @property
    def global_parameters(self) -> List[torch.Tensor]:
        """The global (outer) weights, identical on every rank, in the model's parameter order."""
        return [g.detach() for g in self._global]

    # ---- the elastic schedule --------------------------------------------------------------------
    @property
    def planned(self) -> int:
        """Inner steps this rank runs before its next sync (fixed: sync_every)."""
        if not self._timed:
            return self.sync_every
        return int(self._round.steps[self.rank])

    @property
    def plan(self):
        """The plan in force, identical on every rank: elastic, a ``cadence.ElasticRound``; lag
        and quorum, a ``cadence.OuterPlan`` (``steps`` and ``contributes`` per rank, ``hash``);
        None under the fixed schedule."""
        return self._round if self._timed else None

    def _microseconds(self, s: float, shown) -> int:
        return step_microseconds(self._here(), s, shown)

    def _step_timed(self, seconds, stop: bool) -> bool:
        if seconds is None:
            now = _device.ops.mark(self._device_hint)
            entry, self._mark = (self._mark, now), now
        else:
            try:
                s = float(seconds)
            except (TypeError, ValueError):
                raise InvalidParameterError(f"{self._here()}step duration must be a number of seconds, "
                                            f"got {seconds!r}") from None
            entry = self._microseconds(s, seconds)
            self._mark = _device.ops.mark(self._device_hint)  # a self-timed step after this one starts now
        self._ring[self._recorded % self._history] = entry
        self._recorded += 1
        self.local_steps += 1
        self.progress += 1
        self.step_count += 1
        self._stop = self._stop or bool(stop)
        if self.local_steps < self.planned:
            return False
        if self._elastic is not None:
            self._sync_timed()
        else:
            self._sync_outer()
        return True

    def _sync_timed(self) -> None:
        ops = _device.ops
        for i, e in enumerate(self._ring):  # CUDA events are read here, where the sync waits anyway
            if isinstance(e, tuple):
                s = ops.seconds_between(e[0], e[1])
                self._ring[i] = self._microseconds(max(s, 0.0), s)
        deadline = Deadline(self.timeout)
        w = self._words
        have = min(self._recorded, self._history)
        row = [0] * (w + 2)  # the planner's record, the stop flag, the plan hash
        row[0] = self.local_steps
        row[1] = have
        row[2:2 + have] = self._latest_durations(have)
        row[w] = 1 if self._stop else 0
        row[:w + 1] = self._replica_max(row[:w + 1], deadline)
        row[w + 1] = int(self._round.hash) >> 2
        rows = self._all_gather_rows(row, "all_gather of the timing records", deadline)
        hashes = rows[:, w + 1]
        if (hashes != hashes[0]).any():
            raise TransportError(
                f"{self._here()}the ranks followed different plans at sync {self.syncs + 1} (plan hashes by "
                f"rank: {', '.join(str(int(x)) for x in hashes)}): every rank must use the same schedule, "
                f"history and warm-up (this rank: {self.schedule})")
        steps = rows[:, 0]
        if self.weight_by_steps:
            scale, divisor = float(row[0]), float(steps.sum())
        else:
            scale, divisor = 1.0, float(self.world_size)
        self._begin(0, scale, divisor)
        self._complete(0, deadline)
        records = np.ascontiguousarray(rows[:, :w], dtype=np.int64).reshape(-1)
        self.syncs += 1
        self._round = self._planner.plan(records, self.syncs, _SALT)
        self._records = [int(x) for x in records]
        self.local_steps = 0
        self.progress = 0
        self.stopped = bool(rows[:, w].any())
        self._mark = ops.mark(self._device_hint)

    # ---- the bounded-lag and quorum schedules (cadence.OuterSchedule) ----------------------------
    def _sync_outer(self) -> None:
        """The C++ adapter's timed sync (diloco::sync_timed): every rank's record (steps behind
        its pseudo-gradient, syncs carried, whether it contributes, the plan hash it followed,
        its latest durations) and stop flag all-gathered; the hashes checked; the pseudo-
        gradients of the contributing ranks summed, each weighted by its steps over 1 + its
        staleness, divided by the steps of this sync's contributions; the outer step applied on
        every rank, taken by the contributors; the next plan computed from the records."""
        import cadence

        S = cadence.OuterSchedule
        self._resolve_marks()  # CUDA events are read here, where the sync waits anyway
        ops = _device.ops
        deadline = Deadline(self.timeout)
        w = self._words
        have = min(self._recorded, self._history)
        contributes = int(self._round.contributes[self.rank]) != 0
        row = [0] * (w + 1)  # the record, then the stop flag
        row[S.RECORD_STEPS] = self.progress
        row[S.RECORD_CARRIED] = self.carried
        row[S.RECORD_CONTRIBUTES] = 1 if contributes else 0
        h = int(self._round.hash)
        row[S.RECORD_HASH] = h - (1 << 64) if h >= 1 << 63 else h  # as C++'s static_cast<int64_t>
        row[S.RECORD_HAVE] = have
        row[S.RECORD_HEAD:S.RECORD_HEAD + have] = self._latest_durations(have)
        row[w] = 1 if self._stop else 0
        row = self._replica_max(row, deadline)
        rows = self._all_gather_rows(row, "all_gather of the sync records", deadline)
        hashes = rows[:, S.RECORD_HASH]
        other = [r for r in range(self.world_size) if hashes[r] != row[S.RECORD_HASH]]
        if other:
            raise TransportError(
                f"{self._here()}rank{'s' if len(other) > 1 else ''} {', '.join(map(str, other))} followed another "
                f"plan than this rank at sync {self.syncs + 1} (plan hashes by rank: "
                f"{', '.join(str(int(x)) for x in hashes)}): every rank must use the same schedule "
                f"{self.schedule!r} and history")
        total = 0.0
        for r in range(self.world_size):
            if rows[r, S.RECORD_CONTRIBUTES] == 0:
                continue
            total += float(rows[r, S.RECORD_STEPS]) if self.weight_by_steps else 1.0
            stale = int(rows[r, S.RECORD_CARRIED])
            if stale > 0:
                self.stale_contributions += 1
                self.max_staleness = max(self.max_staleness, stale)
        scale = 0.0
        if contributes:
            scale = (float(self.progress) if self.weight_by_steps else 1.0) / (1.0 + float(self.carried))
        self._begin(0, scale, total if total > 0 else 1.0)
        self._complete(0, deadline, adopt=contributes)
        self.syncs += 1
        if contributes:
            self.progress = 0
            self.carried = 0
        else:
            self.carried += 1
        records = np.ascontiguousarray(rows[:, :w], dtype=np.int64).reshape(-1)
        self._round = self._planner.plan(records, self.syncs)
        self._records = [int(x) for x in records]
        self.local_steps = 0
        self.stopped = bool(rows[:, w].any())
        self._mark = ops.mark(self._device_hint)

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The global weights, each fragment's outer-optimizer state, the counters, the
        error-feedback residuals and, under a timed schedule, the latest durations and the last
        sync's records (from which ``load_state_dict`` recomputes the plan in force); under lag
        and quorum also this rank's steps and staleness behind its next pseudo-gradient and
        (quorum) the global weights its local work started from, so each rank saves and loads
        its own. After completing any fragment in flight, a collective: every rank calls it at
        the same step (timed schedules: right after a sync). The model's and the inner
        optimizer's state are the caller's to save."""
        self.finish()
        self._resolve_marks()
        return {"version": 2, "sync_every": self.sync_every, "fragments": self.fragments, "delay": self.delay,
                "alpha": self.alpha, "world_size": self.world_size, "step_count": self.step_count,
                "outer_steps": self.outer_steps, "global": [g.detach().clone() for g in self._global],
                "outer_optimizers": [o.state_dict() for o in self.outer_optimizers],
                "schedule": self.schedule, "codec": self.codec, "bytes_sent": self.bytes_sent,
                "residual": [None if r is None else r.clone() for r in self._residual],
                "local_steps": self.local_steps, "syncs": self.syncs, "stop": self._stop,
                "ring": [int(x) for x in self._ring], "recorded": self._recorded, "records": self._records,
                "plan_hash": int(self._round.hash) if self._timed else None,
                "progress": self.progress, "carried": self.carried,
                "anchor": None if self._anchor is None else [h.clone() for h in self._anchor],
                "stale": [self.stale_contributions, self.max_staleness]}

    def _resolve_marks(self) -> None:
        for i, e in enumerate(self._ring):
            if isinstance(e, tuple):
                s = _device.ops.seconds_between(e[0], e[1])
                self._ring[i] = self._microseconds(max(s, 0.0), s)

    def load_state_dict(self, sd: dict) -> None:
        """Resumes from ``state_dict()`` with the same sync_every, fragments, delay, schedule,
        codec and model (InvalidParameterError naming the first that differs). Build the model
        and this DiLoCo first (its constructor broadcasts rank 0's weights), then load the
        model's and the inner optimizer's state, then this."""
        here = self._here()
        saved = dict(sd)
        saved.setdefault("schedule", f"fixed:{saved.get('sync_every')}")
        saved.setdefault("codec", "f32")
        for key in ("sync_every", "fragments", "delay", "schedule", "codec"):
            if saved.get(key) != getattr(self, key):
                raise InvalidParameterError(f"{here}checkpoint has {key} = {saved.get(key)!r}, this DiLoCo "
                                            f"{getattr(self, key)!r}")
        if saved.get("world_size", self.world_size) != self.world_size:
            raise InvalidParameterError(f"{here}checkpoint has world_size = {saved['world_size']}, this "
                                        f"process group {self.world_size}")
        if len(sd["global"]) != len(self._global) or any(
                a.shape != b.shape for a, b in zip(sd["global"], self._global)):
            raise InvalidParameterError(f"{here}checkpoint's global weights do not match the model's "
                                        "parameters (count or shapes)")
        if self._timed:
            syncs, records = int(sd["syncs"]), sd["records"]
            if self._elastic is not None:
                plan = (self._planner.bsp_round(0, _SALT) if syncs == 0 else
                        self._planner.plan(np.asarray(records, dtype=np.int64), syncs, _SALT))
            else:
                plan = (self._planner.first_plan() if syncs == 0 else
                        self._planner.plan(np.asarray(records, dtype=np.int64), syncs))
            if int(plan.hash) != int(sd["plan_hash"]):
                raise TransportError(f"{here}load_state_dict: the plan recomputed from the checkpoint's "
                                     f"records hashes {int(plan.hash)}, the saved one {int(sd['plan_hash'])}: "
                                     "the planner differs from the one that saved it (another cadence version?)")
            self._round, self._records, self.syncs = plan, records, syncs
            self._ring = [int(x) for x in sd["ring"]]
            self._recorded = int(sd["recorded"])
            self.local_steps = int(sd["local_steps"])
            self._stop = bool(sd["stop"])
            self.progress = int(sd.get("progress", 0))
            self.carried = int(sd.get("carried", 0))
            self.stale_contributions, self.max_staleness = (int(x) for x in sd.get("stale", (0, 0)))
            self.stopped = False
        with torch.no_grad():
            for g, saved_g in zip(self._global, sd["global"]):
                g.copy_(saved_g)
            if self._anchor is not None:
                for h, saved_h in zip(self._anchor, sd.get("anchor") or sd["global"]):
                    h.copy_(saved_h)
        for o, s in zip(self.outer_optimizers, sd["outer_optimizers"]):
            o.load_state_dict(s)
        self._residual = [None if r is None else r.clone().to(self._global[0].device)
                          for r in sd.get("residual", [None] * self.fragments)]
        self.step_count = int(sd["step_count"])
        self.outer_steps = int(sd["outer_steps"])
        self.bytes_sent = int(sd.get("bytes_sent", 0))
        self._flight = [None] * self.fragments
        self._mark = _device.ops.mark(self._device_hint)
