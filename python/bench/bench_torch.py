"""What cadence.torch costs, measured on this machine over gloo, interleaved (ours, theirs, ours,
theirs, ...) as nccl-tests does, median of blocks:

1. per training step, on 4 processes and a 1M-parameter model: the ElasticBSP averager against
   torch's own PeriodicModelAverager at the same number of merges (torch's period set to the
   local steps per merge that ElasticBSP chose), both called through PostLocalSGDOptimizer;
   target: at most 5% more time per step;
2. one ParameterServer round trip (PSWorker.push_pull, policy "asp" and a no-op update, so the
   time is the protocol's) vs a raw send/recv ping-pong of the same bytes (2 processes);
3. one ElasticModelAverager.sync and one PeriodicModelAverager.sync vs one raw all_reduce of
   the same parameters (2 processes).

    python python/bench/bench_torch.py [--quick] [--only step|ps|sync]
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

SIZES = [1024, 65536, 1 << 20]  # float32 elements: 4 KiB, 256 KiB, 4 MiB


def run(rank, n, init, quick, results):
    import torch
    import torch.distributed as dist

    import cadence.torch as ct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=120))
    blocks = 3 if quick else 7
    out = {}
    for size in SIZES:
        reps = max(5, (40 if quick else 200) * 1024 // max(size // 64, 1024))
        buf = torch.ones(size)
        raw, ours = [], []
        for _ in range(blocks):
            # raw ping-pong: the worker sends, the server answers with as many bytes
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                if rank == 1:
                    dist.send(buf, 0)
                    dist.recv(buf, 0)
                else:
                    dist.recv(buf, 1)
                    dist.send(buf, 1)
            raw.append((time.perf_counter() - t0) / reps)
            dist.barrier()
            if rank == 0:
                ct.ParameterServer("asp", torch.zeros(size), update=lambda w, g, k: None).run()
            else:
                wk = ct.PSWorker(size)
                weights = wk.pull()
                t0 = time.perf_counter()
                for _ in range(reps):
                    wk.push_pull(buf, out=weights)
                ours.append((time.perf_counter() - t0) / reps)
                wk.finish()
        if rank == 1:
            out[("ps", size)] = (statistics.median(raw), statistics.median(ours))
    for size in SIZES:
        reps = max(5, (20 if quick else 100) * 1024 // max(size // 64, 1024))
        params = [torch.ones(size)]
        raw, ela, per = [], [], []
        eavg = ct.ElasticModelAverager("elastic:4")
        pavg = ct.PeriodicModelAverager(1)
        for _ in range(blocks):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(params[0])
                params[0].div_(n)
            raw.append((time.perf_counter() - t0) / reps)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                pavg.step_done()
                pavg.sync(params)
            per.append((time.perf_counter() - t0) / reps)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                while not eavg.step_done(1e-3):  # equal speeds: the plan may give several steps
                    pass
                eavg.sync(params)
            ela.append((time.perf_counter() - t0) / reps)
        if rank == 0:
            out[("avg", size)] = (statistics.median(raw), statistics.median(per), statistics.median(ela))
    results.put((rank, out))
    dist.destroy_process_group()


def step_overhead(rank, n, init, quick, results):
    """Part 1: time per training step, ElasticBSP vs torch's periodic averager, same merges."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    import cadence.torch as ct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    model = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters
    x = torch.randn(32, 1000)
    y = torch.randn(32, 1000)

    def step(opt):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    eavg = ct.ElasticModelAverager("elastic:8", timeout=120)
    eopt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), eavg)
    merges = 8 if quick else 24
    # ElasticBSP's warm-up (BSP until its predictor has the history it needs) before timing
    while eavg.barriers < 6:
        step(eopt)
    blocks = 3 if quick else 7
    ela, per, steps_per_merge = [], [], []
    for _ in range(blocks):
        dist.barrier()
        b0, s0 = eavg.barriers, eavg.total_steps
        t0 = time.perf_counter()
        while eavg.barriers < b0 + merges:
            step(eopt)
        secs = time.perf_counter() - t0
        mine = eavg.total_steps - s0
        # every rank's steps in this block, to set torch's period and to divide the time: the
        # work rate of the job, not of this rank (under ElasticBSP a fast rank runs more steps)
        counts = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(counts)
        mean_steps = int(counts) / n
        ela.append(secs / mean_steps)
        period = max(1, round(mean_steps / merges))
        steps_per_merge.append(period)
        tavg = PeriodicModelAverager(period, 0)
        topt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), tavg)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(period * merges):  # torch averages at its first step: `merges` merges
            step(topt)
        per.append((time.perf_counter() - t0) / (period * merges))
    if rank == 0:
        results.put((rank, {f"step{n}": (statistics.median(per), statistics.median(ela),
                                         statistics.median(steps_per_merge), merges)}))
    else:
        results.put((rank, {}))
    dist.destroy_process_group()


def spawn(target, n, quick):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=target, args=(r, n, init, quick, q)) for r in range(n)]
        for pr in procs:
            pr.start()
        for _ in range(n):
            rank, out = q.get(timeout=900)
            got.update(out)
        for pr in procs:
            pr.join(60)
    return got


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    p.add_argument("--only", choices=("step", "ps", "sync"), help="one part only")
    args = p.parse_args()
    if args.only in (None, "step"):
        print("per training step, 1,001,000 parameters (Linear 1000x1000, batch 32), gloo,")
        print("PostLocalSGDOptimizer, torch's period = ElasticBSP's local steps per merge; time per")
        print("step = a block's time / the mean steps per rank (target: elastic at most 1.05x torch)")
        print(f"{'ranks':>5} {'merges':>7} {'period':>7} {'torch ms/step':>14} {'elastic ms/step':>16} "
              f"{'elastic/torch':>14}")
        for n in (4, 1):  # 1 rank: the bookkeeping alone, no waiting and no transfer
            per, ela, period, merges = spawn(step_overhead, n, args.quick)[f"step{n}"]
            print(f"{n:>5} {merges:>7} {period:>7} {per * 1e3:14.3f} {ela * 1e3:16.3f} {ela / per:14.3f}")
        if args.only == "step":
            return 0
        print()
    got = spawn(run, 2, args.quick)
    if args.only in (None, "ps"):
        print("parameter server round trip (push_pull, asp, no-op update) vs raw send/recv ping-pong")
        print(f"{'bytes':>10} {'raw us':>10} {'ours us':>10} {'raw/ours':>9} {'added us':>9}")
        for size in SIZES:
            raw, ours = got[("ps", size)]
            print(f"{size * 4:>10} {raw * 1e6:10.1f} {ours * 1e6:10.1f} {raw / ours:9.2f} {(ours - raw) * 1e6:9.1f}")
    if args.only in (None, "sync"):
        print("\nmodel averaging sync vs raw all_reduce + divide (2 ranks)")
        print(f"{'bytes':>10} {'raw us':>10} {'periodic':>10} {'ratio':>6} {'elastic':>10} {'ratio':>6}")
        for size in SIZES:
            raw, per, ela = got[("avg", size)]
            print(f"{size * 4:>10} {raw * 1e6:10.1f} {per * 1e6:10.1f} {raw / per:6.2f} {ela * 1e6:10.1f} {raw / ela:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
