# The parameter server on 4 gloo processes (rank 0 serves, ranks 1-3 are workers 0-2 of unequal
# speed): each policy's guarantee at the server, every push applied once (a replay of the log
# gives the final weights bit for bit), BSP's fresh weights, bad input, a stalled worker evicted
# and told so, a killed worker dropped while the run goes on, every wait bounded. One spawn runs
# the scenarios in order (the kill last); the tests check its parts.
import os
import signal
import time

import pytest

# Skip, saying why, where torch, its gloo backend or the bindings are missing (no conftest.py
# here: tests/python/conftest.py is imported as "conftest" by the binding tests).
torch = pytest.importorskip("torch", reason="cadence.torch tests need PyTorch (Debian: python3-torch)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this PyTorch build has no torch.distributed gloo backend", allow_module_level=True)
pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")

import _torch_spawn as _spawn  # noqa: E402

N = 4            # 1 server + 3 workers
SIZE = 10
LR = 0.125
ITERS = 12
POLICIES = ["bsp", "ssp:2", "asp", "elastic:4"]


def _grad(w, k):
    return torch.full((SIZE,), float(w + 1) + 0.25 * k)


def _initial():
    return torch.arange(SIZE, dtype=torch.float32)


def _scenarios(rank, n):
    import torch.distributed as dist

    import cadence
    import cadence.torch as ct

    out = {}
    w = rank - 1

    def train(policy, iters, speed, keep=True, **server_kw):
        if rank == 0:
            s = ct.ParameterServer(policy, _initial(), lr=LR, keep_log=keep, **server_kw)
            stats = s.run()
            return dict(stats=stats, weights=s.weights.tolist())
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        seen = [wk.pull().tolist()]
        for k in range(1, iters + 1):
            time.sleep(speed(w, k))
            seen.append(wk.push_pull(_grad(w, k)).tolist())
        wk.finish()
        return dict(seen=seen)

    # 1. Every policy, workers 1x, 2x, 3x slow.
    for policy in POLICIES:
        out[policy] = train(policy, ITERS, lambda w, k: 0.004 * (w + 1))
        dist.barrier()

    # 2. Bad input.
    bad = {}
    solo = dist.new_group([0])
    if rank == 0:
        for name, fn in [
            ("group_of_one", lambda: ct.ParameterServer("bsp", _initial(), group=solo)),
            ("controller_size", lambda: ct.ParameterServer(cadence.make_controller("bsp", 5), _initial())),
            ("typo", lambda: ct.ParameterServer("bps", _initial())),
            ("worker_on_server", lambda: ct.PSWorker(SIZE)),
            ("evict_after", lambda: ct.ParameterServer("bsp", _initial(), evict_after=-1)),
        ]:
            try:
                fn()
                bad[name] = None
            except Exception as e:  # noqa: BLE001
                bad[name] = (type(e).__name__, isinstance(e, ValueError), str(e))
    else:
        try:
            ct.ParameterServer("bsp", _initial())
            bad["server_on_worker"] = None
        except Exception as e:  # noqa: BLE001
            bad["server_on_worker"] = (type(e).__name__, isinstance(e, ValueError), str(e))
    out["bad"] = bad
    dist.barrier()

    # 3. A worker with another model size is refused at pull() and leaves; the others go on.
    if rank == 0:
        s = ct.ParameterServer("bsp", _initial(), lr=LR)
        out["size"] = dict(stats=s.run())
    elif w == 0:
        wk = ct.PSWorker(SIZE + 1, reply_timeout=20)
        try:
            wk.pull()
            out["size"] = None
        except cadence.WorkerError as e:
            out["size"] = str(e)
        wk.finish()
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.pull()
        for k in range(1, 4):
            wk.push_pull(_grad(w, k))
        wk.finish()
        out["size"] = "ok"
    dist.barrier()

    # 4. Worker 2 falls silent at its 3rd iteration until the server has evicted it (0.6 s of
    #    silence); the others (BSP) go on, and its next push_pull learns that it was evicted.
    #    The others keep training (never silent themselves) until that refusal, so the server
    #    still runs when it comes back.
    if rank == 0:
        s = ct.ParameterServer("bsp", _initial(), lr=LR, keep_log=True, evict_after=0.6,
                               observer=lambda kind, worker, _: _spawn.post(f"stall.{kind}.{worker}"))
        t0 = time.monotonic()
        out["stall"] = dict(stats=s.run(), seconds=time.monotonic() - t0, weights=s.weights.tolist())
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.pull()
        errors = []
        for k in range(1, 100000):  # the bound only catches a refusal that never comes
            if w == 2 and k == 3:
                _spawn.wait("stall.evicted.2")
            elif w != 2 and k > 3 and _spawn.posted("stall.refused.2"):
                break
            try:
                wk.push_pull(_grad(w, k))
            except cadence.WorkerError as e:
                errors.append(str(e))
                try:
                    wk.push_pull(_grad(w, k))  # sticky: refused again at once
                except cadence.WorkerError as e2:
                    errors.append(str(e2))
                break
        wk.finish()
        out["stall"] = dict(errors=errors, iteration=wk.iteration)
    dist.barrier()

    # 5. ElasticBSP's monitoring phase, when nobody waits: worker 2 falls silent at its 2nd
    #    iteration until it is evicted (the server wakes at the liveness deadline); the others
    #    keep training until its late push was refused.
    if rank == 0:
        s = ct.ParameterServer("elastic:4", _initial(), lr=LR, keep_log=True, evict_after=0.5,
                               observer=lambda kind, worker, _: _spawn.post(f"monitor.{kind}.{worker}"))
        out["monitor"] = dict(stats=s.run())
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.pull()
        err = None
        for k in range(1, 100000):  # the bound only catches a refusal that never comes
            if w == 2 and k == 2:
                _spawn.wait("monitor.evicted.2")
            elif w != 2 and k > 2 and _spawn.posted("monitor.refused.2"):
                break
            try:
                wk.push_pull(_grad(w, k))
            except cadence.WorkerError as e:
                err = str(e)
                break
        wk.finish()
        out["monitor"] = dict(error=err, iteration=wk.iteration)
    dist.barrier()

    # 6. Last: worker 1 (rank 2) is killed at its 4th iteration. Its connection closes; the
    #    server drops it long before evict_after and BSP goes on without it.
    if rank == 0:
        s = ct.ParameterServer("bsp", _initial(), lr=LR, keep_log=True, evict_after=15)
        t0 = time.monotonic()
        out["kill"] = dict(stats=s.run(), seconds=time.monotonic() - t0)
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.pull()
        for k in range(1, 9):
            time.sleep(0.02)
            if w == 1 and k == 4:
                os.kill(os.getpid(), signal.SIGKILL)
            wk.push_pull(_grad(w, k))
        wk.finish()
        out["kill"] = "ok"
    return out


@pytest.fixture(scope="module")
def results():
    res = _spawn.run(_scenarios, N, timeout=120, expect_killed=(2,))
    assert res[2][0] == "killed", res[2]
    out = _spawn.values([r for i, r in enumerate(res) if i != 2])
    return {0: out[0], 1: out[1], 3: out[2]}  # by rank; rank 2 was killed


def _replay(log):
    w = _initial()
    for worker, k in log:
        w.add_(_grad(worker, k), alpha=-LR)
    return w.tolist()


@pytest.mark.parametrize("policy", POLICIES)
def test_every_push_applied_once_and_replay_exact(results, policy):
    r = results[0][policy]
    st = r["stats"]
    assert st.pushes == [ITERS] * 3
    assert sorted(st.log) == sorted((w, k) for w in range(3) for k in range(1, ITERS + 1))
    for w in range(3):  # each worker's pushes in its own order
        assert [k for v, k in st.log if v == w] == list(range(1, ITERS + 1))
    assert r["weights"] == _replay(st.log)
    assert st.evictions == []


def test_policy_guarantees_at_the_server(results):
    assert max(results[0]["bsp"]["stats"].max_start_staleness) == 0
    assert max(results[0]["bsp"]["stats"].start_staleness) == 0
    assert results[0]["bsp"]["stats"].parked > 0
    assert max(results[0]["ssp:2"]["stats"].max_start_staleness) <= 2
    assert max(results[0]["ssp:2"]["stats"].start_staleness) <= 2
    # with workers 1x/2x/3x slow, ASP lets the fast one run ahead
    assert max(results[0]["asp"]["stats"].max_start_staleness) > 0
    assert results[0]["asp"]["stats"].parked == 0
    assert len(results[0]["asp"]["stats"].start_staleness) == 3 * ITERS


def test_bsp_workers_start_from_the_whole_round(results):
    total = torch.zeros(SIZE)
    rounds = [_initial()]
    for k in range(1, ITERS + 1):
        for w in range(3):
            total += _grad(w, k)
        rounds.append(_initial() - LR * total)
    for rank in (1, 3):
        seen = results[rank]["bsp"]["seen"]
        assert len(seen) == ITERS + 1
        for k, weights in enumerate(seen):
            if k == 0:
                continue  # pull() is not a release: it may already see round 1's first pushes
            assert torch.allclose(torch.tensor(weights), rounds[k]), (rank, k)


def test_bad_input(results):
    bad = results[0]["bad"]
    for name in ("group_of_one", "controller_size", "typo", "worker_on_server", "evict_after"):
        assert bad[name] is not None, name
        assert bad[name][1], bad[name]
    assert "1 rank" in bad["group_of_one"][2]
    assert "5 workers" in bad["controller_size"][2] and "3" in bad["controller_size"][2]
    assert "bps" in bad["typo"][2]
    assert "is the server" in bad["worker_on_server"][2]
    assert "evict_after" in bad["evict_after"][2]
    assert "is a worker" in results[1]["bad"]["server_on_worker"][2]


def test_model_size_mismatch_is_refused(results):
    assert "model of 11 elements" in results[1]["size"]
    assert results[3]["size"] == "ok"
    st = results[0]["size"]["stats"]
    assert st.pushes == [0, 3, 3] and st.evictions == []


def test_stalled_worker_is_evicted_and_told(results):
    st = results[0]["stall"]["stats"]
    assert [e.worker for e in st.evictions] == [2]
    assert st.evictions[0].reason.startswith("silent")
    assert st.evictions[0].pushes == 2
    assert st.pushes[0] == results[1]["stall"]["iteration"]  # rank 2's results died with it
    assert min(st.pushes[:2]) >= 3  # past the barrier the eviction opened
    assert max(st.max_start_staleness[:2]) == 0
    assert results[0]["stall"]["weights"] == _replay(st.log)  # the late push was not applied
    errors = results[3]["stall"]["errors"]
    assert len(errors) == 2
    assert "evicted" in errors[0] and "silent for" in errors[0]
    assert errors[1] == errors[0]


def test_silent_worker_is_evicted_in_elastic_monitoring_phase(results):
    st = results[0]["monitor"]["stats"]
    assert [e.worker for e in st.evictions] == [2]
    assert st.evictions[0].reason.startswith("silent")
    assert st.pushes[0] == results[1]["monitor"]["iteration"]
    assert st.pushes[2] == 1  # the late push was refused, not applied
    assert "evicted" in results[3]["monitor"]["error"]
    assert results[1]["monitor"]["error"] is None


def test_killed_worker_is_dropped_and_the_run_ends(results):
    k = results[0]["kill"]
    st = k["stats"]
    assert [e.worker for e in st.evictions] == [1]
    assert st.evictions[0].reason.startswith("lost"), st.evictions[0].reason
    assert st.pushes[0] == 8 and st.pushes[2] == 8 and st.pushes[1] == 3
    assert k["seconds"] < 15  # the closed connection, not evict_after, ended it
    assert results[1]["kill"] == "ok" and results[3]["kill"] == "ok"
