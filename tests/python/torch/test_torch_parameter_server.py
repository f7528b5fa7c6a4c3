# The parameter server on 4 gloo processes (rank 0 serves, ranks 1-3 are workers 0-2 of unequal
# speed): each policy's guarantee at the server, every push applied once (a replay of the log
# gives the final weights bit for bit), BSP's fresh weights, bad input, a stalled worker evicted
# and told so, a killed worker dropped while the run goes on, a job restarted from checkpoints,
# every wait bounded. One spawn runs the scenarios in order (the kill last); the tests check its
# parts.
import os
import signal
import time

import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 4            # 1 server + 3 workers
SIZE = 10
LR = 0.125
ITERS = 12
POLICIES = ["bsp", "ssp:2", "asp", "elastic:4"]
REJOIN_ITERS = 5


def _big_size():
    """100M elements (400 MB a copy; about 3 GB in all) when the machine has the memory, else
    just past the old 64 Mi-element cap (2^26 + 1)."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
        if avail > 8 * 1024 * 1024:  # kB: 8 GiB
            return 100_000_000
    except (OSError, StopIteration, ValueError):
        pass
    return (1 << 26) + 1


def _grad(w, k):
    return torch.full((SIZE,), float(w + 1) + 0.25 * k)


def _initial():
    return torch.arange(SIZE, dtype=torch.float32)



def _falls_silent(ct, w, name, at, tries):
    """A worker of an eviction scenario `name`: worker 2 falls silent at its iteration `at`
    until the server has evicted it, then pushes `tries` times; the others keep training (never
    silent themselves) until worker 2's late push was refused, so the server still runs when it
    comes back. The refusals this worker got, and its iterations."""
    import cadence

    wk = ct.PSWorker(SIZE, reply_timeout=20)
    wk.pull()
    errors = []
    for k in range(1, 100000):  # the bound only catches a refusal that never comes
        if w == 2 and k == at:
            _spawn.wait(f"{name}.evicted.2")
        elif w != 2 and k > at and _spawn.posted(f"{name}.refused.2"):
            break
        try:
            wk.push_pull(_grad(w, k))
        except cadence.WorkerError as e:
            errors.append(str(e))
            if len(errors) == tries:
                break
    wk.finish()
    return errors, wk.iteration


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
        errors, iteration = _falls_silent(ct, w, "stall", at=3, tries=2)  # refused twice: sticky
        out["stall"] = dict(errors=errors, iteration=iteration)
    dist.barrier()

    # 5. ElasticBSP's monitoring phase, when nobody waits: worker 2 falls silent at its 2nd
    #    iteration until it is evicted (the server wakes at the liveness deadline); the others
    #    keep training until its late push was refused.
    if rank == 0:
        s = ct.ParameterServer("elastic:4", _initial(), lr=LR, keep_log=True, evict_after=0.5,
                               observer=lambda kind, worker, _: _spawn.post(f"monitor.{kind}.{worker}"))
        out["monitor"] = dict(stats=s.run())
    else:
        errors, iteration = _falls_silent(ct, w, "monitor", at=2, tries=1)
        out["monitor"] = dict(error=errors[0] if errors else None, iteration=iteration)
    dist.barrier()

    # 6. Rejoin under BSP: worker 2 falls silent until it is evicted; its next push is refused;
    #    it rejoins (a new worker id from the controller's add_worker), starts from the weights
    #    it is sent and pushes REJOIN_ITERS more; BSP holds for the new id from its first push.
    #    The server runs in a `with` block, whose close() joins every receiver.
    if rank == 0:
        with ct.ParameterServer("bsp", _initial(), lr=LR, keep_log=True, evict_after=0.6,
                                observer=lambda kind, worker, _: _spawn.post(f"rejoin.{kind}.{worker}")) as s:
            stats = s.run()
        out["rejoin"] = dict(stats=stats, weights=s.weights.tolist(), unjoined=s.close(),
                             alive=sum(t.is_alive() for t in s._threads))
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        seen = {(w, 0): wk.pull().tolist()}
        err = None
        for k in range(1, 100000):  # the bound only catches a rejoin that never ends
            if w == 2 and k == 3:
                _spawn.wait("rejoin.evicted.2")
            elif w != 2 and k > 3 and _spawn.posted("rejoin.done"):
                break
            key = (wk.worker_id, wk.iteration + 1)  # before the call, which counts it
            try:
                seen[key] = wk.push_pull(_grad(w, k)).tolist()
            except cadence.WorkerError as e:
                err = str(e)
                seen[(None, "rejoin")] = wk.rejoin().tolist()
                seen[(wk.worker_id, 0)] = seen[(None, "rejoin")]
                for j in range(1, REJOIN_ITERS + 1):
                    seen[(wk.worker_id, j)] = wk.push_pull(_grad(3, j)).tolist()
                break
        wk.finish()
        if w == 2:
            _spawn.post("rejoin.done")
        out["rejoin"] = dict(error=err, seen=seen, worker_id=wk.worker_id, rejoins=wk.rejoins)
    dist.barrier()

    # 7. A server that fails while workers still train: its `with` block closes it, and the
    #    workers still active learn "the server closed" at their next request instead of
    #    waiting out their reply_timeout.
    if rank == 0:
        def fail_on_finish(kind, worker, _):
            if kind == "finished":
                raise RuntimeError("the observer failed")
        t0 = time.monotonic()
        try:
            with ct.ParameterServer("bsp", _initial(), lr=LR, observer=fail_on_finish) as s:
                s.run()
            out["closed"] = None
        except RuntimeError as e:
            out["closed"] = dict(error=str(e), unjoined=s.close(), seconds=time.monotonic() - t0)
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.pull()
        err = None
        for k in range(1, 100):
            if w == 0 and k == 3:
                break
            try:
                wk.push_pull(_grad(w, k))
            except cadence.WorkerError as e:
                err = str(e)
                break
        wk.finish()
        out["closed"] = err
    dist.barrier()

    # 8. No cap on the model size: a model of _big_size() elements pushes and pulls (ranks 0
    #    and 1 on a group of their own).
    big = dist.new_group([0, 1])
    size = _big_size()
    if rank == 0:
        with ct.ParameterServer("asp", torch.zeros(size), lr=1.0, group=big) as s:
            st = s.run()
            out["big"] = dict(size=s.weights.numel(), pushes=st.pushes,
                              ok=bool((s.weights == -1.0).all()))
        del s
    elif rank == 1:
        wk = ct.PSWorker(size, group=big, reply_timeout=60)
        first = wk.pull()
        pulled = (first.numel(), bool((first == 0).all()))
        del first
        got = wk.push_pull(torch.ones(size))
        out["big"] = dict(pulled=pulled, got=(got.numel(), bool((got == -1.0).all())))
        del got
        wk.finish()
    dist.barrier()

    # 9. A CUDA model on the fake device: the server's weights and the workers' parameters
    #    "live on cuda:0"; every transfer is staged through pinned host buffers (the fake fails
    #    any device tensor that reaches gloo), and training gives the CPU run's weights.
    import _fake_cuda
    fake = _fake_cuda.install()
    if rank == 0:
        s = ct.ParameterServer("bsp", fake.put(_initial()), lr=LR, keep_log=True)
        st = s.run()
        out["cuda"] = dict(stats=st, weights=s.weights.tolist(), counts=dict(fake.counts),
                           on_device=fake.on_device(s.weights))
    else:
        params = [fake.put(torch.zeros(SIZE))]
        wk = ct.PSWorker(params, reply_timeout=20)
        wk.pull_into(params)
        for k in range(1, ITERS + 1):
            time.sleep(0.002 * (w + 1))
            params[0].grad = fake.put(_grad(w, k))
            wk.step(params)
        wk.finish()
        out["cuda"] = dict(counts=dict(fake.counts), weights=params[0].tolist())
    _fake_cuda.uninstall()
    dist.barrier()

    # 10. A restart: a BSP job checkpoints the server (from its observer, after the 9th push:
    #     rounds 1-3) and every worker (after its 3rd push_pull; worker 2 after its 2nd, one push
    #     behind the server), goes on to its 4th iteration and ends; a new job resumes from the
    #     checkpoints and trains to iteration 6. Worker 2 redoes its 3rd push.
    if rank == 0:
        saved = {}

        def save(kind, worker, _):
            if kind == "pushed" and sum(s.stats.pushes) == 9:
                saved["sd"] = _spawn.roundtrip(s.state_dict())
        s = ct.ParameterServer("bsp", _initial(), lr=LR, keep_log=True, observer=save)
        first_log = list(s.run().log)
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.pull()
        for k in range(1, 5):
            wk.push_pull(_grad(w, k))
            if k == (2 if w == 2 else 3):
                saved = _spawn.roundtrip(wk.state_dict())
        wk.finish()
    dist.barrier()
    if rank == 0:
        s = ct.ParameterServer("bsp", torch.zeros(SIZE), lr=LR, keep_log=True)
        s.load_state_dict(saved["sd"])
        weights_at_checkpoint = s.weights.tolist()
        st = s.run()
        out["restart"] = dict(first_log=first_log, stats=st, weights=s.weights.tolist(),
                              at_checkpoint=weights_at_checkpoint,
                              bad=_spawn.error(lambda: ct.ParameterServer("ssp:1", _initial()).load_state_dict(saved["sd"])))
    else:
        wk = ct.PSWorker(SIZE, reply_timeout=20)
        wk.load_state_dict(saved)
        resumed_at = wk.iteration
        wk.pull()
        for k in range(wk.iteration + 1, 7):
            wk.push_pull(_grad(w, k))
        wk.finish()
        out["restart"] = dict(resumed_at=resumed_at, iteration=wk.iteration,
                              bad=_spawn.error(lambda: ct.PSWorker(SIZE + 1).load_state_dict(saved)))
    dist.barrier()

    # 11. Last: worker 1 (rank 2) is killed at its 4th iteration. Its connection closes; the
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


@pytest.mark.parametrize("policy", POLICIES)
def test_weights_received_match_the_servers_log(results, policy):
    # Every reply's weights, as the worker received them, are the initial ones with the pushes
    # the server had applied when it answered (stats.replies), bit for bit.
    st = results[0][policy]["stats"]
    at = {(w, k): n for w, k, n in st.replies}
    assert len(at) == len(st.replies) == 3 * (ITERS + 1)  # one pull and ITERS releases each
    for rank in (1, 3):
        w = rank - 1
        for k, weights in enumerate(results[rank][policy]["seen"]):
            assert weights == _replay(st.log[:at[(w, k)]]), (policy, w, k)


def test_an_evicted_worker_rejoins_under_a_new_id_and_bsp_holds(results):
    st = results[0]["rejoin"]["stats"]
    assert [e.worker for e in st.evictions] == [2] and st.evictions[0].reason.startswith("silent")
    assert [(j.rank, j.old_worker, j.worker) for j in st.joins] == [(3, 2, 3)]
    assert st.pushes[2] == 2 and st.pushes[3] == REJOIN_ITERS
    assert max(st.max_start_staleness) == 0 and max(st.start_staleness) == 0  # BSP, new id too
    assert [k for v, k in st.log if v == 3] == list(range(1, REJOIN_ITERS + 1))
    assert results[0]["rejoin"]["weights"] == _replay(st.log)
    r3 = results[3]["rejoin"]
    assert "evicted" in r3["error"] and r3["worker_id"] == 3 and r3["rejoins"] == 1
    # what it was sent at the rejoin, and at every release after, against the server's log
    at = {(w, k): n for w, k, n in st.replies}
    for (w, k), weights in r3["seen"].items():
        if w is not None:
            assert weights == _replay(st.log[:at[(w, k)]]), (w, k)
    # it rejoined after workers 0 and 1 had pushed round 3 (they waited for worker 2 there)
    assert at[(3, 0)] >= 3 + 3 + 2
    assert results[0]["rejoin"]["unjoined"] == [] and results[0]["rejoin"]["alive"] == 0


def test_a_closed_server_tells_the_workers_and_joins_its_threads(results):
    c = results[0]["closed"]
    assert c is not None and "the observer failed" in c["error"]
    assert c["unjoined"] == []
    assert c["seconds"] < 20  # the workers learned at once; 20 s only catches a hang
    assert results[1]["closed"] is None  # worker 0 finished before the failure
    for rank in (3,):  # rank 2 was killed later: its results died with it
        assert "the server closed" in results[rank]["closed"]


def test_no_cap_on_the_model_size(results):
    b0, b1 = results[0]["big"], results[1]["big"]
    assert b0["size"] > 1 << 26
    assert b0["pushes"] == [1] and b0["ok"]
    assert b1["pulled"] == (b0["size"], True) and b1["got"] == (b0["size"], True)


def test_a_cuda_model_is_staged_through_pinned_host_buffers(results):
    c = results[0]["cuda"]
    st = c["stats"]
    assert st.pushes == [ITERS] * 3 and c["on_device"]
    assert c["weights"] == results[0]["bsp"]["weights"]  # as on the CPU (exact sums)
    assert c["weights"] == _replay(st.log)
    n_replies = 3 * (ITERS + 1)
    assert c["counts"]["h2d"] == 3 * ITERS               # each gradient to the device
    assert c["counts"]["d2h"] == n_replies               # each reply from it
    assert c["counts"]["pinned"] >= 3 * ITERS + n_replies
    for rank in (1, 3):
        k = results[rank]["cuda"]["counts"]
        assert k["d2h"] == ITERS and k["h2d"] == ITERS + 1
        assert results[rank]["cuda"]["weights"] == c["weights"]  # BSP: the last release is final


def test_a_restarted_job_resumes_from_the_checkpoints(results):
    r = results[0]["restart"]
    st = r["stats"]
    assert r["at_checkpoint"] == _replay(r["first_log"][:9])  # rounds 1-3
    assert st.log[:9] == r["first_log"][:9]
    assert sorted(st.resumed) == [(0, 3, 3), (1, 3, 3), (2, 3, 2)]  # worker 2: one push behind
    assert [k for v, k in st.log[9:] if v == 2] == [3, 4, 5, 6]  # it redid its 3rd push
    assert [k for v, k in st.log[9:] if v == 0] == [4, 5, 6]
    assert st.pushes == [6, 6, 7]
    assert r["weights"] == _replay(st.log)
    assert r["bad"] is not None and r["bad"][1] and "policy is 'bsp'" in r["bad"][2]
    for rank, at in ((1, 3), (3, 2)):  # rank 2's results died with it
        assert results[rank]["restart"]["resumed_at"] == at and results[rank]["restart"]["iteration"] == 6
        bad = results[rank]["restart"]["bad"]
        assert bad is not None and bad[1] and "load_state_dict" in bad[2]
