# cadence.torch with real torch jobs, on 3 gloo processes: DDP-wrapped models (local steps under
# no_sync(), DDP's forward buffer sync checked, torch's warm-up), BatchNorm buffers and optimizer state in
# the merge, broadcast_parameters, training that must reach a loss and an accuracy, and every CUDA
# branch (CUDA-event step timing, control tensors on the device for NCCL, host-side polled waits)
# through the fake device of _fake_cuda.py. One spawn runs the scenarios in order (the stall that
# breaks its group last); the tests check its parts.
import hashlib
import time

import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 3
DIM = 16


def _data(rank, n, count, seed):
    """Two Gaussian classes in DIM dimensions (Bayes accuracy about 0.98), this rank's shard."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (count,), generator=g)
    mu = torch.zeros(DIM)
    mu[:4] = 1.0
    x = torch.randn(count, DIM, generator=g) + (2 * y.float() - 1).unsqueeze(1) * mu
    return x[rank::n], y[rank::n]


def _bn_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 2))


def _digest(module):
    """One hash of every floating-point parameter and buffer, to compare ranks bit for bit."""
    h = hashlib.sha1()
    for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()



def _scenarios(rank, n):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import _fake_cuda
    import cadence.torch as ct

    out = {}
    loss_fn = torch.nn.CrossEntropyLoss()

    # 1. ElasticBSP on a DDP model with BatchNorm: ranks of unequal speed (given durations) run
    #    their own numbers of local steps under no_sync(); after every merge every rank holds the
    #    same parameters and running statistics; the model learns (loss falls, test accuracy
    #    above a floor).
    x, y = _data(rank, n, 3000, seed=1)
    xt, yt = _data(0, 1, 1000, seed=2)
    ddp = DDP(_bn_model(), **ct.no_buffer_sync())
    avg = ct.ElasticModelAverager("elastic:4", module=ddp, warmup_steps=2, timeout=30)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    digests, losses, steps, i = [], [], 0, 0
    while True:
        xb, yb = x[i:i + 32], y[i:i + 32]
        i = (i + 32) % (len(x) - 32)
        with avg.local_step(ddp):
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        steps += 1
        # rank 2 is the slow one: the durations are given, so the plans do not depend on this
        # machine's load (the self-timed path is the fake-CUDA scenario's and the averagers')
        if avg.step_done((1 + 2 * rank) * 1e-3):
            stop = avg.sync(ddp, stop=avg.global_steps >= 3 * 90)
            digests.append(_digest(ddp.module))
            if stop:
                break
    model = ddp.module.eval()
    with torch.no_grad():
        acc = float((model(xt).argmax(1) == yt).float().mean())
    out["ddp_elastic"] = dict(digests=digests, steps=steps, first=sum(losses[:10]) / 10,
                              last=sum(losses[-10:]) / 10, accuracy=acc,
                              max_local=avg.max_local_steps,
                              tracked=int(model[1].num_batches_tracked))

    # 2. DDP's default (buffers broadcast at every forward pass) is refused, saying why and
    #    how this torch spells the fix (no communication before the error).
    bad = DDP(_bn_model())
    out["spelling"] = ", ".join(f"{k}={v}" for k, v in ct.no_buffer_sync().items())
    out["buffer_sync"] = _spawn.error(lambda: ct.ElasticModelAverager("elastic:4", module=bad))
    out["buffer_sync_periodic"] = _spawn.error(
        lambda: ct.PeriodicModelAverager(2).local_step(bad).__enter__())

    # 3. torch's recipe with our periodic averager: DDP averages the gradients during the
    #    warm-up (local_step() leaves sync on), then local steps and a merge every 3 steps.
    torch.manual_seed(0)
    lin = DDP(torch.nn.Linear(DIM, 2))
    per = ct.PeriodicModelAverager(3, 4, module=lin, timeout=30)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    seen = []
    for step in range(10):
        with per.local_step(lin):
            loss_fn(lin(x[step * 8:(step + 1) * 8]), y[step * 8:(step + 1) * 8]).backward()
        opt.step()
        opt.zero_grad()
        merged = per.average_parameters(lin)
        seen.append((merged, _digest(lin.module)))
    out["ddp_periodic"] = seen

    # 4. Optimizer state at a merge: "average" makes the momentum buffers equal, "reset" clears
    #    them, "local" (torch's behaviour) leaves each rank its own.
    states = {}
    for mode in ("average", "reset", "local"):
        torch.manual_seed(0)
        m = torch.nn.Linear(DIM, 2)
        o = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        a = ct.PeriodicModelAverager(2, module=m, optimizer=o, optimizer_state=mode, timeout=30)
        for step in range(5):  # merges at steps 0, 2 and 4 (torch's schedule)
            loss_fn(m(x[step * 8:(step + 1) * 8] * (rank + 1)), y[step * 8:(step + 1) * 8]).backward()
            o.step()
            o.zero_grad()
            a.average_parameters(m)
        entries = len(o.state)  # before reading it: o.state is a defaultdict
        bufs = [o.state[p].get("momentum_buffer") for p in m.parameters()]
        states[mode] = dict(entries=entries,
                            momentum=None if bufs[0] is None else
                            hashlib.sha1(torch.cat([b.reshape(-1) for b in bufs]).numpy().tobytes()).hexdigest(),
                            params=_digest(m))
    states["bad"] = _spawn.error(lambda: ct.PeriodicModelAverager(2, optimizer_state="average"))
    out["optimizer_state"] = states

    # 5. broadcast_parameters: rank 1's parameters and buffers (integer ones too) everywhere.
    m = _bn_model(seed=rank)
    for _ in range(rank + 1):
        m(x[:16])  # running statistics and num_batches_tracked differ per rank
    before = _digest(m)
    ct.broadcast_parameters(m, src=1, timeout=30)
    t = [torch.full((3,), float(rank))]
    ct.broadcast_parameters(t, src=2)
    out["broadcast"] = dict(before=before, after=_digest(m), tracked=int(m[1].num_batches_tracked),
                            list=t[0].tolist(), bad=_spawn.error(lambda: ct.broadcast_parameters(t, src=3)))

    # 6. Fake CUDA over gloo: parameters "on cuda:0"; step_done() times steps with events that are
    #    read only at sync(); the control tensors stay on the host (gloo); merges are exact.
    fake = _fake_cuda.install()
    ps = [fake.put(torch.zeros(4)), fake.put(torch.zeros(3, dtype=torch.float64))]
    avg = ct.ElasticModelAverager("elastic:4", warmup_steps=2, timeout=30)
    rounds, exact, k = [], True, 0
    while avg.barriers < 10:
        time.sleep(0.002 * (rank + 1))
        events_before = fake.counts["event_reads"]
        if avg.step_done():
            reads_between = fake.counts["event_reads"] - events_before  # none before sync
            b = avg.barriers
            for t_, base in zip(ps, (1, 2)):
                t_.fill_(base * (10 * b + 3 * rank))
            avg.sync(ps)
            exact &= reads_between == 0 and all(
                torch.equal(t_, torch.full_like(t_, base * (10 * b + 3))) for t_, base in zip(ps, (1, 2)))
            rounds.append([int(s) for s in avg.round.steps])
        k += 1
    # the post-local SGD path: average_parameters() times steps with events too
    evs = fake.counts["events"]
    a2 = ct.ElasticModelAverager("elastic:4", timeout=30)
    calls = 0
    while a2.barriers < 5:  # ranks run their own step counts: stop on a barrier count
        a2.average_parameters(ps)
        calls += 1
    out["fake_cuda"] = dict(rounds=rounds, exact=exact, counts=dict(fake.counts),
                            hint=str(avg._device_hint), control=str(avg._control_device()),
                            postlocal_events=fake.counts["events"] - evs, calls=calls)

    # 6b. DiLoCo on the fake device, ElasticBSP schedule, steps timed by itself: events, read
    #     only at a sync (where it waits anyway); int8 outer gradients; one global model.
    m = torch.nn.Linear(3, 2)
    for p in m.parameters():
        fake.put(p)
    ev0, reads0 = fake.counts["events"], fake.counts["event_reads"]
    d = ct.DiLoCo(m, None, lambda ps: torch.optim.SGD(ps, lr=1.0), schedule="elastic:4", codec="int8",
                  timeout=30)
    early, plans = 0, []
    while d.syncs < 8:
        time.sleep(0.002 * (rank + 1))
        with torch.no_grad():
            for p in m.parameters():
                p.add_(float(rank + 1))
        before = fake.counts["event_reads"]
        if d.step():
            plans.append([int(s) for s in d.plan.steps])
        else:
            early += fake.counts["event_reads"] - before
    out["fake_diloco"] = dict(hint=str(d._device_hint), events=fake.counts["events"] - ev0,
                              reads=fake.counts["event_reads"] - reads0, early=early, plans=plans,
                              glob=[g.reshape(-1).tolist() for g in d.global_parameters])

    # 7. Fake CUDA on a fake NCCL group: the control tensors live on the parameters' device
    #    (never the current device), and sync() without any tensor has no device to use.
    fake = _fake_cuda.install(backend="nccl")
    avg = ct.ElasticModelAverager("elastic:4", timeout=30)
    none = _spawn.error(lambda: (avg.step_done(0.001), avg.sync([])))
    avg = ct.ElasticModelAverager("elastic:4", timeout=30)
    p = [fake.put(torch.full((2,), float(rank)))]
    avg.step_done(0.001)
    avg.sync(p)
    out["fake_nccl"] = dict(no_tensors=none, control=str(avg._control_device()), merged=p[0].tolist())

    # 8. Last: a stalled rank on a fake NCCL subgroup: the others poll the work on the host,
    #    time out within the bound and name rank 2.
    sub = dist.new_group(list(range(n)))
    a = ct.PeriodicModelAverager(1, process_group=sub, timeout=1.5)
    a.step_done()
    q = [fake.put(torch.zeros(1))]
    out["stall"] = _spawn.stalled_sync(rank, n, lambda: a.sync(q))
    _fake_cuda.uninstall()
    return out


@pytest.fixture(scope="module")
def results():
    return _spawn.values(_spawn.run(_scenarios, N, timeout=120))


def test_ddp_elastic_merges_identical_models_and_learns(results):
    digests = [r["ddp_elastic"]["digests"] for r in results]
    assert len(digests[0]) >= 10
    for d in digests[1:]:
        assert d == digests[0]                   # parameters and BN statistics, every barrier
    steps = [r["ddp_elastic"]["steps"] for r in results]
    assert steps[0] > steps[2]                   # ranks ran their own step counts under DDP
    assert max(r["ddp_elastic"]["max_local"] for r in results) > 1
    for r in results:
        e = r["ddp_elastic"]
        assert e["last"] < 0.5 * e["first"], e   # the training loss fell
        assert e["accuracy"] >= 0.9, e           # Bayes accuracy is about 0.98
    # integer buffers (num_batches_tracked) stay each rank's own count
    assert [r["ddp_elastic"]["tracked"] for r in results] == steps


def test_ddp_forward_buffer_sync_is_refused_saying_why(results):
    import inspect
    new = "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    assert results[0]["spelling"] == ("forward_sync_buffers=False" if new else "broadcast_buffers=False")
    for key in ("buffer_sync", "buffer_sync_periodic"):
        err = results[0][key]
        assert err is not None and err[1], err
        assert results[0]["spelling"] in err[2] and "collective" in err[2]


def test_ddp_periodic_follows_torchs_recipe(results):
    _spawn.check_torch_recipe([r["ddp_periodic"] for r in results])


def test_optimizer_state_choices(results):
    st = [r["optimizer_state"] for r in results]
    assert len({s["average"]["momentum"] for s in st}) == 1      # merged with the parameters
    assert len({s["average"]["params"] for s in st}) == 1
    assert all(s["reset"]["entries"] == 0 for s in st)           # cleared at the merge
    assert len({s["local"]["momentum"] for s in st}) == N        # each rank's own (torch's way)
    assert len({s["local"]["params"] for s in st}) == 1
    bad = st[0]["bad"]
    assert bad is not None and bad[1] and "optimizer=" in bad[2]


def test_broadcast_parameters(results):
    src = results[1]["broadcast"]["before"]
    assert results[0]["broadcast"]["before"] != src
    for r in results:
        b = r["broadcast"]
        assert b["after"] == src
        assert b["tracked"] == 2                 # rank 1 ran 2 forward passes
        assert b["list"] == [2.0] * 3
        assert b["bad"] is not None and b["bad"][1] and "src 3" in b["bad"][2]


def test_fake_cuda_event_timing_and_exact_merges(results):
    rounds = results[0]["fake_cuda"]["rounds"]
    for r in results:
        f = r["fake_cuda"]
        assert f["exact"]                        # merges exact, no event read before sync()
        assert f["rounds"] == rounds             # one plan everywhere
        assert f["hint"] == "cuda:0" and f["control"] == "cpu"
        assert f["counts"]["events"] > 0 and f["counts"]["event_reads"] > 0
        assert f["counts"]["event_syncs"] >= f["counts"]["event_reads"]
        assert f["postlocal_events"] >= f["calls"] >= 5  # one event per step at least
    planned = [s for s in rounds if s != [1] * N]
    assert planned and any(s[0] > s[2] for s in planned), rounds  # event times reached the plan


def test_fake_cuda_diloco_times_steps_with_events_read_only_at_a_sync(results):
    plans = results[0]["fake_diloco"]["plans"]
    for r in results:
        f = r["fake_diloco"]
        assert f["hint"] == "cuda:0"
        assert f["events"] > 0 and f["reads"] > 0 and f["early"] == 0, f
        assert f["plans"] == plans and f["glob"] == results[0]["fake_diloco"]["glob"]
    assert any(s[0] > s[2] for s in plans), plans  # rank 2 sleeps 3x longer: the event times reached the plan


def test_fake_nccl_control_tensors_on_the_parameters_device(results):
    for rank, r in enumerate(results):
        f = r["fake_nccl"]
        assert f["control"] == "cuda:0"
        assert f["merged"] == [1.0, 1.0]
        assert f["no_tensors"] is not None and "device tensors only" in f["no_tensors"][2]


def test_fake_nccl_stall_is_polled_bounded_and_named(results):
    for rank in (0, 1):
        kind, text, waited = results[rank]["stall"]
        assert kind == "TransportError"
        assert "polled on the host" in text, text
        assert "rank(s) 2 did not arrive" in text, text
        assert waited < 20.0                     # bounded by the 1.5 s timeout
    assert "stall" in results[2]
