# ElasticModelAverager and PeriodicModelAverager on 3 gloo processes: merges exact on known
# inputs, identical plans on every rank, warm-up, the PostLocalSGDOptimizer path, bad input, a
# plan disagreement and a stalled rank turned into errors. One spawn runs every scenario (process
# start-up dominates the cost); the tests below check its parts.
import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 3
R = 4


def _params(rank, value):
    # Two float32 tensors and one float64 tensor (two merge buckets), all holding known integers.
    return [torch.full((4,), float(value), dtype=torch.float32),
            torch.full((2, 3), float(value) * 2, dtype=torch.float32),
            torch.full((3,), float(value) * 3, dtype=torch.float64)]


def _scenarios(rank, n):
    import torch.distributed as dist
    from torch.distributed.optim import PostLocalSGDOptimizer

    import cadence
    import cadence.torch as ct

    out = {}

    # 1. ElasticBSP, merge average: rank r is (r + 1) times slower; values known before each sync.
    avg = ct.ElasticModelAverager(f"elastic:{R}", warmup_steps=3, timeout=20)
    rounds, merged_ok, steps_between = [], True, []
    params = _params(rank, 0)
    local = 0
    step = 0
    while True:  # ranks run different step counts; they stop together on sync(stop=...)
        step += 1
        local += 1
        due = avg.step_done(((rank + 1) * 1000 + (step % 3) * 37) / 1e6)
        if due:
            b = avg.barriers
            for t, base in zip(params, (1, 2, 3)):
                t.fill_(base * (10 * b + 3 * rank))  # mean over ranks: base * (10 b + 3)
            stop = avg.sync(params, stop=(rank == 1 and avg.barriers >= 11))
            for t, base in zip(params, (1, 2, 3)):
                merged_ok &= bool(torch.equal(t, torch.full_like(t, base * (10 * b + 3))))
            steps_between.append(local)
            local = 0
            r = avg.round
            rounds.append((avg.barriers, [int(s) for s in r.steps], int(r.hash)))
            if stop:
                break
    out["elastic"] = dict(rounds=rounds, merged_ok=merged_ok, steps_between=steps_between,
                          global_steps=avg.global_steps,
                          max_local_steps=avg.max_local_steps, config=avg.config)

    # 2. step_weighted: the weights are the local steps each rank ran since the last barrier.
    avg = ct.ElasticModelAverager(f"elastic:{R}", merge="step_weighted", timeout=20)
    records = []
    params = [torch.zeros(5)]
    while avg.barriers < 8:
        if avg.step_done(((rank + 1) * 1000) / 1e6):
            before = float(7 * rank + 1)
            params[0].fill_(before)
            steps = avg.local_steps
            avg.sync(params)
            records.append((steps, before, params[0].tolist()))
    out["step_weighted"] = records

    # 3. summed_deltas: x = a + sum of (x_r - a); the first barrier averages.
    avg = ct.ElasticModelAverager("elastic:2", merge="summed_deltas", timeout=20)
    p = [torch.zeros(3)]
    sd = []
    for k in range(3):
        while not avg.step_done(0.001):
            pass
        anchor = p[0].clone()
        p[0].copy_(anchor + (rank + 1) * (k + 1))  # delta (r + 1)(k + 1)
        if k == 0:
            p[0].fill_(float(3 * rank))  # first barrier: plain average, 3
        avg.sync(p)
        sd.append(p[0].tolist())
    out["summed_deltas"] = sd

    # 4. Periodic with torch's arguments (positional) and schedule, beside torch's own class as
    #    the oracle: both average the same values at the same steps.
    from torch.distributed.algorithms.model_averaging.averagers import \
        PeriodicModelAverager as TorchPeriodic
    per = ct.PeriodicModelAverager(3, 2, None, timeout=20)
    ref = TorchPeriodic(3, 2)
    ours, theirs = [], []
    q = [torch.zeros(2, dtype=torch.float64)]
    qt = [torch.nn.Parameter(torch.zeros(2, dtype=torch.float64), requires_grad=False)]
    qt[0].grad = torch.zeros(2, dtype=torch.float64)  # torch averages Parameters with a gradient
    for step in range(1, 12):
        q[0].fill_(float(rank * 4 + step))
        qt[0].fill_(float(rank * 4 + step))
        if per.average_parameters(q):
            ours.append((step, q[0].tolist()))
        ref.average_parameters(qt)
        if qt[0].tolist() != [float(rank * 4 + step)] * 2 or rank == 1:  # rank 1 holds the mean
            theirs.append((step, qt[0].tolist()))
    out["periodic"] = dict(ours=ours, theirs=theirs, step=per.step, ref_step=ref.step,
                           global_steps=per.global_steps, barriers=per.barriers)

    # 5. The post-local SGD optimizer: the averager is called after every optimizer step.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    eavg = ct.ElasticModelAverager(f"elastic:{R}", timeout=20)
    opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), eavg)  # stable on every rank
    at_barrier, losses = [], []
    x = torch.full((8, 4), float(rank + 1))
    steps = 0
    while eavg.barriers < 8:
        steps += 1
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        losses.append(loss.item())
        loss.backward()
        b = eavg.barriers
        opt.step()
        if eavg.barriers != b:
            at_barrier.append((eavg.barriers, model.weight.detach().clone().reshape(-1).tolist()))
    out["postlocal"] = dict(at_barrier=at_barrier, steps=steps, step=eavg.step, losses=losses,
                            state_step=opt.state_dict()["step"])

    # 6. Bad input (no communication happens before these errors).
    bad = {}
    a = ct.ElasticModelAverager(f"elastic:{R}")
    for name, fn in [
        ("negative", lambda: a.step_done(-1.0)),
        ("nan", lambda: a.step_done(float("nan"))),
        ("early_sync", lambda: a.sync([torch.zeros(1)])),
        ("merge", lambda: ct.ElasticModelAverager("elastic:4", merge="median")),
        ("config", lambda: ct.ElasticModelAverager("elastc:4")),
        ("period", lambda: ct.PeriodicModelAverager(0)),
        ("timeout", lambda: ct.PeriodicModelAverager(2, timeout=0)),
    ]:
        try:
            fn()
            bad[name] = None
        except Exception as e:  # noqa: BLE001
            bad[name] = (type(e).__name__, isinstance(e, ValueError), str(e))
    a.step_done(0.001)
    try:
        a.sync([torch.zeros(2, dtype=torch.int64)])
        bad["int_tensor"] = None
    except Exception as e:  # noqa: BLE001
        bad["int_tensor"] = (type(e).__name__, isinstance(e, ValueError), str(e))
    out["bad"] = bad

    # 7. Ranks with different configurations: the hash check fails on every rank.
    a = ct.ElasticModelAverager("elastic:5" if rank == 0 else "elastic:4", timeout=20)
    a.step_done(0.001)
    try:
        a.sync([torch.zeros(1)])
        out["mismatch"] = None
    except cadence.TransportError as e:
        out["mismatch"] = str(e)

    # 8. Last (it breaks the process group): rank 2 stalls; the others name it within the timeout.
    dist.barrier()
    a = ct.PeriodicModelAverager(1, timeout=1.5)
    a.step_done()
    out["stall"] = _spawn.stalled_sync(rank, n, lambda: a.sync([torch.zeros(1)]))
    return out


@pytest.fixture(scope="module")
def results():
    return _spawn.values(_spawn.run(_scenarios, N, timeout=90))


def test_elastic_average_is_exact(results):
    for r in results:
        assert r["elastic"]["merged_ok"]


def test_elastic_plans_identical_on_every_rank(results):
    rounds = results[0]["elastic"]["rounds"]
    assert len(rounds) >= 5
    for r in results[1:]:
        assert r["elastic"]["rounds"] == rounds
    assert len({h for _, _, h in rounds}) == len(rounds)  # each barrier's plan has its own hash


def test_elastic_warmup_then_planned_steps(results):
    rounds = results[0]["elastic"]["rounds"]
    # warm-up: BSP until every rank has recorded 3 durations (one per barrier), so the plans made
    # at barriers 1 and 2 are BSP and the one made at barrier 3 is not; then the slow rank runs
    # fewer local steps than the fast one
    assert rounds[0][1] == [1] * N and rounds[1][1] == [1] * N
    assert rounds[2][1] != [1] * N
    planned = [steps for _, steps, _ in rounds if steps != [1] * N]
    assert planned, rounds
    assert any(s[0] > s[2] for s in planned), planned
    for r in results:
        e = r["elastic"]
        assert 1 <= e["max_local_steps"] <= R
        assert all(1 <= k <= R for k in e["steps_between"])
    # global_steps: the same on every rank, the sum of every rank's steps
    assert len({r["elastic"]["global_steps"] for r in results}) == 1
    assert results[0]["elastic"]["global_steps"] == sum(sum(r["elastic"]["steps_between"]) for r in results)
    # every rank ran exactly what the previous plan told it
    for rank, r in enumerate(results):
        e = r["elastic"]
        expect = [1] + [steps[rank] for _, steps, _ in e["rounds"][:-1]]
        assert e["steps_between"] == expect


def test_step_weighted_is_exact(results):
    k = len(results[0]["step_weighted"])
    assert k >= 3
    saw_unequal = False
    for i in range(k):
        steps = [r["step_weighted"][i][0] for r in results]
        xs = [r["step_weighted"][i][1] for r in results]
        saw_unequal |= len(set(steps)) > 1
        want = torch.tensor(sum(s * x for s, x in zip(steps, xs)) / sum(steps),
                            dtype=torch.float64).float().item()
        for r in results:
            assert r["step_weighted"][i][2] == [want] * 5
    assert saw_unequal


def test_summed_deltas_is_exact(results):
    for r in results:
        sd = r["summed_deltas"]
        assert sd[0] == [3.0] * 3                 # the first barrier averages 0, 3, 6
        assert sd[1] == [3.0 + 6 * 2] * 3         # a + (1 + 2 + 3) * 2
        assert sd[2] == [sd[1][0] + 6 * 3] * 3


def test_periodic_has_torchs_arguments_and_schedule(results):
    for rank, r in enumerate(results):
        p = r["periodic"]
        assert [s for s, _ in p["ours"]] == [3, 6, 9]   # steps 2, 5, 8 counted from 0, as torch
        for s, v in p["ours"]:
            assert v == [float(4 + s)] * 2               # mean of 4 r + s over r = 0, 1, 2
        if rank != 1:                                    # (rank 1's own value is the mean)
            assert p["theirs"] == p["ours"]
        assert p["step"] == p["ref_step"] == 11
        assert p["barriers"] == 3 and p["global_steps"] == 9 * N


def test_post_local_sgd_optimizer(results):
    at = [r["postlocal"]["at_barrier"] for r in results]
    assert len(at[0]) >= 3
    for other in at[1:]:
        assert other == at[0]                     # identical parameters after every merge
    for r in results:
        p = r["postlocal"]
        assert p["step"] == p["steps"] == p["state_step"]
        # it trains: the loss (w . x)^2 falls a hundredfold on every rank (measured: 700x to 10^6x)
        assert p["losses"][-1] < 0.01 * p["losses"][0], p["losses"]


def test_bad_input(results):
    bad = results[0]["bad"]
    for name in ("negative", "nan", "early_sync", "merge", "config", "period", "timeout",
                 "int_tensor"):
        assert bad[name] is not None, name
        assert bad[name][1], bad[name]            # a ValueError subclass
    assert "step duration" in bad["negative"][2]
    assert "before the plan calls for it" in bad["early_sync"][2]
    assert "median" in bad["merge"][2]
    assert "elastc:4" in bad["config"][2]
    assert "period" in bad["period"][2]
    assert "int64" in bad["int_tensor"][2]


def test_plan_disagreement_is_an_error(results):
    for r in results:
        assert r["mismatch"] is not None
        assert "different plans" in r["mismatch"]


def test_stalled_rank_is_named(results):
    for rank in (0, 1):
        kind, text, waited = results[rank]["stall"]
        assert kind == "TransportError"
        assert "rank(s) 2 did not arrive" in text, text
        assert waited < 20.0  # bounded by the 1.5 s timeout; 20 s only catches a hang
    # The late rank returns instead of hanging: it joins after the others gave up, while their
    # abandoned all-reduce may still be posted in gloo, so it either fails on its own timeout or
    # completes against the abandoned one (as a late MPI rank can); never a hang.
    assert "stall" in results[2]
