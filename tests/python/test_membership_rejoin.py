"""cadence.membership.Member.rejoin(): a member the quorum dropped while it was alive comes back
in its process as a new incarnation in its slot, with the quorum's state.

Three members run as spawned processes on loopback (insecure=True, a 0.5 s heartbeat). Member 2
is dropped while alive, as by a late resume from SIGSTOP, without racing a clock: it stops
itself before a sync, the test resumes it once the others have reported it lost and committed
a sync without it, and the sync it then enters raises EvictedError or QuorumError (its
incarnation is lost to the others for good); it calls rejoin(), and the job ends with all three
in the quorum and the same state. The same with a DiLoCo on each member (the DiLoCo comes back
with the member, its registrations in their order). Every wait is bounded (BOUND), never timed.
"""

import functools
import os
import signal
import threading
import time
import traceback

import numpy as np
import pytest

from binding_support import membership_or_skip, run_with_late_resume

cadence = pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")
membership = membership_or_skip()

N = 1000          # elements of the state
BOUND = 60.0      # seconds: upper bound on any wait (catches a hang, never reached when healthy)
HEARTBEAT = 0.5   # seconds: op timeout 2 s (room for a loaded CI machine)
HELD_BACK_AT = 2  # member 2 stops itself before the sync after this many committed


def _rank(rank, size, path, ready, went_on, back, abort, results):
    """One member: a local step adds rank+1 to its state (and counts itself in a blob), then
    the state is averaged in a transaction, with a flag agreed in the same sync (max) saying
    whether the job goes on: member 2 wants more until it committed a sync after its rejoin,
    the others until it says so (`back`). Member 2 stops itself (SIGSTOP) before the sync after
    HELD_BACK_AT; member 0 sets `went_on` once it committed a sync without member 2."""
    try:
        ready.wait(BOUND)  # imports done: the three register and start together
        until = time.monotonic() + BOUND
        with membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                               join_timeout=BOUND, connect_timeout=BOUND) as m:
            w = np.full(N, 10.0 * rank)
            more = np.zeros(1)  # agreed in every sync: whether the job goes on
            m.add_state(w, more)
            steps = [0]         # a blob: the local step count, a donor's after a rejoin
            m.add_blob("steps", lambda: str(steps[0]).encode(), lambda b: steps.__setitem__(0, int(b)))
            changes = []
            m.on_change(changes.append)
            m.start()
            dropped = None      # the error member 2's sync raised after its resume
            after_rejoin = None

            def wants_more():
                if abort.is_set() or time.monotonic() > until:
                    return False
                if rank == 2:
                    return after_rejoin is None or m.committed <= after_rejoin
                return not back.is_set()

            while True:
                if rank == 2 and dropped is None and m.committed == HELD_BACK_AT:
                    os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes it (SIGCONT)
                steps[0] += 1
                w += rank + 1

                def body():
                    flag = np.array([1.0 if wants_more() else 0.0])
                    m.allreduce(flag, "max")
                    more[0] = flag[0]
                    m.allreduce_average(w)

                try:
                    r = m.transact(body, backup=[w])
                except (membership.EvictedError, membership.QuorumError) as e:
                    if rank != 2 or dropped is not None:
                        raise
                    dropped = type(e).__name__
                    m.rejoin()
                    after_rejoin = m.committed
                    continue
                assert r["outcome"] in ("committed", "healed"), r
                if rank == 0 and m.quorum["ranks"] == [0, 1] and any(2 in c["lost"] for c in changes):
                    went_on.set()
                if rank == 2 and after_rejoin is not None and m.committed > after_rejoin:
                    back.set()
                if more[0] == 0:
                    break
            m.finish()
            results.put((rank, "ok", dict(hash=m.state_hash, w=w.tolist(), steps=steps[0], quorum=m.quorum["ranks"],
                                          committed=m.committed, dropped=dropped, after_rejoin=after_rejoin,
                                          changes=changes)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        abort.set()
        results.put((rank, "error", traceback.format_exc()))


def test_a_member_dropped_while_alive_rejoins_in_its_process(tmp_path):
    size = 3
    out, ev = run_with_late_resume(_rank, size, str(tmp_path / "rendezvous"), ("went_on", "back", "abort"), BOUND)
    back, abort = ev["back"], ev["abort"]
    assert out[2]["dropped"] in ("EvictedError", "QuorumError"), out[2]["dropped"]
    assert back.is_set() and not abort.is_set(), "the job ended before member 2 came back"
    # The quorum has three members again, and they hold the same state: the arrays, the blob
    # (member 2's step count is a donor's) and the agreed count of syncs.
    for r in range(size):
        assert out[r]["quorum"] == [0, 1, 2], out[r]["quorum"]
        assert out[r]["hash"] == out[0]["hash"]
        assert out[r]["w"] == out[0]["w"]
        assert out[r]["steps"] == out[0]["steps"] and out[r]["committed"] == out[0]["committed"]
    # Members 0 and 1 went on without member 2 (its count came with the state), admitted it
    # again, and the on_change callback registered before followed it into its new member.
    assert out[0]["steps"] > HELD_BACK_AT + 1
    assert any(c["lost"] == [2] for c in out[0]["changes"]) and any(c["admitted"] == [2] for c in out[0]["changes"])
    assert any(2 in c["admitted"] and c["before"]["id"] == 0 for c in out[2]["changes"][1:])


def _diloco_rank(rank, size, path, ready, went_on, abort, results, config):
    """One member with a DiLoCo (`config`, outer Nesterov: outer state to carry) and state
    registered around it: an array `a` and an on_change callback before the DiLoCo, an array
    `b` and a blob after it (every incarnation must register them in this order). An inner step
    adds rank+1 to the weights. Member 2 stops itself before the sync after HELD_BACK_AT outer
    steps; once resumed, its sync raises EvictedError or QuorumError, it scribbles over `a`, `b`
    and its weights (the donor's must come back), rejoins and asks the job to stop, which every
    member agrees in the same sync; the others stop on their own only when something is wrong.
    Streaming: the drop is raised at the completion point of the fragment whose exchange found
    member 2 gone."""
    try:
        ready.wait(BOUND)  # imports done: the three register and start together
        until = time.monotonic() + BOUND
        with membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                               join_timeout=BOUND, connect_timeout=BOUND) as m:
            a = np.arange(7, dtype=np.float64)
            m.add_state(a)
            changes = []
            m.on_change(changes.append)
            w = np.full(N, 10.0 * rank, dtype=np.float32)
            outer = membership.DiLoCo(m, [w], config)
            b = np.arange(5, dtype=np.int64)
            m.add_state(b)
            loads = []
            m.add_blob("tag", lambda: b"tag", loads.append)
            outer.start()
            dropped = None
            held = False  # member 2 stopped itself (once: streaming, the sync that raises may come later)
            while not outer.stop_agreed:
                if abort.is_set() or time.monotonic() > until:
                    outer.request_stop()
                w += rank + 1
                if not outer.step_done(0.001):
                    continue
                if rank == 2 and not held and outer.outer_steps >= HELD_BACK_AT:
                    held = True
                    os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes it (SIGCONT)
                try:
                    outer.sync()
                except (membership.EvictedError, membership.QuorumError) as e:
                    if rank != 2 or dropped is not None:
                        raise
                    dropped = type(e).__name__
                    a[:], b[:], w[:] = -1, -2, -3
                    m.rejoin()
                    outer.request_stop()  # the next sync ends the job
                    continue
                if rank == 0 and m.quorum["ranks"] == [0, 1] and any(2 in c["lost"] for c in changes):
                    went_on.set()
            synced = dict(global_hash=outer.global_hash, hash=m.state_hash, quorum=m.quorum["ranks"],
                          outer_steps=outer.outer_steps)
            outer.finish()
            results.put((rank, "ok", dict(synced=synced, final=outer.global_hash, w=w.tolist(), a=a.tolist(),
                                          b=b.tolist(), loads=loads, dropped=dropped, changes=changes)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        abort.set()
        results.put((rank, "error", traceback.format_exc()))


@pytest.mark.parametrize("config", ["fixed:2,outer=nesterov:0.7:0.9",
                                    "fixed:4,fragments=2,delay=1,outer=nesterov:0.7:0.9"], ids=["sync", "streaming"])
def test_a_member_with_a_diloco_dropped_while_alive_rejoins_with_the_global_state(tmp_path, config):
    size = 3
    out, ev = run_with_late_resume(functools.partial(_diloco_rank, config=config), size,
                                   str(tmp_path / "rendezvous"), ("went_on", "abort"), BOUND)
    assert not ev["abort"].is_set()
    assert out[2]["dropped"] in ("EvictedError", "QuorumError"), out[2]["dropped"]
    # After the sync that agreed the stop (member 2's first after its rejoin), and after finish:
    # three members, the same global weights and outer state, the same registered state.
    for r in range(size):
        assert out[r]["synced"]["quorum"] == [0, 1, 2], out[r]["synced"]
        assert out[r]["synced"]["global_hash"] == out[0]["synced"]["global_hash"]
        assert out[r]["synced"]["hash"] == out[0]["synced"]["hash"]
        assert out[r]["synced"]["outer_steps"] == out[0]["synced"]["outer_steps"] > HELD_BACK_AT + 1
        assert out[r]["final"] == out[0]["final"]
        if "delay" not in config:  # streaming, the fragments not completed last keep local work
            assert out[r]["w"] == out[0]["w"]
        # The arrays registered before and after the DiLoCo came back in their places.
        assert out[r]["a"] == list(range(7)) and out[r]["b"] == list(range(5))
    assert out[2]["loads"] == [b"tag"]  # the blob registered after the DiLoCo, loaded at the join
    assert any(2 in c["admitted"] for c in out[2]["changes"][1:])  # the callback followed it


def single(**kw):
    return membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=HEARTBEAT, **kw)


def test_rejoin_is_refused_where_it_cannot_work():
    with single() as m:
        with pytest.raises(cadence.InvalidParameterError, match="rejoin is for a member that was running"):
            m.rejoin()
        assert not m.may_rejoin  # rank 0 without a holder
        m.start()
        with pytest.raises(cadence.InvalidParameterError, match="rank 0 hosts the job's rendezvous"):
            m.rejoin()
        assert m.transact(lambda: None)["outcome"] == "committed"  # the refusal left it running
    with pytest.raises(cadence.InvalidParameterError, match="the member was closed"):
        m.rejoin()
    with single() as m:
        w = np.zeros(4, dtype=np.float32)
        outer = membership.DiLoCo(m, [w], "fixed:2,outer=sgd:1")
        with pytest.raises(cadence.InvalidParameterError, match="a DiLoCo is already attached"):
            membership.DiLoCo(m, [np.zeros(4, dtype=np.float32)], "fixed:2")
        outer.start()
        with pytest.raises(cadence.InvalidParameterError, match="rank 0 hosts the job's rendezvous"):
            m.rejoin()


def test_a_failed_rejoin_leaves_the_member_closed_but_rejoinable(tmp_path):
    # Member 1 of a job whose rank 0 holds the rendezvous, alone in its quorum, with a DiLoCo;
    # the holder stops, so a rejoin cannot connect: it raises, and the member and its DiLoCo say
    # why until closed.
    path = str(tmp_path / "rendezvous")
    stop = threading.Event()
    held = {}
    holder = threading.Thread(target=lambda: held.update(membership.hold_rendezvous(
        2, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT, stop=stop)), daemon=True)
    holder.start()
    try:
        membership.read_address(path, BOUND)  # the holder is up: a short connect_timeout is for rejoin
        m = membership.Member(1, 2, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT, holder=True,
                              connect_timeout=1.0)
        w = np.arange(4.0)
        m.add_state(w)
        outer = membership.DiLoCo(m, [np.zeros(4, dtype=np.float32)], "fixed:2,outer=sgd:1")
        outer.start()
    finally:
        stop.set()
        holder.join(BOUND)
    assert not holder.is_alive() and held["registrations"] == 1
    with m:
        assert m.may_rejoin and m.quorum["ranks"] == [1]
        with pytest.raises(cadence.TransportError, match="never answered at the rendezvous"):
            m.rejoin()  # nobody answers at the rendezvous any more
        with pytest.raises(cadence.InvalidParameterError, match="its last rejoin\\(\\) failed"):
            _ = m.committed
        with pytest.raises(cadence.InvalidParameterError, match="DiLoCo.sync: .*its last rejoin\\(\\) failed"):
            outer.sync()
        with pytest.raises(cadence.InvalidParameterError, match="its last rejoin\\(\\) failed"):
            _ = outer.outer_steps
        with pytest.raises(cadence.TransportError, match="never answered at the rendezvous"):
            m.rejoin()  # may be tried again (and fails again: still nobody there)
    with pytest.raises(cadence.InvalidParameterError, match="the member was closed"):
        m.rejoin()
