"""cadence.torch.FaultTolerantDiLoCo: a torch DiLoCo job over cadence.membership (3 processes,
a small MLP, the fixed schedule) ends with the same parameters on every process after the
expected outer steps; survives a process killed with SIGKILL mid-run (rank 0, which holds the
rendezvous, or a replica replaced by a new process that receives the global weights, the outer
state and the inner optimizer's momentum). Runs examples/python/fault_tolerant_diloco.py --demo
(real processes on loopback, a job secret; the victim kills itself at a known outer step, every
other wait is for a JSON line or an exit, bounded) and checks the JSON it prints."""

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

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "fault_tolerant_diloco.py"


def demo(*args):
    # A 3 s heartbeat: a loaded machine must not make a live process look lost.
    out = subprocess.run([sys.executable, str(EXAMPLE), "--demo", "--bound", "100", "--heartbeat", "3",
                          "--size", "3", "--steps", "6", "--period", "4", *args],
                         capture_output=True, text=True, timeout=150, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_without_a_fault_every_process_takes_the_same_outer_steps_and_ends_with_the_same_parameters():
    s = demo()
    assert s["same_weights"] and s["same_state_hash"] and s["same_global_hash"]
    assert s["members"] == [0, 1, 2] and s["outcomes"] == ["committed"]
    assert s["outer_steps"] == {"0": 6, "1": 6, "2": 6}
    assert s["inner_steps"] == {"0": 24, "1": 24, "2": 24}  # fixed:4, 6 outer steps


def test_the_others_go_on_without_a_killed_process_rank_0_included():
    s = demo("--kill", "0", "--kill-after", "2")
    assert s["same_weights"] and s["same_state_hash"] and s["same_global_hash"]
    assert s["members"] == [1, 2] and not s["replaced"]
    assert s["loss_seen_by"] == [1, 2]
    assert s["outer_steps"] == {"1": 6, "2": 6}


def test_a_replacement_joins_with_the_global_weights_and_ends_equal():
    s = demo("--kill", "1", "--kill-after", "2")
    assert s["same_weights"] and s["same_state_hash"] and s["same_global_hash"]
    assert s["members"] == [0, 1, 2] and s["replaced"]
    assert s["loss_seen_by"] == [0, 2]
    assert s["replacement_state_bytes"] > 0
    assert s["replacement_has_momentum"]  # the inner optimizer's state came with the weights
    assert len(set(s["outer_steps"].values())) == 1 and s["outer_steps"]["1"] >= 6
    assert s["inner_steps"]["1"] == 8  # it trained 2 outer steps with the others before all left


def test_arguments_and_the_order_of_calls_are_checked():
    import cadence.membership as membership
    import cadence.torch as ct

    class Member:  # never reached: the checks come first
        pass

    with pytest.raises(ct.InvalidParameterError, match="no floating-point parameters"):
        ct.FaultTolerantDiLoCo(torch.nn.Module(), Member())
    with pytest.raises(ct.InvalidParameterError, match="needs a member"):
        ct.FaultTolerantDiLoCo(torch.nn.Linear(2, 1), None)
    with pytest.raises(ct.InvalidParameterError, match="config must be a local-SGD config string"):
        ct.FaultTolerantDiLoCo(torch.nn.Linear(2, 1), Member(), config=20)
    complex_model = torch.nn.Linear(2, 1)
    complex_model.z = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ct.InvalidParameterError, match="parameter 'z' is torch.complex64"):
        ct.FaultTolerantDiLoCo(complex_model, Member())
    wide = torch.nn.Linear(2, 1).double()
    with torch.no_grad():
        wide.bias.fill_(1e300)
    with pytest.raises(ct.InvalidParameterError, match="parameter 'bias' .*beyond float32's range"):
        ct.FaultTolerantDiLoCo(wide, Member())

    m = membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=3.0)
    try:
        with pytest.raises(cadence.ParseError, match="unknown schedule 'sometimes'"):
            ct.FaultTolerantDiLoCo(torch.nn.Linear(2, 1), m, config="sometimes")
        # Any float dtype on any device: one float32 staging array; float64 and bfloat16 here.
        model = torch.nn.Sequential(torch.nn.Linear(3, 2).double(), torch.nn.Linear(2, 1).to(torch.bfloat16))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outer = ct.FaultTolerantDiLoCo(model, m, opt, "fixed:2,outer=sgd:1")
        with pytest.raises(ct.InvalidParameterError, match=r"step: called before start\(\) or join\(\)"):
            outer.step()
        with pytest.raises(ct.InvalidParameterError, match="outer_steps: known after start"):
            _ = outer.outer_steps
        outer.start()
        with pytest.raises(ct.InvalidParameterError, match=r"join: called after start\(\) or join\(\)"):
            outer.join()
        with pytest.raises(ct.InvalidParameterError, match="seconds must be > 0"):
            outer.step(seconds=-1.0)
        reports = []
        for _ in range(4):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            reports.append(outer.step())
        # Alone, outer SGD at lr 1 takes the local weights as they are: 2 outer steps.
        assert [r is not None for r in reports] == [False, True, False, True]
        assert outer.outer_steps == 2 and outer.inner_steps == 4 and outer.quorum["ranks"] == [0]
        assert all(p.dtype in (torch.float64, torch.bfloat16) for p in model.parameters())
        before = [p.detach().clone() for p in model.parameters()]
        assert outer.finish()["outcome"] == "committed"
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        with pytest.raises(ct.InvalidParameterError, match=r"step: called after finish\(\)"):
            outer.step()
        assert isinstance(outer.global_hash, int) and outer.syncs == m.committed
    finally:
        m.close()


def test_a_job_restored_from_state_dict_goes_on_as_if_it_had_not_stopped():
    """One member (the multi-process restore is tests/python/test_membership.py's): 4 outer
    steps, state_dict() through torch.save, 3 more; a new job (new member, module, optimizer,
    other initial weights) loads it and runs the 3: the same parameters, inner momentum, outer
    state and counters, bit for bit (Nesterov outer, SGD with momentum inner, inputs by step)."""
    import io

    import cadence.membership as membership
    import cadence.torch as ct

    def job(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        m = membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=3.0)
        return model, opt, m, ct.FaultTolerantDiLoCo(model, m, opt, "fixed:3,outer=nesterov:0.7:0.9")

    def train(model, opt, outer, until):
        saved = None
        while outer.outer_steps < until:
            g = torch.Generator().manual_seed(outer.inner_steps)  # the inputs of this inner step
            x = torch.randn(8, 3, generator=g)
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            opt.step()
            opt.zero_grad()
            if outer.step(seconds=0.001) is not None and outer.outer_steps == 4:
                buf = io.BytesIO()
                torch.save(outer.state_dict(), buf)
                saved = buf.getvalue()
        return saved

    model, opt, m, outer = job(0)
    try:
        outer.start()
        saved = train(model, opt, outer, 7)
        outer.finish()
        through = (outer.state_dict(), [p.detach().clone() for p in model.parameters()])
    finally:
        m.close()
    assert saved is not None

    model, opt, m, outer = job(1)
    try:
        state = torch.load(io.BytesIO(saved), weights_only=False)
        assert state["diloco"]["outer_state"].any() and state["inner_steps"] == 12
        with pytest.raises(ct.InvalidParameterError, match="has no 'diloco'"):
            outer.load_state_dict({k: v for k, v in state.items() if k != "diloco"})
        outer.load_state_dict(state)
        outer.start()
        assert outer.outer_steps == 4 and outer.inner_steps == 12
        with pytest.raises(ct.InvalidParameterError, match=r"load_state_dict: called after start\(\) or join\(\)"):
            outer.load_state_dict(state)
        train(model, opt, outer, 7)
        outer.finish()
        again = outer.state_dict()
    finally:
        m.close()
    assert all(torch.equal(a, b) for a, b in zip(through[1], model.parameters()))
    for key in ("global_weights", "outer_state", "fragment_outer_steps"):
        assert (again["diloco"][key] == through[0]["diloco"][key]).all(), key
    assert again["diloco"]["clock"] == through[0]["diloco"]["clock"] == 21 and again["inner_steps"] == 21
    mom = [again["inner_optimizer"]["state"][i]["momentum_buffer"] for i in range(4)]
    assert all(torch.equal(a, through[0]["inner_optimizer"]["state"][i]["momentum_buffer"]) for i, a in enumerate(mom))
