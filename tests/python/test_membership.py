"""cadence.membership: fault-tolerant collectives over ZeroMQ from Python, on real processes.

Every rank is a spawned process on loopback (no job secret: insecure=True); the tests check the
transaction contract from outside: after every sync every member holds the same state (equal
state hashes and values), a rank killed with SIGKILL (rank 0 included) is dropped and the sync
retried without it, a replacement joins with the quorum's state (in the first member's slot too,
when rank 0 only holds the rendezvous: hold_rendezvous), and bad input is named. Each
wait is bounded; a process still running at the bound is killed and fails the test.
"""

import multiprocessing as mp
import os
import signal
import traceback

import numpy as np
import pytest

from binding_support import membership_or_skip

cadence = pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")
membership = membership_or_skip()

N = 1000          # elements of the state
BOUND = 120.0     # seconds: upper bound on a whole job (catches a hang, never reached when healthy)
HEARTBEAT = 2.0   # seconds: op timeout 8 s, quorum 16 s (room for a loaded CI machine)


def initial(rank):
    return np.full(N, 10.0 * rank, dtype=np.float64)


def _rank(rank, size, path, steps, kill_at, join, hold, results, holder=False):
    """One rank: a local step adds rank+1, then the state is averaged in a transaction. kill_at:
    SIGKILL itself before that sync. join: a replacement. hold: the others go on past `steps`
    while the file exists (agreed in every sync, as cadence-chaos-rank does). holder: rank 0
    holds the rendezvous (_holder) and is no member."""
    try:
        m = membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                              join_timeout=60.0, connect_timeout=60.0, holder=holder)
        w = initial(rank)
        going_on = np.zeros(1, dtype=np.float64)
        m.add_state(w, going_on)
        changes = []
        m.on_change(lambda c: changes.append((c["after"]["ranks"], c["lost"], c["admitted"])))
        if join:
            m.join()
            os.unlink(hold)  # admitted: the others may stop
        else:
            m.start()
        outcomes = []
        while m.committed < steps or going_on[0] != 0:
            if kill_at is not None and m.committed == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            w += rank + 1

            def body():
                flag = np.array([1.0 if hold and os.path.exists(hold) else 0.0])
                m.allreduce(flag, "max")
                going_on[0] = flag[0]
                m.allreduce_average(w)

            r = m.transact(body, backup=[w])
            assert r["outcome"] in ("committed", "healed"), r
            outcomes.append(r["outcome"])
        m.finish()
        results.put((rank, "ok", dict(hash=m.state_hash, w0=float(w[0]), same=bool((w == w[0]).all()),
                                      quorum=m.quorum["ranks"], committed=m.committed, stats=m.stats(),
                                      changes=changes, outcomes=outcomes)))
        m.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


def _holder(rank, size, path, steps, kill_at, join, hold, results):
    """Rank 0 holding the rendezvous outside the quorum until the members are gone: reports
    hold_rendezvous's counts and the lines it saw."""
    try:
        events = []
        report = membership.hold_rendezvous(size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                                            exit_when_empty=1.0, on_event=events.append)
        results.put((rank, "ok", dict(report, events=events)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


def _diloco_rank(rank, size, path, steps, kill_at, join, hold, results):
    """One rank of DiLoCo over the member: an inner step adds rank+1 to its weights, an outer
    step every 2 inner steps with outer SGD at lr 1 (so the global weights become the mean of
    the local ones). kill_at: SIGKILL itself once that many outer steps are applied."""
    try:
        m = membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                              connect_timeout=60.0)
        w = initial(rank).astype(np.float32)
        outer = membership.DiLoCo(m, [w], "fixed:2,outer=sgd:1")
        outer.start()
        outcomes = []
        while outer.outer_steps < steps:
            if kill_at is not None and outer.outer_steps == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            w += rank + 1
            if outer.step_done(0.001):
                outcomes.append(outer.sync()["outcome"])
        outer.finish()
        results.put((rank, "ok", dict(hash=outer.global_hash, w0=float(w[0]), same=bool((w == w[0]).all()),
                                      quorum=m.quorum["ranks"], outer_steps=outer.outer_steps,
                                      outcomes=outcomes)))
        m.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


def _streaming_rank(rank, size, path, steps, kill_at, join, hold, results):
    """One rank of streaming DiLoCo over the member (2 fragments, each exchanged over the next
    inner step on a C++ thread): an inner step adds rank+1; kill_at: SIGKILL itself while a
    fragment is in flight once that many outer steps are applied."""
    try:
        m = membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                              connect_timeout=60.0)
        w = np.arange(N, dtype=np.float32) + 10.0 * rank
        outer = membership.DiLoCo(m, [w], "fixed:4,fragments=2,delay=1,outer=sgd:1")
        outer.start()
        started = landed = 0
        while outer.outer_steps < steps:
            w += rank + 1
            if outer.step_done(0.001):
                was_in_flight = outer.in_flight
                r = outer.sync()
                if was_in_flight:
                    landed += 1
                    assert r["outcome"] in ("committed", "healed", "discarded"), r
                else:
                    started += 1
                    assert r["attempts"] == 0 and outer.in_flight, r
                    if kill_at is not None and outer.outer_steps >= kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
        outer.finish()
        results.put((rank, "ok", dict(hash=outer.global_hash, quorum=m.quorum["ranks"], outer_steps=outer.outer_steps,
                                      started=started, landed=landed)))
        m.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


def run_job(tmp_path, size, steps, kill=None, replace=None, target=_rank, holder=False):
    """Runs `size` ranks of `target` (rank `kill` SIGKILLs itself before sync kill_at); with
    `replace`, a new process takes the killed rank's slot once it died. With `holder`, rank 0 is
    _holder and the others are members with holder=True. Returns {rank: result}."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    path = str(tmp_path / "rendezvous")
    hold = str(tmp_path / "hold") if replace else ""
    if hold:
        open(hold, "w").close()
    member = {"holder": True} if holder else {}
    procs = {}
    for r in range(size):
        kill_at = kill[1] if kill and kill[0] == r else None
        args = (r, size, path, steps, kill_at, False, hold, results)
        p = ctx.Process(target=_holder, args=args) if holder and r == 0 else \
            ctx.Process(target=target, args=args, kwargs=member)
        p.start()
        procs[r] = p
    out = {}
    try:
        if replace:
            victim = procs[kill[0]]
            victim.join(BOUND)
            assert victim.exitcode == -signal.SIGKILL, f"rank {kill[0]} did not die as planned: {victim.exitcode}"
            p = ctx.Process(target=target, args=(kill[0], size, path, steps, None, True, hold, results),
                            kwargs=member)
            p.start()
            procs[kill[0]] = p
        expected = size - (1 if kill and not replace else 0)
        while len(out) < expected:
            rank, status, value = results.get(timeout=BOUND)
            assert status == "ok", f"rank {rank} failed:\n{value}"
            out[rank] = value
        for p in procs.values():
            p.join(BOUND)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
                p.join()
    return out


def expected_value(size, steps, lost=None):
    """The value every element holds after `steps` syncs: the mean of the initial values, then
    each sync adds the mean of (rank + 1) over the ranks in the quorum. lost=(rank, at): that
    rank leaves before sync `at` (0-based)."""
    v = np.mean([10.0 * r for r in range(size)])
    ranks = list(range(size))
    for s in range(steps):
        if lost and s == lost[1]:
            ranks.remove(lost[0])
        v += np.mean([r + 1 for r in ranks])
    return v


def test_every_member_commits_the_same_average(tmp_path):
    out = run_job(tmp_path, 3, steps=6)
    assert sorted(out) == [0, 1, 2]
    hashes = {v["hash"] for v in out.values()}
    assert len(hashes) == 1
    for v in out.values():
        assert v["same"] and v["w0"] == expected_value(3, 6)
        assert v["quorum"] == [0, 1, 2]
        assert v["committed"] == 7  # six syncs and the closing one
        assert v["stats"]["failed_syncs"] == 0


@pytest.mark.parametrize("victim", [2, 0], ids=["a worker", "rank 0"])
def test_a_killed_rank_is_dropped_and_the_sync_retried_without_it(tmp_path, victim):
    out = run_job(tmp_path, 3, steps=6, kill=(victim, 3))
    survivors = sorted(r for r in range(3) if r != victim)
    assert sorted(out) == survivors
    assert len({v["hash"] for v in out.values()}) == 1
    healed = any("healed" in v["outcomes"] for v in out.values())
    for v in out.values():
        # Syncs 0-2 with every rank, the others without the victim: it killed itself after
        # completing sync 2, so sync 3 failed on the loss and ran again without it. Unless its
        # last message of sync 2 died with it: then sync 2 failed on both survivors and ran
        # again without it. Or one survivor completed sync 2 and the other did not: that one
        # was healed from the first, taking its state as it stood at its next sync point, one
        # local step (at most rank + 1 = 3) past the average.
        assert v["same"]
        if healed:
            assert abs(v["w0"] - expected_value(3, 6, lost=(victim, 3))) <= 3
        else:
            assert v["w0"] in (expected_value(3, 6, lost=(victim, 3)), expected_value(3, 6, lost=(victim, 2)))
        assert v["quorum"] == survivors
        assert any(victim in lost for _, lost, _ in v["changes"])


def test_a_replacement_joins_with_the_quorums_state(tmp_path):
    out = run_job(tmp_path, 3, steps=4, kill=(2, 2), replace=True)
    assert sorted(out) == [0, 1, 2]
    assert len({v["hash"] for v in out.values()}) == 1
    assert len({v["w0"] for v in out.values()}) == 1
    joiner = out[2]
    assert joiner["stats"]["state_received_bytes"] >= N * 8
    assert joiner["quorum"] == [0, 1, 2]
    assert any(2 in admitted for _, _, admitted in out[0]["changes"])


def test_with_rank_0_holding_the_rendezvous_the_first_member_is_replaced(tmp_path):
    # Rank 0 only holds the rendezvous; ranks 1..3 are the members and rank 1, the first (the
    # quorum's leader), is killed after 2 syncs: a replacement registers in its slot and joins.
    out = run_job(tmp_path, 4, steps=4, kill=(1, 2), replace=True, holder=True)
    assert sorted(out) == [0, 1, 2, 3]
    members = {r: v for r, v in out.items() if r != 0}
    assert len({v["hash"] for v in members.values()}) == 1
    assert len({v["w0"] for v in members.values()}) == 1
    for v in members.values():
        assert v["same"] and v["quorum"] == [1, 2, 3]
    joiner = members[1]
    assert joiner["stats"]["state_received_bytes"] >= N * 8
    assert any(1 in lost for _, lost, _ in members[2]["changes"])
    assert any(1 in admitted for _, _, admitted in members[2]["changes"])
    # The holder saw 3 first registrations and the replacement's, the victim's loss and the
    # goodbyes of the 3 at the end, then returned by itself once nobody was left.
    held = out[0]
    assert held["registrations"] == 4 and held["losses"] == 4, held
    assert held["emptied"] and held["alive"] == 0
    assert "rendezvous: slot 1 registered (incarnation 2)" in held["events"]
    assert "rendezvous: slot 1 lost (incarnation 1)" in held["events"]


def test_holder_arguments_are_checked():
    with pytest.raises(cadence.InvalidParameterError, match="rank 0 holds the rendezvous with holder=True"):
        membership.Member(0, 4, rendezvous="tcp://127.0.0.1:0", insecure=True, holder=True)
    with pytest.raises(cadence.InvalidParameterError, match="size 1 leaves no member besides the rendezvous"):
        membership.hold_rendezvous(1, rendezvous="tcp://127.0.0.1:0", insecure=True)
    with pytest.raises(cadence.InvalidParameterError, match="needs rendezvous"):
        membership.hold_rendezvous(3, insecure=True)


def test_hold_rendezvous_stops_when_asked_and_a_raising_stop_propagates():
    import threading

    stop = threading.Event()
    stop.set()
    r = membership.hold_rendezvous(3, rendezvous="tcp://127.0.0.1:0", insecure=True, stop=stop)
    assert r["registrations"] == 0 and not r["emptied"]

    class Enough(Exception):
        pass

    def stop_raising():
        raise Enough("from stop")

    with pytest.raises(Enough, match="from stop"):
        membership.hold_rendezvous(3, rendezvous="tcp://127.0.0.1:0", insecure=True, stop=stop_raising)


def diloco_value(size, steps, lost=None):
    """DiLoCo with outer SGD at lr 1 and 2 inner steps an outer step: the global weights start
    as rank 0's (0) and each outer step adds 2 x the mean of (rank + 1) over the ranks in it."""
    v, ranks = 0.0, list(range(size))
    for s in range(steps):
        if lost and s == lost[1]:
            ranks.remove(lost[0])
        v += 2 * np.mean([r + 1 for r in ranks])
    return v


def test_diloco_outer_steps_commit_the_mean_of_the_local_weights(tmp_path):
    out = run_job(tmp_path, 3, steps=4, target=_diloco_rank)
    assert len({v["hash"] for v in out.values()}) == 1
    for v in out.values():
        assert v["same"] and v["w0"] == diloco_value(3, 4)
        assert v["outer_steps"] == 4 and v["outcomes"] == ["committed"] * 4


@pytest.mark.parametrize("victim", [1, 0], ids=["a worker", "rank 0"])
def test_diloco_drops_a_killed_ranks_pseudo_gradient_and_goes_on(tmp_path, victim):
    out = run_job(tmp_path, 3, steps=5, kill=(victim, 2), target=_diloco_rank)
    survivors = sorted(r for r in range(3) if r != victim)
    assert sorted(out) == survivors
    assert len({v["hash"] for v in out.values()}) == 1
    for v in out.values():
        # Outer steps 0-1 with every rank, the rest without the victim; or, when its last
        # message of step 1 died with it, step 1 too was run again without it. A survivor
        # healed from one that completed a step takes its global weights: the same values.
        assert v["same"] and v["w0"] in (diloco_value(3, 5, lost=(victim, 2)), diloco_value(3, 5, lost=(victim, 1)))
        assert v["quorum"] == survivors and v["outer_steps"] == 5


@pytest.mark.parametrize("victim", [None, 1], ids=["no fault", "a rank lost in flight"])
def test_streaming_diloco_overlaps_its_exchange_and_survives_a_loss_in_flight(tmp_path, victim):
    out = run_job(tmp_path, 3, steps=6, kill=(victim, 2) if victim is not None else None, target=_streaming_rank)
    survivors = [r for r in range(3) if r != victim]
    assert sorted(out) == survivors
    assert len({v["hash"] for v in out.values()}) == 1
    for v in out.values():
        assert v["quorum"] == survivors and v["outer_steps"] >= 6
        # Every exchange started at a send point and completed at its completion point (the
        # last one by finish()).
        assert v["started"] >= 6 and v["landed"] in (v["started"], v["started"] - 1)


def test_streaming_diloco_closed_while_a_fragment_is_in_flight():
    w = np.full(8, 2.0, dtype=np.float32)
    m = single()
    outer = membership.DiLoCo(m, [w], "fixed:4,fragments=2,delay=1,outer=sgd:1")
    outer.start()
    while not outer.in_flight:
        w += 1
        if outer.step_done(0.001):
            outer.sync()
    assert outer.outer_steps == 0  # as of the last completed exchange: none yet
    m.close()  # joins the fragment's thread before the member goes
    with pytest.raises(cadence.InvalidParameterError, match="the member is closed"):
        outer.sync()


def test_bad_arguments_are_named():
    with pytest.raises(cadence.InvalidParameterError, match="rank 3 is out of range for size 2"):
        membership.Member(3, 2, rendezvous="tcp://127.0.0.1:0", insecure=True)
    with pytest.raises(cadence.InvalidParameterError, match="no job secret"):
        env = os.environ.pop("CADENCE_JOB_SECRET", None)
        try:
            membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0")
        finally:
            if env is not None:
                os.environ["CADENCE_JOB_SECRET"] = env
    with pytest.raises(cadence.InvalidParameterError, match="needs rendezvous"):
        membership.Member(0, 1, insecure=True)


def single(**kw):
    return membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=HEARTBEAT, **kw)


def test_a_single_member_checks_its_arrays_and_arguments():
    with single() as m:
        w = np.arange(4, dtype=np.float32)
        m.add_state(w)
        with pytest.raises(cadence.ArrayTypeError, match="writable, C-contiguous"):
            m.add_state(np.arange(8, dtype=np.float64)[::2])
        with pytest.raises(cadence.ArrayTypeError):
            m.add_state([1.0, 2.0])
        with pytest.raises(cadence.InvalidParameterError, match="float32, float64"):
            m.add_state(np.zeros(2, dtype=np.complex64))
        with pytest.raises(cadence.InvalidParameterError, match="must be float32"):
            membership.DiLoCo(m, [np.zeros(3)])
        with pytest.raises(cadence.ParseError, match="unknown schedule 'sometimes'"):
            membership.DiLoCo(m, [np.zeros(3, dtype=np.float32)], "sometimes")
        m.start()
        assert m.quorum["ranks"] == [0] and m.view_rank == 0
        with pytest.raises(cadence.InvalidParameterError, match="before the member's start"):
            membership.DiLoCo(m, [np.zeros(3, dtype=np.float32)])
        with pytest.raises(cadence.InvalidParameterError, match="before start"):
            m.add_state(np.zeros(2))
        r = m.transact(lambda: m.allreduce_average(w), backup=[w])
        assert r["outcome"] == "committed" and np.array_equal(w, np.arange(4, dtype=np.float32))
        with pytest.raises(cadence.InvalidParameterError, match="policy 'maybe'"):
            m.transact(lambda: None, policy="maybe")
        assert m.finish()["outcome"] == "committed"
        assert m.committed == 2
    with pytest.raises(cadence.InvalidParameterError, match="closed"):
        _ = m.committed


def test_an_exception_in_the_body_propagates_and_ends_the_members_part():
    class Boom(Exception):
        pass

    def body():
        raise Boom("from the body")

    with single() as m:
        m.start()
        with pytest.raises(Boom, match="from the body"):
            m.transact(body)
        # The others saw this member leave the sync: it must not go on.
        with pytest.raises(cadence.TransportError, match="body threw on this member"):
            m.transact(lambda: None)
    with single() as m:
        w = np.zeros(3)
        m.start()
        with pytest.raises(cadence.InvalidParameterError, match="unknown reduce op 'prod'"):
            m.transact(lambda: m.allreduce(w, "prod"))


def test_diloco_alone_then_closed():
    w = np.full(4, 2.0, dtype=np.float32)
    m = single()
    outer = membership.DiLoCo(m, [w], "fixed:2,outer=sgd:1")
    outer.start()
    for _ in range(4):
        w += 1
        if outer.step_done(0.001):
            assert outer.sync()["outcome"] == "committed"
    # Alone, outer SGD at lr 1 takes the local weights as they are.
    assert outer.outer_steps == 2 and np.array_equal(w, np.full(4, 6.0, dtype=np.float32))
    outer.finish()
    m.close()
    with pytest.raises(cadence.InvalidParameterError, match="the member is closed"):
        outer.sync()


def _restart_rank(rank, size, path, steps, kill_at, join, hold, results, *, ckpt, save_at=None, first_only=False):
    """One rank of DiLoCo with Nesterov (its momentum carries over outer steps) whose inner step
    adds rank+1. save_at: after that many outer steps, state_dict() to ckpt/rank<r>.npz and go on
    to `steps` (the job that never stops); else load_state_dict() it before start() (on rank 0
    only with first_only: start() broadcasts the first member's) and run to `steps`."""
    try:
        m = membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                              connect_timeout=60.0)
        w = initial(rank).astype(np.float32)
        outer = membership.DiLoCo(m, [w], "fixed:2,outer=nesterov:0.7:0.9")
        file = os.path.join(ckpt, f"rank{rank}.npz")
        if save_at is None and (rank == 0 or not first_only):
            with np.load(file) as z:
                outer.load_state_dict({k: z[k] for k in z.files})
            assert np.array_equal(w, np.load(file)["global_weights"])  # the global weights, now
        outer.start()
        while outer.outer_steps < steps:
            w += rank + 1
            if outer.step_done(0.001):
                assert outer.sync()["outcome"] == "committed"
                if outer.outer_steps == save_at:
                    np.savez(file, **outer.state_dict())
        outer.finish()
        sd = outer.state_dict()
        results.put((rank, "ok", dict(hash=outer.global_hash, w=w.copy(), state=sd["outer_state"], syncs=sd["syncs"],
                                      clock=sd["clock"], outer_steps=outer.outer_steps)))
        m.close()
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, "error", traceback.format_exc()))


def test_diloco_restored_from_state_dict_goes_on_as_if_it_had_not_stopped(tmp_path):
    import functools

    ckpt = str(tmp_path)
    for job in ("a", "bFalse", "bTrue"):
        (tmp_path / job).mkdir()
    through = run_job(tmp_path / "a", 2, steps=5, target=functools.partial(_restart_rank, ckpt=ckpt, save_at=2))
    saved = np.load(os.path.join(ckpt, "rank0.npz"))
    assert sorted(saved.files) == sorted(["global_weights", "outer_state", "fragment_outer_steps", "syncs",
                                          "fragment_steps", "stale_contributions", "max_staleness", "clock"])
    assert int(saved["clock"]) == 4 and saved["outer_state"].any()  # 2 outer steps of 2 inner steps: momentum
    for first_only in (False, True):
        again = run_job(tmp_path / f"b{first_only}", 2, steps=5,
                        target=functools.partial(_restart_rank, ckpt=ckpt, first_only=first_only))
        for r in range(2):
            # Bit for bit: the same ranks reduce in the same order.
            assert again[r]["hash"] == through[r]["hash"]
            assert np.array_equal(again[r]["w"], through[r]["w"])
            assert np.array_equal(again[r]["state"], through[r]["state"])
            assert again[r]["syncs"] == through[r]["syncs"]
            assert (again[r]["outer_steps"], again[r]["clock"]) == (through[r]["outer_steps"], through[r]["clock"]) \
                == (5, 10)


def test_diloco_state_dict_refusals_are_named():
    w = np.zeros(4, dtype=np.float32)
    m = single()
    outer = membership.DiLoCo(m, [w], "fixed:2,outer=adam:0.01")
    with pytest.raises(cadence.InvalidParameterError, match="built by start"):
        outer.state_dict()
    good = {"global_weights": np.ones(4, dtype=np.float32), "outer_state": np.zeros(8, dtype=np.float32),
            "fragment_outer_steps": np.zeros(1, dtype=np.uint64), "syncs": 3, "fragment_steps": 3,
            "stale_contributions": 0, "max_staleness": 0, "clock": 6}
    with pytest.raises(cadence.InvalidParameterError, match="has no clock"):
        outer.load_state_dict({k: v for k, v in good.items() if k != "clock"})
    with pytest.raises(cadence.InvalidParameterError, match="has 5 global weights; this member's tensors hold 4"):
        outer.load_state_dict(dict(good, global_weights=np.ones(5, dtype=np.float32)))
    with pytest.raises(cadence.InvalidParameterError, match="1 state slots of 4.*this outer optimizer has 2"):
        outer.load_state_dict(dict(good, outer_state=np.zeros(4, dtype=np.float32)))
    outer.load_state_dict(good)
    assert np.array_equal(w, np.ones(4, dtype=np.float32))
    outer.start()
    sd = outer.state_dict()
    assert sd["syncs"] == 3 and sd["clock"] == 6 and np.array_equal(sd["global_weights"], np.ones(4))
    with pytest.raises(cadence.InvalidParameterError, match="before start"):
        outer.load_state_dict(good)
    outer.finish()
    m.close()
