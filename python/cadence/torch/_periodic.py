# Periodic model averaging (post-local SGD) over torch.distributed, with the arguments and the
# schedule of torch's PeriodicModelAverager, over one group or across the replica groups of a
# hierarchy; with its checkpoint.
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import _device
from ._averager_base import _Averager, materialize
from ._common import InvalidParameterError


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

    In a hierarchy (``process_group`` the cross group, ``replica_group`` the group DDP or FSDP2
    runs in; ``cadence.torch.replica_groups``), it merges across the replica groups at the same
    steps, and the stop flag is agreed on across both. Its other arguments are
    :class:`ElasticModelAverager`'s; ``state_dict()`` / ``load_state_dict()`` checkpoint its
    step counters.
    """

    _component = "PeriodicModelAverager"

    def __init__(self, period: int = 1, warmup_steps: int = 0, process_group=None, *,
                 replica_group=None, timeout: Optional[float] = None,
                 name_stragglers: bool = True, module=None, merge_buffers: bool = True,
                 optimizer=None, optimizer_state: str = "local", store=None):
        super().__init__(process_group, replica_group, timeout, name_stragglers, module,
                         merge_buffers, optimizer, optimizer_state, store)
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
        ps, extras = self._collect(materialize(params))
        device = self._control_device() if stop is not None else None
        deadline = self._begin()
        self._merge(ps, extras, "average", deadline)
        any_stop = False
        if stop is not None:
            flag = _device.ops.tensor([1 if stop else 0], torch.int64, device)
            self._wait(dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group,
                                       async_op=True), "all_reduce of the stop flag", deadline, device)
            any_stop = bool(self._replica_max([int(flag[0])], device, deadline, "the stop flag")[0])
        self._after_merge()
        self.global_steps += self.local_steps * self.world_size  # every rank ran as many
        self.local_steps = 0
        self.barriers += 1
        self._due = False
        return any_stop

    # ---- checkpoint ---------------------------------------------------------------------------
    def _identity(self) -> dict:
        return dict(super()._identity(), period=self.period, warmup_steps=self.warmup_steps)

    def state_dict(self) -> dict:
        """This rank's step counters as plain data (``torch.save``,
        ``torch.load(weights_only=True)``); every rank's are alike, since every rank runs the
        same steps."""
        return dict(self._identity(), version=1, step=self.step, local_steps=self.local_steps,
                    barriers=self.barriers, global_steps=self.global_steps, due=self._due,
                    step_marked=self._step_marked)

    def load_state_dict(self, sd: dict) -> None:
        """Resumes from ``state_dict()`` with the same period, warm-up and group sizes
        (InvalidParameterError naming the first that differs): the next merge comes at the
        step it would have come without the restart."""
        self._check_state(sd)
        self.step = int(sd["step"])
        self.local_steps = int(sd["local_steps"])
        self.barriers = int(sd["barriers"])
        self.global_steps = int(sd["global_steps"])
        self._due = bool(sd["due"])
        self._step_marked = bool(sd["step_marked"])
