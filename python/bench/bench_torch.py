"""What cadence.torch costs, measured on this machine over gloo, interleaved (ours, theirs, ours,
theirs, ...) as nccl-tests does, median of blocks:

1. per training step, on 2 and 4 processes and a 1M-parameter model, every variant through
   PostLocalSGDOptimizer: our PeriodicModelAverager against torch's at the same period;
   ElasticBSP against torch's at the period ElasticBSP chose in the same block; and DDP (a
   gradient all-reduce every step) beside them; target: at most 5% more time per step than
   torch's averager at an equal period;
2. one ParameterServer round trip (PSWorker.push_pull, policy "asp" and a no-op update, so the
   time is the protocol's) vs a raw send/recv ping-pong of the same bytes (2 processes);
3. one ElasticModelAverager.sync and one PeriodicModelAverager.sync vs one raw all_reduce of
   the same parameters (2 processes).

    python python/bench/bench_torch.py [--quick] [--only step|ps|sync] [--ranks 2,4] [--period 4]
"""
import argparse
import datetime
import os
import socket
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
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n,
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


VARIANTS = ("ddp", "torch", "ours", "elastic", "torch@elastic")


def step_overhead(rank, n, init, quick, results, period, merges):
    """Part 1: time per training step of each way of training, blocks interleaved in one run:
    DDP (a gradient all-reduce every step); torch's PeriodicModelAverager and ours at the same
    period, each through PostLocalSGDOptimizer; ElasticBSP through PostLocalSGDOptimizer, and
    torch's averager again at the period ElasticBSP chose in the same block."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging.averagers import \
        PeriodicModelAverager as TorchPeriodic
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cadence.torch as ct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    model = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters
    ddp_model = torch.nn.Linear(1000, 1000)  # DDP's own copy: its hooks stay on its parameters
    ddp = DDP(ddp_model)
    x = torch.randn(32, 1000)
    y = torch.randn(32, 1000)

    def step(opt, net, timed_by=None):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        if timed_by is not None:
            # ElasticBSP, told that every step of every rank takes as long: its plan is then a
            # fixed period (the ranks here are equally fast; a measured time would carry the
            # gaps between blocks and this machine's noise into the plan), so its cost is
            # compared with torch's at exactly the same period
            timed_by.step_done(1e-3)
        opt.step()

    merges = 4 if quick else merges
    blocks = 3 if quick else 15
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    tavg = TorchPeriodic(period, 0)
    topt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), tavg)
    oavg = ct.PeriodicModelAverager(period, 0, timeout=120)
    oopt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), oavg)
    eavg = ct.ElasticModelAverager(f"elastic:{period}", timeout=120)
    eopt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), eavg)
    while eavg.barriers < 6:  # ElasticBSP's warm-up (BSP until its predictor has a history)
        step(eopt, model, eavg)
    times = {v: [] for v in VARIANTS}
    chosen = []

    def timed(opt, net, steps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(opt, net)
        return (time.perf_counter() - t0) / steps

    for b in range(blocks):
        order = ["ddp", "torch", "ours", "elastic"]
        order = order[b % 4:] + order[:b % 4]  # every variant in every position
        for v in order:
            if v == "ddp":
                times[v].append(timed(ddp_opt, ddp, period * merges))
            elif v == "torch":
                times[v].append(timed(topt, model, period * merges))
            elif v == "ours":
                times[v].append(timed(oopt, model, period * merges))
            else:
                # as many steps as the others' blocks, then on to the next barrier
                dist.barrier()
                s0 = eavg.total_steps
                t0 = time.perf_counter()
                while eavg.total_steps - s0 < period * merges or eavg.local_steps:
                    step(eopt, model, eavg)
                secs = time.perf_counter() - t0
                # the job's work rate: every rank's steps (a fast rank runs more under ElasticBSP)
                counts = torch.tensor([eavg.total_steps - s0, eavg.barriers], dtype=torch.int64)
                dist.all_reduce(counts)
                mean_steps = int(counts[0]) / n
                times[v].append(secs / mean_steps)
                k = max(1, round(mean_steps * n / int(counts[1])))  # steps per barrier
                chosen.append(k)
                t = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3), TorchPeriodic(k, 0))
                times["torch@elastic"].append(timed(t, model, period * merges))
    if rank == 0:
        # absolute times: each variant's best block (this machine's other load only ever adds
        # time); ratios: the median over blocks of the ratio of two variants timed one after
        # the other, which cancels the load that drifts from block to block
        best = {v: min(ts) for v, ts in times.items()}
        paired = {f"{a}/{b}": statistics.median(x / y for x, y in zip(times[a], times[b]))
                  for a, b in (("ours", "torch"), ("elastic", "torch@elastic"), ("ours", "ddp"))}
        results.put((rank, {f"step{n}": (best, paired, statistics.median(chosen), merges)}))
    else:
        results.put((rank, {}))
    dist.destroy_process_group()


def spawn(target, n, quick, *extra):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        # a TCP store, as torchrun's: the averagers count arrivals in the group's store, and a
        # FileStore (file://) rewrites a growing file at every count, a cost no real job pays
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        init = f"tcp://127.0.0.1:{port}"
        procs = [ctx.Process(target=target, args=(r, n, init, quick, q) + extra) for r in range(n)]
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
    p.add_argument("--ranks", default="2,4", help="process counts of part 1 (default 2,4)")
    p.add_argument("--period", type=int, default=4, help="the averagers' period in part 1 (default 4)")
    p.add_argument("--merges", type=int, default=16,
                   help="a block's steps in part 1: period x merges (default 16)")
    args = p.parse_args()
    if args.only in (None, "step"):
        import torch

        print(f"torch {torch.__version__}; per training step, 1,001,000 parameters (Linear 1000x1000, "
              "batch 32), gloo,")
        print(f"one thread per rank; each averager through PostLocalSGDOptimizer; period {args.period} "
              f"(torch's and ours); ElasticBSP elastic:{args.period} with equal step times (its plan is")
        print("then a fixed period k), torch's averager beside it at k (torch@k). ms per step: each "
              "variant's best block (a block's time / the mean steps per rank); ratios: the median "
              "over blocks of two variants timed one after the other")
        print(f"{'ranks':>5} {'ddp':>8} {'torch':>8} {'ours':>8} {'ours/torch':>10} {'elastic':>8} "
              f"{'k':>3} {'torch@k':>8} {'elastic/torch@k':>15} {'ours/ddp':>8}")
        for n in [int(r) for r in args.ranks.split(",")]:
            best, ratio, k, merges = spawn(step_overhead, n, args.quick, args.period, args.merges)[f"step{n}"]
            print(f"{n:>5} {best['ddp'] * 1e3:8.2f} {best['torch'] * 1e3:8.2f} {best['ours'] * 1e3:8.2f} "
                  f"{ratio['ours/torch']:10.3f} {best['elastic'] * 1e3:8.2f} {k:>3.0f} "
                  f"{best['torch@elastic'] * 1e3:8.2f} {ratio['elastic/torch@elastic']:15.3f} "
                  f"{ratio['ours/ddp']:8.3f}", flush=True)
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
