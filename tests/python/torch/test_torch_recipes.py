# The averagers' recipes beyond one flat group, on 4 gloo processes: hierarchical averaging (DDP,
# and FSDP2 where torch has it, inside replica groups of 2 ranks; ElasticBSP across), the DDP
# communication-hook form, torch.compile, checkpoints that resume a run exactly where an
# uninterrupted one goes, and the wrappers refused by name. One spawn runs the scenarios in
# order; the tests check its parts. Step durations are given (step_done(seconds)), so the plans
# are the same in every run.
import hashlib

import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 4
DIM = 8
HAS_COMPILE = hasattr(torch, "compile")


def _has_fsdp2():
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or (torch 1.13 on Python 3.11) failing to import
        return False
    return True


HAS_FSDP2 = _has_fsdp2()


def _digest(tensors):
    h = hashlib.sha1()
    for t in tensors:
        t = t.full_tensor() if hasattr(t, "full_tensor") else t  # a DTensor: the whole tensor
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, DIM, generator=g), torch.randint(0, 2, (16,), generator=g)



def _hierarchy(ct, rank, model, wrapped, avg, seconds, budget):
    """Trains `wrapped` (DDP or FSDP2 inside the replica group) under `avg` (ElasticBSP across
    the groups) until the groups' steps reach `budget`; the parameters' digest after every step
    and every merge, the steps between merges, the plans."""
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    per_step, merged, between, rounds, local, step = [], [], [], [], 0, 0
    while True:
        x, y = _batch(rank, step)
        with avg.local_step(wrapped):  # nothing in a hierarchy: DDP/FSDP sync inside the group
            loss_fn(wrapped(x), y).backward()
        opt.step()
        opt.zero_grad()
        step += 1
        local += 1
        per_step.append(_digest(model.parameters()))
        if avg.step_done(seconds):
            stop = avg.sync(model, stop=avg.global_steps >= budget)
            merged.append(_digest(model.parameters()))
            between.append(local)
            local = 0
            rounds.append([int(s) for s in avg.round.steps])
            if stop:
                break
    return dict(per_step=per_step, merged=merged, between=between, rounds=rounds)


def _elastic_run(ct, rank, barriers, avg=None, params=None, start=0):
    """ElasticBSP with summed deltas on known values and given durations: the plans and the
    merged values of barriers start+1 .. barriers."""
    avg = avg or ct.ElasticModelAverager("elastic:4", merge="summed_deltas", warmup_steps=2, timeout=30)
    params = params or [torch.zeros(3)]
    out = []
    while avg.barriers < barriers:
        if avg.step_done((1000 + 700 * rank) / 1e6):
            b = avg.barriers
            params[0].add_(float(rank + b))
            avg.sync(params)
            out.append(([int(s) for s in avg.round.steps], params[0].tolist()))
    return avg, params, out


def _scenarios(rank, n):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cadence.torch as ct

    out = {}
    groups = ct.replica_groups(2)  # replica groups {0, 1}, {2, 3}; cross groups {0, 2}, {1, 3}
    out["groups"] = (groups.index, groups.replicas, groups.size)
    # members of one replica group report different durations (the slower one counts), the
    # second replica group is the slow one
    seconds = (1000 + 300 * (rank % 2) + 2000 * groups.index) / 1e6

    # 1. DDP inside each replica group, ElasticBSP across.
    model = _model()
    ddp = DDP(model, process_group=groups.replica)
    avg = ct.ElasticModelAverager("elastic:4", process_group=groups.cross, replica_group=groups.replica,
                                  module=ddp, warmup_steps=2, timeout=30)
    out["ddp"] = _hierarchy(ct, rank, model, ddp, avg, seconds, budget=24)
    out["ddp_wrong_group"] = _spawn.error(lambda: ct.ElasticModelAverager(
        "elastic:4", process_group=groups.cross, replica_group=groups.replica, module=DDP(_model())))

    # 2. FSDP2 inside each replica group (its DTensor shards averaged shard by shard).
    if HAS_FSDP2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = _model()
        fully_shard(model, mesh=mesh["shard"])
        avg = ct.ElasticModelAverager("elastic:4", process_group=mesh.get_group("replicate"),
                                      replica_group=mesh.get_group("shard"), warmup_steps=2, timeout=30)
        out["fsdp2"] = _hierarchy(ct, rank, model, model, avg, seconds, budget=24)
        flat = ct.PeriodicModelAverager(1, timeout=30)
        flat.step_done()
        out["fsdp2_flat"] = _spawn.error(lambda: flat.sync(model))
        # FSDP1 needs an accelerator to be built; an instance left unbuilt is enough to be refused
        from torch.distributed.fsdp import FullyShardedDataParallel
        out["fsdp1"] = _spawn.error(lambda: ct.ElasticModelAverager(
            "elastic:4", module=FullyShardedDataParallel.__new__(FullyShardedDataParallel)))

    # 3. The communication-hook form. Periodic: the hook all-reduces the gradients in torch's
    #    warm-up (steps 0-3), then hands back local ones; merges at steps 4 and 7.
    model = _model()
    ddp = DDP(model)
    per = ct.PeriodicModelAverager(3, 4, module=ddp, timeout=30)
    per.register_comm_hook(ddp)
    loss_fn = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []
    for step in range(10):
        x, y = _batch(rank, step)
        loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
        merged = per.average_parameters(model)
        seen.append((merged, _digest(model.parameters())))
    out["hook_periodic"] = seen
    #    ElasticBSP: no gradient all-reduce at any step; ranks run their own step counts.
    model = _model()
    ddp = DDP(model, **ct.no_buffer_sync())
    avg = ct.ElasticModelAverager("elastic:4", module=ddp, warmup_steps=2, timeout=30)
    ddp.register_comm_hook(avg, ct.averager_hook)  # torch's own spelling works too
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    digests, between, local, step = [], [], 0, 0
    while True:
        x, y = _batch(rank, step)
        loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
        step += 1
        local += 1
        if avg.step_done((1000 + 1500 * rank) / 1e6):
            stop = avg.sync(ddp, stop=avg.global_steps >= 40)
            digests.append(_digest(model.parameters()))
            between.append(local)
            local = 0
            if stop:
                break
    out["hook_elastic"] = dict(digests=digests, between=between)
    out["hook_unused"] = _spawn.error(lambda: ct.ElasticModelAverager("elastic:4").register_comm_hook(
        DDP(_model(), find_unused_parameters=True, **ct.no_buffer_sync())))
    out["hook_hierarchy"] = _spawn.error(lambda: ct.PeriodicModelAverager(
        2, process_group=groups.cross, replica_group=groups.replica).register_comm_hook(
        DDP(_model(), process_group=groups.replica)))

    # 4. torch.compile: the compiled DDP model trains under local_step(ddp); the compiled
    #    wrapper itself is refused by name.
    if HAS_COMPILE:
        model = _model()
        ddp = DDP(model, **ct.no_buffer_sync())
        compiled = torch.compile(ddp, backend="aot_eager")
        avg = ct.ElasticModelAverager("elastic:4", module=ddp, warmup_steps=2, timeout=30)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        digests, step = [], 0
        while True:
            x, y = _batch(rank, step)
            with avg.local_step(ddp):
                loss_fn(compiled(x), y).backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if avg.step_done((1000 + 1500 * rank) / 1e6):
                if avg.sync(ddp, stop=avg.global_steps >= 24):
                    break
                digests.append(_digest(model.parameters()))
        out["compile"] = dict(digests=digests, steps=step,
                              refused=_spawn.error(lambda: ct.ElasticModelAverager("elastic:4", module=compiled)))

    # 5. Checkpoints: an ElasticBSP run (summed deltas: the anchors are saved too) stopped at
    #    barrier 5 and resumed by new averagers goes on exactly as an uninterrupted run; so
    #    does the periodic schedule.
    _, _, whole = _elastic_run(ct, rank, 10)
    avg, params, first = _elastic_run(ct, rank, 5)
    sd = _spawn.roundtrip(avg.state_dict())
    fresh = ct.ElasticModelAverager("elastic:4", merge="summed_deltas", warmup_steps=2, timeout=30)
    fresh.load_state_dict(sd)
    _, _, rest = _elastic_run(ct, rank, 10, avg=fresh, params=params)
    out["checkpoint_elastic"] = dict(whole=whole, resumed=first + rest)
    out["checkpoint_bad"] = dict(
        config=_spawn.error(lambda: ct.ElasticModelAverager("elastic:6", merge="summed_deltas", warmup_steps=2)
                      .load_state_dict(sd)),
        kind=_spawn.error(lambda: ct.PeriodicModelAverager(2).load_state_dict(sd)))
    per = ct.PeriodicModelAverager(3, 2, timeout=30)
    q = [torch.zeros(2)]
    merges = []
    for step in range(12):
        if step == 6:  # restart
            sd = _spawn.roundtrip(per.state_dict())
            per = ct.PeriodicModelAverager(3, 2, timeout=30)
            per.load_state_dict(sd)
        q[0].fill_(float(rank + step))
        if per.average_parameters(q):
            merges.append((step, q[0].tolist()))
    out["checkpoint_periodic"] = dict(merges=merges, barriers=per.barriers, step=per.step)

    # 6. Last (its merge is abandoned in flight: the group is not used after it): ranks that
    #    would merge different numbers of elements all raise, naming the counts, and their
    #    tensors are left as they were.
    a = ct.ElasticModelAverager("elastic:4", timeout=30)
    a.step_done(0.001)
    t = [torch.full((3 + rank % 2,), float(rank))]
    out["sizes"] = (_spawn.error(lambda: a.sync(t)), t[0].tolist())
    return out


@pytest.fixture(scope="module")
def results():
    return _spawn.values(_spawn.run(_scenarios, N, timeout=240))


def _check_hierarchy(results, key):
    runs = [r[key] for r in results]
    for a, b in ((0, 1), (2, 3)):  # a replica group's members step together
        assert runs[a]["per_step"] == runs[b]["per_step"]
        assert runs[a]["between"] == runs[b]["between"]
    for r in runs[1:]:  # every rank holds the same model after every merge, under one plan
        assert r["merged"] == runs[0]["merged"] and r["rounds"] == runs[0]["rounds"]
    assert len(runs[0]["merged"]) >= 5
    planned = [s for s in runs[0]["rounds"] if s != [1, 1]]
    assert planned and all(s[0] > s[1] for s in planned), runs[0]["rounds"]  # group 0 is faster
    assert sum(runs[0]["between"]) > sum(runs[2]["between"])


def test_replica_groups_are_consecutive_ranks(results):
    assert [r["groups"] for r in results] == [(0, 2, 2), (0, 2, 2), (1, 2, 2), (1, 2, 2)]


def test_hierarchy_ddp_inside_replica_groups_elastic_across(results):
    _check_hierarchy(results, "ddp")
    err = results[0]["ddp_wrong_group"]
    assert err is not None and err[1] and "process_group=replica_group" in err[2]


@pytest.mark.skipif(not HAS_FSDP2, reason="this torch has no FSDP2 (fully_shard, DeviceMesh) that imports")
def test_hierarchy_fsdp2_shards_inside_replica_groups_elastic_across_fsdp1_refused(results):
    _check_hierarchy(results, "fsdp2")
    err = results[0]["fsdp2_flat"]
    assert err is not None and err[1] and "DTensor" in err[2] and "replica_group=" in err[2]
    err = results[0]["fsdp1"]
    assert err is not None and err[1] and "FullyShardedDataParallel (FSDP1) is not supported" in err[2]
    assert "fully_shard()" in err[2]


def test_comm_hook_periodic_follows_torchs_recipe(results):
    _spawn.check_torch_recipe([r["hook_periodic"] for r in results])  # the hook all-reduced in the warm-up


def test_comm_hook_elastic_lets_ranks_run_their_own_steps(results):
    runs = [r["hook_elastic"] for r in results]
    for r in runs[1:]:
        assert r["digests"] == runs[0]["digests"]
    assert sum(runs[0]["between"]) > sum(runs[3]["between"])  # rank 3 is the slow one
    for key, text in (("hook_unused", "find_unused_parameters=False"), ("hook_hierarchy", "no communication hook")):
        err = results[0][key]
        assert err is not None and err[1] and text in err[2], err


@pytest.mark.skipif(not HAS_COMPILE, reason="torch.compile needs torch 2")
def test_torch_compile_trains_and_its_wrapper_is_refused_by_name(results):
    runs = [r["compile"] for r in results]
    assert len(runs[0]["digests"]) >= 3
    for r in runs[1:]:
        assert r["digests"] == runs[0]["digests"]
    assert runs[0]["steps"] > runs[3]["steps"]
    err = runs[0]["refused"]
    assert err is not None and err[1] and "torch.compile() returned (OptimizedModule)" in err[2]


def test_a_resumed_elastic_run_goes_on_as_an_uninterrupted_one(results):
    for r in results:
        c = r["checkpoint_elastic"]
        assert len(c["whole"]) == 10
        assert c["resumed"] == c["whole"]  # the plans, and the merged values (summed deltas)
    assert any(s != [1] * N for s, _ in results[0]["checkpoint_elastic"]["whole"][5:])
    bad = results[0]["checkpoint_bad"]
    assert bad["config"] is not None and bad["config"][1] and "config" in bad["config"][2]
    assert bad["kind"] is not None and "not a PeriodicModelAverager state_dict" in bad["kind"][2]


def test_a_resumed_periodic_run_merges_at_the_same_steps(results):
    for r in results:
        c = r["checkpoint_periodic"]
        assert [s for s, _ in c["merges"]] == [2, 5, 8, 11] and c["barriers"] == 4 and c["step"] == 12
        for s, v in c["merges"]:
            assert v == [float(1.5 + s)] * 2  # the mean of rank + s over 4 ranks


def test_ranks_merging_different_sizes_all_raise_and_keep_their_tensors(results):
    for rank, r in enumerate(results):
        err, values = r["sizes"]
        assert err is not None and err[0] == "TransportError", err
        assert "different numbers of elements at barrier 1 (by rank: 3, 4, 3, 4)" in err[2], err
        assert values == [float(rank)] * (3 + rank % 2)
