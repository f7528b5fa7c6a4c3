"""Fault-tolerant collectives over ZeroMQ: a job that loses any process goes on with the rest.

:class:`Member` is one process's part in such a job (the C++ ``cadence::membership::member``
over a ZeroMQ communicator, docs/collective.md). The processes form a *quorum*; each sync is
a *transaction* (:meth:`Member.transact`) whose collectives (:meth:`Member.allreduce`,
:meth:`Member.allreduce_average`, :meth:`Member.broadcast`) either complete on every member
or, when a member is lost, stalls or leaves, fail on every survivor: the survivors agree on a
smaller quorum and then run the sync again on it (``policy="retry"``, after putting the
``backup`` arrays back) or give it up everywhere (``policy="discard"``), so the registered state
is identical on every member after every sync. A replacement (``Member(..., )`` then
:meth:`Member.join`) is admitted at the next sync and receives the registered state from a
member.

    m = cadence.membership.Member(rank, size, rendezvous_file="/shared/job.addr",
                                  secret=os.environ["CADENCE_JOB_SECRET"])
    m.add_state(weights)                  # NumPy arrays or torch CPU tensors, registered once
    m.join() if restarted else m.start()
    for step in range(steps):
        local_step(weights)
        m.transact(lambda: m.allreduce_average(weights), backup=[weights])
    m.finish()                            # every member, after the same syncs

Rank 0 holds the ZeroMQ rendezvous. As a member, it may be lost like any rank once the job
runs, but after that no process can join (docs/status.md). Or the job's rank 0 runs
:func:`hold_rendezvous` alone, outside every quorum, and the members (ranks 1..size-1) pass
``holder=True``: then any member can be lost and replaced, the first one included.

    report = cadence.membership.hold_rendezvous(size, rendezvous_file="/shared/job.addr",
                                                exit_when_empty=10.0)   # rank 0's process
    m = cadence.membership.Member(rank, size, rendezvous_file="/shared/job.addr", holder=True)

``cadence.torch.FaultTolerantAverager`` averages a
torch model's parameters this way. This module needs the compiled ``cadence._membership``,
built when libzmq is found at ``pip install`` time (Debian: ``libzmq3-dev``).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterable

from ._core import InvalidParameterError

try:
    from . import _membership
except ImportError as _e:  # built without libzmq
    raise ImportError(
        "cadence.membership needs the compiled module cadence._membership, which is built only when "
        f"libzmq is found when the package is installed ({_e}). Install libzmq's headers (Debian: "
        "apt-get install libzmq3-dev pkgconf) and reinstall cadence-sync (pip install .); "
        "docs/python.md, 'Fault-tolerant collectives'.") from _e

SyncFailed = _membership.SyncFailed
EvictedError = _membership.EvictedError
QuorumError = _membership.QuorumError

__all__ = ["Member", "DiLoCo", "SyncFailed", "EvictedError", "QuorumError", "hold_rendezvous", "publish_address",
           "read_address"]


# Every Member not closed yet, closed at exit (_close_open_members).
_open_members: "weakref.WeakSet[Member]" = weakref.WeakSet()


def _close_open_members() -> None:
    """At interpreter exit, before finalization: closes every Member still open, its DiLoCo's
    streaming fragment thread joined first. Else that thread (which calls the on_change, on_event
    and blob callbacks with the GIL) could still run while the interpreter finalizes, and a
    thread that takes the GIL then is ended by pthread_exit, whose forced unwind through C++
    aborts the process; and the member, held in a cycle through C++ with its DiLoCo, would never
    close its sockets. An error closing one is ignored: the process is ending."""
    for m in list(_open_members):
        try:
            m.close()
        except Exception:  # noqa: BLE001 - at exit, nothing is left to tell
            pass


atexit.register(_close_open_members)


def _array(x: Any, who: str) -> Any:
    """A NumPy array or a torch CPU tensor as an object with the buffer protocol, sharing memory."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if x.device.type != "cpu":
            raise InvalidParameterError(
                f"cadence.membership.{who}: a tensor on {x.device} (the membership moves host memory: "
                "keep a CPU copy of what it syncs, or stage it)")
        if not x.is_contiguous():
            raise InvalidParameterError(f"cadence.membership.{who}: the tensor is not contiguous")
        return x.detach().numpy()
    return x


def publish_address(path: str, address: str) -> None:
    """Writes ``address`` to ``path`` atomically (a temporary file renamed into place), as rank 0
    does with ``rendezvous_file``."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(address + "\n")
    os.replace(tmp, path)


def read_address(path: str, timeout: float) -> str:
    """The address rank 0 wrote to ``path``, waiting up to ``timeout`` seconds for it."""
    until = time.monotonic() + timeout
    while True:
        try:
            with open(path, encoding="ascii") as f:
                line = f.readline().strip()
            if line:
                return line
        except FileNotFoundError:
            pass
        if time.monotonic() >= until:
            raise TimeoutError(f"cadence.membership: no rendezvous address written to {path} within "
                               f"{timeout:g} s (is rank 0 running?)")
        time.sleep(0.01)


def _connection(who: str, rank: int, size: int, rendezvous: str | None, rendezvous_file: str | None,
                address: str, secret: str | None, insecure: bool,
                connect_timeout: float) -> tuple[str, Callable[[str], None] | None, str]:
    """The rendezvous address, rank 0's publication of it (``on_bound``) and the secret, for rank
    ``rank`` of a job, as :class:`Member` and :func:`hold_rendezvous` take them."""
    if rendezvous is None and rendezvous_file is None:
        raise InvalidParameterError(f"cadence.membership.{who}: needs rendezvous= or rendezvous_file=")
    on_bound = None
    if rendezvous is None:
        if rank == 0:
            rendezvous = f"tcp://{address}:0"
        elif 0 <= rank < size:
            rendezvous = read_address(rendezvous_file, connect_timeout)
    if rank == 0 and rendezvous_file is not None:
        path = rendezvous_file
        on_bound = lambda a: publish_address(path, a)  # noqa: E731
    if not insecure and secret is None:
        secret = os.environ.get("CADENCE_JOB_SECRET", "")
    return rendezvous or "", on_bound, secret or ""


def hold_rendezvous(size: int, *, rendezvous: str | None = None, rendezvous_file: str | None = None,
                    address: str = "127.0.0.1", secret: str | None = None, insecure: bool = False,
                    heartbeat: float = 1.0, connect_timeout: float = 60.0, exit_when_empty: float | None = None,
                    stop: Callable[[], bool] | threading.Event | None = None,
                    on_event: Callable[[str], None] | None = None) -> dict:
    """Holds the job's rendezvous as its rank 0, outside every quorum (the C++
    ``membership::hold_rendezvous``): answers the registrations of the members, ranks
    1..size-1 made with ``Member(..., holder=True)``, so that any of them can be lost and a
    replacement can still register in its slot and join.

    ``rendezvous``, ``rendezvous_file``, ``address``, ``secret``, ``insecure``, ``heartbeat``
    and ``connect_timeout`` as :class:`Member`'s for rank 0 (with ``rendezvous_file``, the
    address bound is written there). Returns once ``stop`` (a callable, or a
    ``threading.Event``: its ``is_set``; asked about every 0.1 s) says so or, with
    ``exit_when_empty`` seconds, once every member slot has registered and none has been
    alive that long (the job is over; leave room for a restart). An exception ``stop`` raises
    ends the hold and propagates. ``on_event`` gets a line for every registration and loss of a
    member. Returns the report: ``registrations`` and ``losses`` (of member processes, goodbyes
    included), ``alive`` (members alive at the end), ``emptied`` (whether ``exit_when_empty``
    ended it) and ``seconds``. Raises InvalidParameterError for a size below 2."""
    rendezvous, on_bound, secret = _connection("hold_rendezvous", 0, size, rendezvous, rendezvous_file, address,
                                               secret, insecure, connect_timeout)
    if isinstance(stop, threading.Event):
        stop = stop.is_set
    return _membership._hold_rendezvous(int(size), rendezvous, address, secret, insecure, float(heartbeat),
                                        float(connect_timeout), float(exit_when_empty or 0.0), stop, on_bound,
                                        on_event)


class Member:
    """One process of a fault-tolerant collective job over ZeroMQ.

    Arguments:
        rank, size: this process's slot and the number of slots. A replacement takes a lost
            rank's slot (not rank 0's, unless ``holder``: rank 0 holds the rendezvous).
        rendezvous: the ZeroMQ address rank 0 binds and the others register at
            (``"tcp://10.0.0.1:29500"``; rank 0 may give port 0). Or:
        rendezvous_file: rank 0 binds ``tcp://{address}:0`` (or ``rendezvous``) and writes the
            address it got here; the others wait for the file (up to ``connect_timeout``).
        address: the interface this process binds its own endpoint on (default loopback).
        secret: the job secret as hex (64 digits; ``cadence-chaos-rank`` and the C++ tools read
            it from ``$CADENCE_JOB_SECRET``): every connection is authenticated and encrypted
            (CURVE). Default: ``$CADENCE_JOB_SECRET``. Or ``insecure=True``: nothing is
            authenticated (loopback tests only).
        heartbeat: the heartbeat timeout in seconds; a peer silent that long is lost. The op
            timeout is 4x and the quorum timeout 8x (``timeouts::scaled``).
        join_timeout: how long :meth:`join` waits to be admitted.
        connect_timeout: the wait for the rendezvous file and the communicator's construction.
        min_size: the fewest members a quorum may have (``QuorumError`` below it).
        max_attempts: runs of a ``retry`` sync before it is discarded.
        sync_initial_state: the first quorum streams the leader's state to every member, so
            replicas start identical even when initialised apart.
        on_event: called with a log line at every change of membership.
        holder: the job's rank 0 runs :func:`hold_rendezvous` and is no member: the members
            are ranks 1..size-1 (this rank must not be 0), and any of them, the first one
            included, can be lost and replaced in its slot.

    A member the quorum dropped while it was alive (:class:`EvictedError`,
    :class:`QuorumError` from a sync) comes back in the same process with :meth:`rejoin`.

    Every call must come from the thread that created the member. Use it as a context manager
    (or call :meth:`close`) so that its sockets close; a member still open when the interpreter
    exits is closed then (an ``atexit`` hook), so that no thread of it outlives Python.
    """

    def __init__(self, rank: int, size: int, *, rendezvous: str | None = None,
                 rendezvous_file: str | None = None, address: str = "127.0.0.1",
                 secret: str | None = None, insecure: bool = False, heartbeat: float = 1.0,
                 join_timeout: float = 120.0, connect_timeout: float = 60.0, min_size: int = 1,
                 max_attempts: int = 8, sync_initial_state: bool = False,
                 on_event: Callable[[str], None] | None = None, holder: bool = False) -> None:
        if rendezvous is None and rendezvous_file is None:
            raise InvalidParameterError("cadence.membership.Member: needs rendezvous= or rendezvous_file=")
        if not isinstance(rank, int) or not isinstance(size, int):
            raise InvalidParameterError("cadence.membership.Member: rank and size must be ints")
        if min_size < 1:
            raise InvalidParameterError(f"cadence.membership.Member: min_size {min_size} must be >= 1")
        # What rejoin() resolves the rendezvous from again (rank 0 may have written a new file).
        self._where = dict(rank=rank, size=size, rendezvous=rendezvous, rendezvous_file=rendezvous_file,
                           address=address, secret=secret, insecure=insecure, connect_timeout=connect_timeout)
        self._holder = bool(holder)
        rendezvous, on_bound, secret = _connection("Member", rank, size, rendezvous, rendezvous_file, address,
                                                   secret, insecure, connect_timeout)
        self._m = _membership._Member(rank, size, rendezvous, address, secret, insecure,
                                      float(heartbeat), float(join_timeout), float(connect_timeout),
                                      int(min_size), int(max_attempts), bool(sync_initial_state), bool(holder),
                                      on_bound, on_event)
        _open_members.add(self)  # closed at exit if the program does not

    # ---- the replica's state ----

    def add_state(self, *arrays: Any) -> None:
        """Registers arrays of the replica's state (parameters, optimizer moments): streamed to a
        newcomer or a member left behind, in registration order. NumPy arrays or torch CPU
        tensors, C-contiguous; every member registers the same sizes in the same order, before
        :meth:`start` or :meth:`join`. The arrays are held and must not be resized."""
        for a in arrays:
            self._m.add_state(_array(a, "Member.add_state"))  # held by the member until close()

    def add_blob(self, name: str, save: Callable[[], bytes], load: Callable[[bytes], None]) -> None:
        """Registers small state that is not an array (counters, a schedule's clock) under
        ``name``: ``save()`` runs on a member that sends the state, ``load(data)`` on one that
        receives it."""
        self._m.add_blob(name, save, load)

    def on_change(self, callback: Callable[[dict], None]) -> None:
        """Calls ``callback(change)`` after every reconfiguration (the first quorum included),
        after the state transfer: ``change`` holds ``before`` and ``after`` (quorums: ``id`` and
        ``ranks``), ``lost``, ``admitted``, ``healed`` and ``committed``. An exception it raises
        is reported as unraisable, not propagated (it runs inside the reconfiguration)."""
        self._m.on_change(callback)

    # ---- forming and joining ----

    def start(self) -> None:
        """Forms the first quorum with the other initial processes (each calls start()).
        Raises :class:`QuorumError` when too few arrive within the quorum timeout."""
        self._m.start()

    def join(self) -> None:
        """Asks the running quorum to admit this process (new, or restarted in a lost rank's
        slot); returns once admitted, with the quorum's state in the registered arrays."""
        self._m.join()

    def rejoin(self) -> None:
        """Comes back into the job as a new incarnation in this slot, in this process, after the
        quorum dropped this member while it was alive: call it where a sync (:meth:`transact`)
        raised :class:`EvictedError` or :class:`QuorumError` (a short link cut stretched by
        TCP's backoff, a resume from SIGSTOP after the others went on; a member merely late to a
        sync, its transport alive, is healed back instead), instead of ending the process and restarting it to :meth:`join`.

        It ends the current member and its communicator (a :class:`DiLoCo` made on it first,
        joining a streaming fragment's thread), resolves the rendezvous again (reads
        ``rendezvous_file`` anew), connects a new communicator, registers with it what was
        registered before, in the order it was (the arrays of :meth:`add_state`, the blobs of
        :meth:`add_blob`, the :meth:`on_change` callbacks, the DiLoCo's state; ``on_event`` too)
        and calls :meth:`join`. It costs what a replacement costs: a new incarnation the quorum
        admits at its next sync, and a state transfer that overwrites the arrays and loads the
        blobs with a donor's state (this member's work since its last committed sync is lost).
        :meth:`stats` start from zero; :attr:`committed` is the quorum's. The caller goes on with
        its next sync (every member then syncs at the same count).

        **A DiLoCo comes back too**: the same :class:`DiLoCo` object is made anew on the new
        member (its weights and config kept, its :meth:`DiLoCo.request_stop` still asked) and
        joins through it, as :meth:`DiLoCo.join` does: it receives the donor's global weights
        (into ``weights``), outer optimizer state and counters (:attr:`DiLoCo.outer_steps`, the
        fixed schedule's clock). The caller goes on with its inner steps; a sync the drop cut
        short is not run again here (the others ran it without this member).

        Raises InvalidParameterError before :meth:`start`/:meth:`join`, after :meth:`close`, and
        on rank 0 of a job without ``holder`` (it hosts the rendezvous: restart the job's rank 0
        instead, or run the job with :func:`hold_rendezvous`). An attempt that fails (no
        rendezvous file within ``connect_timeout``: TimeoutError; no answer at the rendezvous:
        TransportError; not admitted within ``join_timeout``: :class:`QuorumError`) raises and
        leaves the member closed but rejoinable: calls other than rejoin() and :meth:`close`
        (the DiLoCo's included) raise until a later rejoin() succeeds."""
        w = self._where
        rendezvous, _, _ = _connection("Member.rejoin", w["rank"], w["size"], w["rendezvous"], w["rendezvous_file"],
                                       w["address"], w["secret"], w["insecure"], w["connect_timeout"])
        self._m.rejoin(rendezvous)

    @property
    def may_rejoin(self) -> bool:
        """Whether this member's slot may :meth:`rejoin`: every member of a job whose rank 0
        holds the rendezvous (``holder=True``), every rank but 0 otherwise."""
        return self._holder or self._where["rank"] != 0

    # ---- syncs ----

    def transact(self, body: Callable[[], None], backup: Iterable[Any] = (), policy: str = "retry") -> dict:
        """Runs ``body()`` (collectives on this member) as one sync of the quorum.

        When a member is lost during it, the collectives raise :class:`SyncFailed`; let it
        propagate out of ``body``. The survivors then agree on a new quorum, and this member is
        healed from one that committed the sync, or its ``backup`` arrays are put back and
        ``body`` runs again (``policy="retry"``, up to ``max_attempts`` runs) or the sync is
        given up (``policy="discard"``). Another exception raised by ``body`` ends the sync on
        this member (the others see it leave) and propagates. Returns the report: ``outcome``
        ("committed", "healed" or "discarded"), ``committed`` (syncs committed so far),
        ``attempts`` and ``reconfigurations``. ``attempts`` 0 with "discarded": the sync was
        given up without running ``body``, because this member was healed at its previous sync
        by members that had begun this one and gave it up; so every member gives up the same
        syncs."""
        arrays = [_array(a, "Member.transact") for a in backup]
        return self._m.transact(body, arrays, policy)

    def allreduce(self, array: Any, op: str = "sum") -> None:
        """All-reduces ``array`` in place over the quorum (``op``: sum, min or max)."""
        self._m.allreduce(_array(array, "Member.allreduce"), op)

    def allreduce_average(self, array: Any) -> None:
        """Replaces the float32/float64 ``array`` by its mean over the quorum, in place."""
        self._m.allreduce_average(_array(array, "Member.allreduce_average"))

    def broadcast(self, array: Any, root: int = 0) -> None:
        """Copies ``array`` from the quorum member with view rank ``root`` to every member."""
        self._m.broadcast(_array(array, "Member.broadcast"), root)

    def finish(self) -> dict:
        """Ends this member's part after its last sync: one closing sync that changes no state,
        so that a last sync committed on some members and failed on others is healed. Every
        member calls it once, after the same syncs. Returns its report."""
        return self._m.finish()

    # ---- what it knows ----

    @property
    def rank(self) -> int:
        """This process's slot."""
        return self._m.rank

    @property
    def size(self) -> int:
        """The number of slots."""
        return self._m.size

    @property
    def quorum(self) -> dict:
        """The quorum adopted last: ``id`` (only grows) and ``ranks``."""
        return self._m.quorum

    @property
    def view_rank(self) -> int:
        """This member's rank within the current quorum (0 .. len(quorum["ranks"]) - 1)."""
        return self._m.view_rank

    @property
    def committed(self) -> int:
        """Syncs the quorum has committed."""
        return self._m.committed

    @property
    def state_hash(self) -> int:
        """A 64-bit hash of the registered state: equal on every member after every sync."""
        return self._m.state_hash

    @property
    def nonce(self) -> int:
        """This process's nonce (the quorum's name for it)."""
        return self._m.nonce

    def stats(self) -> dict:
        """Counts since start: reconfigurations, failed syncs, retries, discarded, healed, state
        bytes sent and received, the last reconfiguration's seconds."""
        return self._m.stats()

    def close(self) -> None:
        """Closes the member and its sockets; later calls raise."""
        _open_members.discard(self)
        self._m.close()

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DiLoCo:
    """DiLoCo's outer steps as transactions of a :class:`Member` (the C++
    ``exchange::diloco_member``, docs/local-sgd.md "Faults: on the membership layer"): a
    process lost during an outer sync drops out of it and the others run it again without its
    pseudo-gradient; a replacement (:meth:`join`) starts from the current global weights and
    outer optimizer state.

    ``weights``: this process's float32 arrays (NumPy, or torch CPU tensors), the inner
    optimizer's parameters, read for the pseudo-gradient and overwritten with the new global
    weights at each outer step. ``config``: the C++ local-SGD config,
    ``"<schedule>[,outer=<optimizer>][,fragments=F][,alpha=A][,codec=C][,feedback=0|1][,weights=steps|uniform]"``
    (``fixed:H``, ``elastic:R``, ``lag:H:s``, ``quorum:K:H[:grace]``; outer ``nesterov:0.7:0.9``
    by default). Make it before the member's start/join, then call :meth:`start` or
    :meth:`join` instead of the member's; every sync of the member goes through it, so a member
    carries one DiLoCo at most (a second raises InvalidParameterError). When the quorum drops
    the member while it is alive, :meth:`Member.rejoin` brings this DiLoCo back with it (made
    anew on the new incarnation, with the job's global weights and outer state).

    **Streaming** (``fixed:H,fragments=F,delay=D``, D at most H / F): :meth:`sync` at a
    fragment's send point starts its exchange as a transaction on a C++ thread and returns at
    once (``attempts`` 0); the inner steps go on, and :meth:`sync` at the completion point (D
    steps later, :attr:`due`) waits for it and mixes the fragment in. Meanwhile
    (:attr:`in_flight`) the member belongs to that thread: call only :meth:`step_done`,
    :attr:`due`, :meth:`sync`, :meth:`finish`, :attr:`in_flight` and :attr:`outer_steps` (as of
    the fragment that last completed), and expect the member's ``on_change``/``on_event`` callbacks on
    that thread (with the GIL). ``weights`` are read only at the send point and written at the
    completion point.

        m = Member(rank, size, rendezvous_file=path)
        outer = DiLoCo(m, [w], "fixed:20,outer=nesterov:0.7:0.9")
        outer.join() if restarted else outer.start()
        while outer.outer_steps < steps:
            t = time.perf_counter(); inner_step(w)
            if outer.step_done(time.perf_counter() - t):
                outer.sync()
        outer.finish()

    **Ending the job**: every process must call :meth:`finish` after the same syncs. Leave the
    loop on :attr:`outer_steps` (shared), or on :attr:`stop_agreed` when one process decides
    (a budget, a target loss, SIGTERM): its :meth:`request_stop` goes into the next outer
    sync, after which every member's :attr:`stop_agreed` is true.

    **A restart of the whole job** (maintenance, preemption): :meth:`state_dict` after a sync
    (not while a fragment is in flight) holds the global weights, the outer optimizer's state
    and the shared counters, equal on every member; in the new job, :meth:`load_state_dict`
    before :meth:`start` on every process, and the job goes on from there (the first member's
    is broadcast; ``weights`` start as its global weights: each process's local work since the
    last sync, and with fragments the unsynced fragments' since theirs, is not in it).
    """

    _COUNTERS = ("syncs", "fragment_steps", "stale_contributions", "max_staleness", "clock")

    def __init__(self, member: Member, weights: Iterable[Any], config: str = "fixed:20") -> None:
        arrays = [_array(w, "DiLoCo") for w in weights]
        self._d = _membership._DiLoCo(member._m, arrays, config)  # holds the arrays
        member._m._keep(self._d)  # the member's reconfiguration hook calls it: alive until close()
        self.member = member

    def start(self) -> None:
        """Forms the first quorum; the first member's weights become everyone's."""
        self._d.start()

    def join(self) -> None:
        """Joins the running job: returns with the global weights in ``weights``."""
        self._d.join()

    def step_done(self, seconds: float) -> bool:
        """This process finished an inner step that took ``seconds``: whether :meth:`sync` is
        due now (the timed schedules plan from the durations)."""
        return self._d.step_done(seconds)

    @property
    def due(self) -> bool:
        """Whether :meth:`sync` must be called now."""
        return self._d.due

    def sync(self) -> dict:
        """The outer sync due now, as a transaction; returns the member's report (``outcome``
        committed, healed or discarded). ``weights`` then hold the new global weights."""
        return self._d.sync()

    def finish(self) -> dict:
        """The member's closing sync, after the last outer step (every process)."""
        return self._d.finish()

    @property
    def in_flight(self) -> bool:
        """Whether a streaming fragment's exchange is in flight (started, not yet completed)."""
        return self._d.in_flight

    def request_stop(self) -> None:
        """Asks the job to stop (a time budget, a target loss, SIGTERM): the next outer sync's
        transaction carries the request (one small all-reduce), after which :attr:`stop_agreed`
        is true on every member after that same sync. Any thread may call it, a signal handler
        included, before or after :meth:`start`; it cannot be taken back. A sync given up
        everywhere carries nothing (the request goes into the next one); a request of a process
        lost before the sync that carries it commits is agreed only if a survivor completed that
        sync, else it is lost with the process (a survivor's is always agreed)."""
        self._d.request_stop()

    @property
    def stop_requested(self) -> bool:
        """Whether this process asked (:meth:`request_stop`)."""
        return self._d.stop_requested

    @property
    def stop_agreed(self) -> bool:
        """Whether the job agreed to stop: true on every member after the same committed outer
        sync (the first that carried a request; a healed member and a joiner receive it with
        the state), and from then on; streaming, as of the last completion point. Leave the
        loop on it and call :meth:`finish` (every process then calls it after the same syncs)::

            while not outer.stop_agreed:
                inner_step(w)
                if outer.step_done(seconds):
                    outer.sync()
                if time.monotonic() > budget:
                    outer.request_stop()
            outer.finish()
        """
        return self._d.stop_agreed

    @property
    def outer_steps(self) -> int:
        """Outer steps the job has applied (shared: equal on every member; while a fragment is
        in flight, as of the fragment that last completed)."""
        return self._d.outer_steps

    @property
    def global_hash(self) -> int:
        """A hash of the global weights and the outer optimizer's state: equal on every member
        after every commit."""
        return self._d.global_hash

    def state_dict(self) -> dict:
        """What a restart of the whole job needs, as of the last committed sync (the C++
        ``diloco_member::checkpoint()``): ``global_weights`` (float32, flat in the weights'
        order), ``outer_state`` (float32, the outer optimizer's slots end to end),
        ``fragment_outer_steps`` (uint64, per fragment) as NumPy arrays, and the ints ``syncs``,
        ``fragment_steps``, ``stale_contributions``, ``max_staleness`` and ``clock`` (the fixed
        schedule's step). Raises InvalidParameterError before start/join and while a fragment
        is in flight."""
        import numpy as np

        raw = self._d.state_dict()
        out = {"global_weights": np.frombuffer(raw["global_weights"], dtype=np.float32).copy(),
               "outer_state": np.frombuffer(raw["outer_state"], dtype=np.float32).copy(),
               "fragment_outer_steps": np.array(raw["fragment_outer_steps"], dtype=np.uint64)}
        for k in self._COUNTERS:
            out[k] = int(raw[k])
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restores a :meth:`state_dict` (of a job with the same weights' sizes, outer optimizer
        and fragments) for :meth:`start` to begin from; call it before :meth:`start` on every
        process. ``weights`` hold its global weights from now on. Raises InvalidParameterError
        for a missing key or other sizes (naming what differs) and after start/join."""
        import numpy as np

        who = "cadence.membership.DiLoCo.load_state_dict"
        if not isinstance(state, dict):
            raise InvalidParameterError(f"{who}: expected a dict from DiLoCo.state_dict(), got {type(state).__name__}")
        need = ("global_weights", "outer_state", "fragment_outer_steps") + self._COUNTERS
        missing = [k for k in need if k not in state]
        if missing:
            raise InvalidParameterError(f"{who}: the state has no {', '.join(missing)} (keys: {sorted(state)})")

        def floats(key: str) -> bytes:
            a = state[key]
            if type(a).__module__.startswith("torch"):
                a = a.detach().cpu().numpy()
            return np.ascontiguousarray(a, dtype=np.float32).reshape(-1).tobytes()

        counters = [int(state[k]) for k in self._COUNTERS]
        steps = [int(x) for x in np.asarray(state["fragment_outer_steps"]).reshape(-1)]
        self._d.load_state_dict(floats("global_weights"), floats("outer_state"), *counters, steps)
