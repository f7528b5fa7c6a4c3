# The parameter server's state machine on its own (cadence.torch._ps_core.ServerCore), on a fake
# clock and without any process or tensor: what it admits, how it numbers each worker's pushes,
# whom it evicts and when, what it refuses, how a worker rejoins, how it closes, and how a
# checkpoint resumes; then hundreds of seeded random schedules against the rules every run keeps.
import random

import pytest

pytest.importorskip("torch", reason="cadence.torch needs PyTorch (Debian: python3-torch)")
pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")

import cadence  # noqa: E402
from cadence.torch import _ps_protocol as proto  # noqa: E402
from cadence.torch._ps_core import Apply, Notify, Refuse, Reply, ServerCore  # noqa: E402
from cadence.torch._ps_server import _dtype_name  # noqa: E402

SIZE = 10
F32, F64 = proto.dtype_code(proto.DTYPES[0]), proto.dtype_code(proto.DTYPES[1])
NO_SENDS = staticmethod(lambda slot: (None, None))


def core(policy="asp", workers=3, evict_after=None, transfer_timeout=5.0):
    c = ServerCore(cadence.make_controller(policy, workers), list(range(1, workers + 1)), SIZE, F32,
                   _dtype_name, evict_after=evict_after, transfer_timeout=transfer_timeout,
                   keep_log=True, who="test server")
    c.start(0.0)
    return c


def push(c, w, k, now=0.0, count=SIZE, code=F32, slot=None):
    return c.message(w if slot is None else slot, proto.PUSH, w, k, count, code, now)


def pull(c, w, count=SIZE, code=F32, now=0.0):
    return c.message(w, proto.PULL, w, 0, count, code, now)


def kinds(actions):
    return [type(a).__name__ for a in actions]


def test_a_pull_is_admitted_only_for_the_servers_model():
    c = core()
    assert pull(c, 0) == [Reply(0, 0)]
    bad = pull(c, 1, count=SIZE + 1)
    assert kinds(bad) == ["Refuse", "Notify"] and bad[0].status == proto.ERROR
    assert "worker 1 has a model of 11 elements, the server one of 10" in bad[0].text
    bad = pull(c, 2, code=F64)
    assert "worker 2 has a torch.float64 model, the server a torch.float32 one" in bad[0].text
    assert c.state == ["active"] * 3  # refused, not evicted: it may finish()


def test_each_workers_pushes_are_applied_in_order_once():
    c = core()
    assert push(c, 0, 1) == [Apply(0, 1), Reply(0, 1), Notify("pushed", 0, "")]
    assert push(c, 0, 2) == [Apply(0, 2), Reply(0, 2), Notify("pushed", 0, "")]
    out = push(c, 0, 2)  # a retried push
    assert Apply(0, 2) not in out and c.state[0] == "evicted"
    refusal = next(a for a in out if isinstance(a, Refuse))
    assert refusal.status == proto.EVICTED and "it pushed iteration 2 after 2" in refusal.text
    assert c.stats.pushes == [2, 0, 0] and c.stats.log == [(0, 1), (0, 2)]
    # its next request is answered by the notice already sent: nothing more goes out
    assert push(c, 0, 3) == [Notify("refused", 0, "worker 0 was evicted (its notice was sent at eviction)")]
    assert kinds(push(c, 0, 3)) == ["Refuse", "Notify"]  # then sticky refusals


def test_a_push_of_the_wrong_size_or_dtype_or_identity_evicts():
    c = core()
    assert "a gradient of 11 torch.float32 elements" in push(c, 0, 1, count=SIZE + 1)[0].text
    assert "a gradient of 10 torch.float64 elements" in push(c, 1, 1, code=F64)[0].text
    assert "it sent as worker 0, but rank 3 is worker 2" in push(c, 0, 1, slot=2)[0].text
    assert c.state == ["evicted"] * 3 and not c.active
    c = core()
    assert push(c, 0, 1, code=0)[0] == Apply(0, 1)  # code 0: the model's own dtype


def test_bsp_parks_the_fast_worker_and_releases_it_with_the_round():
    c = core("bsp", workers=2)
    assert push(c, 0, 1) == [Apply(0, 1), Notify("pushed", 0, "")]
    assert c.stats.parked == 1 and c.heard[0] is None  # excused from liveness while parked
    out = push(c, 1, 1, now=0.5)
    assert out == [Apply(1, 1), Reply(1, 1), Reply(0, 1), Notify("pushed", 1, "")]
    # each reply carried the weights after both pushes of the round
    assert c.stats.replies == [(1, 1, 2), (0, 1, 2)] and c.stats.max_start_staleness == [0, 0]


def test_silence_evicts_and_releases_whoever_waited_for_the_silent_worker():
    c = core("bsp", workers=2, evict_after=1.0)
    push(c, 0, 1, now=0.2)  # parked: waits for worker 1
    assert c.next_wake(0.2) == pytest.approx(0.8 + 1e-3)  # worker 1's deadline (heard at 0)
    assert c.tick(0.9, NO_SENDS) == []
    out = c.tick(1.0, NO_SENDS)
    assert kinds(out) == ["Refuse", "Reply", "Notify"]
    assert out[1] == Reply(0, 1) and out[2].kind == "evicted" and out[2].reason.startswith("silent for 1.000 s")
    assert c.stats.evictions[0].worker == 1 and c.stats.evictions[0].silent_seconds == 1.0


def test_a_lost_connection_or_an_untaken_reply_drops_without_a_notice():
    c = core("bsp", workers=2)
    push(c, 0, 1)
    out = c.lost(1, "Connection closed by peer", 0.1)
    assert out == [Reply(0, 1), Notify("evicted", 1, "lost: Connection closed by peer")]
    c = core(transfer_timeout=5.0)
    push(c, 0, 1)
    assert c.tick(4.0, lambda slot: (None, (0.0, 0) if slot == 0 else None)) == []
    out = c.tick(5.5, lambda slot: (None, (0.0, 0) if slot == 0 else None))
    assert out == [Notify("evicted", 0, "lost: its reply was not received within 5 s (transfer_timeout)")]
    out = c.tick(5.5, lambda slot: ("pair closed", None) if slot == 1 else (None, None))
    assert out[0].reason == "lost: a reply could not be sent: pair closed"


def test_requests_after_finish_are_refused():
    c = core()
    assert c.message(0, proto.FINISH, 0, 0, 0, 0, 0.0) == [Notify("finished", 0, "")]
    out = push(c, 0, 1)
    assert out[0].status == proto.ERROR and out[0].text == "worker 0 already called finish()"


def test_an_evicted_worker_rejoins_under_the_controllers_next_id():
    c = core("bsp", workers=2, evict_after=1.0)
    c.tick(2.0, NO_SENDS)  # both silent: both evicted
    out = c.message(1, proto.JOIN, 1, 0, SIZE, F32, 2.5)
    assert out == [Reply(2, 0), Notify("joined", 2, "rank 2 (worker 1 before)")]
    assert c.id_of == [0, 2] and c.slot_of == [0, 1, 1] and c.stats.pushes == [0, 0, 0]
    assert push(c, 2, 1, slot=1, now=2.6)[:2] == [Apply(2, 1), Reply(2, 1)]  # alone in BSP
    out = c.message(1, proto.JOIN, 2, 1, SIZE, F32, 2.7)  # an active worker asking to rejoin
    assert "rank 2 is worker 2 and active: rejoin() is for a worker the server evicted" in out[0].text


def test_closing_tells_every_active_worker_once():
    c = core(workers=2)
    c.message(1, proto.FINISH, 1, 0, 0, 0, 0.0)
    out = c.close()
    assert out == [Refuse(0, "the server closed", proto.CLOSED, 0)]
    assert c.closing_message(0, proto.PUSH) == []  # the notice answers it
    assert c.closing_message(0, proto.PUSH) == [Refuse(0, "the server closed", proto.CLOSED, 0)]
    assert c.closing_message(0, proto.FINISH) == []  # its goodbye


def test_a_checkpoint_resumes_each_worker_where_it_says_it_was():
    c = core("ssp:1", workers=3, evict_after=1.0)
    for k in (1, 2):
        for w in (0, 1):
            push(c, w, k, now=0.1 * k)
    c.tick(1.05, NO_SENDS)  # worker 2 never spoke: evicted
    c.message(2, proto.JOIN, 2, 0, SIZE, F32, 1.1)  # and back as worker 3
    sd = c.state_dict()
    r = core("ssp:1", workers=3, evict_after=1.0)
    r.load_state_dict(sd, fresh_controller=True)
    assert r.state == ["active", "active", "evicted", "active"] and r.id_of == [0, 1, 3]
    assert r.controller.workers == [0, 1, 3] and r.stats.pushes == [2, 2, 0, 0]
    r.start(10.0)
    # worker 0's own checkpoint is one push older than the server's: it continues from there
    assert push(r, 0, 2, now=10.1)[0] == Apply(0, 2)
    assert r.message(1, proto.PULL, 1, 2, SIZE, F32, 10.2) == [Reply(1, 2)]
    assert r.stats.resumed == [(0, 2, 1), (1, 2, 2)]
    assert push(r, 1, 4, now=10.3)[-1].kind == "evicted"  # after the first request: strict again
    assert r.message(2, proto.PUSH, 3, 1, SIZE, F32, 10.4)[0] == Apply(3, 1)  # the rejoined id
    assert r.stats.resumed[-1] == (3, 0, 0)


def test_a_checkpoint_of_another_server_is_refused_naming_the_difference():
    sd = core().state_dict()
    with pytest.raises(cadence.InvalidParameterError, match="3 workers, this one has 2"):
        core(workers=2).load_state_dict(sd, fresh_controller=True)
    other = dict(sd, size=SIZE + 1)
    with pytest.raises(cadence.InvalidParameterError, match="11 elements of type torch.float32"):
        core().load_state_dict(other, fresh_controller=True)
    with pytest.raises(cadence.InvalidParameterError, match="fresh controller"):
        core().load_state_dict(sd, fresh_controller=False)


@pytest.mark.parametrize("policy", ["bsp", "ssp:2", "asp"])
def test_seeded_random_schedules_keep_every_rule(policy):
    """Workers that send only when answered, a few pushes out of order, finishes and silences,
    on 300 seeded schedules: every applied push is the next of its worker's numbering, every
    request of an active worker is answered exactly once, the log positions of the replies
    never go back, the staleness at release never passes the policy's bound, and once the
    workers left finish, the run ends with nobody waiting."""
    bound = {"bsp": 0, "ssp:2": 2, "asp": None}[policy]
    for seed in range(300):
        rnd = random.Random(seed)
        n = rnd.randint(2, 4)
        c = core(policy, workers=n, evict_after=3.0)
        waiting = [False] * n  # sent a request, no answer yet
        it = [0] * n
        last = [0] * n

        def process(out):
            for a in out:
                if isinstance(a, Apply):
                    assert a.iteration == last[a.worker] + 1, (seed, a)
                    last[a.worker] = a.iteration
                elif isinstance(a, Reply):
                    assert waiting[a.worker], (seed, a)  # one answer per request
                    waiting[a.worker] = False
                elif isinstance(a, Refuse):
                    waiting[a.worker] = False  # an answer, or a notice before the next request
            for w in range(n):
                if c.state[w] != "active":
                    waiting[w] = False

        now = 0.0
        for _ in range(300):
            now += rnd.random() * 0.5
            ready = [w for w in range(n) if not waiting[w] and c.state[w] == "active"]
            if not ready or rnd.random() < 0.05:
                process(c.tick(now, NO_SENDS))
                continue
            w = rnd.choice(ready)
            r = rnd.random()
            if r < 0.03:
                process(c.message(w, proto.FINISH, w, it[w], 0, 0, now))
            else:
                it[w] += 2 if r < 0.05 else 1  # now and then a push out of order
                waiting[w] = True
                process(push(c, w, it[w], now=now))
        for _ in range(4 * n):  # the workers left finish, the parked ones once released
            for w in range(n):
                if c.state[w] == "active" and not waiting[w]:
                    process(c.message(w, proto.FINISH, w, it[w], 0, 0, now))
        assert not c.active and not any(waiting), seed
        for w in range(n):
            assert [k for v, k in c.stats.log if v == w] == list(range(1, last[w] + 1)), (seed, w)
        positions = [p for _, _, p in c.stats.replies]
        assert positions == sorted(positions), seed
        if bound is not None:
            assert max(c.stats.max_start_staleness) <= bound, seed
