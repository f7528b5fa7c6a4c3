# DiLoCo over torch.distributed: inner steps by the user's optimizer, an outer optimizer on the
# averaged pseudo-gradient (global minus local weights), streaming fragments whose all-reduce
# overlaps the next inner steps, a mixing factor, and a checkpoint. The Python face of
# cadence::exchange::diloco's fixed schedule (docs/local-sgd.md).
from __future__ import annotations

import itertools
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from ._common import (Deadline, InvalidParameterError, TransportError, WaitTimeout, check_seconds,
                      global_rank, group_info, group_timeout, wait_work, where)


def _nesterov(params):
    """DiLoCo's outer optimizer (arXiv 2311.08105): SGD, lr 0.7, Nesterov momentum 0.9."""
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


class DiLoCo:
    r"""DiLoCo (arXiv 2311.08105) with Streaming DiLoCo's fragments, overlap and mixing
    (2501.18512) over ``torch.distributed``::

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
    H) and, ``delay`` steps later (the all-reduce running meanwhile), applies the outer step
    to its global weights and sets the local ones to ``alpha * local + (1 - alpha) * global``.

    ``outer_optimizer`` builds the outer optimizer from a list of parameters (one per fragment,
    so each keeps its own step count); default SGD with Nesterov momentum, lr 0.7, momentum
    0.9. ``process_group``: the ranks that average (under DDP or FSDP inside replica groups,
    the cross group of ``cadence.torch.replica_groups``, every replica's ranks holding the same
    weights). ``timeout`` bounds each wait (default: the group's). The constructor broadcasts
    rank 0's weights into every rank's model. ``state_dict()`` holds the global weights, the
    outer optimizers' state and the counters; a fragment in flight is completed first.

    This class runs the fixed schedule; the policy-timed schedules (ElasticBSP, bounded lag,
    quorum with a grace window) and compressed outer gradients are the C++ adapter's
    (``cadence::exchange::diloco``) for now.
    """

    _component = "DiLoCo"

    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer,
                 outer_optimizer: Optional[Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer]] = None,
                 sync_every: int = 50, fragments: int = 1, delay: int = 0, alpha: float = 0.0,
                 process_group=None, timeout: Optional[float] = None):
        self.process_group, self.rank, self.world_size = group_info(self._component, process_group)
        here = self._here()
        if not isinstance(model, torch.nn.Module):
            raise InvalidParameterError(f"{here}model must be a torch.nn.Module, got {type(model).__name__}")
        for name, value, least in (("sync_every", sync_every, 1), ("fragments", fragments, 1), ("delay", delay, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise InvalidParameterError(f"{here}{name} must be an integer >= {least}, got {value!r}")
        if fragments > sync_every:
            raise InvalidParameterError(f"{here}fragments {fragments} exceed sync_every = {sync_every} (each "
                                        "fragment needs a step of its own)")
        if delay >= sync_every:
            raise InvalidParameterError(f"{here}delay {delay} must be less than sync_every = {sync_every} (a "
                                        "fragment's exchange ends before its next one starts)")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) < 1.0:
            raise InvalidParameterError(f"{here}alpha must be a number in [0, 1), got {alpha!r}")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.sync_every = sync_every
        self.fragments = fragments
        self.delay = delay
        self.alpha = float(alpha)
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
        deadline = Deadline(self.timeout)
        with torch.no_grad():
            for p in params:
                self._wait(dist.broadcast(p.data, global_rank(self.process_group, 0), group=self.process_group,
                                          async_op=True),
                           "broadcast of rank 0's weights", deadline)
        self._global = [torch.nn.Parameter(p.detach().clone()) for p in params]
        make = outer_optimizer if outer_optimizer is not None else _nesterov
        self.outer_optimizers = [make(self._global[a:b]) for a, b in self._frag]
        self.step_count = 0  # inner steps since the start
        self.outer_steps = 0  # fragment outer steps applied
        self._flight = [None] * fragments  # (work, flat pseudo-gradient, started) per fragment

    # ---- helpers ---------------------------------------------------------------------------------
    def _here(self) -> str:
        return where(self._component, self.rank, self.world_size)

    def _wait(self, work, what: str, deadline: Deadline) -> None:
        try:
            wait_work(work, deadline, poll=False)
        except (RuntimeError, WaitTimeout) as e:
            raise TransportError(f"{self._here()}{what} at step {self.step_count} failed or did not complete "
                                 f"within {self.timeout:g} s: {e}") from e

    def _sends_at(self, f: int, t: int) -> bool:
        h = self.sync_every
        return t % h == (f + 1) * h // self.fragments % h

    def _begin(self, f: int) -> None:
        a, b = self._frag[f]
        with torch.no_grad():
            flat = torch.cat([(g.detach() - p.detach()).reshape(-1)
                              for g, p in zip(self._global[a:b], self._local[a:b])])
        work = dist.all_reduce(flat, group=self.process_group, async_op=True)
        self._flight[f] = (work, flat, self.step_count)

    def _complete(self, f: int, deadline: Deadline) -> None:
        work, flat, _ = self._flight[f]
        self._flight[f] = None
        self._wait(work, f"all-reduce of fragment {f}'s pseudo-gradient", deadline)
        flat.div_(self.world_size)
        a, b = self._frag[f]
        at = 0
        for g in self._global[a:b]:
            n = g.numel()
            g.grad = flat[at:at + n].view_as(g).to(g.dtype)
            at += n
        self.outer_optimizers[f].step()
        self.outer_optimizers[f].zero_grad(set_to_none=True)
        with torch.no_grad():
            for g, p in zip(self._global[a:b], self._local[a:b]):
                if self.alpha == 0.0:
                    p.copy_(g)
                else:
                    p.mul_(self.alpha).add_(g, alpha=1.0 - self.alpha)
        self.outer_steps += 1

    # ---- the loop --------------------------------------------------------------------------------
    def step(self) -> bool:
        """One inner step finished (after ``inner_optimizer.step()``). Completes the fragments
        whose delay ends now and starts those whose turn it is (with delay 0 at once, blocking);
        returns True when it applied or started an outer step. TransportError names the
        collective and the step when a peer fails or stalls past the timeout."""
        self.step_count += 1
        t = self.step_count
        deadline = Deadline(self.timeout)
        acted = False
        for f in range(self.fragments):
            fl = self._flight[f]
            if fl is not None and fl[2] + self.delay == t:
                self._complete(f, deadline)
                acted = True
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

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The global weights, each fragment's outer-optimizer state and the counters (after
        completing any fragment in flight, a collective: every rank calls it at the same step).
        The model's and the inner optimizer's state are the caller's to save."""
        self.finish()
        return {"version": 1, "sync_every": self.sync_every, "fragments": self.fragments, "delay": self.delay,
                "alpha": self.alpha, "world_size": self.world_size, "step_count": self.step_count,
                "outer_steps": self.outer_steps, "global": [g.detach().clone() for g in self._global],
                "outer_optimizers": [o.state_dict() for o in self.outer_optimizers]}

    def load_state_dict(self, sd: dict) -> None:
        """Resumes from ``state_dict()`` with the same sync_every, fragments, delay and model
        (InvalidParameterError naming the first that differs)."""
        for key in ("sync_every", "fragments", "delay"):
            if sd.get(key) != getattr(self, key):
                raise InvalidParameterError(f"{self._here()}checkpoint has {key} = {sd.get(key)!r}, this DiLoCo "
                                            f"{getattr(self, key)!r}")
        if len(sd["global"]) != len(self._global) or any(
                a.shape != b.shape for a, b in zip(sd["global"], self._global)):
            raise InvalidParameterError(f"{self._here()}checkpoint's global weights do not match the model's "
                                        "parameters (count or shapes)")
        with torch.no_grad():
            for g, saved in zip(self._global, sd["global"]):
                g.copy_(saved)
        for o, s in zip(self.outer_optimizers, sd["outer_optimizers"]):
            o.load_state_dict(s)
        self.step_count = int(sd["step_count"])
        self.outer_steps = int(sd["outer_steps"])
        self._flight = [None] * self.fragments
