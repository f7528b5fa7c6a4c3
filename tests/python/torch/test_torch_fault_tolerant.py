"""cadence.torch.FaultTolerantAverager: a torch job whose processes average their model over
cadence.membership survives a process killed with SIGKILL (rank 0 included) and takes back a
replacement, which receives the weights and the optimizer's momentum; every process ends with
the same weights; with replicas of several processes (DDP inside, each replica a torchrun job),
a replica restarted by torchrun rejoins, replica 0 too when rank 0 only holds the rendezvous
(--holder). Runs examples/python/fault_tolerant_averaging.py --demo (real processes on
loopback, a job secret, every wait bounded) and checks the JSON it prints."""

import json
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
cadence = pytest.importorskip("cadence")
try:
    import cadence.membership  # noqa: F401
except ImportError as e:  # built without libzmq (tests/python/test_membership.py says when that is wrong)
    pytest.skip(f"cadence.membership is not built ({e})", allow_module_level=True)

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "fault_tolerant_averaging.py"


def demo(*args):
    # A 3 s heartbeat: a loaded machine must not make a live process look lost.
    out = subprocess.run([sys.executable, str(EXAMPLE), "--demo", "--bound", "200", "--heartbeat", "3", *args],
                         capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_killed_process_is_replaced_and_every_process_ends_with_the_same_weights():
    s = demo("--size", "3", "--kill", "1", "--steps", "6")
    assert s["same_weights"] and s["same_state_hash"]
    assert s["members"] == [0, 1, 2] and s["replaced"]
    assert s["loss_seen_by"] == [0, 2]
    assert s["replacement_state_bytes"] > 0
    assert s["replacement_has_momentum"]  # the optimizer's state came with the weights
    assert len(set(s["syncs"].values())) == 1


def test_the_job_outlives_rank_0():
    s = demo("--size", "3", "--kill", "0", "--steps", "6")
    assert s["same_weights"] and s["same_state_hash"]
    assert s["members"] == [1, 2] and not s["replaced"]
    assert s["loss_seen_by"] == [1, 2]


def test_replicas_run_ddp_inside_and_a_replica_restarted_by_torchrun_rejoins():
    # Two replicas, each a torchrun job of 2 processes with DDP inside; a process of replica 1
    # killed: its torchrun restarts the replica, whose first rank rejoins and hands the weights
    # and the momentum to the other; replica 0 goes on throughout.
    s = demo("--size", "2", "--kill", "1", "--replica-ranks", "2", "--steps", "6")
    assert s["same_weights"] and s["same_state_hash"]  # across the replicas and inside each
    assert s["members"] == [0, 1] and s["replaced"]
    assert s["loss_seen_by"] == [0]
    assert s["replacement_state_bytes"] > 0 and s["replacement_has_momentum"]


def test_with_a_holder_replica_0_restarted_by_torchrun_rejoins():
    # Rank 0 only holds the rendezvous (--holder) and the replicas are ranks 1..3, each a
    # torchrun job of 2 processes; a process of replica 0 (rank 1, the quorum's first member, its
    # leader) killed: its torchrun restarts the replica, which registers in its slot again and
    # rejoins. Three replicas: a quorum of two does not go on without its leader (only half of
    # it is left, without the leader).
    s = demo("--size", "3", "--kill", "0", "--replica-ranks", "2", "--holder", "--steps", "6")
    assert s["holder"] and s["replaced"]
    assert s["same_weights"] and s["same_state_hash"]  # across the replicas and inside each
    assert s["members"] == [1, 2, 3]
    assert s["loss_seen_by"] == [2, 3]
    assert s["replacement_state_bytes"] > 0 and s["replacement_has_momentum"]
    assert len(set(s["syncs"].values())) == 1


def test_arguments_are_checked():
    import cadence.torch as ct

    class Member:  # never reached: the checks come first
        pass

    model = torch.nn.Linear(2, 1)
    with pytest.raises(ct.InvalidParameterError, match="period must be an integer >= 1"):
        ct.FaultTolerantAverager(model, Member(), period=0)
    with pytest.raises(ct.InvalidParameterError, match="policy 'later'"):
        ct.FaultTolerantAverager(model, Member(), policy="later")
    with pytest.raises(ct.InvalidParameterError, match="float32 or float64"):
        ct.FaultTolerantAverager(model.to(torch.float16), Member())
    with pytest.raises(ct.InvalidParameterError, match="needs a member"):
        ct.FaultTolerantAverager(torch.nn.Linear(2, 1), None)
