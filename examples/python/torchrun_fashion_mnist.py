#!/usr/bin/env python3
"""Time to 80% test accuracy on Fashion-MNIST under three ways of training one small CNN with
torchrun: DDP (BSP: a gradient all-reduce every step), torch's post-local SGD (DDP's warm-up,
then local steps and torch's PeriodicModelAverager) and Cadence's ElasticBSP averager (local
steps under DDP's no_sync(), merges where the plan puts them, BatchNorm statistics merged too).

    torchrun --standalone --nproc_per_node 4 examples/python/torchrun_fashion_mnist.py \\
        [--policy ddp --policy torch-periodic:8 --policy elastic:8] [--straggle 0.02]

One script for CPU and GPU: each rank takes cuda:<LOCAL_RANK> when CUDA is there (NCCL when
every local rank has a GPU of its own, else gloo with CUDA tensors), else the CPU and gloo;
--device and --backend override. The process group comes from torchrun's environment (env://).
Each policy starts from the same weights (cadence.torch.broadcast_parameters from rank 0) and
trains until the test accuracy, measured every --eval-every steps per rank on the model every
rank then holds, reaches --target; evaluation time is not counted. --straggle S makes the last
rank sleep S seconds per step. Rank 0 prints one table row per policy.

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist) or --data DIR with the
four original .gz files; --synthetic trains on generated data instead (for a smoke run where the
data set is missing). --smoke: a few steps per policy, only to check that everything runs.
"""
import argparse
import contextlib
import datetime
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_fashion_mnist import DATA, load  # noqa: E402  (the same loader as the mp.spawn example)

POLICIES = ("ddp", "torch-periodic:8", "elastic:8")


def make_model(torch):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 8, 5, padding=2), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


def synthetic(n_train, n_test, seed=0):
    """Ten Gaussian classes in image shape, learnable to well above 80%."""
    g = np.random.default_rng(seed)
    centers = g.normal(0, 1, (10, 784)).astype(np.float32)

    def draw(n):
        y = g.integers(0, 10, n)
        return (centers[y] + g.normal(0, 2.0, (n, 784)).astype(np.float32)), y.astype(np.int64)

    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    return xtr, ytr, xte, yte


class Run:
    """One policy on this rank: the model, the optimizer, the clock that leaves evaluation out."""

    def __init__(self, torch, args, device, policy):
        self.torch, self.args, self.device, self.policy = torch, args, device, policy
        self.start = time.perf_counter()
        self.paused = 0.0
        self.steps = 0

    def sync_device(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def seconds(self):
        self.sync_device()
        return time.perf_counter() - self.start - self.paused

    def evaluate(self, model, xte, yte, rank, world, deadline_hit):
        """Test accuracy of `model` over the whole test set (each rank scores its share; one
        all-reduce), and whether any rank is past the time budget. Not counted in the time."""
        torch = self.torch
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            x, y = xte[rank::world], yte[rank::world]
            correct = 0
            for i in range(0, len(x), 1000):
                xb = torch.from_numpy(x[i:i + 1000]).to(self.device).view(-1, 1, 28, 28)
                correct += int((model(xb).argmax(1).cpu() == torch.from_numpy(y[i:i + 1000])).sum())
        model.train()
        t = torch.tensor([correct, len(x), 1.0 if deadline_hit else 0.0], dtype=torch.float64,
                         device=self.device if self.args.backend_name == "nccl" else "cpu")
        torch.distributed.all_reduce(t)
        self.sync_device()
        self.paused += time.perf_counter() - t0
        return float(t[0] / t[1]), bool(t[2] > 0)


def train_policy(torch, args, policy, data, rank, world, device):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cadence.torch as ct

    xtr, ytr, xte, yte = data
    x, y = xtr[rank::world], ytr[rank::world]
    model = make_model(torch).to(device)
    ct.broadcast_parameters(model, src=0)  # one starting point (DDP would broadcast it as well)
    ids = [device.index] if device.type == "cuda" else None
    loss_fn = torch.nn.CrossEntropyLoss()
    straggle = args.straggle if rank == world - 1 else 0.0
    g = np.random.default_rng(rank)
    order = g.permutation(len(x))
    pos = 0

    def batch():
        nonlocal order, pos
        if pos + args.batch > len(order):
            order, pos = g.permutation(len(x)), 0
        j = order[pos:pos + args.batch]
        pos += args.batch
        return (torch.from_numpy(x[j]).to(device, non_blocking=True).view(-1, 1, 28, 28),
                torch.from_numpy(y[j]).to(device, non_blocking=True))

    run = Run(torch, args, device, policy)
    reached, acc, merges = None, 0.0, 0
    every = args.eval_every

    def checkpoint(net):
        """At a point where every rank holds the same model: evaluate; True to stop."""
        nonlocal reached, acc
        over = run.seconds() > args.max_seconds or run.steps >= args.max_steps
        acc, any_over = run.evaluate(net, xte, yte, rank, world, over)
        if reached is None and acc >= args.target:
            reached = run.seconds()
        return reached is not None or any_over

    def step(net, opt, context=contextlib.nullcontext):
        """One step of this rank: a batch, forward and backward (inside context()), the
        optimizer, the straggler's sleep."""
        xb, yb = batch()
        with context():
            loss_fn(net(xb), yb).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if straggle:
            time.sleep(straggle)
        run.steps += 1

    if policy == "ddp":
        net = DDP(model, device_ids=ids)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
        while True:
            step(net, opt)
            if run.steps % every == 0 and checkpoint(model):
                break
        merges = run.steps
    elif policy.startswith("torch-periodic:"):
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer
        period = int(policy.split(":", 1)[1])
        warmup = args.warmup
        net = DDP(model, device_ids=ids)
        # torch's recipe: DDP all-reduces the gradients for `warmup` steps, then nothing (no
        # intra-node all-reduce either), and the averager merges every `period` steps.
        net.register_comm_hook(PostLocalSGDState(None, None, warmup, post_local_gradient_allreduce=False),
                               post_localSGD_hook)
        opt = PostLocalSGDOptimizer(torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9),
                                    PeriodicModelAverager(period, warmup))
        next_eval = every
        while True:
            step(net, opt)
            s = run.steps - 1  # the step just taken, counted from 0 as torch counts
            averaged = s >= warmup and (s - warmup) % period == 0
            merges += averaged
            # evaluate where every rank holds the same parameters: in the warm-up (DDP) or
            # right after a merge
            if run.steps >= next_eval and (s < warmup or averaged):
                next_eval = run.steps + every
                if checkpoint(model):
                    break
    elif policy.startswith("elastic:") or policy.startswith("cadence-periodic:"):
        net = DDP(model, device_ids=ids, **ct.no_buffer_sync())  # the averager merges buffers
        opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
        if policy.startswith("elastic:"):
            avg = ct.ElasticModelAverager(policy, module=net, timeout=args.timeout)
        else:
            avg = ct.PeriodicModelAverager(int(policy.split(":", 1)[1]), args.warmup, module=net,
                                           timeout=args.timeout)
        next_check = every * world
        while True:
            step(net, opt, lambda: avg.local_step(net))  # no_sync(): no all-reduce, no collective
            if avg.step_done():  # timed on the device (CUDA events) when it is a GPU
                avg.sync(net)
                # ranks run their own step counts: checkpoints go by the steps of all ranks
                # together, which every rank knows alike after a barrier
                if avg.global_steps >= next_check:
                    next_check += every * world
                    if checkpoint(model):
                        break
        merges = avg.barriers
    else:
        raise SystemExit(f"unknown policy {policy!r} (ddp, torch-periodic:K, elastic:R[...], "
                         "cadence-periodic:K)")
    total = torch.tensor([run.steps], dtype=torch.int64,
                         device=device if args.backend_name == "nccl" else "cpu")
    dist.all_reduce(total)
    return dict(reached=reached, accuracy=acc, seconds=run.seconds(), steps=int(total),
                merges=merges)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", action="append",
                   help="ddp | torch-periodic:K | elastic:R[:predictor][:variant] | cadence-periodic:K "
                        f"(repeat; default {' '.join(POLICIES)})")
    p.add_argument("--target", type=float, default=0.8, help="test accuracy to reach")
    p.add_argument("--straggle", type=float, default=0.0, help="seconds the last rank sleeps per step")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--warmup", type=int, default=20, help="DDP steps before local SGD (torch-periodic)")
    p.add_argument("--eval-every", type=int, default=20, help="steps per rank between evaluations")
    p.add_argument("--max-steps", type=int, default=3000, help="steps per rank before giving up")
    p.add_argument("--max-seconds", type=float, default=300.0, help="seconds before giving up")
    p.add_argument("--test-limit", type=int, default=10000, help="test images used")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    p.add_argument("--timeout", type=float, default=120.0, help="bound on every collective, seconds")
    p.add_argument("--data", default=DATA)
    p.add_argument("--synthetic", action="store_true", help="generated data instead of Fashion-MNIST")
    p.add_argument("--smoke", action="store_true", help="a few steps per policy, to check it runs")
    args = p.parse_args()
    if args.smoke:
        args.max_steps, args.eval_every, args.test_limit, args.warmup = 12, 4, 1000, 4

    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        sys.exit("run me under torchrun: torchrun --standalone --nproc_per_node 4 " + sys.argv[0])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    use_cuda = (args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()))
    if use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if args.backend == "auto":
        # NCCL needs a GPU per rank; ranks sharing a GPU use gloo, which takes CUDA tensors too
        own_gpu = use_cuda and local_world <= torch.cuda.device_count()
        args.backend_name = "nccl" if own_gpu and dist.is_nccl_available() else "gloo"
    else:
        args.backend_name = args.backend
    dist.init_process_group(args.backend_name, init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout))

    if args.synthetic:
        data = synthetic(12000, 2000)
    else:
        xtr, ytr, xte, yte = load(args.data)
        mean, std = 0.2860, 0.3530
        data = ((xtr - mean) / std, ytr, (xte - mean) / std, yte)
    if args.test_limit:
        data = (data[0], data[1], data[2][:args.test_limit], data[3][:args.test_limit])

    if rank == 0:
        print(f"{world} ranks, {device.type}, {args.backend_name}, straggle {args.straggle:g} s, "
              f"target {args.target:.0%}, batch {args.batch} per rank", flush=True)
        print(f"{'policy':<20} {'s to target':>11} {'accuracy':>9} {'steps':>7} {'merges':>7}", flush=True)
    for policy in args.policy or POLICIES:
        r = train_policy(torch, args, policy, data, rank, world, device)
        if rank == 0:
            got = f"{r['reached']:11.2f}" if r["reached"] is not None else f"{'not reached':>11}"
            print(f"{policy:<20} {got} {r['accuracy']:9.3f} {r['steps']:7d} {r['merges']:7d}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
