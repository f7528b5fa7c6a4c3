"""cadence.torch.FaultTolerantAverager(rejoin=1) and FaultTolerantDiLoCo(rejoin=1): a process the
quorum dropped while it was alive (a late resume from SIGSTOP) comes back in-process at its next
sync, with a donor's weights, step count (the DiLoCo's global weights, outer state and counters)
and optimizer state, and every process ends with the same weights. Three spawned
processes on loopback (insecure=True, a 0.5 s heartbeat); the process stops itself, and the
test resumes it once the others committed a sync without it: every wait is bounded, none timed.
"""

import os
import signal
import time
import traceback

import pytest
from binding_support import run_with_late_resume

torch = pytest.importorskip("torch")
cadence = pytest.importorskip("cadence")
try:
    import cadence.membership as membership
except ImportError as e:  # built without libzmq (tests/python/test_membership.py says when that is wrong)
    pytest.skip(f"cadence.membership is not built ({e})", allow_module_level=True)

BOUND = 60.0     # seconds: upper bound on any wait (catches a hang)
HEARTBEAT = 0.5  # seconds: op timeout 2 s (room for a loaded CI machine)
HELD_BACK_AT = 2  # process 2 stops itself before the step whose sync follows this many


def _model_and_data(rank):
    """A process's model (seeded alike everywhere), SGD with momentum, and its own data."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt, torch.full((8, 4), float(rank + 1)), torch.zeros(8, 1)


def _member(rank, size, path):
    return membership.Member(rank, size, rendezvous_file=path, insecure=True, heartbeat=HEARTBEAT,
                             join_timeout=BOUND, connect_timeout=BOUND)


def _process(rank, size, path, ready, went_on, abort, results):
    """One process: SGD with momentum on its own data, averaged every step. Process 2 stops
    itself before a sync; once back (rejoined), it asks the job to stop at its next sync."""
    try:
        import cadence.torch as ct

        until = time.monotonic() + BOUND
        model, opt, x, y = _model_and_data(rank)
        ready.wait(BOUND)  # imports done: the three register and start together
        with _member(rank, size, path) as m:
            avg = ct.FaultTolerantAverager(model, m, period=1, optimizer=opt, rejoin=1)
            avg.start()
            outcomes = []
            while not avg.stopping:
                if rank == 2 and avg.rejoins == 0 and avg.syncs == HELD_BACK_AT:
                    os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes it (SIGCONT)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                stop = abort.is_set() or time.monotonic() > until or (rank == 2 and avg.rejoins == 1)
                r = avg.step(stop=stop)
                outcomes.append(r)
                if rank == 0 and m.quorum["ranks"] == [0, 1]:
                    went_on.set()
            avg.finish()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
            results.put((rank, "ok", dict(weights=flat, hash=m.state_hash, quorum=m.quorum["ranks"],
                                          rejoins=avg.rejoins, outcomes=outcomes, local_steps=avg.local_steps,
                                          momentum="momentum_buffer" in opt.state[model.weight])))
    except BaseException:  # noqa: BLE001 - reported to the parent
        abort.set()
        results.put((rank, "error", traceback.format_exc()))


def test_a_dropped_process_rejoins_and_ends_with_the_same_weights(tmp_path):
    size = 3
    out, ev = run_with_late_resume(_process, size, str(tmp_path / "rendezvous"), ("went_on", "abort"), BOUND)
    abort = ev["abort"]
    assert not abort.is_set()
    rejoined = [r for r in out[2]["outcomes"] if r["outcome"] == "rejoined"]
    assert len(rejoined) == 1 and rejoined[0]["rejoin_attempts"] == 1, out[2]["outcomes"]
    assert out[2]["rejoins"] == 1 and out[0]["rejoins"] == out[1]["rejoins"] == 0
    for r in range(size):
        assert out[r]["quorum"] == [0, 1, 2]
        assert out[r]["weights"] == out[0]["weights"] and out[r]["hash"] == out[0]["hash"]
        assert out[r]["local_steps"] == out[0]["local_steps"]  # the donor's count came with the state
        assert out[r]["momentum"]


def _diloco_process(rank, size, path, ready, went_on, abort, results):
    """One process: DiLoCo (2 inner SGD steps with momentum an outer step, outer Nesterov) on its
    own data. Process 2 stops itself once HELD_BACK_AT outer syncs committed; back (rejoined at
    its next outer sync), it asks the job to stop."""
    try:
        import cadence.torch as ct

        until = time.monotonic() + BOUND
        model, opt, x, y = _model_and_data(rank)
        ready.wait(BOUND)  # imports done: the three register and start together
        with _member(rank, size, path) as m:
            outer = ct.FaultTolerantDiLoCo(model, m, opt, "fixed:2,outer=nesterov:0.7:0.9", rejoin=1)
            outer.start()
            outcomes, held = [], False
            while not outer.should_stop:
                if rank == 2 and not held and outer.syncs >= HELD_BACK_AT:
                    held = True
                    os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes it (SIGCONT)
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if abort.is_set() or time.monotonic() > until:
                    outer.request_stop()
                r = outer.step(0.001)
                if r is None:
                    continue
                outcomes.append(r)
                if r["outcome"] == "rejoined":
                    outer.request_stop()  # the next outer sync ends the job
                if rank == 0 and outer.quorum["ranks"] == [0, 1]:
                    went_on.set()
            synced = dict(global_hash=outer.global_hash, hash=m.state_hash, outer_steps=outer.outer_steps)
            outer.finish()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
            results.put((rank, "ok", dict(weights=flat, synced=synced, quorum=outer.quorum["ranks"],
                                          rejoins=outer.rejoins, outcomes=outcomes,
                                          momentum="momentum_buffer" in opt.state[model.weight])))
    except BaseException:  # noqa: BLE001 - reported to the parent
        abort.set()
        results.put((rank, "error", traceback.format_exc()))


def test_a_dropped_diloco_process_rejoins_with_the_global_weights(tmp_path):
    size = 3
    out, ev = run_with_late_resume(_diloco_process, size, str(tmp_path / "rendezvous"), ("went_on", "abort"), BOUND)
    assert not ev["abort"].is_set()
    rejoined = [r for r in out[2]["outcomes"] if r["outcome"] == "rejoined"]
    assert len(rejoined) == 1 and rejoined[0]["rejoin_attempts"] == 1, out[2]["outcomes"]
    assert out[2]["rejoins"] == 1 and out[0]["rejoins"] == out[1]["rejoins"] == 0
    for r in range(size):
        assert out[r]["quorum"] == [0, 1, 2]
        assert out[r]["synced"] == out[0]["synced"]  # after the sync that agreed the stop
        assert out[r]["synced"]["outer_steps"] > HELD_BACK_AT + 1
        assert out[r]["weights"] == out[0]["weights"]
        assert out[r]["momentum"]  # process 2's came from a donor


def test_rejoin_arguments_are_checked():
    import cadence.torch as ct

    class Member:  # never reached: the checks come first
        pass

    model = torch.nn.Linear(2, 1)
    with pytest.raises(ct.InvalidParameterError, match="rejoin must be an integer >= 0"):
        ct.FaultTolerantAverager(model, Member(), rejoin=-1)
    with pytest.raises(ct.InvalidParameterError, match="rejoin > 0 with a replica_group"):
        ct.FaultTolerantAverager(model, Member(), rejoin=1, replica_group=object())
    with pytest.raises(ct.InvalidParameterError, match="FaultTolerantDiLoCo: rejoin must be an integer >= 0"):
        ct.FaultTolerantDiLoCo(model, Member(), rejoin=True)
    with pytest.raises(ct.InvalidParameterError, match="FaultTolerantDiLoCo: rejoin > 0 with a replica_group"):
        ct.FaultTolerantDiLoCo(model, Member(), rejoin=2, replica_group=object())
