# A parameter server over torch.distributed point-to-point calls: one server rank applies pushes
# and answers each worker when the Cadence policy (cadence.make_controller) lets it proceed;
# silent workers are evicted. The Python twin of cadence::exchange::parameter_server (1 server).
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from ._common import (Deadline, InvalidParameterError, TransportError, WorkerError, check_seconds,
                      flatten_params, global_rank, group_info)

# Message kinds and reply statuses, as the C++ adapter's ps_kind / ps_status.
PUSH, PULL, FINISH, REPLY = 1, 2, 3, 4
OK, EVICTED, ERROR = 0, 1, 2
HEADER_WORDS = 6  # kind, worker, iteration, count, status, pad

#: The adapter's four tags on the process group: control, data, reply, reply data.
DEFAULT_TAG_BASE = 0x0CAD0


def _header(kind=0, worker=0, iteration=0, count=0, status=0) -> torch.Tensor:
    return torch.tensor([kind, worker, iteration, count, status, 0], dtype=torch.int64)


def _model_size(component: str, model) -> Tuple[int, torch.dtype]:
    if isinstance(model, int) and not isinstance(model, bool):
        if model < 0:
            raise InvalidParameterError(f"cadence.torch.{component}: model size must be >= 0, got {model}")
        return model, torch.float32
    ts = flatten_params(model)
    if not ts:
        return 0, torch.float32
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1 or not ts[0].is_floating_point():
        raise InvalidParameterError(f"cadence.torch.{component}: the model's tensors must share one "
                                    f"floating-point dtype, got {sorted(str(d) for d in dtypes)}")
    return sum(t.numel() for t in ts), ts[0].dtype


def flatten(params) -> torch.Tensor:
    """The parameters (model.parameters(), a list of tensors) as one flat tensor (a copy)."""
    ts = flatten_params(params)
    return torch.cat([t.detach().reshape(-1) for t in ts]) if ts else torch.zeros(0)


def flatten_grads(params) -> torch.Tensor:
    """The parameters' gradients as one flat tensor (zeros where a gradient is None)."""
    ts = flatten_params(params)
    return torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).detach().reshape(-1)
                      for t in ts]) if ts else torch.zeros(0)


def unflatten_into(params, flat: torch.Tensor) -> None:
    """Copies a flat tensor back into the parameters, in order."""
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
    ``update(weights, gradient, worker)`` that changes ``weights`` (the server's flat tensor) in
    place."""

    def __init__(self, lr: float = 0.01):
        self.lr = float(lr)

    def __call__(self, weights: torch.Tensor, gradient: torch.Tensor, worker: int) -> None:
        weights.add_(gradient, alpha=-self.lr)


@dataclasses.dataclass
class Eviction:
    """A worker the server dropped: silent past ``evict_after``, or lost (its connection
    failed)."""
    worker: int
    pushes: int
    silent_seconds: float
    reason: str


@dataclasses.dataclass
class PSStats:
    """What the server measured (as the C++ ps_stats)."""
    pushes: List[int]
    max_start_staleness: List[int]
    evictions: List[Eviction] = dataclasses.field(default_factory=list)
    #: with keep_log: (worker, iteration) of every applied push, in order
    log: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    #: with keep_log: the controller's staleness of each released worker, in release order
    start_staleness: List[int] = dataclasses.field(default_factory=list)
    #: pushes whose reply was deferred by the policy
    parked: int = 0


class _Roles:
    """Who serves and who works in a group: the server's group rank and the workers' group
    ranks in order (worker id = position)."""

    def __init__(self, component: str, group, server_rank: int):
        self.group, self.rank, self.size = group_info(component, group)
        if self.size < 2:
            raise InvalidParameterError(
                f"cadence.torch.{component}: the process group has {self.size} rank; a parameter "
                "server needs at least 2 (one server and one worker)")
        if not isinstance(server_rank, int) or not 0 <= server_rank < self.size:
            raise InvalidParameterError(f"cadence.torch.{component}: server_rank {server_rank!r} is "
                                        f"out of range [0, {self.size})")
        self.server = server_rank
        self.workers = [r for r in range(self.size) if r != server_rank]
        self.server_global = global_rank(self.group, server_rank)

    def worker_global(self, w: int) -> int:
        return global_rank(self.group, self.workers[w])

    def worker_id(self, rank: int) -> int:
        return self.workers.index(rank)


def _tags(tag_base: int):
    if not isinstance(tag_base, int) or tag_base < 0:
        raise InvalidParameterError(f"cadence.torch: tag_base must be an integer >= 0, got {tag_base!r}")
    return tag_base, tag_base + 1, tag_base + 2, tag_base + 3


class ParameterServer:
    r"""The server end, on one rank of the process group: holds the flat model, applies each
    push with ``update`` on arrival, and answers each worker when the policy lets it proceed.

    Args:
        policy: a config string for ``cadence.make_controller`` ("bsp", "ssp:3", "dssp:2:8",
            "elastic:15", "asp", ...) or a controller object built for the number of workers.
        initial: the initial model: a tensor (flattened) or ``model.parameters()``.
        update: ``update(weights, gradient, worker)``, in place; default ``SGD(lr)``.
        lr: the default SGD's learning rate.
        group: the process group (default: the world); every other rank is a worker, worker
            id = its position among the non-server ranks (rank - 1 with server_rank 0).
        server_rank: the server's rank in the group.
        evict_after: seconds of silence (while not waiting on the server) after which a worker
            is evicted; None: never (a dead worker is still dropped when its connection
            closes).
        transfer_timeout: seconds one reply may take to leave.
        keep_log: keep the push order and every release's staleness in ``stats``.
        observer: ``observer(kind, worker, reason)``, called on the serving thread after the
            server acted, for each ``"finished"``, ``"evicted"`` (reason: silence or a lost
            connection) and ``"refused"`` (a request from an evicted or finished worker, or a
            bad one; reason: the refusal's text). Keep it short; an exception ends ``run()``.

    ``run()`` serves until every worker finished or was evicted and returns the stats.
    Receives never time out inside gloo (a timed-out gloo receive closes the connection for
    good), so the server takes each worker's messages on a thread of its own, blocked in a
    receive, and waits on a queue with the next liveness deadline as its timeout.
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
        if isinstance(initial, torch.Tensor):
            self.weights = initial.detach().reshape(-1).clone()
        else:
            self.weights = flatten(initial)
        if not self.weights.is_floating_point():
            raise InvalidParameterError("cadence.torch.ParameterServer: the model must be floating "
                                        f"point, got {self.weights.dtype}")
        self.update = update if update is not None else SGD(lr)
        self.evict_after = check_seconds("ParameterServer", "evict_after", evict_after, allow_none=True)
        self.transfer_timeout = check_seconds("ParameterServer", "transfer_timeout", transfer_timeout)
        self.keep_log = bool(keep_log)
        if observer is not None and not callable(observer):
            raise InvalidParameterError("cadence.torch.ParameterServer: observer must be callable")
        self._observer = observer
        self._t_control, self._t_data, self._t_reply, self._t_reply_data = _tags(tag_base)
        self.stats = PSStats(pushes=[0] * n, max_start_staleness=[0] * n)
        self._state = ["active"] * n
        self._applied = [0] * n
        self._heard: List[Optional[float]] = [None] * n  # None: excused or untracked
        self._sends: List[list] = [[] for _ in range(n)]
        self._notified = set()  # evicted workers sent their eviction notice
        self._queue: "queue.Queue" = queue.Queue()
        self._threads: List[threading.Thread] = []
        self._start = 0.0

    @property
    def workers(self) -> int:
        return len(self._roles.workers)

    def _who(self) -> str:
        return f"cadence.torch.ParameterServer (server rank {self._roles.server})"

    # ---- receiving ------------------------------------------------------------------------
    def _receiver(self, w: int) -> None:
        """Worker w's messages, in order, onto the queue; ends after its finish(), after any
        message once it is evicted, or when its connection fails."""
        src = self._roles.worker_global(w)
        grp = self._roles.group
        try:
            while True:
                h = torch.zeros(HEADER_WORDS, dtype=torch.int64)
                dist.recv(h, src=src, group=grp, tag=self._t_control)
                kind, count = int(h[0]), int(h[3])
                payload = None
                if kind == PUSH:
                    n = max(0, min(count, 1 << 26))
                    payload = torch.empty(n, dtype=self.weights.dtype)
                    dist.recv(payload, src=src, group=grp, tag=self._t_data)
                self._queue.put(("msg", w, h, payload))
                if kind == FINISH or self._state[w] != "active":
                    return
        except Exception as e:  # the connection failed or the process group was torn down
            self._queue.put(("lost", w, str(e), None))

    # ---- serving --------------------------------------------------------------------------
    def run(self) -> PSStats:
        """Serves until every worker finished or was evicted; returns ``stats``."""
        self._start = time.monotonic()
        for w in range(self.workers):
            self._heard[w] = self._start
            t = threading.Thread(target=self._receiver, args=(w,), daemon=True,
                                 name=f"cadence-ps-recv-{w}")
            t.start()
            self._threads.append(t)
        while "active" in self._state:
            try:
                item = self._queue.get(timeout=self._next_wake())
            except queue.Empty:
                item = None
            if item is not None:
                what, w, a, b = item
                if what == "lost":
                    self._drop(w, "lost: " + a)
                else:
                    self._handle(w, a, b)
            self._evict_silent()
        return self.stats

    def _now(self) -> float:
        return time.monotonic()

    def _next_wake(self) -> float:
        if self.evict_after is None:
            return 1.0  # nothing to watch: wake only to re-check
        watched = [t for t in self._heard if t is not None]
        if not watched:
            return 1.0
        return max(min(watched) + self.evict_after - self._now(), 0.0) + 1e-3

    def _evict_silent(self) -> None:
        if self.evict_after is None:
            return
        now = self._now()
        for w, t in enumerate(self._heard):
            if t is not None and self._state[w] == "active" and now - t >= self.evict_after:
                self._drop(w, f"silent for {now - t:.3f} s (evict_after)", now - t)

    def _handle(self, w: int, h: torch.Tensor, payload: Optional[torch.Tensor]) -> None:
        kind, iteration, count = int(h[0]), int(h[2]), int(h[3])
        size = self.weights.numel()
        if kind == PULL:
            if self._state[w] != "active":
                self._refuse(w)
            elif count != size:
                self._refuse_text(w, f"worker {w} has a model of {count} elements, the server one "
                                     f"of {size} (do all ranks use one model size?)")
            else:
                self._heard_now(w)
                self._reply(w, iteration)
        elif kind == PUSH:
            if self._state[w] != "active":
                self._refuse(w)
                return
            if count != size:
                self._refuse_text(w, f"gradient of {count} elements, but the server's model has "
                                     f"{size} (do all ranks use one model size?)")
                return
            if iteration != self._applied[w] + 1:
                raise TransportError(f"{self._who()}: worker {w} pushed iteration {iteration} after "
                                     f"{self._applied[w]}")
            self.update(self.weights, payload, w)
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
        elif kind == FINISH:
            if self._state[w] != "active":
                return
            self._state[w] = "finished"
            self._heard[w] = None
            self._release_all(list(self.controller.remove_worker(w)))
            self._notify("finished", w, "")
        else:
            raise TransportError(f"{self._who()}: unexpected message kind {kind} from worker {w}")

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

    # ---- sending --------------------------------------------------------------------------
    def _isend(self, w: int, tensors, reap: bool = True) -> bool:
        """Sends to worker w without blocking the server; False (and w dropped) when its
        connection is gone. The previous sends to w are complete by now (w received them before
        it could send what this answers); waiting for them frees their buffers."""
        dst = self._roles.worker_global(w)
        try:
            if reap:
                deadline = Deadline(self.transfer_timeout)
                for work in self._sends[w]:
                    work.wait(timeout=deadline.remaining())
                self._sends[w].clear()
            for tag, t in tensors:
                self._sends[w].append(dist.isend(t, dst, group=self._roles.group, tag=tag))
            return True
        except RuntimeError as e:
            self._sends[w].clear()
            self._drop(w, f"lost: {e}")
            return False

    def _reply(self, w: int, iteration: int) -> None:
        self._isend(w, [(self._t_reply, _header(REPLY, w, iteration, self.weights.numel())),
                        (self._t_reply_data, self.weights.clone())])

    def _refuse(self, w: int) -> None:
        if w in self._notified:
            # It has its eviction notice already (and stops at the first refusal).
            self._notify("refused", w, f"worker {w} was evicted (its notice was sent at eviction)")
            return
        self._refuse_text(w, f"worker {w} was evicted (silent for longer than evict_after)"
                          if self._state[w] == "evicted" else f"worker {w} already called finish()")

    def _refuse_text(self, w: int, text: str, reap: bool = True, notify: bool = True) -> None:
        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        status = EVICTED if self._state[w] == "evicted" else ERROR
        self._isend(w, [(self._t_reply, _header(REPLY, w, self._applied[w], data.numel(), status)),
                        (self._t_reply_data, data)], reap=reap)
        if notify:
            self._notify("refused", w, text)

    def _notify(self, kind: str, w: int, reason: str) -> None:
        if self._observer is not None:
            self._observer(kind, w, reason)

    def _drop(self, w: int, reason: str, silent: float = 0.0) -> None:
        """Removes worker w for good: from the controller (releasing whoever waited only for
        it), with a refusal queued for its next push so that it learns it was evicted."""
        if self._state[w] != "active":
            return
        self._state[w] = "evicted"
        self._heard[w] = None
        self.stats.evictions.append(Eviction(w, self._applied[w], silent, reason))
        if not reason.startswith("lost"):
            # Not waited for: a stalled worker takes it with its next reply.
            self._refuse_text(w, f"worker {w} was evicted ({reason})", reap=False, notify=False)
            self._notified.add(w)
        self._release_all(list(self.controller.remove_worker(w)))
        self._notify("evicted", w, reason)


class PSWorker:
    r"""A worker's end: push a gradient, get back the weights the policy lets it start from.

    Args:
        model: the model size (elements) or ``model.parameters()`` (size and dtype from it).
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
        self.size, mdtype = _model_size("PSWorker", model)
        self.dtype = dtype if dtype is not None else mdtype
        self.reply_timeout = check_seconds("PSWorker", "reply_timeout", reply_timeout)
        self.transfer_timeout = check_seconds("PSWorker", "transfer_timeout", transfer_timeout)
        self._t_control, self._t_data, self._t_reply, self._t_reply_data = _tags(tag_base)
        self.worker_id = r.worker_id(r.rank)
        self.iteration = 0
        self._finished = False
        self._refusal: Optional[str] = None

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
            works = [dist.isend(t, dst, group=self._roles.group, tag=tag) for tag, t in tensors]
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
        return h, dist.irecv(h, src=self._roles.server_global, group=self._roles.group,
                             tag=self._t_reply)

    def _collect(self, op: str, out: Optional[torch.Tensor], posted) -> torch.Tensor:
        src = self._roles.server_global
        h, work = posted
        try:
            work.wait(timeout=Deadline(self.reply_timeout).remaining())
        except RuntimeError as e:
            raise TransportError(f"{self._who()}: {op} iteration {self.iteration}: no reply from "
                                 f"server rank {self._roles.server} within {self.reply_timeout:g} s "
                                 f"(reply_timeout): {e}") from e
        status, count = int(h[4]), int(h[3])
        try:
            if status != OK:
                text = torch.zeros(max(count, 0), dtype=torch.uint8)
                dist.irecv(text, src=src, group=self._roles.group, tag=self._t_reply_data).wait(
                    timeout=Deadline(self.transfer_timeout).remaining())
                msg = (f"{self._who()}: {op} refused by server rank {self._roles.server}: "
                       f"{bytes(text.tolist()).decode(errors='replace')}")
                if status == EVICTED:
                    self._refusal = msg  # an evicted worker stays evicted
                raise WorkerError(msg)
            if count != self.size:
                raise TransportError(f"{self._who()}: the server sent {count} weights; this worker's "
                                     f"model has {self.size}")
            if out is None or out.numel() != self.size or out.dtype != self.dtype:
                out = torch.empty(self.size, dtype=self.dtype)
            dist.irecv(out, src=src, group=self._roles.group, tag=self._t_reply_data).wait(
                timeout=Deadline(self.transfer_timeout).remaining())
            return out
        except RuntimeError as e:
            if isinstance(e, (WorkerError, TransportError)):
                raise
            raise TransportError(f"{self._who()}: {op}: receiving from server rank "
                                 f"{self._roles.server} failed: {e}") from e

    def pull(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The current weights at once (no policy applies): the starting point. The server
        checks the model size here."""
        self._check_usable("pull")
        posted = self._post_reply()
        self._send("pull", [(self._t_control, _header(PULL, self.worker_id, self.iteration, self.size))])
        return self._collect("pull", out, posted)

    def push_pull(self, gradient: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Sends ``gradient`` (model-size elements, any shape), then blocks until the policy lets
        this worker start its next iteration; returns the fresh flat weights (in ``out`` when
        given). Raises WorkerError when the server evicted this worker, TransportError naming
        the server when it is gone."""
        self._check_usable("push_pull")
        g = gradient.detach().reshape(-1)
        if g.numel() != self.size:
            raise InvalidParameterError(f"{self._who()}: gradient of {g.numel()} elements for a "
                                        f"model of {self.size}")
        if g.dtype != self.dtype:
            raise InvalidParameterError(f"{self._who()}: gradient dtype {g.dtype}, model dtype {self.dtype}")
        g = g.contiguous()
        k = self.iteration + 1
        posted = self._post_reply()
        self._send("push_pull", [(self._t_control, _header(PUSH, self.worker_id, k, self.size)),
                                 (self._t_data, g)])
        self.iteration = k
        return self._collect("push_pull", out, posted)

    def finish(self) -> None:
        """Leaves: the server stops counting this worker (releasing whoever waited for it).
        Later calls raise WorkerError. An evicted worker leaves without telling the server."""
        if self._finished:
            raise WorkerError(f"{self._who()}: finish() called twice")
        self._finished = True
        if self._refusal is None:
            self._send("finish", [(self._t_control, _header(FINISH, self.worker_id, self.iteration))])

    # ---- model helpers --------------------------------------------------------------------
    def pull_into(self, params) -> None:
        """pull() written into the parameters."""
        unflatten_into(flatten_params(params), self.pull())

    def step(self, params) -> None:
        """Pushes the parameters' gradients and writes the weights the server answers with
        into them (one push_pull)."""
        params = flatten_params(params)  # a generator (model.parameters()) is read twice
        unflatten_into(params, self.push_pull(flatten_grads(params)))
