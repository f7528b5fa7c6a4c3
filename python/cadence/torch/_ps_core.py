# The parameter server's state machine, without I/O: admission (pulls checked against the model),
# request numbering (each worker's pushes in order, once), eviction (silence, a lost connection,
# an undelivered reply, a protocol error), refusals, rejoins, closing, and the checkpoint of all
# of it. It takes what arrived (a header's words, a lost connection, the clock, the state of the
# sends) and answers with actions for the I/O layer (_ps_server.py) to carry out in order: apply a
# push, reply with the weights, refuse with a text, notify the observer. It holds no tensor, thread
# or process group, so tests drive it alone, on a fake clock (tests/python/torch/test_ps_core.py).
#
# Map: actions and stats · ServerCore (state map in its docstring) · inputs (message, lost,
# send_failed, tick, close, closing_message) · decisions (join, release, refuse, drop) ·
# checkpoint (state_dict, load_state_dict).
from __future__ import annotations

import dataclasses
from typing import Callable, List, NamedTuple, Optional, Tuple

import cadence

from ._ps_protocol import CLOSED, ERROR, EVICTED, FINISH, JOIN, PULL, PUSH


# ---- actions and stats --------------------------------------------------------------------------

class Apply(NamedTuple):
    """Apply the push that came with the message (worker, its iteration) to the weights."""
    worker: int
    iteration: int


class Reply(NamedTuple):
    """Send the weights as they are now to `worker` (header: iteration)."""
    worker: int
    iteration: int


class Refuse(NamedTuple):
    """Send a refusal: `text`, with reply status `status` (header: iteration)."""
    worker: int
    text: str
    status: int
    iteration: int


class Notify(NamedTuple):
    """Call the observer: kind is "pushed", "finished", "evicted", "refused" or "joined"."""
    kind: str
    worker: int
    reason: str


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
    #: after load_state_dict: (worker, pushes the checkpoint had applied, the iteration its first
    #: request after the restart continued from), one per worker that came back
    resumed: List[Tuple[int, int, int]] = dataclasses.field(default_factory=list)


# ---- the state machine --------------------------------------------------------------------------

class ServerCore:
    """The decisions of one parameter server over ``len(worker_ranks)`` worker slots.

    State map (per worker id, growing on rejoin): ``state`` ("active", "finished", "evicted"),
    ``applied`` (the last push applied: the next must be one more), ``heard`` (when it last
    spoke or was released; None while excused: parked, or gone), ``slot_of`` (its rank's
    position). Per slot: ``id_of`` (the id its rank speaks as now). ``notice_pending``: ids
    that were sent a refusal unasked (eviction, close), which answers their next request.
    ``resuming``: ids whose first request after load_state_dict() sets where their numbering
    continues. Every input returns the actions to carry out, in order."""

    def __init__(self, controller, worker_ranks: List[int], size: int, dtype_code: int,
                 dtype_name: Callable[[int], str], *, evict_after: Optional[float],
                 transfer_timeout: float, keep_log: bool, who: str):
        n = len(worker_ranks)
        self.controller = controller
        self.worker_ranks = list(worker_ranks)
        self.size = size
        self.dtype_code = dtype_code
        self._name = dtype_name
        self.evict_after = evict_after
        self.transfer_timeout = transfer_timeout
        self.keep_log = keep_log
        self.who = who
        self.stats = PSStats(pushes=[0] * n, max_start_staleness=[0] * n)
        self.state = ["active"] * n
        self.applied = [0] * n
        self.heard: List[Optional[float]] = [None] * n
        self.slot_of = list(range(n))
        self.id_of = list(range(n))
        self.notice_pending = set()
        self.resuming = set()
        self.start_time = 0.0
        self._out: list = []

    @property
    def active(self) -> bool:
        return "active" in self.state

    # ---- inputs -----------------------------------------------------------------------------
    def start(self, now: float) -> None:
        self.start_time = now
        for w in self.id_of:
            if self.state[w] == "active":
                self.heard[w] = now

    def next_wake(self, now: float) -> float:
        """Seconds until the next liveness deadline (at most 1 s: also the period at which
        undelivered replies are checked)."""
        wake = 1.0
        if self.evict_after is not None:
            watched = [t for t in self.heard if t is not None]
            if watched:
                wake = min(wake, max(min(watched) + self.evict_after - now, 0.0) + 1e-3)
        return wake

    def message(self, slot: int, kind: int, worker: int, iteration: int, count: int, code: int,
                now: float) -> list:
        """A request from the rank at `slot` (its header's words; a push's payload, `count`
        elements of type `code`, was received whatever the header says, so the stream stays
        in step)."""
        w = self.id_of[slot]
        if kind == JOIN:
            self._join(slot, w, now)
        elif kind == FINISH:
            if self.state[w] == "active" and worker == w:
                self.state[w] = "finished"
                self.heard[w] = None
                self._release_all(self.controller.remove_worker(w), now)
                self._notify("finished", w, "")
            # else an evicted worker's goodbye: its receiver ends, nothing else to do
        elif self.state[w] != "active":
            self._refuse(w)
        elif worker != w:
            self._drop(w, f"protocol: it sent as worker {worker}, but rank "
                          f"{self.worker_ranks[self.slot_of[w]]} is worker {w}", now)
        elif kind == PULL:
            self._resume(w, iteration)
            self._pull(w, iteration, count, code, now)
        elif kind == PUSH:
            self._resume(w, iteration - 1)
            self._push(w, iteration, count, code, now)
        else:
            self._drop(w, f"protocol: unknown message kind {kind}", now)
        return self._take()

    def lost(self, slot: int, reason: str, now: float) -> list:
        """The connection of the rank at `slot` failed (its receiver saw it)."""
        self._drop(self.id_of[slot], "lost: " + reason, now)
        return self._take()

    def send_failed(self, w: int, reason: str, now: float) -> list:
        """A send to worker w could not be posted."""
        self._drop(w, f"lost: {reason}", now)
        return self._take()

    def tick(self, now: float, sends: Callable[[int], Tuple[Optional[str], Optional[tuple]]]) -> list:
        """Evicts the workers silent past evict_after, and drops an active worker whose send
        failed or whose reply was not received within transfer_timeout (it stopped).
        ``sends(slot)`` is (the failure of a send to that slot or None, (posted, worker) of its
        oldest reply in flight or None)."""
        if self.evict_after is not None:
            for w, t in enumerate(self.heard):
                if t is not None and self.state[w] == "active" and now - t >= self.evict_after:
                    self._drop(w, f"silent for {now - t:.3f} s (evict_after)", now, now - t)
        for slot in range(len(self.id_of)):
            w = self.id_of[slot]
            if self.state[w] != "active":
                continue
            failure, oldest = sends(slot)
            if failure is not None:
                self._drop(w, f"lost: a reply could not be sent: {failure}", now)
            elif oldest is not None and oldest[1] == w and now - oldest[0] > self.transfer_timeout:
                self._drop(w, f"lost: its reply was not received within "
                              f"{self.transfer_timeout:g} s (transfer_timeout)", now)
        return self._take()

    def close(self) -> list:
        """Stops serving: every worker still active is told that the server closed."""
        for w, state in enumerate(self.state):
            if state == "active":  # parked, or computing: its next request finds the notice
                self.state[w] = "finished"
                self._refuse_text(w, "the server closed", notify=False, status=CLOSED)
                self.notice_pending.add(w)
        return self._take()

    def closing_message(self, slot: int, kind: int) -> list:
        """A request that arrived after close(): refused, unless the notice answers it."""
        if kind != FINISH:
            w = self.id_of[slot]
            if w in self.notice_pending:
                self.notice_pending.discard(w)
            else:
                self._refuse_text(w, "the server closed", notify=False, status=CLOSED)
        return self._take()

    # ---- decisions ----------------------------------------------------------------------------
    def _take(self) -> list:
        out, self._out = self._out, []
        return out

    def _resume(self, w: int, last: int) -> None:
        if w in self.resuming:
            self.resuming.discard(w)
            self.stats.resumed.append((w, self.applied[w], last))
            self.applied[w] = last

    def _pull(self, w: int, iteration: int, count: int, code: int, now: float) -> None:
        if count != self.size:
            self._refuse_text(w, f"worker {w} has a model of {count} elements, the server one of "
                                 f"{self.size} (do all ranks use one model size?)")
        elif code and code != self.dtype_code:
            self._refuse_text(w, f"worker {w} has a {self._name(code)} model, the server a "
                                 f"{self._name(self.dtype_code)} one")
        else:
            self._heard_now(w, now)
            self._reply(w, iteration)

    def _push(self, w: int, iteration: int, count: int, code: int, now: float) -> None:
        got = code if self._name(code) is not None else self.dtype_code  # 0: the model's own
        if count != self.size or got != self.dtype_code:
            self._drop(w, f"protocol: a gradient of {count} {self._name(got)} elements for a model "
                          f"of {self.size} {self._name(self.dtype_code)} ones", now)
            return
        if iteration != self.applied[w] + 1:
            self._drop(w, f"protocol: it pushed iteration {iteration} after {self.applied[w]} "
                          "(a retried or reordered push)", now)
            return
        self._out.append(Apply(w, iteration))
        self.applied[w] = iteration
        self.stats.pushes[w] += 1
        if self.keep_log:
            self.stats.log.append((w, iteration))
        self._heard_now(w, now)
        d = self.controller.push(w, now - self.start_time)
        released = list(d.released)
        if d.proceed:
            released.insert(0, w)
        else:
            self.stats.parked += 1
            self.heard[w] = None  # excused: it waits on us
        self._release_all(released, now)
        self._notify("pushed", w, "")

    def _join(self, slot: int, old: int, now: float) -> None:
        rank = self.worker_ranks[slot]
        if self.state[old] == "active":
            self._refuse_text(old, f"rank {rank} is worker {old} and active: rejoin() is for a "
                                   "worker the server evicted")
            return
        new = int(self.controller.add_worker())
        if new != len(self.state):
            raise cadence.TransportError(f"{self.who}: the controller issued worker id {new} for a "
                                         f"rejoin; expected {len(self.state)}")
        self._add_id(slot)
        self.heard[new] = now
        self.stats.joins.append(Join(rank, old, new))
        self._reply(new, 0)
        self._notify("joined", new, f"rank {rank} (worker {old} before)")

    def _add_id(self, slot: int) -> None:
        self.state.append("active")
        self.applied.append(0)
        self.heard.append(None)
        self.slot_of.append(slot)
        self.stats.pushes.append(0)
        self.stats.max_start_staleness.append(0)
        self.id_of[slot] = len(self.state) - 1

    def _heard_now(self, w: int, now: float) -> None:
        if self.state[w] == "active":
            self.heard[w] = now

    def _release_all(self, released, now: float) -> None:
        for w in released:
            w = int(w)
            if self.state[w] != "active":
                continue
            gap = int(self.controller.staleness(w))
            self.stats.max_start_staleness[w] = max(self.stats.max_start_staleness[w], gap)
            if self.keep_log:
                self.stats.start_staleness.append(gap)
            self._reply(w, self.applied[w])
            self._heard_now(w, now)  # its silence counts from its release

    def _reply(self, w: int, iteration: int) -> None:
        if self.keep_log:
            self.stats.replies.append((w, iteration, len(self.stats.log)))
        self._out.append(Reply(w, iteration))

    def _refuse(self, w: int) -> None:
        """Answers a request from a worker that is no longer active."""
        if w in self.notice_pending:
            # The notice posted when it was dropped answers this request.
            self.notice_pending.discard(w)
            self._notify("refused", w, f"worker {w} was evicted (its notice was sent at eviction)")
            return
        self._refuse_text(w, f"worker {w} was evicted (silent for longer than evict_after)"
                          if self.state[w] == "evicted" else f"worker {w} already called finish()")

    def _refuse_text(self, w: int, text: str, notify: bool = True, status: Optional[int] = None) -> None:
        if status is None:
            status = EVICTED if self.state[w] == "evicted" else ERROR
        self._out.append(Refuse(w, text, status, self.applied[w]))
        if notify:
            self._notify("refused", w, text)

    def _notify(self, kind: str, w: int, reason: str) -> None:
        self._out.append(Notify(kind, w, reason))

    def _drop(self, w: int, reason: str, now: float, silent: float = 0.0) -> None:
        """Removes worker w: from the controller (releasing whoever waited only for it), with a
        notice posted for it (unless its connection is gone), read by its next request."""
        if self.state[w] != "active":
            return
        self.state[w] = "evicted"
        self.heard[w] = None
        self.stats.evictions.append(Eviction(w, self.applied[w], silent, reason))
        if not reason.startswith("lost"):
            self._refuse_text(w, f"worker {w} was evicted ({reason})", notify=False)
            self.notice_pending.add(w)
        self._release_all(self.controller.remove_worker(w), now)
        self._notify("evicted", w, reason)

    # ---- checkpoint ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Plain data (ints, strings, lists): who is which worker id in which state, each id's
        applied pushes, and the stats. The controller's clocks are not kept: a restarted server
        starts them again, which every policy's guarantee allows (they bound clock gaps)."""
        st = self.stats
        return dict(workers=len(self.worker_ranks), size=self.size, dtype=self.dtype_code,
                    state=list(self.state), applied=list(self.applied), slot_of=list(self.slot_of),
                    id_of=list(self.id_of),
                    stats=dict(pushes=list(st.pushes), max_start_staleness=list(st.max_start_staleness),
                               evictions=[dataclasses.astuple(e) for e in st.evictions],
                               joins=[dataclasses.astuple(j) for j in st.joins],
                               log=[list(x) for x in st.log], start_staleness=list(st.start_staleness),
                               replies=[list(x) for x in st.replies], parked=st.parked,
                               resumed=[list(x) for x in st.resumed]))

    def load_state_dict(self, sd: dict, fresh_controller: bool) -> None:
        """Takes a state_dict() of a server with as many workers and the same model size and
        dtype; the controller must be a fresh one (built for the initial workers, nothing pushed):
        the rejoined ids are added to it again and the ids no longer active removed."""
        def bad(what):
            return cadence.InvalidParameterError(f"{self.who}: load_state_dict: {what}")

        n = len(self.worker_ranks)
        if sd.get("workers") != n:
            raise bad(f"the checkpoint is of a server with {sd.get('workers')} workers, this one has {n}")
        if sd.get("size") != self.size or sd.get("dtype") != self.dtype_code:
            raise bad(f"the checkpoint's model has {sd.get('size')} elements of type "
                      f"{self._name(sd.get('dtype', 0))}, this server's {self.size} of type "
                      f"{self._name(self.dtype_code)}")
        if not fresh_controller:
            raise bad("call it before run(), on a server built with a fresh controller (a config "
                      "string, or a controller nothing was pushed to)")
        state = list(sd["state"])
        for w in range(n, len(state)):
            got = int(self.controller.add_worker())
            if got != w:
                raise bad(f"the controller issued worker id {got} for the checkpoint's worker {w}")
        for w, s in enumerate(state):
            if s != "active":
                self.controller.remove_worker(w)
        self.state = state
        self.applied = list(sd["applied"])
        self.slot_of = list(sd["slot_of"])
        self.id_of = list(sd["id_of"])
        self.heard = [None] * len(state)
        s = sd["stats"]
        self.stats = PSStats(pushes=list(s["pushes"]), max_start_staleness=list(s["max_start_staleness"]),
                             evictions=[Eviction(*e) for e in s["evictions"]],
                             joins=[Join(*j) for j in s["joins"]], log=[tuple(x) for x in s["log"]],
                             start_staleness=list(s["start_staleness"]),
                             replies=[tuple(x) for x in s["replies"]], parked=s["parked"],
                             resumed=[tuple(x) for x in s["resumed"]])
        self.notice_pending = set()
        self.resuming = {w for w, st in enumerate(state) if st == "active"}
