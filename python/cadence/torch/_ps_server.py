# The parameter server's I/O over torch.distributed point-to-point calls: a receiver thread per
# worker rank, a sender thread per worker rank (_Outbox), the serving loop, the weights and the
# update rule. Every decision (who is admitted, refused, evicted, released) is ServerCore's
# (_ps_core.py); this file carries its actions out. Replies never block the server; a bad, silent
# or lost worker is refused or dropped, never fatal; CUDA models are staged through pinned host
# buffers, since gloo's point-to-point calls read host memory. The wire format: _ps_protocol.py.
#
# Map: _Outbox (one slot's sends in flight) · ParameterServer: construction · receiving · serving
# (the loop and the actions) · closing · checkpoint.
from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Callable, List, Optional, Tuple

import torch

from . import _device
from . import _ps_protocol as proto
from ._common import InvalidParameterError, check_seconds, Deadline, flatten_params
from ._ps_core import Apply, Notify, PSStats, Refuse, Reply, ServerCore


class _Outbox:
    """One worker slot's replies in flight. A gloo send completes only when it is waited for, and
    a wait that times out closes every connection of the group, so each slot's sends are waited
    for, in order and without a timeout, on a thread of the slot's own; the serving thread only
    reads how many are in flight, since when, and whether one failed. The thread (and the
    pending deque) keeps each reply's buffer alive until gloo is done with it."""

    def __init__(self, slot: int):
        self._slot = slot
        self._queue: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._pending: collections.deque = collections.deque()  # (works, tensors, posted, worker)
        self._thread: Optional[threading.Thread] = None
        self.failed: Optional[str] = None

    def post(self, works, tensors, posted: float, worker: int) -> None:
        item = (works, tensors, posted, worker)
        with self._lock:
            self._pending.append(item)
        if self._thread is None:
            self._thread = threading.Thread(target=self._reap, daemon=True,
                                            name=f"cadence-ps-send-{self._slot}")
            self._thread.start()
        self._queue.put(item)

    def _reap(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            for work in item[0]:
                try:
                    work.wait(timeout=proto.FOREVER)
                except Exception as e:  # the connection failed
                    if self.failed is None:
                        self.failed = str(e)
            with self._lock:
                self._pending.popleft()

    def in_flight(self) -> Tuple[int, Optional[Tuple[float, int]]]:
        """(replies in flight, (posted, worker) of the oldest)."""
        with self._lock:
            if not self._pending:
                return 0, None
            oldest = self._pending[0]
            return len(self._pending), (oldest[2], oldest[3])

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)

    def join(self, seconds: float) -> bool:
        if self._thread is not None:
            self._thread.join(max(seconds, 0.0))
            return not self._thread.is_alive()
        return True


def _dtype_name(code: int) -> Optional[str]:
    d = proto.dtype_of(code)
    return None if d is None else str(d)


class ParameterServer:
    r"""The server end, on one rank of the process group: holds the flat model (on the device of
    ``initial``), applies each push with ``update`` on arrival, and answers each worker when the
    policy lets it proceed.

    Args:
        policy: a config string for ``cadence.make_controller`` ("bsp", "ssp:3", "dssp:2:8",
            "elastic:15", "asp", ...) or a controller object built for the number of workers.
        initial: the initial model: a tensor (flattened) or ``model.parameters()``; on the CPU
            or a GPU (updates then run on the GPU; transfers are staged through pinned host
            buffers).
        update: ``update(weights, gradient, worker)``, in place; default ``SGD(lr)``.
        lr: the default SGD's learning rate.
        group: the process group (default: the world; it must be gloo or MPI). Every other
            rank is a worker; worker id = its position among the non-server ranks (rank - 1
            with server_rank 0), and the controller's next id when it rejoins.
        server_rank: the server's rank in the group.
        evict_after: seconds of silence (while not waiting on the server) after which a worker
            is evicted; None: never (a dead worker is still dropped when its connection
            closes).
        transfer_timeout: seconds a reply may take to be received; a worker that leaves its
            reply pending longer (it stopped) is dropped. Also close()'s default bound.
        keep_log: keep the push order, every release's staleness and every reply's log
            position in ``stats``.
        observer: ``observer(kind, worker, reason)``, called on the serving thread after the
            server acted, for each ``"pushed"`` (a push applied and answered as the policy
            says: a point to save ``state_dict()``), ``"finished"``, ``"evicted"`` (reason:
            why), ``"refused"`` (a request from an evicted, finished or bad worker; reason: the
            refusal's text) and ``"joined"`` (worker: the new id). Keep it short; an exception
            ends ``run()``.

    ``run()`` serves until every worker finished or was evicted and returns the stats;
    ``close()`` (or leaving a ``with`` block) then refuses whatever still arrives and joins the
    receiver threads. ``state_dict()`` / ``load_state_dict()`` checkpoint the weights and the
    workers' standing, so a restarted job resumes where it stopped.

    Receives never time out inside gloo (a timed-out gloo receive closes the connection for
    good), so the server takes each worker's messages on a thread of its own, blocked in a
    receive, and waits on a queue with the next liveness deadline as its timeout. Sends are
    posted with ``isend`` and never waited for.
    """

    def __init__(self, policy, initial, *, update: Optional[Callable] = None, lr: float = 0.01,
                 group=None, server_rank: int = 0, evict_after: Optional[float] = None,
                 transfer_timeout: float = 60.0, keep_log: bool = False,
                 tag_base: int = proto.DEFAULT_TAG_BASE,
                 observer: Optional[Callable[[str, int, str], None]] = None):
        self._roles = proto.Roles("ParameterServer", group, server_rank)
        r = self._roles
        if r.rank != r.server:
            raise InvalidParameterError(f"cadence.torch.ParameterServer: rank {r.rank} is a worker "
                                        f"(rank {r.server} serves)")
        n = len(r.workers)
        import cadence

        self._policy = policy if isinstance(policy, str) else None
        if isinstance(policy, str):
            controller = cadence.make_controller(policy, n)
        else:
            controller = policy
            cap = getattr(policy, "worker_capacity", None)
            cap = int(cap() if callable(cap) else cap)
            if cap != n:
                raise InvalidParameterError(
                    f"cadence.torch.ParameterServer: the controller has {cap} workers but the "
                    f"process group has {n} ({r.size} ranks, 1 server)")
        ops = _device.ops
        if isinstance(initial, torch.Tensor):
            size, dtype, device = proto.model_info("ParameterServer", [initial])
            self.weights = ops.place(initial.detach().reshape(-1).clone(), device)
        else:
            initial = flatten_params(initial)
            size, dtype, device = proto.model_info("ParameterServer", initial)
            self.weights = ops.place(proto.flatten(initial), device)
        self.device = device
        self._staged = ops.is_accelerator(device)  # transfers go through pinned host buffers
        self.update = update if update is not None else proto.SGD(lr)
        self.evict_after = check_seconds("ParameterServer", "evict_after", evict_after, allow_none=True)
        self.transfer_timeout = check_seconds("ParameterServer", "transfer_timeout", transfer_timeout)
        self.keep_log = bool(keep_log)
        if observer is not None and not callable(observer):
            raise InvalidParameterError("cadence.torch.ParameterServer: observer must be callable")
        self._observer = observer
        self._t_control, self._t_data, self._t_reply, self._t_reply_data = proto.tags(tag_base)
        self._core = ServerCore(controller, [r.workers[s] for s in range(n)], size,
                                proto.dtype_code(dtype), _dtype_name, evict_after=self.evict_after,
                                transfer_timeout=self.transfer_timeout, keep_log=self.keep_log,
                                who=self._who())
        # Per slot: its sends in flight and its receiver thread. The payload of the message
        # being handled (a push's gradient) waits in _payload for the core's Apply.
        self._outbox = [_Outbox(slot) for slot in range(n)]
        self._threads: List[threading.Thread] = []
        self._queue: "queue.Queue" = queue.Queue()
        self._payload: Optional[torch.Tensor] = None
        self._ran = False
        self._closed = False
        self._unjoined: List[int] = []

    @property
    def controller(self):
        """The policy's controller."""
        return self._core.controller

    @property
    def stats(self) -> PSStats:
        """What the server measured (``PSStats``)."""
        return self._core.stats

    @property
    def workers(self) -> int:
        """Worker ids issued (initial workers and rejoins)."""
        return len(self._core.state)

    def _who(self) -> str:
        return f"cadence.torch.ParameterServer (server rank {self._roles.server})"

    # ---- receiving ------------------------------------------------------------------------
    def _receiver(self, slot: int) -> None:
        """The messages of the worker at `slot`, in order, onto the queue; ends after its
        finish() (also the goodbye of an evicted worker, or of one told the server closed) or
        when its connection fails."""
        src = self._roles.slot_global(slot)
        grp = self._roles.group
        ops = _device.ops
        try:
            while True:
                h = torch.zeros(proto.HEADER_WORDS, dtype=torch.int64)
                proto.recv(h, src, grp, self._t_control, "receive header").wait(timeout=proto.FOREVER)
                kind, count = int(h[0]), int(h[3])
                payload = None
                if kind == proto.PUSH:
                    # Exactly what the worker sent (its count and dtype): the stream stays in step
                    # even when the size is wrong, and the refusal says why. No cap beyond that:
                    # the server holds what the worker holds.
                    dtype = proto.dtype_of(int(h[5])) or self.weights.dtype
                    payload = ops.host_buffer(max(count, 0), dtype, pinned=self._staged)
                    proto.recv(payload, src, grp, self._t_data, "receive gradient").wait(timeout=proto.FOREVER)
                self._queue.put(("msg", slot, h, payload))
                if kind == proto.FINISH:
                    return
        except Exception as e:  # the connection failed or the process group was torn down
            self._queue.put(("lost", slot, str(e), None))

    # ---- serving --------------------------------------------------------------------------
    def run(self) -> PSStats:
        """Serves until every worker finished or was evicted; returns ``stats``."""
        if self._ran:
            raise InvalidParameterError(f"{self._who()}: run() was called already (a server "
                                        "serves once; make a new one, with another tag_base)")
        self._ran = True
        core = self._core
        core.start(time.monotonic())
        for slot in range(len(self._roles.workers)):
            t = threading.Thread(target=self._receiver, args=(slot,), daemon=True,
                                 name=f"cadence-ps-recv-{slot}")
            t.start()
            self._threads.append(t)
        while core.active:
            try:
                item = self._queue.get(timeout=core.next_wake(time.monotonic()))
            except queue.Empty:
                item = None
            if item is not None:
                what, slot, h, payload = item
                if what == "lost":
                    self._carry_out(core.lost(slot, h, time.monotonic()))
                else:
                    self._payload = payload
                    w = [int(x) for x in h.tolist()]
                    self._carry_out(core.message(slot, w[0], w[1], w[2], w[3], w[5], time.monotonic()))
                    self._payload = None
            self._carry_out(core.tick(time.monotonic(), self._sends))
        return self.stats

    def _sends(self, slot: int):
        return self._outbox[slot].failed, self._outbox[slot].in_flight()[1]

    def _carry_out(self, actions) -> None:
        """The core's actions, in order (a send that cannot be posted adds the core's answer)."""
        todo = collections.deque(actions)
        while todo:
            a = todo.popleft()
            if isinstance(a, Apply):
                g = self._payload
                if self._staged:
                    g = _device.ops.to_device(g, self.device)
                self.update(self.weights, g, a.worker)
            elif isinstance(a, Reply):
                code = proto.dtype_code(self.weights.dtype)
                todo.extend(self._post(a.worker, [
                    (self._t_reply, proto.header(proto.REPLY, a.worker, a.iteration,
                                                 self.weights.numel(), proto.OK, code)),
                    (self._t_reply_data, self._weights_for_reply())]))
            elif isinstance(a, Refuse):
                data = torch.tensor(list(a.text.encode()), dtype=torch.uint8)
                todo.extend(self._post(a.worker, [
                    (self._t_reply, proto.header(proto.REPLY, a.worker, a.iteration, data.numel(),
                                                 a.status)),
                    (self._t_reply_data, data)]))
            elif isinstance(a, Notify) and self._observer is not None:
                self._observer(a.kind, a.worker, a.reason)

    def _post(self, w: int, tensors) -> list:
        """Posts the sends to worker w without waiting; when its connection is gone, the
        core's answer (w dropped). What is in flight to one worker is bounded by the protocol:
        one reply per request (a worker sends its next request only after taking the reply),
        plus at most one notice (its eviction, or the close). A reply it does not take within
        transfer_timeout drops it (ServerCore.tick)."""
        slot = self._core.slot_of[w]
        dst = self._roles.slot_global(slot)
        try:
            works = [proto.send(t, dst, self._roles.group, tag, "reply") for tag, t in tensors]
        except RuntimeError as e:
            return self._core.send_failed(w, str(e), time.monotonic())
        self._outbox[slot].post(works, [t for _, t in tensors], time.monotonic(), w)
        return []

    def _weights_for_reply(self) -> torch.Tensor:
        """A copy of the weights as they are now, on the host, owned by the reply in flight."""
        if not self._staged:
            return self.weights.clone()
        ops = _device.ops
        host = ops.host_buffer(self.weights.numel(), self.weights.dtype, pinned=True)
        return ops.to_host(self.weights, host)

    # ---- closing --------------------------------------------------------------------------
    def close(self, timeout: Optional[float] = None) -> List[int]:
        """Stops serving and joins the receiver threads, within ``timeout`` seconds (default
        ``transfer_timeout``): every worker still active is told that the server closed (a
        parked one at once), whatever arrives is refused the same way, and each receiver ends
        at its worker's finish() or goodbye (a worker told the server closed says goodbye at
        once), or when its connection is lost. Returns the
        ranks whose receiver or sender thread is still blocked at the timeout: a worker alive
        but silent, or stopped with a reply it does not take (its threads end when that worker
        sends, receives or exits; they hold the buffers gloo may still read). Idempotent."""
        if self._closed:
            return list(self._unjoined)
        self._closed = True
        deadline = Deadline(self.transfer_timeout if timeout is None
                            else check_seconds("ParameterServer", "timeout", timeout))
        self._carry_out(self._core.close())
        while any(t.is_alive() for t in self._threads) and deadline.left() > 0:
            try:
                what, slot, h, _ = self._queue.get(timeout=min(0.05, max(deadline.left(), 0.001)))
            except queue.Empty:
                continue
            if what == "msg":
                self._carry_out(self._core.closing_message(slot, int(h[0])))
        for t in self._threads:
            t.join(max(deadline.left(), 0.0))
        for outbox in self._outbox:
            outbox.stop()
        stuck = set()
        for slot, outbox in enumerate(self._outbox):
            if not outbox.join(deadline.left()):
                stuck.add(slot)
        stuck |= {slot for slot, t in enumerate(self._threads) if t.is_alive()}
        self._unjoined = [self._roles.workers[slot] for slot in sorted(stuck)]
        return list(self._unjoined)

    def __enter__(self) -> "ParameterServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The weights (a tensor on their device) and the workers' standing: which rank is
        which worker id, each id's state and pushes applied, the stats; plain data that
        ``torch.save`` writes and ``torch.load(weights_only=True)`` reads. Take it after
        ``run()`` returned, or from the ``observer`` (on the serving thread, so between two
        pushes)."""
        return dict(kind="ParameterServer", version=1, policy=self._policy,
                    weights=self.weights.detach().clone(), core=self._core.state_dict())

    def load_state_dict(self, sd: dict) -> None:
        """Resumes from ``state_dict()`` before ``run()``: the weights, and the workers' standing
        (the rejoined ids are issued again by the controller, the evicted and finished ones
        removed from it). Each worker's first request after the restart sets where its push
        numbering continues (its ``PSWorker.load_state_dict``'s iteration), since the server
        and the workers need not have checkpointed at the same push; ``stats.resumed`` records
        both numbers. The controller's clocks start again, which every policy allows (they
        bound clock gaps, not clocks). Raises InvalidParameterError for a checkpoint of
        another server (workers, model size or dtype, policy) or after run()."""
        here = f"{self._who()}: load_state_dict"
        if not isinstance(sd, dict) or sd.get("kind") != "ParameterServer":
            raise InvalidParameterError(f"{here}: not a ParameterServer state_dict (kind "
                                        f"{sd.get('kind') if isinstance(sd, dict) else type(sd).__name__!r})")
        if sd.get("policy") != self._policy:
            raise InvalidParameterError(f"{here}: the checkpoint's policy is {sd.get('policy')!r}, "
                                        f"this server's {self._policy!r}")
        fresh = not self._ran and all(c == 0 for c in self.controller.clocks)
        self._core.load_state_dict(sd["core"], fresh_controller=fresh)
        with torch.no_grad():
            self.weights.copy_(sd["weights"].reshape(-1).to(self.weights.dtype))
