"""cadence.torch.FaultTolerantDiLoCo with streaming (``fixed:4,fragments=2,delay=1``: each
fragment's exchange runs as a transaction on a C++ thread over the next inner step). Two members
in threads of this process train a toy regression and end with the same global hash and module
weights, unlike the delay-0 run (the exchanges really overlap) and with a loss far below the
start; a process killed (SIGKILL) with a fragment in flight, through the example's --demo, leaves
the others going on and ending equal (a replacement too); while a fragment is in flight
state_dict() and global_hash raise, naming why and when to call them, and the other readings
hold; a replica of two processes holds the first rank's weights after every sync, send points
included. Every wait is bounded."""

import tempfile
import threading

import pytest

from _torch_spawn import need_gloo, run, values
from test_torch_fault_tolerant_diloco import demo

torch = need_gloo()
try:
    import cadence.membership as membership
except ImportError as e:  # built without libzmq (tests/python/test_membership.py says when that is wrong)
    pytest.skip(f"cadence.membership is not built ({e})", allow_module_level=True)

import cadence.torch as ct

STREAMING = "fixed:4,fragments=2,delay=1,outer=nesterov:0.7:0.5"
TARGET = torch.linspace(-1, 1, 8)


def single():
    return membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=3.0)


_SEEDED = threading.Lock()  # the members are threads: torch's global generator is shared


def toy(seed=0):
    with _SEEDED:  # seed and draw together, or another thread's draw moves the first member's weights
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def inner_step(model, opt, g):
    x = torch.randn(32, 8, generator=g)
    torch.nn.functional.mse_loss(model(x), (x @ TARGET).unsqueeze(1)).backward()
    opt.step()
    opt.zero_grad()


def eval_loss(model):
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), (x @ TARGET).unsqueeze(1)))


def _member_thread(rank, path, config, inner_steps, out):
    try:
        model, opt = toy()  # every member starts from the first member's weights anyway
        m = membership.Member(rank, 2, rendezvous_file=path, insecure=True, heartbeat=3.0, connect_timeout=30.0)
        try:
            outer = ct.FaultTolerantDiLoCo(model, m, opt, config)
            outer.start()
            first_loss = eval_loss(model)
            g = torch.Generator().manual_seed(10 + rank)  # each member its own data
            trace = []
            while outer.inner_steps < inner_steps:
                inner_step(model, opt, g)
                report = outer.step(seconds=0.001)
                trace.append(None if report is None else (report["attempts"], outer.in_flight, outer.outer_steps,
                                                          outer.syncs))
            outer.finish()
            out[rank] = dict(trace=trace, hash=outer.global_hash, syncs=outer.syncs, outer_steps=outer.outer_steps,
                             weights=torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                             first_loss=first_loss, last_loss=eval_loss(model), in_flight=outer.in_flight)
        finally:
            m.close()
    except BaseException as e:  # noqa: BLE001 - reported by the test
        out[rank] = e


def two_members(config, inner_steps=40):
    out = [None, None]
    with tempfile.TemporaryDirectory() as tmp:
        threads = [threading.Thread(target=_member_thread, args=(r, f"{tmp}/rendezvous", config, inner_steps, out),
                                    daemon=True) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60.0)  # only catches a hang
        assert not any(t.is_alive() for t in threads), f"a member still runs after 60 s: {out}"
    for r, o in enumerate(out):
        if isinstance(o, BaseException):
            raise AssertionError(f"member {r} raised") from o
    return out


def test_two_streaming_members_end_equal_and_unlike_the_delay_0_run():
    a, b = two_members(STREAMING)
    assert a["hash"] == b["hash"] and torch.equal(a["weights"], b["weights"])
    assert a["outer_steps"] == b["outer_steps"] == 10 and a["syncs"] == b["syncs"] and not a["in_flight"]
    # Send points (steps 2, 4, ..., 40: attempts 0, in flight) and completion points a step
    # later (the exchange's report, nothing in flight: fragment 1's at step 5 completes outer
    # step 1); finish() completes the fragment sent at step 40.
    sent = [t for t in a["trace"] if t is not None and t[0] == 0]
    landed = [t for t in a["trace"] if t is not None and t[0] > 0]
    assert len(sent) == 20 and len(landed) == 19 and all(t[1] for t in sent) and not any(t[1] for t in landed)
    assert a["trace"][1][0] == 0 and a["trace"][2][0] == 1 and a["trace"][4][2] == 1
    assert [t[3] for t in sent] == [1] + [t[3] for t in landed]  # syncs: as the last completion left them
    assert a["last_loss"] < a["first_loss"] / 10  # it learns
    c, d = two_members("fixed:4,fragments=2,outer=nesterov:0.7:0.5")  # the same without the overlap
    assert c["hash"] == d["hash"] and torch.equal(c["weights"], d["weights"]) and c["outer_steps"] == 10
    assert not torch.allclose(a["weights"], c["weights"], atol=1e-6) and a["hash"] != c["hash"]
    assert c["last_loss"] < c["first_loss"] / 10


def test_in_flight_state_dict_and_global_hash_say_why_and_when():
    model, opt = toy()
    with single() as m:
        outer = ct.FaultTolerantDiLoCo(model, m, opt, STREAMING)
        outer.start()
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            inner_step(model, opt, g)
            report = outer.step(seconds=0.001)
        assert report["attempts"] == 0 and report["committed"] == outer.syncs == 1 and outer.in_flight
        with pytest.raises(ct.InvalidParameterError,
                           match=r"state_dict: a streaming fragment's exchange is in flight .*when in_flight is "
                                 r"False: after a step\(\) that completed a fragment and sent none, or after "
                                 r"finish\(\)"):
            outer.state_dict()
        with pytest.raises(ct.InvalidParameterError, match="global_hash: a streaming fragment's exchange is in flight"):
            _ = outer.global_hash
        assert outer.quorum["ranks"] == [0] and outer.outer_steps == 0 and not outer.should_stop
        inner_step(model, opt, g)
        report = outer.step(seconds=0.001)  # the completion point
        assert report["attempts"] == 1 and report["committed"] == outer.syncs == 2 and not outer.in_flight
        assert outer.state_dict()["diloco"]["fragment_steps"] == 1 and isinstance(outer.global_hash, int)
        inner_step(model, opt, g)
        assert outer.step(seconds=0.001)["attempts"] == 0 and outer.in_flight  # fragment 1 sent
        assert outer.finish()["outcome"] == "committed" and not outer.in_flight  # completes it first
        sd = outer.state_dict()
        assert sd["diloco"]["fragment_steps"] == 2 and outer.outer_steps == 1
        # The module holds the final global weights (every fragment's).
        assert torch.equal(torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                           torch.from_numpy(sd["diloco"]["global_weights"]))
    with single() as m:  # what the member's DiLoCo cannot carry, named by it
        with pytest.raises(ct.InvalidParameterError, match="delay=3 with fragments=2 and H = 4.*use delay <= 2"):
            ct.FaultTolerantDiLoCo(torch.nn.Linear(2, 1), m, config="fixed:4,fragments=2,delay=3")


def test_a_process_killed_with_a_fragment_in_flight_leaves_the_others_going_on_equal():
    s = demo("--fragments", "2", "--delay", "1", "--kill", "0", "--kill-after", "2")
    assert s["same_weights"] and s["same_state_hash"] and s["same_global_hash"]
    assert s["members"] == [1, 2] and not s["replaced"] and s["loss_seen_by"] == [1, 2]
    assert len(set(s["outer_steps"].values())) == 1 and s["outer_steps"]["1"] >= 5


def _replica(rank, n):
    """A replica of two processes (rank 0 holds a one-member streaming job): after every
    step(), both ranks hold the same weights and readings, at send and completion points."""
    import torch.distributed as dist

    model, opt = toy(seed=rank)  # different until start() hands rank 0's over
    member = single() if rank == 0 else None
    outer = ct.FaultTolerantDiLoCo(model, member, opt, STREAMING, replica_group=dist.group.WORLD)
    outer.start()
    g = torch.Generator().manual_seed(5)  # the same data on both ranks (as DDP would keep them)
    seen = []
    for _ in range(10):
        inner_step(model, opt, g)
        report = outer.step(seconds=0.001)
        if report is not None:
            seen.append((report["attempts"], outer.in_flight, outer.outer_steps, outer.syncs,
                         torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()))
    err = None
    try:
        outer.state_dict()
    except ct.InvalidParameterError as e:
        err = str(e)
    outer.finish()
    out = dict(seen=seen, err=err, hash=outer.global_hash,
               weights=torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist())
    if member is not None:
        member.close()
    return out


def test_a_replicas_ranks_hold_the_first_ranks_weights_after_every_sync():
    a, b = values(run(_replica, 2, timeout=60.0))
    assert a == b
    assert [s[:2] for s in a["seen"]] == [(0, True), (1, False)] * 4 + [(0, True)]  # steps 2..10
    assert "in flight" in a["err"]  # step 10 sent fragment 1
