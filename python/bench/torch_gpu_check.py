#!/usr/bin/env python3
"""cadence.torch on a real GPU: the CUDA branches that the CPU tests run through a fake device
(tests/python/torch/_fake_cuda.py), checked once on the hardware. Prints one PASS/FAIL line per
check and "torch GPU checks: N passed, M failed"; exits 1 on any failure, 0 with a message when
there is no GPU. About 30 s on one GPU.

1. An NCCL group of 1 on cuda:0: the averagers keep their control tensors on the parameters'
   device; step_done() without a duration times a step by CUDA events (a step of known GPU
   time, launched in microseconds, is recorded at its GPU length); merges, the stop flag and
   broadcast_parameters on CUDA tensors; waits polled on the host.
2. Two processes sharing cuda:0 over gloo: ElasticBSP merges of CUDA tensors exact; a parameter
   server whose model and workers live on the GPU (staged through pinned host buffers) gives the
   CPU's weights; a parameter server on an NCCL group is refused, saying why.
3. With two GPUs or more: a rank that stalls on NCCL is named by the other within the bound
   (the host-side poll), instead of a hang until NCCL's watchdog.

    python3 python/bench/torch_gpu_check.py     # with cadence installed (or on PYTHONPATH)
"""
import datetime
import os
import sys
import tempfile
import time
import traceback

RESULTS = []


def check(name, fn):
    try:
        detail = fn()
        RESULTS.append((name, True, detail or ""))
    except Exception as e:  # noqa: BLE001
        RESULTS.append((name, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))


def single_nccl(init):
    import torch
    import torch.distributed as dist

    import cadence.torch as ct

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))

    def control_on_device():
        avg = ct.ElasticModelAverager("elastic:4", timeout=30)
        p = [torch.full((1000,), 3.0, device=dev)]
        avg.step_done(0.001)
        avg.sync(p)
        d = avg._control_device()
        assert d.type == "cuda" and d.index == 0, d
        assert torch.equal(p[0], torch.full_like(p[0], 3.0))
        return f"control tensors on {d}"

    def event_timing():
        # calibrate torch.cuda._sleep: cycles per GPU millisecond
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(10_000_000)
        e.record()
        e.synchronize()
        per_ms = 10_000_000 / s.elapsed_time(e)
        avg = ct.ElasticModelAverager("elastic:4", timeout=30)
        p = [torch.zeros(10, device=dev)]
        avg.step_done(0.001)
        avg.sync(p)  # the averager now knows the parameters' device
        host, pending = [], []
        for _ in range(3):  # warm-up: every step is a barrier
            t0 = time.perf_counter()
            torch.cuda._sleep(int(per_ms * 30))  # 30 ms of GPU time, launched at once
            host.append(time.perf_counter() - t0)
            due = avg.step_done()
            pending.append(isinstance(avg._ring[(avg._recorded - 1) % avg._history], tuple))
            if due:
                avg.sync(p)
        assert all(pending), "a step was not timed by events (or was read before sync())"
        avg._resolve_ring()  # what the next sync() does first (the last step may not be due)
        steps_us = list(avg._ring[1:4])
        assert all(25_000 <= us <= 60_000 for us in steps_us), steps_us
        assert max(host) < 0.01, host
        return f"steps recorded {[round(us / 1000, 1) for us in steps_us]} ms; launches took " \
               f"{[round(h * 1e3, 2) for h in host]} ms on the host"

    def periodic_and_stop():
        per = ct.PeriodicModelAverager(2, 1, timeout=30)
        p = [torch.full((5,), 2.0, device=dev)]
        merged = []
        for _ in range(6):
            if per.step_done():
                merged.append(per.step)
                assert per.sync(p, stop=True) is True
        assert merged == [2, 4, 6], merged
        return "torch's schedule; stop flag on the device"

    def broadcast():
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(dev)
        ct.broadcast_parameters(m, src=0, timeout=30)
        return "ok"

    check("nccl/1: control tensors on the parameters' device", control_on_device)
    check("nccl/1: step_done() timed by CUDA events", event_timing)
    check("nccl/1: periodic averager (torch's schedule) and stop flag", periodic_and_stop)
    check("nccl/1: broadcast_parameters on CUDA tensors", broadcast)
    dist.destroy_process_group()


def _two_gloo(rank, n, init, q):
    import torch
    import torch.distributed as dist

    import cadence
    import cadence.torch as ct

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    out = {}
    # ElasticBSP merges of CUDA tensors over gloo, exact
    avg = ct.ElasticModelAverager("elastic:4", warmup_steps=2, timeout=30)
    p = [torch.zeros(1000, device=dev), torch.zeros(7, dtype=torch.float64, device=dev)]
    exact = True
    while avg.barriers < 8:
        torch.cuda._sleep(200_000 * (rank + 1))
        if avg.step_done():
            b = avg.barriers
            for t, base in zip(p, (1, 2)):
                t.fill_(base * (10 * b + 3 * rank))
            avg.sync(p)
            exact &= all(torch.equal(t, torch.full_like(t, base * (10 * b + 1.5)))
                         for t, base in zip(p, (1, 2)))
    out["elastic"] = exact
    dist.barrier()
    # a parameter server with the model and the worker on the GPU
    size, lr, iters = 100_000, 0.5, 5
    if rank == 0:
        s = ct.ParameterServer("bsp", torch.zeros(size, device=dev), lr=lr)
        s.run()
        out["ps"] = (s.weights.device.type, float(s.weights[0]), float(s.weights[-1]))
    else:
        params = [torch.zeros(size, device=dev, requires_grad=True)]
        wk = ct.PSWorker(params)
        wk.pull_into(params)
        for k in range(1, iters + 1):
            params[0].grad = torch.full((size,), float(k), device=dev)
            wk.step(params)
        wk.finish()
        out["ps"] = float(params[0][0])
    dist.barrier()
    # an NCCL group for the parameter server is refused (no NCCL communicator is created)
    try:
        g = dist.new_group([0, 1], backend="nccl")
        if rank == 0:
            ct.ParameterServer("bsp", torch.zeros(4, device=dev), group=g)
        else:
            ct.PSWorker(4, group=g)
        out["nccl_refused"] = None
    except cadence.InvalidParameterError as e:
        out["nccl_refused"] = str(e)
    except Exception as e:  # noqa: BLE001
        out["nccl_refused"] = f"unexpected {type(e).__name__}: {e}"
    q.put((rank, out))
    q.close()
    q.join_thread()
    os._exit(0)


def _two_nccl_stall(rank, n, init, q):
    import torch
    import torch.distributed as dist

    import cadence
    import cadence.torch as ct

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    p = [torch.ones(1000, device=dev)]
    warm = ct.PeriodicModelAverager(1, timeout=30)
    warm.step_done()
    warm.sync(p)  # NCCL's communicator is up on both ranks
    a = ct.PeriodicModelAverager(1, timeout=2.0)
    a.step_done()
    out = None
    if rank == 1:
        time.sleep(8)  # stalls past rank 0's bound
    else:
        t0 = time.monotonic()
        try:
            a.sync(p)
        except cadence.TransportError as e:
            out = (str(e), time.monotonic() - t0)
    q.put((rank, out))
    q.close()
    q.join_thread()
    os._exit(0)  # the abandoned collective stays queued on the NCCL stream: fail-stop


def spawn(target, n, timeout):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=target, args=(r, n, init, q), daemon=True) for r in range(n)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            try:
                r, out = q.get(timeout=1.0)
                got[r] = out
            except Exception:  # noqa: BLE001
                if all(not p.is_alive() for p in procs):
                    break
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return got


def main():
    try:
        import torch
    except ImportError:
        print("torch GPU checks skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("torch GPU checks skipped: no CUDA device")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s): "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        single_nccl(os.path.join(tmp, "rendezvous"))

    got = spawn(_two_gloo, 2, 120)

    def gloo(key, want):
        def fn():
            assert set(got) == {0, 1}, f"ranks returned: {sorted(got)}"
            v = [got[0].get(key), got[1].get(key)]
            return want(v)
        return fn

    def exact(v):
        assert v == [True, True], v
    check("gloo/2 sharing cuda:0: ElasticBSP merges of CUDA tensors exact", gloo("elastic", exact))

    def ps(v):
        expect = -0.5 * 15.0  # lr * (1 + 2 + ... + 5)
        assert v[0] == ("cuda", expect, expect), v
        assert v[1] == expect, v
        return f"server weights on {v[0][0]}, {expect} everywhere"
    check("gloo/2 sharing cuda:0: a CUDA model through the parameter server", gloo("ps", ps))

    def refused(v):
        for text in v:
            assert text and "needs gloo" in text, v
        return v[0][:100] + "..."
    check("gloo/2: a parameter server on an NCCL group is refused, saying why", gloo("nccl_refused", refused))

    if torch.cuda.device_count() >= 2:
        got2 = spawn(_two_nccl_stall, 2, 60)

        def stall():
            text, waited = got2[0]
            assert "rank(s) 1 did not arrive" in text and "polled on the host" in text, text
            assert waited < 5.0, waited
            return f"named within {waited:.2f} s (timeout 2 s)"
        check("nccl/2: a stalled rank is named within the bound", stall)
    else:
        print("SKIP nccl/2: a stalled rank is named within the bound (needs 2 GPUs)")

    for name, ok, detail in RESULTS:
        print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    failed = sum(1 for _, ok, _ in RESULTS if not ok)
    print(f"torch GPU checks: {len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
