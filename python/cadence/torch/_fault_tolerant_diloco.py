# DiLoCo for a torch model that survives the loss of any process: the module's parameters staged
# into one flat float32 CPU array that cadence.membership.DiLoCo (the C++ diloco_member) syncs as
# a transaction over ZeroMQ, and a replacement admitted with the global weights and outer state.
from __future__ import annotations

import time
from typing import Optional

import torch

from ._common import (FlatStaging, InvalidParameterError, Rejoin, broadcast_state_dict, check_seconds,
                      load_state_dict_bytes, replica_roles, state_dict_bytes)

_HERE = "cadence.torch.FaultTolerantDiLoCo"


class FaultTolerantDiLoCo:
    r"""DiLoCo (local SGD with an outer optimizer) for ``module`` over the processes of a
    :class:`cadence.membership.Member`, so that the job goes on when any process is lost (rank 0
    included) and takes back a replacement without a checkpoint.

    The module's floating-point parameters (any device, any float dtype) are staged in ONE flat
    float32 CPU array, which :class:`cadence.membership.DiLoCo` registers with the member: the
    C++ adapter keeps the global weights, the outer optimizer's state and the shared counters
    there and streams them to a joiner. Each outer sync is a transaction: a process lost during
    it drops out (its pseudo-gradient with it) and the others run it again; every survivor
    then holds the same global weights (``member.state_hash`` and :attr:`global_hash` are
    equal), and the module holds them (rounded to its dtype)::

        member = cadence.membership.Member(rank, size, rendezvous_file=path)
        outer = cadence.torch.FaultTolerantDiLoCo(model, member, inner_opt, "fixed:20,outer=nesterov:0.7:0.9")
        outer.join() if restarted else outer.start()
        while not outer.should_stop:                # agreed: true on every process after the same sync
            loss(model, next(data)).backward(); inner_opt.step(); inner_opt.zero_grad()
            outer.step()                            # an outer sync when the schedule says so
            if time.monotonic() > budget:           # one process decides (a budget, a loss, SIGTERM)
                outer.request_stop()
        outer.finish()                              # every process, after the same outer steps

    ``config``: the C++ local-SGD config, as :class:`cadence.membership.DiLoCo` takes it
    (``"<schedule>[,outer=<optimizer>][,fragments=F][,delay=D][,alpha=A][,codec=C]
    [,feedback=0|1]"``; schedules ``fixed:H``, ``elastic:R``, ``lag:H:s``,
    ``quorum:K:H[:grace]``). The timed schedules plan from the inner steps' durations:
    :meth:`step` measures the time since the previous call (or since start, join or the last
    sync), or takes ``seconds``. ``inner_optimizer``: its ``state_dict()`` is streamed to a
    replacement from a member at its admission (the donor's moments instead of none) and, with
    ``replica_group``, handed to the replica's other ranks at start and join.

    **Streaming** (``fixed:H,fragments=F,delay=D``, D > 0; D at most the steps between two
    fragments' send points, H / F rounded down: the member's DiLoCo refuses more, naming it, as
    it refuses ``delay`` with a timed schedule): a fragment's exchange overlaps the next D
    inner steps. At a fragment's send point :meth:`step` stages the module, takes the
    fragment's pseudo-gradient and starts its sync as a transaction on a C++ thread (a loss
    during it is retried there without the lost process; a joiner is admitted there), and
    returns at once with a report of ``attempts`` 0 (``outcome`` committed, ``committed`` the
    syncs so far: nothing completed yet); the module is left as it was. D steps later, at the
    fragment's completion point, :meth:`step` waits for it and returns its report; the
    module then holds that fragment's new global weights (mixed with ``alpha``; the other
    fragments keep their local work until their own completion points). While a fragment is
    in flight (:attr:`in_flight`; from its send point to its completion point) the member
    belongs to that thread: :attr:`syncs` and :attr:`quorum` are as the last completed sync
    (or the thread's last reconfiguration) left them, :attr:`should_stop` as of the last
    completion point, :attr:`outer_steps` as of the fragment that last completed (also with D
    equal to the steps between send points, where every completion point sends the next
    fragment and one is always in flight until :meth:`finish`), and :attr:`global_hash` and
    :meth:`state_dict` raise InvalidParameterError (read them when :attr:`in_flight` is False:
    after a completion point that sent nothing, or after :meth:`finish`). Do not read the
    member's own properties (``state_hash``, ``committed``) while a fragment is in flight
    either. :meth:`finish` completes a fragment in flight first. A joiner admitted by a
    fragment's transaction receives the inner optimizer's state as it is at that moment (read
    on the fragment's thread).

    **Ending the loop.** Every process must call :meth:`finish` after the same outer syncs;
    the module then holds the job's final global weights, the same on every process.
    When one process decides (a time budget, a target loss, SIGTERM from the scheduler), it
    calls :meth:`request_stop`: the next outer sync carries the request
    (:meth:`cadence.membership.DiLoCo.request_stop`, one small all-reduce per outer sync) and
    :attr:`should_stop` is then true on every process after that same sync. A loop may also
    end on what every member holds alike after each sync, :attr:`outer_steps`. A request of a
    process lost before the sync that carries it commits may be lost with it (a survivor's
    never is).

    **Replicas of several processes** (DDP inside a replica), as
    :class:`FaultTolerantAverager`: ``replica_group`` is the replica's gloo (CPU) group, its
    first rank holds the member (``member=None`` on the others). The first rank decides at each
    :meth:`step` whether an outer sync is due and tells the others (one small all-reduce per
    inner step); after each sync (streaming: at send points too) it broadcasts its module's
    weights and the counters, so every rank of every replica holds the same weights. Start
    each replica as its own ``torchrun --max-restarts`` job; its restart rejoins
    (docs/python-torch.md).

    **A live process the quorum dropped** (a short link cut, a resume from SIGSTOP after the
    others went on) gets :class:`EvictedError` or :class:`QuorumError` from an outer sync (with
    streaming, from the :meth:`step` at the completion point of the fragment whose exchange
    found it dropped). With ``rejoin=N`` (N > 0) it comes back in the same process instead, as
    :class:`FaultTolerantAverager` does (``member.rejoin()``, which makes the member's DiLoCo anew
    and joins through it): admitted at the quorum's next sync, it receives the global weights,
    the outer optimizer's state, the counters and the inner optimizer's state of a donor, and
    the module then holds the global weights, as after :meth:`join` (this process's local work
    since its last committed sync is lost). That step's report has ``outcome`` ``"rejoined"``
    (and ``rejoin_attempts``), and :attr:`rejoins` counts them. At most N ``rejoin()`` calls in
    all, a failed one included; after the last, the error propagates. A drop in :meth:`finish`
    and one on a member that may not rejoin (``member.may_rejoin``) propagate. A
    :meth:`request_stop` of this process stays asked across the rejoin. Not with
    ``replica_group`` (restart the whole replica instead).

    **A restart of the whole job** (a maintenance window, a preemption; a lost process needs no
    checkpoint: its replacement receives everything from a member). :meth:`state_dict` after
    :meth:`step` returned a report (or after :meth:`finish`; streaming: with no fragment in
    flight) holds the module's ``state_dict()``, the inner optimizer's, :attr:`inner_steps` and
    the membership DiLoCo's (:meth:`cadence.membership.DiLoCo.state_dict`: the global weights,
    the outer optimizer's state, the counters and the fixed schedule's clock; ``None`` on a
    replica's other ranks, which hold no member). In the new job, build the module, the
    optimizer, the member and this object, then :meth:`load_state_dict` (one checkpoint, from
    any member, on every process) before :meth:`start`: the job goes on as if it had not
    stopped (bit for bit with the same processes and inputs). Not in it: the local work since
    the last sync (the module starts from the global weights) and the timed schedules' plan (it
    warms up again).

    Raises InvalidParameterError for a module without floating-point parameters, a complex
    parameter, a float64 value beyond float32's range, a config that is not a string (the
    member's DiLoCo raises cadence.ParseError for a bad one, and InvalidParameterError for a
    delay it cannot carry), a member on the wrong rank of a replica, ``rejoin`` that is not an
    integer >= 0 or is given with ``replica_group``, and calls out of order
    (:meth:`start` or :meth:`join` twice, :meth:`step` before them or after :meth:`finish`;
    :attr:`global_hash` and :meth:`state_dict` while a fragment is in flight).

    Limits: the module's buffers (BatchNorm statistics) stay each process's own.
    """

    def __init__(self, module: torch.nn.Module, member, inner_optimizer=None, config: str = "fixed:20", *,
                 replica_group=None, rejoin: int = 0):
        if not isinstance(config, str):
            raise InvalidParameterError(f"{_HERE}: config must be a local-SGD config string (\"fixed:20\", "
                                        f"\"elastic:2,outer=nesterov:0.7:0.9\"), got {config!r}")
        self._rejoin = Rejoin("FaultTolerantDiLoCo", rejoin, replica_group)
        self.replica_group = replica_group
        self._leader, self._src = replica_roles("FaultTolerantDiLoCo", member, replica_group)
        named = []
        for name, p in module.named_parameters():
            if p.is_complex():
                raise InvalidParameterError(f"{_HERE}: parameter {name!r} is {p.dtype}; DiLoCo's global weights "
                                            "and outer state are float32 (real)")
            if p.is_floating_point():
                named.append((name, p))
        if not named:
            raise InvalidParameterError(f"{_HERE}: the module has no floating-point parameters (DiLoCo's outer "
                                        "step needs some)")
        self.module = module
        self.member = member
        self.inner_optimizer = inner_optimizer
        self.config = config
        self.inner_steps = 0
        # Parameters of a wider range than float32 (float64): checked at each staging.
        self._wide = [(n, p) for n, p in named if torch.finfo(p.dtype).max > torch.finfo(torch.float32).max]
        self._staging = FlatStaging([p for _, p in named], dtype=torch.float32)
        self._flat = self._staging.flats[torch.float32]
        self._to_flat()
        self._phase = "new"  # then "running" (start or join), then "finished"
        self._mark = 0.0  # when the current inner step began (time.perf_counter())
        # On a replica's other ranks: what its first rank last told them (outer_steps,
        # committed, quorum, global_hash).
        self._told: dict = {}
        self._stop_asked = False  # request_stop() on this rank
        # On the first rank (streaming): what the member last said while it could be asked (the
        # fragment's thread owns it in flight): syncs committed, and the quorum (also from the
        # reconfigurations that thread goes through, via on_change).
        self._committed = 0
        self._quorum: Optional[dict] = None
        self._outer = None
        if member is not None:
            import cadence.membership as membership  # needs the compiled _membership (libzmq)

            self._outer = membership.DiLoCo(member, [self._flat], config)  # registers the state
            member.on_change(self._changed)
            if inner_optimizer is not None:
                member.add_blob("cadence.torch.FaultTolerantDiLoCo/inner_optimizer",
                                lambda: state_dict_bytes(inner_optimizer),
                                lambda data: load_state_dict_bytes(inner_optimizer, data))

    # ---- the staging array ----

    def _to_flat(self) -> None:
        self._staging.to_flat()
        if self._wide and not bool(torch.isfinite(self._flat).all()):
            for name, p in self._wide:
                if bool(torch.isfinite(p).all()) and not bool(torch.isfinite(p.detach().float()).all()):
                    raise InvalidParameterError(
                        f"{_HERE}: parameter {name!r} ({p.dtype}) holds a value beyond float32's range "
                        f"(|x| > {torch.finfo(torch.float32).max:.4g}); DiLoCo's global weights are float32")

    def _from_flat(self) -> None:
        self._staging.from_flat()

    # ---- the replica's other ranks ----

    _OUTCOMES = ("committed", "healed", "discarded", "rejoined")

    def _share(self, report: Optional[dict] = None, optimizer_state: bool = False) -> Optional[dict]:
        """The replica's first rank hands the weights, the counters and the sync's report (and,
        after start or join, the inner optimizer's state) to the replica's other ranks; returns
        the report as the first rank had it."""
        if self.replica_group is None:
            return report
        import torch.distributed as dist

        dist.broadcast(self._flat, self._src, group=self.replica_group)
        box = [None]
        if self._leader:
            # In flight, the member and the global weights belong to the fragment's thread: what
            # the first rank last read (no global hash until the fragment completes).
            box = [{"report": report, "outer_steps": self._outer.outer_steps, "committed": self._ask("committed"),
                    "quorum": self._ask("quorum"), "in_flight": self._outer.in_flight,
                    "global_hash": None if self._outer.in_flight else self._outer.global_hash,
                    "should_stop": self._outer.stop_agreed}]
        dist.broadcast_object_list(box, self._src, group=self.replica_group)
        self._told = box[0]
        if optimizer_state and self.inner_optimizer is not None:
            broadcast_state_dict(self.inner_optimizer, self._leader, self._src, self.replica_group)
        return self._told["report"]

    def _due(self, seconds: float) -> bool:
        due = self._outer.step_done(seconds) if self._leader else False
        if self.replica_group is None:
            return due
        import torch.distributed as dist

        # The first rank's verdict, and any rank's stop request (for the first rank's member):
        # one small all-reduce (max) per inner step.
        flag = torch.tensor([1 if due else 0, 1 if self._stop_asked else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.replica_group)
        if self._leader and int(flag[1]) != 0:
            self._outer.request_stop()
        return bool(flag[0])

    # ---- the job ----

    def _check(self, what: str, phase: str) -> None:
        if self._phase != phase:
            said = {"new": "before start() or join()", "running": "after start() or join()",
                    "finished": "after finish()"}[self._phase]
            need = {"new": "once, before any step", "running": "after start() or join() and before finish()"}[phase]
            raise InvalidParameterError(f"{_HERE}.{what}: called {said}; it must come {need}")

    def _begin(self, how: str) -> None:
        self._check(how, "new")
        if self._leader:
            self._to_flat()  # the module as it is now (a checkpoint loaded after construction)
            getattr(self._outer, how)()
        self._phase = "running"  # the member may be asked from here on (_share)
        self._take_up()

    def _take_up(self) -> None:
        """After the member's DiLoCo started, joined or rejoined: what it agreed on or received
        (the global weights in the staging array; the inner optimizer's state, loaded by its
        blob) into the replica's ranks and the module."""
        if self._leader:
            self._read_member()
        self._share(optimizer_state=True)
        self._from_flat()
        self._mark = time.perf_counter()

    def start(self) -> None:
        """Forms the first quorum: the first member's parameters become every process's (every
        rank of a replica calls it)."""
        self._begin("start")

    def join(self) -> None:
        """Joins the running job (a replacement): returns once admitted, with the global weights
        in the module and the outer state and counters in the adapter (every rank of the replica
        calls it)."""
        self._begin("join")

    def step(self, seconds: Optional[float] = None) -> Optional[dict]:
        """Counts one inner step, after the inner optimizer's step: ``seconds`` is its duration
        (default: the time since the previous call, or since start, join or the last sync). When
        the schedule says an outer sync is due, runs it as a transaction and returns the
        member's report (``outcome`` committed, healed or discarded; ``committed``; with
        ``rejoin``, "rejoined" after this process was dropped and came back, see the class); the
        module then holds the global weights. Else None. Streaming: at a send point the fragment's
        exchange starts and the report has ``attempts`` 0; at its completion point the report is
        that exchange's and the module holds the fragment's global weights (see the class
        comment)."""
        self._check("step", "running")
        now = time.perf_counter()
        s = check_seconds("FaultTolerantDiLoCo.step", "seconds", seconds) if seconds is not None else now - self._mark
        self.inner_steps += 1
        if not self._due(max(s, 1e-6)):
            self._mark = time.perf_counter()
            return None
        report = None
        if self._leader:
            self._to_flat()  # the local weights: read at a send point, mixed into at a completion point
            completes = self._outer.in_flight  # due now with a fragment in flight: its completion point
            try:
                report = self._outer.sync()
            except Exception as e:  # noqa: BLE001 - only the quorum's drops are answered
                if not self._rejoin.answers(self.member, e):
                    raise
                return self._rejoin.after(self.member, e, self._take_up)  # the module holds the global weights
            if not self._outer.in_flight:
                self._read_member()
            elif completes:
                self._committed = int(report["committed"])  # the member's count after that exchange
            else:  # only a send point: nothing completed, nothing committed yet
                report = dict(report, committed=self._committed)
        report = self._share(report)
        self._from_flat()
        self._mark = time.perf_counter()
        return report

    def request_stop(self) -> None:
        """Asks the job to stop (a time budget, a target loss, SIGTERM): the next outer sync
        carries the request and :attr:`should_stop` becomes true on every process after that
        same sync (see the class comment). Any rank may ask (on a replica's other ranks the
        request reaches its first rank's member at the next :meth:`step`), from a signal
        handler too, and before :meth:`start`; it cannot be taken back. Raises
        InvalidParameterError after :meth:`finish`."""
        if self._phase == "finished":
            raise InvalidParameterError(f"{_HERE}.request_stop: called after finish(); the job has ended")
        self._stop_asked = True
        if self._leader:
            self._outer.request_stop()

    def finish(self) -> dict:
        """The member's closing sync, after the last outer step (every process, after the same
        outer steps); a last sync that failed here but committed elsewhere is healed, a
        streaming fragment in flight completes first, and the module holds the job's final
        global weights (every fragment's; the same on every process)."""
        self._check("finish", "running")
        report = None
        if self._leader:
            self._to_flat()  # a fragment in flight is mixed into the local weights as it completes
            report = self._outer.finish()
            self._read_member()
            g = self._outer.state_dict()["global_weights"]  # nothing in flight now
            self._flat.copy_(torch.from_numpy(g))
        report = self._share(report)
        self._from_flat()
        self._phase = "finished"
        return report

    # ---- what it knows ----

    @property
    def rejoin(self) -> int:
        """``rejoin=N``: the ``member.rejoin()`` calls this process may make in all."""
        return self._rejoin.limit

    @property
    def rejoins(self) -> int:
        """Times this process came back into the job with ``member.rejoin()`` (``rejoin=N``)."""
        return self._rejoin.rejoins

    def _read_member(self) -> None:
        """On the first rank, with no fragment in flight: the member's count and quorum."""
        self._committed = self.member.committed
        self._quorum = self.member.quorum

    def _changed(self, change: dict) -> None:
        # The member's reconfiguration hook (streaming: on the fragment's thread, with the GIL).
        self._quorum = change["after"]

    @staticmethod
    def _flying(what: str, why: str = "and the global weights belong to its thread until then; call it",
                ) -> InvalidParameterError:
        return InvalidParameterError(
            f"{_HERE}.{what}: a streaming fragment's exchange is in flight (from its send point to its completion "
            f"point, delay inner steps later), {why} when in_flight is False: after a step() that completed a "
            "fragment and sent none, or after finish()")

    def _ask(self, what: str):
        if self._phase == "new":
            raise InvalidParameterError(f"{_HERE}.{what}: known after start() or join()")
        if self._leader:
            if what == "outer_steps":
                return self._outer.outer_steps  # in flight: as of the last completion point
            if what == "should_stop":
                return self._outer.stop_agreed
            if what == "in_flight":
                return self._outer.in_flight
            if what == "global_hash":
                if self._outer.in_flight:
                    raise self._flying("global_hash")
                return self._outer.global_hash
            if not self._outer.in_flight:
                self._read_member()
            return self._committed if what == "committed" else self._quorum
        if what == "global_hash" and self._told["in_flight"]:
            raise self._flying("global_hash")
        return self._told[what]

    @property
    def outer_steps(self) -> int:
        """Outer steps the job has applied: equal on every process after every sync (leave the
        training loop on it). Streaming: as of the last sync that left no fragment in flight
        (see the class comment)."""
        return self._ask("outer_steps")

    @property
    def should_stop(self) -> bool:
        """Whether the job agreed to stop (:meth:`request_stop` on some process): true on every
        process after the same outer sync, and from then on; leave the loop on it and call
        :meth:`finish`. Raises InvalidParameterError before :meth:`start` or :meth:`join`."""
        return bool(self._ask("should_stop"))

    @property
    def syncs(self) -> int:
        """Syncs the job has committed (``member.committed``; streaming, while a fragment is in
        flight: as of the last completed sync)."""
        return self._ask("committed")

    @property
    def quorum(self) -> dict:
        """The quorum adopted last (``member.quorum``: ``id`` and ``ranks``; streaming, while a
        fragment is in flight: as the fragment's thread last adopted one); on a replica's other
        ranks, as its first rank last told them."""
        return self._ask("quorum")

    @property
    def in_flight(self) -> bool:
        """Whether a streaming fragment's exchange is in flight (after a :meth:`step` at its
        send point, until the one at its completion point or :meth:`finish`); always False with
        ``delay`` 0. Raises InvalidParameterError before :meth:`start` or :meth:`join`."""
        return bool(self._ask("in_flight"))

    @property
    def global_hash(self) -> int:
        """A hash of the global weights and the outer optimizer's state: equal on every process
        after every commit. Raises InvalidParameterError while a streaming fragment is in flight
        (:attr:`in_flight`)."""
        return self._ask("global_hash")

    # ---- a restart of the whole job ----

    def state_dict(self) -> dict:
        """What a restart of the whole job needs (see the class comment): ``module`` (the
        module's ``state_dict()``, cloned), ``inner_optimizer`` (its ``state_dict()``, copied;
        None without one), ``inner_steps`` and ``diloco`` (the membership DiLoCo's
        ``state_dict()``: NumPy arrays and ints; None on a replica's other ranks). Take it right
        after a sync (the module then holds the global weights) with no streaming fragment in
        flight, or after :meth:`finish`. Raises InvalidParameterError before :meth:`start` or
        :meth:`join` and while a fragment is in flight (:attr:`in_flight`)."""
        import copy

        if self._phase == "new":
            raise InvalidParameterError(f"{_HERE}.state_dict: called before start() or join(); the state is "
                                        "known once the job runs")
        if self.in_flight:
            raise self._flying("state_dict", "so the global weights and the outer state are not settled; take the "
                                             "checkpoint")
        module = {k: v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v)
                  for k, v in self.module.state_dict().items()}
        inner = None if self.inner_optimizer is None else copy.deepcopy(self.inner_optimizer.state_dict())
        return {"version": 1, "module": module, "inner_optimizer": inner, "inner_steps": self.inner_steps,
                "diloco": self._outer.state_dict() if self._leader else None}

    def load_state_dict(self, state: dict) -> None:
        """Restores a :meth:`state_dict` (of a job with the same module, inner optimizer and
        config) before :meth:`start`, on every process: the module's and the inner optimizer's
        state, :attr:`inner_steps`, and the membership DiLoCo's, from which :meth:`start`
        begins (the first member's is broadcast). Raises InvalidParameterError after
        :meth:`start` or :meth:`join`, for a state without what this process needs (naming the
        key), and as the membership DiLoCo's for other sizes (naming what differs)."""
        self._check("load_state_dict", "new")
        if not isinstance(state, dict) or state.get("version") != 1:
            raise InvalidParameterError(f"{_HERE}.load_state_dict: expected a dict from "
                                        "FaultTolerantDiLoCo.state_dict() (version 1)")
        for key in ("module", "inner_steps", "diloco", "inner_optimizer"):
            if key not in state:
                raise InvalidParameterError(f"{_HERE}.load_state_dict: the state has no {key!r}")
        if self._leader and state["diloco"] is None:
            raise InvalidParameterError(f"{_HERE}.load_state_dict: the state has no membership DiLoCo state "
                                        "('diloco' is None: saved on a replica's other rank); save it on a "
                                        "process that holds the member")
        if self.inner_optimizer is not None and state["inner_optimizer"] is None:
            raise InvalidParameterError(f"{_HERE}.load_state_dict: the state has no inner optimizer's state "
                                        "(saved without one), and this FaultTolerantDiLoCo has one")
        if self._leader:
            self._outer.load_state_dict(state["diloco"])  # checks the sizes first
        self.module.load_state_dict(state["module"])
        if self.inner_optimizer is not None:
            self.inner_optimizer.load_state_dict(state["inner_optimizer"])
        self.inner_steps = int(state["inner_steps"])
