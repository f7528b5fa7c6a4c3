#!/usr/bin/env python3
"""cadence.torch.DiLoCo under torchrun: a 2-layer MLP on ten Gaussian classes, every replica its
own shard, inner steps by SGD with momentum, the outer step by DiLoCo's Nesterov (lr 0.7,
momentum 0.9) on the averaged pseudo-gradient.

* --replica-size S: replica groups of S consecutive ranks (a node each under --nproc_per_node)
  run DDP inside; DiLoCo averages across them (cadence.torch.replica_groups' cross group).
  S = 1 (default): every rank is a replica of its own.
* --schedule fixed:<H> (default fixed:10), or a timed schedule: elastic:<R> (ElasticBSP's plan
  sets each replica's inner steps from the measured step times), lag:<H>:<s> (a faster replica
  runs up to s more steps) or quorum:<K>:<H>[...] (the outer step when K replicas are done; a late
  one's work counts later); the last replica is slower by --straggle seconds per step. Under a
  timed schedule the loop ends on DiLoCo's stop agreement, not on a step count, and a replica's
  ranks agree on one record (replica_group), so every cross group follows the same plan.
* --codec f32|bf16|fp16|int8|int4: how the pseudo-gradients travel (int8/int4 with error
  feedback).
* --check: after every outer step, every rank's global weights are compared with every other
  rank's (an all-gather over the world), and so are the model's weights (equal to the global
  ones: alpha 0, no delay) except under a quorum, where a left-out replica keeps its own local
  work: identical across replicas and within them, or the job fails.

    torchrun --standalone --nproc_per_node 4 examples/python/torchrun_diloco.py \\
        --replica-size 2 --schedule elastic:8 --codec int8 --check

Rank 0 prints one line: the schedule, the test accuracy, the inner and outer steps, the bytes
this rank sent in outer syncs, and the checks passed.
"""
import argparse
import datetime
import sys
import time

DIM, CLASSES = 32, 10


def data(torch, shard, shards, n=6000, seed=0):
    """Ten overlapping Gaussian classes; this shard of the training set, the test set."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, DIM, generator=g) * 0.5
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = centers[y] + torch.randn(n, DIM, generator=g)
    return x[:4000][shard::shards], y[:4000][shard::shards], x[4000:], y[4000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica-size", type=int, default=1, help="ranks per DDP replica group (default 1)")
    ap.add_argument("--schedule", default="fixed:10",
                    help="fixed:<H>, elastic:<R>, lag:<H>:<s> or quorum:<K>:<H>[...] (default fixed:10)")
    ap.add_argument("--codec", default="f32", help="f32, bf16, fp16, int8 or int4 (default f32)")
    ap.add_argument("--steps", type=int, default=200, help="inner steps per replica (default 200)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05, help="the inner SGD's learning rate")
    ap.add_argument("--straggle", type=float, default=0.0,
                    help="seconds the last replica sleeps per step (default 0)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one outer sync may take")
    ap.add_argument("--check", action="store_true", help="compare every rank's weights after each outer step")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cadence.torch as ct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = ct.replica_groups(args.replica_size)
    # a replica's ranks split its shard (DDP: each its part of the batch)
    x, y, xte, yte = data(torch, groups.index, groups.replicas)
    x, y = x[rank % groups.size::groups.size], y[rank % groups.size::groups.size]
    torch.manual_seed(groups.index)  # replicas start apart: DiLoCo's broadcast makes them equal
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
    net = DDP(model, process_group=groups.replica) if groups.size > 1 else model
    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    timed = not args.schedule.startswith("fixed")  # elastic, lag, quorum: plans from step times
    diloco = ct.DiLoCo(model, inner, schedule=args.schedule, codec=args.codec, process_group=groups.cross,
                       replica_group=groups.replica if timed and groups.size > 1 else None,
                       timeout=args.timeout)
    loss_fn = torch.nn.CrossEntropyLoss()
    slow = groups.index == groups.replicas - 1 and args.straggle > 0
    g = torch.Generator().manual_seed(rank)
    checks = 0
    t0 = time.perf_counter()
    while True:
        j = torch.randint(0, len(x), (args.batch // groups.size,), generator=g)
        loss_fn(net(x[j]), y[j]).backward()
        inner.step()
        inner.zero_grad()
        if slow:
            time.sleep(args.straggle)
        synced = diloco.step(stop=diloco.step_count >= args.steps) if timed else diloco.step()
        if synced and args.check:  # every rank after the same outer step (alpha 0, no delay)
            compared = [("global", diloco.global_parameters)]
            if not args.schedule.startswith("quorum"):
                compared.append(("model", list(model.parameters())))
            for name, tensors in compared:
                mine = torch.cat([p.detach().reshape(-1) for p in tensors])
                every = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(every, mine)
                bad = [r for r in range(world) if not torch.equal(every[r], every[0])]
                if bad:
                    sys.exit(f"rank {rank}: after outer step {diloco.outer_steps} the {name} weights of ranks "
                             f"{bad} differ from rank 0's")
            checks += 1
        if diloco.stopped if timed else diloco.step_count >= args.steps:
            break
    diloco.finish()
    with torch.no_grad():
        acc = float((model(xte).argmax(1) == yte).float().mean())
    seconds = time.perf_counter() - t0
    dist.barrier()
    if rank == 0:
        inside = f"DDP inside {groups.replicas} replica groups of {groups.size}" if groups.size > 1 else \
            f"{groups.replicas} replicas"
        checked = f", weights identical on all {world} ranks after {checks} outer steps" if args.check else ""
        print(f"diloco {diloco.schedule} codec {args.codec} ({inside}): accuracy {acc:.3f} in {seconds:.1f} s, "
              f"{diloco.step_count} inner steps, {diloco.outer_steps} outer steps, {diloco.bytes_sent} bytes "
              f"sent{checked}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
