"""An agreed stop for DiLoCo on the membership layer: one process asks (request_stop), the next
outer sync carries the request, and every process sees it (stop_agreed / should_stop) after that
same sync, so all call finish() together. cadence.membership.DiLoCo on one member (with and
without streaming); cadence.torch.FaultTolerantDiLoCo in a replica of two processes (gloo), the
request made by the rank that holds no member; and the example's --demo, where one of two
processes receives SIGTERM and both stop after the same outer step. Every wait is bounded."""

import json
import pathlib
import subprocess
import sys

import pytest

from _torch_spawn import need_gloo, run, values

torch = need_gloo()
try:
    import cadence.membership as membership
except ImportError as e:  # built without libzmq (tests/python/test_membership.py says when that is wrong)
    pytest.skip(f"cadence.membership is not built ({e})", allow_module_level=True)

import numpy as np

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "fault_tolerant_diloco.py"


def single():
    return membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=2.0)


@pytest.mark.parametrize("config", ["fixed:2,outer=sgd:1", "fixed:4,fragments=2,delay=1,outer=sgd:1"],
                         ids=["delay 0", "streaming"])
def test_a_request_is_agreed_by_the_next_sync_that_carries_it(config):
    w = np.zeros(16, dtype=np.float32)
    with single() as m:
        outer = membership.DiLoCo(m, [w], config)
        outer.request_stop()  # before start: the first outer sync carries it
        assert outer.stop_requested
        outer.start()
        assert not outer.stop_agreed  # the weights' broadcast carries nothing
        steps = 0
        while not outer.stop_agreed:
            assert steps < 50, "no stop agreed"
            w += 1
            steps += 1
            if outer.step_done(0.001):
                outer.sync()
        # delay 0: the sync at step 2; streaming: fragment 0 sent at step 2 lands at step 3.
        assert steps == (2 if "delay" not in config else 3)
        outer.finish()
        assert outer.stop_agreed


def _replica(rank, n):
    """One replica of two processes: rank 0 holds a one-member job, rank 1 (no member) asks
    after its 5th inner step; the request reaches rank 0 at the next step's all-reduce and the
    sync at step 6 (fixed:2) carries it."""
    import torch.distributed as dist

    import cadence.torch as ct

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    member = single() if rank == 0 else None
    outer = ct.FaultTolerantDiLoCo(model, member, opt, "fixed:2,outer=sgd:1", replica_group=dist.group.WORLD)
    outer.start()
    seen = []
    while not outer.should_stop:
        if outer.inner_steps >= 40:
            raise AssertionError("no stop agreed after 40 inner steps")
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        outer.step(seconds=0.001)
        seen.append(outer.should_stop)
        if rank == 1 and outer.inner_steps == 5:
            outer.request_stop()
    outer.finish()
    out = dict(inner=outer.inner_steps, outer=outer.outer_steps, seen=seen,
               weights=torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist())
    if member is not None:
        member.close()
    return out


def test_a_replicas_rank_without_the_member_asks_and_both_ranks_stop_after_the_same_sync():
    a, b = values(run(_replica, 2, timeout=60.0))
    assert a["inner"] == b["inner"] == 6 and a["outer"] == b["outer"] == 3
    assert a["seen"] == b["seen"] == [False] * 5 + [True]
    assert a["weights"] == b["weights"]


def test_the_example_stops_every_process_after_the_same_outer_step_on_one_sigterm():
    out = subprocess.run([sys.executable, str(EXAMPLE), "--demo", "--bound", "60", "--heartbeat", "3",
                          "--size", "2", "--steps", "1000", "--term", "1", "--term-after", "2"],
                         capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["same_weights"] and s["same_state_hash"] and s["same_global_hash"]
    assert s["terminated"] == 1 and s["outcomes"] == ["committed"]
    steps = set(s["outer_steps"].values())
    assert len(steps) == 1 and 3 <= steps.pop() < 1000  # after the SIGTERM, long before --steps
    assert len(set(s["inner_steps"].values())) == 1
