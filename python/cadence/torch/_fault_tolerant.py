# Periodic model averaging that survives the loss of any process: the replicas' parameters
# averaged inside cadence.membership transactions over ZeroMQ (no torch.distributed group, which
# dies with any rank), and a replacement process admitted with the current weights.
from __future__ import annotations

from typing import Optional

import torch

from ._common import (FlatStaging, InvalidParameterError, Rejoin, broadcast_state_dict, load_state_dict_bytes,
                      replica_roles, state_dict_bytes)


class FaultTolerantAverager:
    r"""Averages ``module``'s parameters (and floating-point buffers) over the processes of a
    :class:`cadence.membership.Member` every ``period`` steps, so that the job goes on when any
    process is lost (rank 0 included) and takes back a replacement without a checkpoint.

    Each sync is a transaction of the member: when a process is lost during it, the survivors
    re-form the quorum and run the sync again without it (``policy="retry"``, the weights put
    back first) or give it up (``"discard"``); every survivor holds the same weights after every
    sync (``member.state_hash`` is equal). The weights are synced through flat CPU copies (one
    per dtype), so the module may live on any device; a replacement receives them, and the
    optimizer's ``state_dict()`` when ``optimizer`` is given, from a member at its admission::

        member = cadence.membership.Member(rank, size, rendezvous_file=path)
        avg = cadence.torch.FaultTolerantAverager(model, member, period=8, optimizer=opt)
        avg.join() if restarted else avg.start()
        for batch in data:
            loss(model, batch).backward(); opt.step(); opt.zero_grad()
            avg.step()                   # averages every 8th call, surviving faults
        avg.finish()                     # every process, after the same steps

    Construct it before :meth:`start` / :meth:`join` (it registers the state with the member).

    **Replicas of several processes** (DDP or any data parallelism inside a replica):
    ``replica_group`` is the ``torch.distributed`` group of the replica's processes (a gloo
    group, or one with a CPU backend: the weights travel as CPU tensors); its first rank holds
    the member (one member per replica, the replica's id as its rank) and every other rank
    passes ``member=None``. After each sync the replica's first rank broadcasts the result (and
    the stop flag, the step count and, at start or join, the optimizer's state) to the others,
    so every rank of every replica holds the same weights. A replica that loses a process dies
    as a whole (its group does): start each replica with its own ``torchrun --max-restarts``, and
    its restart rejoins (``join()`` when ``TORCHELASTIC_RESTART_COUNT`` > 0) while the other
    replicas go on (docs/python-torch.md, "Surviving a lost process").

    **A live process the quorum dropped** (a short link cut, a resume from SIGSTOP after the
    others went on) gets :class:`EvictedError` or
    :class:`QuorumError` from a sync. With ``rejoin=N`` (N > 0) the averager comes back in the
    same process instead (``member.rejoin()``: a new incarnation in its slot, admitted at the
    quorum's next sync with the weights, the step count and the optimizer's state of a donor,
    which overwrite this process's unsynced work); that sync's report has ``outcome``
    ``"rejoined"`` (and ``rejoin_attempts``), and :attr:`rejoins` counts them. At most N
    ``rejoin()`` calls in all, a failed one included; after the last, the error propagates. A
    drop in :meth:`finish` (the closing sync) and one on a member that may not rejoin (rank 0 of
    a job without a holder: ``member.may_rejoin``) propagate. A ``stop`` asked in the sync that
    found this process dropped is not carried into the job (that sync did not run here): ask
    again at the next one. Not with ``replica_group`` (the replica's other ranks cannot follow
    a new incarnation: restart the replica instead).
    """

    def __init__(self, module: torch.nn.Module, member, period: int = 1, *, optimizer=None,
                 buffers: bool = True, policy: str = "retry", replica_group=None, rejoin: int = 0):
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise InvalidParameterError(f"cadence.torch.FaultTolerantAverager: period must be an integer >= 1, "
                                        f"got {period!r}")
        if policy not in ("retry", "discard"):
            raise InvalidParameterError(f"cadence.torch.FaultTolerantAverager: policy {policy!r} is neither "
                                        "'retry' nor 'discard'")
        self._rejoin = Rejoin("FaultTolerantAverager", rejoin, replica_group)
        self.replica_group = replica_group
        self._leader, self._src = replica_roles("FaultTolerantAverager", member, replica_group)
        self.module = module
        self.member = member
        self.period = period
        self.policy = policy
        self.optimizer = optimizer
        self.local_steps = 0
        tensors = [p for p in module.parameters()]
        if buffers:
            tensors += [b for b in module.buffers() if b.is_floating_point()]
        if not tensors:
            raise InvalidParameterError("cadence.torch.FaultTolerantAverager: the module has no parameters")
        for t in tensors:
            if not t.is_floating_point():
                raise InvalidParameterError("cadence.torch.FaultTolerantAverager: a parameter of dtype "
                                            f"{t.dtype} (averaging needs floating point)")
            if t.dtype not in (torch.float32, torch.float64):
                raise InvalidParameterError(f"cadence.torch.FaultTolerantAverager: dtype {t.dtype} is not "
                                            "averaged by the membership yet (float32 or float64)")
        # One flat CPU copy per dtype, the tensors of that dtype in order: what the member
        # registers, averages and streams to a newcomer.
        self._staging = FlatStaging(tensors)
        self._flat = self._staging.flats
        self._to_flat()
        # Whether a member asked the job to stop, agreed in every sync (the maximum of the
        # members' flags); registered, so a newcomer admitted at that sync knows it too.
        self._stop = torch.zeros(1, dtype=torch.float64)
        self._syncs = 0  # the member's committed count, as the replica's first rank last told
        if member is not None:
            member.add_state(*self._flat.values(), self._stop)
            member.add_blob("cadence.torch.FaultTolerantAverager", self._save_counters, self._load_counters)
            if optimizer is not None:
                member.add_blob("optimizer", self._save_optimizer, self._load_optimizer)

    # ---- the flat copies ----

    def _to_flat(self) -> None:
        self._staging.to_flat()

    def _from_flat(self) -> None:
        self._staging.from_flat()

    # A newcomer takes up the donor's step count at the sync that admits it, so that it syncs
    # at the same steps as the others.
    def _save_counters(self) -> bytes:
        return str(self.local_steps).encode()

    def _load_counters(self, data: bytes) -> None:
        self.local_steps = int(data.decode())

    @property
    def syncs(self) -> int:
        """Syncs the job has committed (``member.committed``; on a replica's other ranks, as its
        first rank last told them)."""
        return self.member.committed if self.member is not None else self._syncs

    @property
    def rejoin(self) -> int:
        """``rejoin=N``: the ``member.rejoin()`` calls this process may make in all."""
        return self._rejoin.limit

    @property
    def rejoins(self) -> int:
        """Times this process came back into the job with ``member.rejoin()`` (``rejoin=N``)."""
        return self._rejoin.rejoins

    _OUTCOMES = ("committed", "healed", "discarded", "rejoined")

    def _share(self, optimizer_state: bool = False, report: Optional[dict] = None) -> Optional[dict]:
        """The replica's first rank hands its weights, stop flag, counters and the sync's outcome
        (and, after start or join, the optimizer's state) to the replica's other ranks; returns
        the report as the first rank had it."""
        if self.replica_group is None:
            return report
        import torch.distributed as dist

        for f in self._flat.values():
            dist.broadcast(f, self._src, group=self.replica_group)
        outcome = self._OUTCOMES.index(report["outcome"]) if report is not None and self._leader else 0
        counters = torch.tensor([float(self._stop[0]), float(self.local_steps), float(self.syncs), float(outcome)],
                                dtype=torch.float64)
        dist.broadcast(counters, self._src, group=self.replica_group)
        self._stop[0] = counters[0]
        self.local_steps, self._syncs = int(counters[1]), int(counters[2])
        if report is not None and not self._leader:
            report = {"outcome": self._OUTCOMES[int(counters[3])], "committed": self._syncs}
        if optimizer_state and self.optimizer is not None:
            broadcast_state_dict(self.optimizer, self._leader, self._src, self.replica_group)
        return report

    def _save_optimizer(self) -> bytes:
        return state_dict_bytes(self.optimizer)

    def _load_optimizer(self, data: bytes) -> None:
        load_state_dict_bytes(self.optimizer, data)

    # ---- the job ----

    def start(self) -> None:
        """Forms the first quorum (``member.start()``) and takes up the state it agreed on
        (every rank of the replica calls it)."""
        if self.member is not None:
            self.member.start()
        self._take_up()

    def join(self) -> None:
        """Joins the running job (``member.join()``): returns once admitted, with the quorum's
        weights (and optimizer state) in the module (every rank of the replica calls it)."""
        if self.member is not None:
            self.member.join()
        self._take_up()

    def _take_up(self) -> None:
        """After the member's start, join or rejoin: the state it received (the flat weights; the
        step count and the optimizer's state were loaded by their blobs) into the replica's
        ranks and the module."""
        self._share(optimizer_state=True)
        self._from_flat()

    def step(self, stop: bool = False) -> Optional[dict]:
        """Counts one local step; on every ``period``-th, averages (:meth:`sync`) and returns
        the sync's report, else None."""
        self.local_steps += 1
        if self.local_steps % self.period != 0:
            return None
        return self.sync(stop)

    @property
    def stopping(self) -> bool:
        """True once a sync agreed to stop (a member passed ``stop=True``): every member sees it
        after the same sync, so all leave their loops together (then :meth:`finish`)."""
        return bool(self._stop[0] != 0)

    def sync(self, stop: bool = False) -> dict:
        """Averages the weights over the quorum now, as one transaction; returns the member's
        report (``outcome``: committed, healed or discarded; with ``rejoin``, "rejoined" after
        this process was dropped and came back, see the class). The module holds the result.
        ``stop``: this member asks the job to stop after this sync (:attr:`stopping`)."""
        self._to_flat()
        flats = list(self._flat.values())
        report = None
        if self.member is not None:
            def body():
                flag = torch.tensor([1.0 if stop else 0.0], dtype=torch.float64)
                self.member.allreduce(flag, "max")
                for f in flats:
                    self.member.allreduce_average(f)
                self._stop.copy_(flag)  # once the sync completed here

            try:
                report = self.member.transact(body, backup=flats, policy=self.policy)
            except Exception as e:  # noqa: BLE001 - only the quorum's drops are answered
                if not self._rejoin.answers(self.member, e):
                    raise
                return self._rejoin.after(self.member, e, self._take_up)  # the module holds the donor's state
        report = self._share(report=report if report is not None else {"outcome": "committed"})
        self._from_flat()
        return report

    def finish(self) -> dict:
        """The closing sync (``member.finish()``): every process calls it once, after the same
        steps; the module then holds the job's final weights."""
        report = self.member.finish() if self.member is not None else {"outcome": "committed"}
        report = self._share(report=report)
        self._from_flat()
        return report
