"""What cadence.torch costs over the raw torch.distributed calls it makes, on 2 gloo processes
on this machine, interleaved (raw, ours, raw, ours, ...) as nccl-tests does, median of blocks:

1. one ParameterServer round trip (PSWorker.push_pull, policy "asp" and a no-op update, so the
   time is the protocol's) vs a raw send/recv ping-pong of the same bytes;
2. one ElasticModelAverager.sync and one PeriodicModelAverager.sync vs one raw all_reduce of
   the same parameters.

    python python/bench/bench_torch.py [--quick]
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = p.parse_args()
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=run, args=(r, 2, init, args.quick, q)) for r in range(2)]
        for pr in procs:
            pr.start()
        got = {}
        for _ in range(2):
            rank, out = q.get(timeout=600)
            got.update(out)
        for pr in procs:
            pr.join(60)
    print("parameter server round trip (push_pull, asp, no-op update) vs raw send/recv ping-pong")
    print(f"{'bytes':>10} {'raw us':>10} {'ours us':>10} {'raw/ours':>9} {'added us':>9}")
    for size in SIZES:
        raw, ours = got[("ps", size)]
        print(f"{size * 4:>10} {raw * 1e6:10.1f} {ours * 1e6:10.1f} {raw / ours:9.2f} {(ours - raw) * 1e6:9.1f}")
    print("\nmodel averaging sync vs raw all_reduce + divide (2 ranks)")
    print(f"{'bytes':>10} {'raw us':>10} {'periodic':>10} {'ratio':>6} {'elastic':>10} {'ratio':>6}")
    for size in SIZES:
        raw, per, ela = got[("avg", size)]
        print(f"{size * 4:>10} {raw * 1e6:10.1f} {per * 1e6:10.1f} {raw / per:6.2f} {ela * 1e6:10.1f} {raw / ela:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
