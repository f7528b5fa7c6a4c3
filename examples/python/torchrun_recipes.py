#!/usr/bin/env python3
"""cadence.torch's recipes under torchrun, one small job each (a 2-layer MLP on ten Gaussian
classes, every rank its own shard, the last rank slower by --straggle seconds per step):

* hierarchy: replica groups of --replica-size ranks (a node each under --nproc_per_node) run DDP
  inside (FSDP2's fully_shard with --fsdp, torch 2.x), and ElasticBSP averages across them;
* hook: torch's post-local SGD recipe with Cadence's periodic averager as DDP's communication
  hook (no no_sync() in the loop), through PostLocalSGDOptimizer;
* restart: ElasticBSP with a checkpoint per rank in --checkpoint-dir at every --save-every
  barriers; started again, a job resumes from it (run it with --stop-at B, then again);
* ps-restart: a BSP parameter server (rank 0) and its workers, checkpointed the same way (the
  server every --save-every rounds, from its observer; each worker after every push).

    torchrun --standalone --nproc_per_node 4 examples/python/torchrun_recipes.py \\
        [--recipe hierarchy --recipe hook --recipe restart --recipe ps-restart] [--fsdp]

Rank 0 prints one line per recipe: its test accuracy and what the recipe did.
"""
import argparse
import datetime
import os
import sys
import time

RECIPES = ("hierarchy", "hook", "restart", "ps-restart")
DIM, CLASSES = 32, 10


def data(torch, rank, world, n=6000, seed=0):
    """Ten overlapping Gaussian classes; this rank's training shard, the test set."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(CLASSES, DIM, generator=g) * 0.5
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = centers[y] + torch.randn(n, DIM, generator=g)
    return x[:4000][rank::world], y[:4000][rank::world], x[4000:], y[4000:]


def make_model(torch):
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))


def accuracy(torch, model, xte, yte):
    with torch.no_grad():
        return float((model(xte).argmax(1) == yte).float().mean())


class Shard:
    """Endless minibatches of this rank's shard, and the straggler's sleep."""

    def __init__(self, torch, x, y, batch, seed, straggle):
        self.torch, self.x, self.y, self.batch, self.straggle = torch, x, y, batch, straggle
        self.g = torch.Generator().manual_seed(seed)
        self.pos, self.order = 0, torch.randperm(len(x), generator=self.g)

    def next(self):
        if self.pos + self.batch > len(self.order):
            self.pos, self.order = 0, self.torch.randperm(len(self.x), generator=self.g)
        j = self.order[self.pos:self.pos + self.batch]
        self.pos += self.batch
        if self.straggle:
            time.sleep(self.straggle)
        return self.x[j], self.y[j]


def hierarchy(torch, args, rank, world, shard, loss_fn):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cadence.torch as ct

    model = make_model(torch)
    groups = ct.replica_groups(args.replica_size)
    if args.fsdp:  # FSDP2 shards inside each replica group; the averager merges shard by shard
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (groups.replicas, groups.size), mesh_dim_names=("replicate", "shard"))
        fully_shard(model, mesh=mesh["shard"])
        net, cross, replica = model, mesh.get_group("replicate"), mesh.get_group("shard")
    else:
        net, cross, replica = DDP(model, process_group=groups.replica), groups.cross, groups.replica
    avg = ct.ElasticModelAverager(f"elastic:{args.lookahead}", process_group=cross, replica_group=replica,
                                  module=net, timeout=args.timeout)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    while True:
        x, y = shard.next()
        with avg.local_step(net):  # nothing to turn off: DDP or FSDP sync inside the group
            loss_fn(net(x), y).backward()
        opt.step()
        opt.zero_grad()
        if avg.step_done() and avg.sync(model, stop=avg.global_steps >= args.steps):
            break
    if args.fsdp:  # the whole parameters on every rank, for the evaluation
        full = make_model(torch)
        with torch.no_grad():
            for p, q in zip(full.parameters(), model.parameters()):
                p.copy_(q.full_tensor())
        model = full
    dist.barrier()
    return model, (f"{groups.replicas} replica groups of {groups.size} ({'FSDP2' if args.fsdp else 'DDP'} "
                   f"inside), {avg.barriers} merges across")


def hook(torch, args, rank, world, shard, loss_fn):
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    import cadence.torch as ct

    model = make_model(torch)
    ddp = DDP(model, **ct.no_buffer_sync())
    avg = ct.PeriodicModelAverager(args.period, args.warmup, module=ddp, timeout=args.timeout)
    avg.register_comm_hook(ddp)  # gradient all-reduce in the warm-up only; no no_sync() below
    opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9), avg)
    for _ in range(args.steps // world):
        x, y = shard.next()
        loss_fn(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model, f"{args.warmup} DDP steps, then {avg.barriers} merges every {args.period}"


def restart(torch, args, rank, world, shard, loss_fn):
    import torch.distributed as dist

    import cadence.torch as ct

    model = make_model(torch)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    avg = ct.ElasticModelAverager(f"elastic:{args.lookahead}", module=model, timeout=args.timeout)
    path = os.path.join(args.checkpoint_dir, f"elastic-rank{rank}.pt")
    resumed = None
    if os.path.exists(path):  # every rank saved at the same barrier: resume there
        sd = load(torch, path)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optimizer"])
        avg.load_state_dict(sd["averager"])
        resumed = avg.barriers
    while True:
        x, y = shard.next()
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if avg.step_done():
            stop = avg.sync(model, stop=avg.global_steps >= args.steps)
            if stop:
                break
            if avg.barriers % args.save_every == 0:  # every rank at the same barrier
                torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict(),
                                averager=avg.state_dict()), path)
            if avg.barriers == args.stop_at:
                return None, f"stopped at barrier {avg.barriers} (--stop-at)"
    if os.path.exists(path):
        os.remove(path)  # the job is done: a new one starts fresh
    dist.barrier()
    how = "started fresh" if resumed is None else f"resumed at barrier {resumed}"
    return model, f"{how}, stopped at barrier {avg.barriers}"


def ps_restart(torch, args, rank, world, shard, loss_fn):
    import torch.distributed as dist

    import cadence.torch as ct

    model = make_model(torch)
    params = list(model.parameters())
    path = os.path.join(args.checkpoint_dir, f"ps-rank{rank}.pt")
    sd = load(torch, path) if os.path.exists(path) else None
    stopping = args.stop_at > 0
    if rank == 0:
        def save(kind, worker, _):  # on the serving thread, between two pushes
            # under BSP, every save_every rounds (a round ends at its last push)
            if kind == "pushed" and sum(server.stats.pushes) % (args.save_every * (world - 1)) == 0:
                torch.save(dict(server=server.state_dict()), path)
        server = ct.ParameterServer("bsp", params, lr=args.lr, observer=save)
        if sd is not None:
            server.load_state_dict(sd["server"])
        resumed = sum(server.stats.pushes) if sd is not None else None
        server.run()
        ct.unflatten_into(params, server.weights)
        detail = f"{sum(server.stats.pushes)} pushes in all, resumed workers {server.stats.resumed}"
    else:
        worker = ct.PSWorker(params, reply_timeout=args.timeout)
        if sd is not None:
            worker.load_state_dict(sd["worker"])
        resumed = worker.iteration if sd is not None else None
        worker.pull_into(params)
        while worker.iteration < args.steps // (world - 1) and worker.iteration != args.stop_at:
            x, y = shard.next()
            model.zero_grad()
            loss_fn(model(x), y).backward()
            worker.step(params)
            torch.save(dict(worker=worker.state_dict()), path)
        worker.finish()  # (a killed job would not say goodbye; the server's checkpoint predates it)
        detail = f"worker at iteration {worker.iteration}"
    dist.barrier()
    if not stopping and os.path.exists(path):
        os.remove(path)  # the job is done: a new one starts fresh
    how = "started fresh" if resumed is None else f"resumed at {resumed} pushes"
    return (None if stopping else model), f"{how}, {detail}"


def load(torch, path):
    """A checkpoint of plain data and tensors: torch.load(weights_only=True) on torch 2 (the
    default from 2.6); 1.13's weights_only cannot read a float (an optimizer's lr)."""
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(path, weights_only=True)
    return torch.load(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", action="append", choices=RECIPES, help=f"repeat; default {' '.join(RECIPES)}")
    p.add_argument("--steps", type=int, default=400, help="steps of all ranks together per recipe")
    p.add_argument("--lookahead", type=int, default=8, help="ElasticBSP's R")
    p.add_argument("--period", type=int, default=4, help="the periodic averager's period (hook)")
    p.add_argument("--warmup", type=int, default=8, help="DDP steps before local SGD (hook)")
    p.add_argument("--replica-size", type=int, default=2, help="ranks per replica group (hierarchy)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 inside the replica groups (torch 2.x)")
    p.add_argument("--checkpoint-dir", default="cadence-checkpoints", help="restart: where to save")
    p.add_argument("--save-every", type=int, default=5, help="restart: barriers (iterations) between saves")
    p.add_argument("--stop-at", type=int, default=-1, help="restart: stop (as if killed) at this barrier")
    p.add_argument("--straggle", type=float, default=0.002, help="seconds the last rank sleeps per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--timeout", type=float, default=120.0, help="bound on every collective, seconds")
    args = p.parse_args()

    import torch
    import torch.distributed as dist

    if "RANK" not in os.environ:
        sys.exit("run me under torchrun: torchrun --standalone --nproc_per_node 4 " + sys.argv[0])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout))
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    x, y, xte, yte = data(torch, rank, world)
    loss_fn = torch.nn.CrossEntropyLoss()
    run = {"hierarchy": hierarchy, "hook": hook, "restart": restart, "ps-restart": ps_restart}
    for recipe in args.recipe or RECIPES:
        shard = Shard(torch, x, y, args.batch, rank, args.straggle if rank == world - 1 else 0.0)
        t0 = time.perf_counter()
        model, detail = run[recipe](torch, args, rank, world, shard, loss_fn)
        if rank == 0:
            score = f"accuracy {accuracy(torch, model, xte, yte):.3f}" if model is not None else "stopped"
            print(f"{recipe:<11} {score:<14} {time.perf_counter() - t0:6.2f} s  {detail}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
