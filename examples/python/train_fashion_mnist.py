#!/usr/bin/env python3
"""Fashion-MNIST on N processes under Cadence policies, through cadence.torch.

Each --policy spawns N processes joined by a gloo process group on this machine, trains a small
MLP on equal shards of the training set, and prints the wall time and the test accuracy:

* a parameter-server policy ("bsp", "asp", "ssp:3", "dssp:2:8", "elastic:15", any string
  cadence.make_controller accepts): rank 0 serves, ranks 1..N-1 are workers that push gradients
  and pull weights (cadence.torch.ParameterServer / PSWorker);
* "elastic-avg:R[:predictor][:variant]": ElasticBSP model averaging, every rank trains
  (cadence.torch.ElasticModelAverager with the config "elastic:R...");
* "periodic:k": model averaging every k local steps (cadence.torch.PeriodicModelAverager).

--straggle S makes the last rank sleep S seconds more per step, the case ElasticBSP is for.

    python3 examples/python/train_fashion_mnist.py --procs 4 \\
        --policy bsp --policy ssp:2 --policy elastic-avg:8 --policy periodic:4

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), or --data DIR holding
the four original .gz files.
"""
import argparse
import datetime
import gzip
import os
import sys
import tempfile
import time

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"
FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def load(data_dir):
    missing = [f for f in FILES if not os.path.exists(os.path.join(data_dir, f))]
    if missing:
        sys.exit(f"Fashion-MNIST not found in {data_dir} (missing {', '.join(missing)}): install "
                 "Debian's package dataset-fashion-mnist (apt install dataset-fashion-mnist) or "
                 "pass --data DIR with the four original .gz files")

    def read(name, offset):
        with gzip.open(os.path.join(data_dir, name), "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)

    xtr = read(FILES[0], 16).reshape(-1, 784).astype(np.float32) / 255.0
    ytr = read(FILES[1], 8).astype(np.int64)
    xte = read(FILES[2], 16).reshape(-1, 784).astype(np.float32) / 255.0
    yte = read(FILES[3], 8).astype(np.int64)
    return xtr, ytr, xte, yte


def make_model(torch):
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def accuracy(torch, model, xte, yte):
    with torch.no_grad():
        pred = model(torch.from_numpy(xte)).argmax(1)
        return float((pred == torch.from_numpy(yte)).float().mean())


def batches(torch, x, y, batch, seed):
    """An endless stream of shuffled minibatches of this shard."""
    g = np.random.default_rng(seed)
    while True:
        idx = g.permutation(len(x))
        for i in range(0, len(idx) - batch + 1, batch):
            j = idx[i:i + batch]
            yield torch.from_numpy(x[j]), torch.from_numpy(y[j])


def worker_main(rank, n, init_file, policy, args, results):
    import torch
    import torch.distributed as dist

    import cadence.torch as ct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=args.timeout))
    xtr, ytr, xte, yte = load(args.data)
    if args.train_limit:
        xtr, ytr = xtr[:args.train_limit], ytr[:args.train_limit]
    model = make_model(torch)
    loss_fn = torch.nn.CrossEntropyLoss()
    straggle = args.straggle if rank == n - 1 else 0.0
    t0 = time.perf_counter()
    report = {}

    if policy.startswith("elastic-avg:") or policy.startswith("periodic:"):
        shard = slice(rank, None, n)
        x, y = xtr[shard], ytr[shard]
        budget = args.epochs * (len(x) // args.batch)  # steps per rank in the epochs
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        if policy.startswith("elastic-avg:"):
            avg = ct.ElasticModelAverager("elastic:" + policy.split(":", 1)[1], timeout=args.timeout)
        else:
            avg = ct.PeriodicModelAverager(int(policy.split(":", 1)[1]), timeout=args.timeout)
        steps = 0
        for xb, yb in batches(torch, x, y, args.batch, seed=rank):
            s = time.perf_counter()
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
            if straggle:
                time.sleep(straggle)
            steps += 1
            if avg.step_done(time.perf_counter() - s):
                avg.sync(model.parameters())
                # Ranks run different step counts under ElasticBSP: they stop together, at the
                # barrier where all ranks' steps together reach the job's budget (global_steps
                # is the same on every rank), so every policy processes as many minibatches.
                if avg.global_steps >= n * budget:
                    break
        report.update(steps=steps, barriers=avg.barriers)
    else:
        if rank == 0:
            server = ct.ParameterServer(policy, model.parameters(), lr=args.lr,
                                        evict_after=args.evict_after)
            stats = server.run()
            ct.unflatten_into(model.parameters(), server.weights)
            report.update(pushes=sum(stats.pushes), parked=stats.parked,
                          max_staleness=max(stats.max_start_staleness),
                          evicted=[e.worker for e in stats.evictions])
        else:
            shard = slice(rank - 1, None, n - 1)
            x, y = xtr[shard], ytr[shard]
            worker = ct.PSWorker(model.parameters(), reply_timeout=args.timeout)
            worker.pull_into(model.parameters())
            stream = batches(torch, x, y, args.batch, seed=rank)
            for _ in range(args.epochs * (len(x) // args.batch)):
                xb, yb = next(stream)
                model.zero_grad()
                loss_fn(model(xb), yb).backward()
                if straggle:
                    time.sleep(straggle)
                worker.step(model.parameters())  # push the gradient, wait as the policy says
            worker.finish()
    seconds = time.perf_counter() - t0
    if rank == 0:
        report.update(seconds=seconds, accuracy=accuracy(torch, model, xte, yte))
        results.put(report)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", action="append", help="a policy (repeat for several); default: "
                   "bsp, ssp:2, elastic-avg:8, periodic:4")
    p.add_argument("--procs", type=int, default=4, help="processes (PS: 1 server + procs-1 workers)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--straggle", type=float, default=0.0,
                   help="seconds the last rank sleeps per step (a straggler)")
    p.add_argument("--train-limit", type=int, default=0, help="use only this many training images")
    p.add_argument("--evict-after", type=float, default=None, help="PS: evict a worker silent this long")
    p.add_argument("--timeout", type=float, default=120.0, help="bound on every wait, seconds")
    p.add_argument("--data", default=DATA)
    args = p.parse_args()
    policies = args.policy or ["bsp", "ssp:2", "elastic-avg:8", "periodic:4"]
    if args.procs < 2:
        sys.exit("--procs must be >= 2")
    load(args.data)  # fail early, naming the package, when the data is missing

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    print(f"{'policy':<18} {'seconds':>8} {'accuracy':>9}  details")
    for policy in policies:
        results = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            init = os.path.join(tmp, "rendezvous")
            procs = [ctx.Process(target=worker_main, args=(r, args.procs, init, policy, args, results))
                     for r in range(args.procs)]
            for pr in procs:
                pr.start()
            try:
                report = results.get(timeout=args.timeout * 4)
            except Exception:
                report = None
            for pr in procs:
                pr.join(timeout=30)
                if pr.is_alive():
                    pr.kill()
        if report is None or any(pr.exitcode for pr in procs):
            print(f"{policy:<18} failed (exit codes {[pr.exitcode for pr in procs]})")
            continue
        secs, acc = report.pop("seconds"), report.pop("accuracy")
        details = ", ".join(f"{k}={v}" for k, v in report.items())
        print(f"{policy:<18} {secs:8.2f} {acc:9.4f}  {details}", flush=True)


if __name__ == "__main__":
    main()
