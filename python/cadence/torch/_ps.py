# A parameter server over torch.distributed point-to-point calls: one server rank applies pushes
# and answers each worker when the Cadence policy (cadence.make_controller) lets it proceed. The
# Python twin of cadence::exchange::parameter_server with one server. Replies never block the
# server; a bad, silent or lost worker is refused or dropped, never fatal; an evicted worker that
# is still alive can rejoin under a new worker id; CUDA models are staged through pinned host
# buffers, since gloo's point-to-point calls read host memory.
from __future__ import annotations

import collections
import dataclasses
import datetime
import queue
import threading
import time
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _device
from ._common import (Deadline, InvalidParameterError, TransportError, WorkerError, check_seconds,
                      flatten_params, global_rank, group_info)

# Message kinds and reply statuses, as the C++ adapter's ps_kind / ps_status (JOIN and CLOSED
# are this adapter's own).
PUSH, PULL, FINISH, REPLY, JOIN = 1, 2, 3, 4, 5
OK, EVICTED, ERROR, CLOSED = 0, 1, 2, 3
HEADER_WORDS = 6  # kind, worker, iteration, count, status, dtype code

#: The adapter's four tags on the process group: control, data, reply, reply data.
DEFAULT_TAG_BASE = 0x0CAD0

# Element types a model may have, by the code the header carries (0: unknown).
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# How long the server's own threads wait on one receive or send: unbounded in practice. A gloo wait
# that times out signals the timeout to every connection of the group's context, so a timeout
# there would end the server for every worker; liveness is evict_after's job, not gloo's.
_FOREVER = datetime.timedelta(days=3650)


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) + 1 if dtype in _DTYPES else 0


def _dtype_of(code: int) -> Optional[torch.dtype]:
    return _DTYPES[code - 1] if 1 <= code <= len(_DTYPES) else None


def _failed(work) -> bool:
    """Whether a completed work object failed (is_success where torch has it)."""
    try:
        return not work.is_success()
    except Exception:
        try:
            return work.exception() is not None
        except Exception:
            return False


def _header(kind=0, worker=0, iteration=0, count=0, status=0, dtype=0) -> torch.Tensor:
    return torch.tensor([kind, worker, iteration, count, status, dtype], dtype=torch.int64)


def _model_info(component: str, model) -> Tuple[int, torch.dtype, torch.device]:
    """(elements, dtype, device) of a model given as a size or as its parameters."""
    if isinstance(model, int) and not isinstance(model, bool):
        if model < 0:
            raise InvalidParameterError(f"cadence.torch.{component}: model size must be >= 0, got {model}")
        return model, torch.float32, _device.CPU
    ts = flatten_params(model)
    if not ts:
        return 0, torch.float32, _device.CPU
    ops = _device.ops
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1 or not ts[0].is_floating_point() or ts[0].dtype not in _DTYPES:
        raise InvalidParameterError(f"cadence.torch.{component}: the model's tensors must share one "
                                    f"floating-point dtype ({', '.join(str(d) for d in _DTYPES)}), "
                                    f"got {sorted(str(d) for d in dtypes)}")
    devices = {ops.device_of(t) for t in ts}
    if len(devices) != 1:
        raise InvalidParameterError(f"cadence.torch.{component}: the model's tensors must live on "
                                    f"one device, got {sorted(str(d) for d in devices)}")
    if any(t.is_sparse for t in ts):
        raise InvalidParameterError(f"cadence.torch.{component}: sparse tensors are not supported")
    return sum(t.numel() for t in ts), ts[0].dtype, ops.device_of(ts[0])


def flatten(params) -> torch.Tensor:
    """The parameters (model.parameters(), a list of tensors) as one flat tensor (a copy, on
    their device)."""
    ts = flatten_params(params)
    return torch.cat([t.detach().reshape(-1) for t in ts]) if ts else torch.zeros(0)


def flatten_grads(params) -> torch.Tensor:
    """The parameters' gradients as one flat tensor (zeros where a gradient is None)."""
    ts = flatten_params(params)
    return torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).detach().reshape(-1)
                      for t in ts]) if ts else torch.zeros(0)


def unflatten_into(params, flat: torch.Tensor) -> None:
    """Copies a flat tensor back into the parameters, in order (across devices if need be)."""
    offset = 0
    params = flatten_params(params)
    if sum(t.numel() for t in params) != flat.numel():
        raise InvalidParameterError(f"cadence.torch.unflatten_into: {flat.numel()} values for "
                                    f"parameters of {sum(t.numel() for t in params)} elements")
    with torch.no_grad():
        for t in params:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n


class SGD:
    """The default update rule: ``weights -= lr * gradient``. An update rule is any callable
    ``update(weights, gradient, worker)`` that changes ``weights`` (the server's flat tensor, on
    the model's device) in place."""

    def __init__(self, lr: float = 0.01):
        self.lr = float(lr)

    def __call__(self, weights: torch.Tensor, gradient: torch.Tensor, worker: int) -> None:
        weights.add_(gradient, alpha=-self.lr)


@dataclasses.dataclass
class Eviction:
    """A worker the server dropped: silent past ``evict_after``, lost (its connection failed),
    not receiving its replies, or refused for a protocol error."""
    worker: int
    pushes: int
    silent_seconds: float
    reason: str


@dataclasses.dataclass
class Join:
    """An evicted worker's rank that came back under a new worker id."""
    rank: int
    old_worker: int
    worker: int


@dataclasses.dataclass
class PSStats:
    """What the server measured (as the C++ ps_stats). Per-worker lists grow when a worker
    rejoins (its new id is the controller's next)."""
    pushes: List[int]
    max_start_staleness: List[int]
    evictions: List[Eviction] = dataclasses.field(default_factory=list)
    joins: List[Join] = dataclasses.field(default_factory=list)
    #: with keep_log: (worker, iteration) of every applied push, in order
    log: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    #: with keep_log: the controller's staleness of each released worker, in release order
    start_staleness: List[int] = dataclasses.field(default_factory=list)
    #: with keep_log: (worker, iteration, pushes applied) for every reply that carried weights:
    #: the weights were the initial ones with log[:pushes applied] applied
    replies: List[Tuple[int, int, int]] = dataclasses.field(default_factory=list)
    #: pushes whose reply was deferred by the policy
    parked: int = 0


def _check_p2p_backend(component: str, group) -> None:
    be = _device.ops.backend(group)
    if not any(b in be for b in ("gloo", "mpi")):
        raise InvalidParameterError(
            f"cadence.torch.{component}: the process group's backend is {be!r}; the parameter "
            "server needs gloo (or MPI) for its point-to-point traffic (tagged messages, receives "
            "on threads). Create one beside your NCCL group with "
            "torch.distributed.new_group(backend='gloo') and pass it as group=; CUDA models are "
            "staged through pinned host buffers")


class _Roles:
    """Who serves and who works in a group: the server's group rank and the workers' group
    ranks in order (a rank's slot = its position; its first worker id = its slot)."""

    def __init__(self, component: str, group, server_rank: int):
        self.group, self.rank, self.size = group_info(component, group)
        if self.size < 2:
            raise InvalidParameterError(
                f"cadence.torch.{component}: the process group has {self.size} rank; a parameter "
                "server needs at least 2 (one server and one worker)")
        if isinstance(server_rank, bool) or not isinstance(server_rank, int) \
                or not 0 <= server_rank < self.size:
            raise InvalidParameterError(f"cadence.torch.{component}: server_rank {server_rank!r} is "
                                        f"out of range [0, {self.size})")
        _check_p2p_backend(component, self.group)
        self.server = server_rank
        self.workers = [r for r in range(self.size) if r != server_rank]
        self.server_global = global_rank(self.group, server_rank)

    def slot_global(self, slot: int) -> int:
        return global_rank(self.group, self.workers[slot])

    def slot_of_rank(self, rank: int) -> int:
        return self.workers.index(rank)


def _tags(tag_base: int):
    if isinstance(tag_base, bool) or not isinstance(tag_base, int) or tag_base < 0:
        raise InvalidParameterError(f"cadence.torch: tag_base must be an integer >= 0, got {tag_base!r}")
    return tag_base, tag_base + 1, tag_base + 2, tag_base + 3


def _send(t: torch.Tensor, dst: int, group, tag: int, what: str):
    _device.ops.check_host(t, what)
    return dist.isend(t, dst, group=group, tag=tag)


def _recv_work(t: torch.Tensor, src: int, group, tag: int, what: str):
    _device.ops.check_host(t, what)
    return dist.irecv(t, src=src, group=group, tag=tag)


# ---- the server ---------------------------------------------------------------------------------

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
                    work.wait(timeout=_FOREVER)
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
            server acted, for each ``"finished"``, ``"evicted"`` (reason: why), ``"refused"``
            (a request from an evicted, finished or bad worker; reason: the refusal's text) and
            ``"joined"`` (worker: the new id). Keep it short; an exception ends ``run()``.

    ``run()`` serves until every worker finished or was evicted and returns the stats;
    ``close()`` (or leaving a ``with`` block) then refuses whatever still arrives and joins the
    receiver threads.

    Receives never time out inside gloo (a timed-out gloo receive closes the connection for
    good), so the server takes each worker's messages on a thread of its own, blocked in a
    receive, and waits on a queue with the next liveness deadline as its timeout. Sends are
    posted with ``isend`` and never waited for.
    """

    def __init__(self, policy, initial, *, update: Optional[Callable] = None, lr: float = 0.01,
                 group=None, server_rank: int = 0, evict_after: Optional[float] = None,
                 transfer_timeout: float = 60.0, keep_log: bool = False,
                 tag_base: int = DEFAULT_TAG_BASE,
                 observer: Optional[Callable[[str, int, str], None]] = None):
        self._roles = _Roles("ParameterServer", group, server_rank)
        r = self._roles
        if r.rank != r.server:
            raise InvalidParameterError(f"cadence.torch.ParameterServer: rank {r.rank} is a worker "
                                        f"(rank {r.server} serves)")
        n = len(r.workers)
        import cadence

        if isinstance(policy, str):
            self.controller = cadence.make_controller(policy, n)
        else:
            self.controller = policy
            cap = getattr(policy, "worker_capacity", None)
            cap = int(cap() if callable(cap) else cap)
            if cap != n:
                raise InvalidParameterError(
                    f"cadence.torch.ParameterServer: the controller has {cap} workers but the "
                    f"process group has {n} ({r.size} ranks, 1 server)")
        ops = _device.ops
        if isinstance(initial, torch.Tensor):
            size, dtype, device = _model_info("ParameterServer", [initial])
            self.weights = ops.place(initial.detach().reshape(-1).clone(), device)
        else:
            initial = flatten_params(initial)
            size, dtype, device = _model_info("ParameterServer", initial)
            self.weights = ops.place(flatten(initial), device)
        self.device = device
        self._staged = ops.is_accelerator(device)  # transfers go through pinned host buffers
        self.update = update if update is not None else SGD(lr)
        self.evict_after = check_seconds("ParameterServer", "evict_after", evict_after, allow_none=True)
        self.transfer_timeout = check_seconds("ParameterServer", "transfer_timeout", transfer_timeout)
        self.keep_log = bool(keep_log)
        if observer is not None and not callable(observer):
            raise InvalidParameterError("cadence.torch.ParameterServer: observer must be callable")
        self._observer = observer
        self._t_control, self._t_data, self._t_reply, self._t_reply_data = _tags(tag_base)
        self.stats = PSStats(pushes=[0] * n, max_start_staleness=[0] * n)
        # Per worker id (grows on rejoin): state, pushes applied, last heard (None: excused).
        self._state = ["active"] * n
        self._applied = [0] * n
        self._heard: List[Optional[float]] = [None] * n
        self._slot_of = list(range(n))        # worker id -> slot (its rank's position)
        # Per slot: its current worker id, its sends in flight, its receiver thread.
        self._id_of = list(range(n))
        self._outbox = [_Outbox(slot) for slot in range(n)]
        self._threads: List[threading.Thread] = []
        # Ids with a refusal posted unasked (at eviction, or at close), which answers their next
        # request.
        self._notice_pending = set()
        self._queue: "queue.Queue" = queue.Queue()
        self._start = 0.0
        self._ran = False
        self._closed = False
        self._unjoined: List[int] = []

    @property
    def workers(self) -> int:
        """Worker ids issued (initial workers and rejoins)."""
        return len(self._state)

    def _who(self) -> str:
        return f"cadence.torch.ParameterServer (server rank {self._roles.server})"

    def _rank(self, w: int) -> int:
        return self._roles.workers[self._slot_of[w]]

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
                h = torch.zeros(HEADER_WORDS, dtype=torch.int64)
                _recv_work(h, src, grp, self._t_control, "receive header").wait(timeout=_FOREVER)
                kind, count = int(h[0]), int(h[3])
                payload = None
                if kind == PUSH:
                    # Exactly what the worker sent (its count and dtype): the stream stays in step
                    # even when the size is wrong, and the refusal says why. No cap beyond that:
                    # the server holds what the worker holds.
                    dtype = _dtype_of(int(h[5])) or self.weights.dtype
                    payload = ops.host_buffer(max(count, 0), dtype, pinned=self._staged)
                    _recv_work(payload, src, grp, self._t_data, "receive gradient").wait(timeout=_FOREVER)
                self._queue.put(("msg", slot, h, payload))
                if kind == FINISH:
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
        self._start = time.monotonic()
        for slot in range(len(self._roles.workers)):
            self._heard[self._id_of[slot]] = self._start
            t = threading.Thread(target=self._receiver, args=(slot,), daemon=True,
                                 name=f"cadence-ps-recv-{slot}")
            t.start()
            self._threads.append(t)
        while "active" in self._state:
            try:
                item = self._queue.get(timeout=self._next_wake())
            except queue.Empty:
                item = None
            if item is not None:
                what, slot, a, b = item
                if what == "lost":
                    self._drop(self._id_of[slot], "lost: " + a)
                else:
                    self._handle(slot, a, b)
            self._evict_silent()
            self._check_sends()
        return self.stats

    def _now(self) -> float:
        return time.monotonic()

    def _next_wake(self) -> float:
        wake = 1.0  # also the period at which undelivered replies are checked
        if self.evict_after is not None:
            watched = [t for t in self._heard if t is not None]
            if watched:
                wake = min(wake, max(min(watched) + self.evict_after - self._now(), 0.0) + 1e-3)
        return wake

    def _evict_silent(self) -> None:
        if self.evict_after is None:
            return
        now = self._now()
        for w, t in enumerate(self._heard):
            if t is not None and self._state[w] == "active" and now - t >= self.evict_after:
                self._drop(w, f"silent for {now - t:.3f} s (evict_after)", now - t)

    def _handle(self, slot: int, h: torch.Tensor, payload: Optional[torch.Tensor]) -> None:
        kind, hid, iteration, count, code = int(h[0]), int(h[1]), int(h[2]), int(h[3]), int(h[5])
        w = self._id_of[slot]
        size = self.weights.numel()
        if kind == JOIN:
            self._join(slot, w)
            return
        if kind == FINISH:
            if self._state[w] == "active" and hid == w:
                self._state[w] = "finished"
                self._heard[w] = None
                self._release_all(list(self.controller.remove_worker(w)))
                self._notify("finished", w, "")
            return  # an evicted worker's goodbye: its receiver ends, nothing else to do
        if self._state[w] != "active":
            self._refuse(w)
            return
        if hid != w:
            self._drop(w, f"protocol: it sent as worker {hid}, but rank {self._rank(w)} is worker {w}")
            return
        if kind == PULL:
            if count != size:
                self._refuse_text(w, f"worker {w} has a model of {count} elements, the server one "
                                     f"of {size} (do all ranks use one model size?)")
            elif code and _dtype_of(code) != self.weights.dtype:
                self._refuse_text(w, f"worker {w} has a {_dtype_of(code)} model, the server a "
                                     f"{self.weights.dtype} one")
            else:
                self._heard_now(w)
                self._reply(w, iteration)
        elif kind == PUSH:
            if count != size or payload.dtype != self.weights.dtype:
                self._drop(w, f"protocol: a gradient of {count} {payload.dtype} elements for a "
                              f"model of {size} {self.weights.dtype} ones")
                return
            if iteration != self._applied[w] + 1:
                self._drop(w, f"protocol: it pushed iteration {iteration} after "
                              f"{self._applied[w]} (a retried or reordered push)")
                return
            g = _device.ops.to_device(payload, self.device) if self._staged else payload
            self.update(self.weights, g, w)
            self._applied[w] = iteration
            self.stats.pushes[w] += 1
            if self.keep_log:
                self.stats.log.append((w, iteration))
            now = self._now()
            self._heard_now(w, now)
            d = self.controller.push(w, now - self._start)
            released = list(d.released)
            if d.proceed:
                released.insert(0, w)
            else:
                self.stats.parked += 1
                self._heard[w] = None  # excused: it waits on us
            self._release_all(released)
        else:
            self._drop(w, f"protocol: unknown message kind {kind}")

    def _join(self, slot: int, old: int) -> None:
        rank = self._roles.workers[slot]
        if self._state[old] == "active":
            self._refuse_text(old, f"rank {rank} is worker {old} and active: rejoin() is for a "
                                   "worker the server evicted")
            return
        new = int(self.controller.add_worker())
        if new != len(self._state):
            raise TransportError(f"{self._who()}: the controller issued worker id {new} for a "
                                 f"rejoin; expected {len(self._state)}")
        self._state.append("active")
        self._applied.append(0)
        self._heard.append(self._now())
        self._slot_of.append(slot)
        self.stats.pushes.append(0)
        self.stats.max_start_staleness.append(0)
        self._id_of[slot] = new
        self.stats.joins.append(Join(rank, old, new))
        self._reply(new, 0)
        self._notify("joined", new, f"rank {rank} (worker {old} before)")

    def _heard_now(self, w: int, now: Optional[float] = None) -> None:
        if self._state[w] == "active":
            self._heard[w] = self._now() if now is None else now

    def _release_all(self, released) -> None:
        for w in released:
            w = int(w)
            if self._state[w] != "active":
                continue
            gap = int(self.controller.staleness(w))
            self.stats.max_start_staleness[w] = max(self.stats.max_start_staleness[w], gap)
            if self.keep_log:
                self.stats.start_staleness.append(gap)
            self._reply(w, self._applied[w])
            self._heard_now(w)  # its silence counts from its release

    # ---- sending (never waits) --------------------------------------------------------------
    def _post(self, w: int, tensors) -> bool:
        """Posts the sends to worker w without waiting; False (and w dropped) when its
        connection is gone. What is in flight to one worker is bounded by the protocol: one
        reply per request (a worker sends its next request only after taking the reply), plus
        at most one notice (its eviction, or the close). A reply it does not take within
        transfer_timeout drops it (_check_sends)."""
        slot = self._slot_of[w]
        outbox = self._outbox[slot]
        dst = self._roles.slot_global(slot)
        try:
            works = [_send(t, dst, self._roles.group, tag, "reply") for tag, t in tensors]
        except RuntimeError as e:
            self._drop(w, f"lost: {e}")
            return False
        outbox.post(works, [t for _, t in tensors], self._now(), w)
        return True

    def _check_sends(self) -> None:
        """Drops an active worker whose reply is not received within transfer_timeout (it
        stopped), or whose send failed."""
        now = self._now()
        for slot, outbox in enumerate(self._outbox):
            w = self._id_of[slot]
            if self._state[w] != "active":
                continue
            if outbox.failed is not None:
                self._drop(w, f"lost: a reply could not be sent: {outbox.failed}")
                continue
            _, oldest = outbox.in_flight()
            if oldest is not None and oldest[1] == w and now - oldest[0] > self.transfer_timeout:
                self._drop(w, f"lost: its reply was not received within "
                              f"{self.transfer_timeout:g} s (transfer_timeout)")

    def _weights_for_reply(self) -> torch.Tensor:
        """A copy of the weights as they are now, on the host, owned by the reply in flight."""
        if not self._staged:
            return self.weights.clone()
        ops = _device.ops
        host = ops.host_buffer(self.weights.numel(), self.weights.dtype, pinned=True)
        return ops.to_host(self.weights, host)

    def _reply(self, w: int, iteration: int) -> None:
        if self.keep_log:
            self.stats.replies.append((w, iteration, len(self.stats.log)))
        code = _dtype_code(self.weights.dtype)
        self._post(w, [(self._t_reply, _header(REPLY, w, iteration, self.weights.numel(), OK, code)),
                       (self._t_reply_data, self._weights_for_reply())])

    def _refuse(self, w: int) -> None:
        """Answers a request from a worker that is no longer active."""
        if w in self._notice_pending:
            # The notice posted when it was dropped answers this request.
            self._notice_pending.discard(w)
            self._notify("refused", w, f"worker {w} was evicted (its notice was sent at eviction)")
            return
        self._refuse_text(w, f"worker {w} was evicted (silent for longer than evict_after)"
                          if self._state[w] == "evicted" else f"worker {w} already called finish()")

    def _refuse_text(self, w: int, text: str, notify: bool = True, status: Optional[int] = None) -> None:
        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        if status is None:
            status = EVICTED if self._state[w] == "evicted" else ERROR
        self._post(w, [(self._t_reply, _header(REPLY, w, self._applied[w], data.numel(), status)),
                       (self._t_reply_data, data)])
        if notify:
            self._notify("refused", w, text)

    def _notify(self, kind: str, w: int, reason: str) -> None:
        if self._observer is not None:
            self._observer(kind, w, reason)

    def _drop(self, w: int, reason: str, silent: float = 0.0) -> None:
        """Removes worker w: from the controller (releasing whoever waited only for it), with a
        notice posted for it (unless its connection is gone), read by its next request."""
        if self._state[w] != "active":
            return
        self._state[w] = "evicted"
        self._heard[w] = None
        self.stats.evictions.append(Eviction(w, self._applied[w], silent, reason))
        if not reason.startswith("lost"):
            self._refuse_text(w, f"worker {w} was evicted ({reason})", notify=False)
            self._notice_pending.add(w)
        self._release_all(list(self.controller.remove_worker(w)))
        self._notify("evicted", w, reason)

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
        for w, state in enumerate(self._state):
            if state == "active":  # parked, or computing: its next request finds the notice
                self._state[w] = "finished"
                self._refuse_text(w, "the server closed", notify=False, status=CLOSED)
                self._notice_pending.add(w)
        while any(t.is_alive() for t in self._threads) and deadline.left() > 0:
            try:
                what, slot, h, _ = self._queue.get(timeout=min(0.05, max(deadline.left(), 0.001)))
            except queue.Empty:
                continue
            if what == "msg" and int(h[0]) != FINISH:
                w = self._id_of[slot]
                if w in self._notice_pending:
                    self._notice_pending.discard(w)
                else:
                    self._refuse_text(w, "the server closed", notify=False, status=CLOSED)
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


# ---- a worker -----------------------------------------------------------------------------------

#: Every worker's goodbyes in flight (sends not waited for), kept until gloo completes them.
_GOODBYES = _Outbox(-1)


class PSWorker:
    r"""A worker's end: push a gradient, get back the weights the policy lets it start from.

    Args:
        model: the model size (elements) or ``model.parameters()`` (size, dtype and device from
            it; a CUDA model is staged through pinned host buffers).
        dtype: the element type when ``model`` is a size (default float32).
        group, server_rank, tag_base: as the server's.
        reply_timeout: seconds to wait for the server's answer to one push; a parked worker
            legitimately waits for the slowest one, so make it longer than any straggle (or
            than the server's evict_after).
        transfer_timeout: seconds one send may take.
    """

    def __init__(self, model, *, dtype: Optional[torch.dtype] = None, group=None,
                 server_rank: int = 0, reply_timeout: float = 300.0,
                 transfer_timeout: float = 60.0, tag_base: int = DEFAULT_TAG_BASE):
        self._roles = _Roles("PSWorker", group, server_rank)
        r = self._roles
        if r.rank == r.server:
            raise InvalidParameterError(f"cadence.torch.PSWorker: rank {r.rank} is the server")
        self.size, mdtype, self.device = _model_info("PSWorker", model)
        self.dtype = dtype if dtype is not None else mdtype
        if self.dtype not in _DTYPES:
            raise InvalidParameterError(f"cadence.torch.PSWorker: dtype {self.dtype} is not one of "
                                        f"{', '.join(str(d) for d in _DTYPES)}")
        self._staged = _device.ops.is_accelerator(self.device)
        self.reply_timeout = check_seconds("PSWorker", "reply_timeout", reply_timeout)
        self.transfer_timeout = check_seconds("PSWorker", "transfer_timeout", transfer_timeout)
        self._t_control, self._t_data, self._t_reply, self._t_reply_data = _tags(tag_base)
        self.worker_id = r.slot_of_rank(r.rank)
        self.iteration = 0
        self.rejoins = 0
        self._finished = False
        self._refusal: Optional[str] = None
        self._evicted = False
        self._server_closed = False

    def _who(self) -> str:
        return f"cadence.torch.PSWorker (worker {self.worker_id}, rank {self._roles.rank})"

    def _check_usable(self, op: str) -> None:
        if self._finished:
            raise WorkerError(f"{self._who()}: {op} after finish()")
        if self._refusal is not None:
            raise WorkerError(self._refusal)

    def _send(self, op: str, tensors) -> None:
        dst = self._roles.server_global
        deadline = Deadline(self.transfer_timeout)
        try:
            # Post every send first, then wait: the header and the payload travel back to back
            # instead of one rendezvous after the other.
            works = [_send(t, dst, self._roles.group, tag, op) for tag, t in tensors]
            for work in works:
                work.wait(timeout=deadline.remaining())
        except RuntimeError as e:
            raise TransportError(f"{self._who()}: {op} after {self.iteration} iterations: sending to "
                                 f"server rank {self._roles.server} failed: {e}") from e

    def _post_reply(self):
        """The receive of the server's reply header, posted before the request goes out so the
        server's answer never waits for it (the header has a fixed size; the payload's
        receive is posted once the header says what follows)."""
        h = torch.zeros(HEADER_WORDS, dtype=torch.int64)
        return h, _recv_work(h, self._roles.server_global, self._roles.group, self._t_reply,
                             "receive reply header")

    def _collect(self, op: str, posted, into: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, int]:
        """The reply: (the weights in a host tensor, the worker id the server addressed)."""
        src = self._roles.server_global
        grp = self._roles.group
        h, work = posted
        try:
            work.wait(timeout=Deadline(self.reply_timeout).remaining())
        except RuntimeError as e:
            raise TransportError(f"{self._who()}: {op} iteration {self.iteration}: no reply from "
                                 f"server rank {self._roles.server} within {self.reply_timeout:g} s "
                                 f"(reply_timeout): {e}") from e
        status, count, hid = int(h[4]), int(h[3]), int(h[1])
        try:
            if status != OK:
                text = torch.zeros(max(count, 0), dtype=torch.uint8)
                _recv_work(text, src, grp, self._t_reply_data, "receive refusal").wait(
                    timeout=Deadline(self.transfer_timeout).remaining())
                msg = (f"{self._who()}: {op} refused by server rank {self._roles.server}: "
                       f"{bytes(text.tolist()).decode(errors='replace')}")
                if status == EVICTED:
                    self._refusal = msg  # an evicted worker stays evicted (until rejoin())
                    self._evicted = True
                elif status == CLOSED:
                    self._refusal = msg
                    self._server_closed = True
                    self._say_goodbye()  # ends the server's receiver for this rank
                raise WorkerError(msg)
            if count != self.size:
                raise TransportError(f"{self._who()}: the server sent {count} weights; this worker's "
                                     f"model has {self.size}")
            ops = _device.ops
            if (into is None or into.numel() != self.size or into.dtype != self.dtype
                    or ops.device_of(into).type != "cpu" or not into.is_contiguous()):
                into = ops.host_buffer(self.size, self.dtype, pinned=self._staged)
            _recv_work(into.reshape(-1), src, grp, self._t_reply_data, "receive weights").wait(
                timeout=Deadline(self.transfer_timeout).remaining())
            return into, hid
        except RuntimeError as e:
            if isinstance(e, (WorkerError, TransportError)):
                raise
            raise TransportError(f"{self._who()}: {op}: receiving from server rank "
                                 f"{self._roles.server} failed: {e}") from e

    def _deliver(self, host: torch.Tensor, out: Optional[torch.Tensor], device) -> torch.Tensor:
        """The weights where the caller wants them: in `out`, else on `device`."""
        if out is not None:
            if out is not host:
                with torch.no_grad():
                    out.reshape(-1).copy_(host)
            return out
        ops = _device.ops
        return ops.to_device(host, device) if ops.is_accelerator(device) else host

    def pull(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The current weights at once (no policy applies): the starting point. The server
        checks the model size here. On this worker's device unless ``out`` is given."""
        self._check_usable("pull")
        posted = self._post_reply()
        self._send("pull", [(self._t_control, _header(PULL, self.worker_id, self.iteration, self.size,
                                                      0, _dtype_code(self.dtype)))])
        host, _ = self._collect("pull", posted, out)
        return self._deliver(host, out, self.device)

    def push_pull(self, gradient: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sends ``gradient`` (model-size elements, any shape, on any device), then blocks until
        the policy lets this worker start its next iteration; returns the fresh flat weights
        (in ``out`` when given, else on the gradient's device). Raises WorkerError when the
        server evicted this worker (``rejoin()`` can then bring it back) or closed,
        TransportError naming the server when it is gone."""
        self._check_usable("push_pull")
        ops = _device.ops
        if gradient.numel() != self.size:
            raise InvalidParameterError(f"{self._who()}: gradient of {gradient.numel()} elements for a "
                                        f"model of {self.size}")
        if gradient.dtype != self.dtype:
            raise InvalidParameterError(f"{self._who()}: gradient dtype {gradient.dtype}, model dtype "
                                        f"{self.dtype}")
        device = ops.device_of(gradient)
        if ops.is_accelerator(device):
            g = ops.to_host(gradient, ops.host_buffer(self.size, self.dtype, pinned=True))
        else:
            g = gradient.detach().reshape(-1).contiguous()
        k = self.iteration + 1
        posted = self._post_reply()
        self._send("push_pull", [(self._t_control, _header(PUSH, self.worker_id, k, self.size, 0,
                                                           _dtype_code(self.dtype))),
                                 (self._t_data, g)])
        self.iteration = k
        host, _ = self._collect("push_pull", posted, out)
        return self._deliver(host, out, device)

    def rejoin(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Takes part again after the server evicted this worker (its ``push_pull`` raised
        WorkerError saying so): the server adds a worker to its controller (``add_worker``: a new
        worker id, starting at the slowest clock) and answers with the current weights, which
        this returns (the new starting point; iterations count from 0 again). Only a living
        worker can rejoin: a process that crashed has left the gloo group for good."""
        if self._finished:
            raise WorkerError(f"{self._who()}: rejoin after finish()")
        if not self._evicted or self._server_closed:
            raise InvalidParameterError(f"{self._who()}: rejoin() is for a worker the server "
                                        "evicted" + (" (the server has closed)" if self._server_closed else ""))
        posted = self._post_reply()
        self._send("rejoin", [(self._t_control, _header(JOIN, self.worker_id, self.iteration, self.size,
                                                        0, _dtype_code(self.dtype)))])
        host, hid = self._collect("rejoin", posted, out)
        self.worker_id = hid
        self.iteration = 0
        self.rejoins += 1
        self._evicted = False
        self._refusal = None
        return self._deliver(host, out, self.device)

    def finish(self) -> None:
        """Leaves: the server stops counting this worker (releasing whoever waited for it).
        Later calls raise WorkerError. An evicted worker's goodbye is not waited for (it ends
        the server's receiver for this rank); after the server closed, nothing more is sent."""
        if self._finished:
            raise WorkerError(f"{self._who()}: finish() called twice")
        self._finished = True
        if self._server_closed:
            return  # its goodbye went out with the refusal
        if self._evicted:
            self._say_goodbye()
            return
        self._send("finish", [(self._t_control, _header(FINISH, self.worker_id, self.iteration))])

    def _say_goodbye(self) -> None:
        """A FINISH the server's receiver for this rank ends on, posted and not waited for (the
        server no longer answers this worker). The send is kept alive by a reaper thread until
        gloo is done with it: a gloo send whose work object is destroyed before it completed
        is dropped (or worse), which would leave the server's receiver to take the next job's
        first message."""
        h = _header(FINISH, self.worker_id, self.iteration)
        try:
            work = _send(h, self._roles.server_global, self._roles.group, self._t_control, "finish")
        except RuntimeError:
            return  # the server is gone: nothing to say goodbye to
        _GOODBYES.post([work], [h], time.monotonic(), self.worker_id)

    # ---- model helpers --------------------------------------------------------------------
    def pull_into(self, params) -> None:
        """pull() written into the parameters."""
        unflatten_into(flatten_params(params), self.pull())

    def step(self, params) -> None:
        """Pushes the parameters' gradients and writes the weights the server answers with
        into them (one push_pull; staged through host memory for a CUDA model)."""
        params = flatten_params(params)  # a generator (model.parameters()) is read twice
        g = _device.ops.place(flatten_grads(params), self.device)
        unflatten_into(params, self.push_pull(g))
