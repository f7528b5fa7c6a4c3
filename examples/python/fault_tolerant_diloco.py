"""A torch DiLoCo job that survives the loss of any process, over cadence.membership.

Each process trains its own replica of a small model with an inner optimizer (SGD with
momentum) and takes an outer step with the others every --period inner steps through
cadence.torch.FaultTolerantDiLoCo: the module's parameters are staged in one float32 CPU
array, whose pseudo-gradient the outer optimizer (--outer, Nesterov by default) applies in a
transaction over ZeroMQ; a process lost during it drops out and the others run it again
without its pseudo-gradient. A replacement started with --join takes a lost rank's slot and
receives the global weights, the outer optimizer's state and the inner optimizer's momentum
from a member; nothing is read from a checkpoint.

One process (rank 0 writes the rendezvous address to the shared file, the others read it; the
job secret from $CADENCE_JOB_SECRET, 64 hex digits):

    python fault_tolerant_diloco.py --rank R --size N --rendezvous-file /shared/job.addr
    python fault_tolerant_diloco.py --rank R --size N --rendezvous-file /shared/job.addr --join

Every process leaves its loop on an agreed stop (FaultTolerantDiLoCo.should_stop: true on
every process after the same outer sync), which one process asks for: the quorum's lowest rank
once the next outer step is the --steps-th (with --want K, not before the quorum has had K
members again, a replacement in, for 2 outer steps), or any process that receives SIGTERM (a
scheduler's preemption) at once. The others stop because it asked, not by counting. --holder
(rank 0 only holds the rendezvous), a replica of several processes under torchrun, and the
JSON lines (start, sync, reconfig, done) are as in fault_tolerant_averaging.py, whose process
harness this example uses.

The demonstration on this machine (--demo): starts --size processes on loopback; with --kill R,
rank R kills itself (SIGKILL) once --kill-after outer steps are applied (a process of replica R
other than its first with --replica-ranks), and a replacement takes its slot (not rank 0's
without --holder: rank 0 holds the rendezvous, so the others go on without it); with --term R,
the demo sends rank R SIGTERM once it reported --term-after outer steps, and every process
stops after the same outer step (give a large --steps); with --fragments F --delay D (streaming
DiLoCo: each fragment's exchange overlaps the next D inner steps), --kill's rank dies with a
fragment's exchange in flight. Prints one JSON object: whether every
process ended with the same weights and global hash, the outer and inner steps of each, the
state the replacement received. Exit status 0 when every process ended with the same weights.

    python examples/python/fault_tolerant_diloco.py --demo --size 3
    python examples/python/fault_tolerant_diloco.py --demo --size 3 --kill 1
    python examples/python/fault_tolerant_diloco.py --demo --size 3 --kill 0 --holder
    python examples/python/fault_tolerant_diloco.py --demo --size 2 --steps 1000 --term 1 --term-after 2
    python examples/python/fault_tolerant_diloco.py --demo --size 3 --fragments 2 --delay 1 --kill 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import signal
import sys
import tempfile
import time

# The process harness (JSON lines, the holder, torchrun replicas) is the averaging example's.
from fault_tolerant_averaging import Proc, emit, init_replica_group, run_holder, torchrun_args


#: With --want, the outer steps every process takes with the full quorum before it leaves (the
#: replacement trains too).
WITH_ALL = 2


def run_rank(a: argparse.Namespace) -> int:
    if a.holder and a.rank == 0:
        return run_holder(a)
    import torch

    import cadence.membership as membership
    import cadence.torch as ct

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    group, first, restarted, net, local = None, True, False, model, 0
    if "LOCAL_RANK" in os.environ:  # a replica of several processes, DDP inside it
        import torch.distributed as dist

        init_replica_group()
        group, first, local = dist.group.WORLD, dist.get_rank() == 0, dist.get_rank()
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        net = torch.nn.parallel.DistributedDataParallel(model)
    join = a.join or restarted
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    member = None
    if first:
        member = membership.Member(a.rank, a.size, rendezvous_file=a.rendezvous_file, insecure=a.insecure,
                                   heartbeat=a.heartbeat, join_timeout=a.join_timeout, holder=a.holder)
        member.on_change(lambda c: emit(event="reconfig", rank=a.rank, members=c["after"]["ranks"],
                                        lost=c["lost"], admitted=c["admitted"], step=c["committed"]))
    config = f"fixed:{a.period},outer={a.outer}"
    if a.fragments != 1 or a.delay != 0:  # streaming DiLoCo: each fragment's exchange overlaps --delay steps
        config += f",fragments={a.fragments},delay={a.delay}"
    outer = ct.FaultTolerantDiLoCo(model, member, opt, config, replica_group=group)
    # A scheduler's SIGTERM (preemption): this process asks, and every process stops after the
    # same outer sync (the handler runs between Python calls, never inside a sync). Once the
    # loop is left the stop is agreed: a later SIGTERM has nothing to add.
    looping = [True]
    signal.signal(signal.SIGTERM, lambda signum, frame: outer.request_stop() if looping[0] else None)
    outer.join() if join else outer.start()
    pids = [os.getpid()]
    if group is not None:
        pids = [None] * dist.get_world_size()
        dist.all_gather_object(pids, os.getpid())
    if first:
        emit(event="start", rank=a.rank, join=join, members=outer.quorum["ranks"], outer_steps=outer.outer_steps,
             pids=pids)
    # The victim (the replica's second process with --replica-ranks) dies at a known outer step
    # (with --delay, at the first inner step after it with a fragment's exchange in flight).
    dies = a.die_at is not None and not join and local == (1 if group is not None else 0)
    g = torch.Generator().manual_seed(1000 + a.rank + 100 * int(join) + 10000 * local)  # each its own data
    target = torch.linspace(-1, 1, 8)
    # With --want: the outer step since which the quorum has had --want members (None while
    # it has fewer); equal on every member, the replacement included, as the quorum is.
    full_since = outer.outer_steps if len(outer.quorum["ranks"]) >= a.want else None

    def ask_when_due() -> None:
        # The quorum's lowest rank asks once the next outer step is the last by count (the
        # request goes into that step's sync); if it is lost first, the next lowest asks.
        last = outer.outer_steps + 1
        if (first and outer.quorum["ranks"][0] == a.rank and last >= a.steps and full_since is not None
                and last >= full_since + WITH_ALL):
            outer.request_stop()

    ask_when_due()
    while not outer.should_stop:
        if dies and outer.outer_steps == a.die_at and (a.delay == 0 or outer.in_flight):
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(64, 8, generator=g)
        y = (x @ target).unsqueeze(1) + 0.01 * torch.randn(64, 1, generator=g)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        report = outer.step()
        if report is not None:
            full = len(outer.quorum["ranks"]) >= a.want
            full_since = (outer.outer_steps if full_since is None else full_since) if full else None
            ask_when_due()
        if report is not None and first:
            emit(event="sync", rank=a.rank, outer_steps=outer.outer_steps, outcome=report["outcome"],
                 members=outer.quorum["ranks"], loss=round(float(loss.detach()), 6))
    looping[0] = False
    outer.finish()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]
    momentum = all(opt.state[p].get("momentum_buffer") is not None for p in model.parameters())
    replica = [(digest, momentum)]
    if group is not None:
        replica = [None] * dist.get_world_size()
        dist.all_gather_object(replica, (digest, momentum))
    if first:
        emit(event="done", rank=a.rank, outer_steps=outer.outer_steps, inner_steps=outer.inner_steps,
             members=outer.quorum["ranks"], hash=f"{member.state_hash:016x}",
             global_hash=f"{outer.global_hash:016x}", weights=digest, stats=member.stats(),
             replica_same=len({d for d, _ in replica}) == 1, momentum=all(m for _, m in replica))
        member.close()
    if group is not None:
        dist.destroy_process_group()
    return 0


def demo(a: argparse.Namespace) -> int:
    if a.kill is not None and not 0 <= a.kill < a.size:
        raise SystemExit(f"--kill {a.kill} is not a rank of --size {a.size}")
    if a.kill is not None and not 0 <= a.kill_after < a.steps:
        raise SystemExit(f"--kill-after {a.kill_after} must be below --steps {a.steps} (the kill comes mid-run)")
    if a.term is not None and not 0 <= a.term < a.size:
        raise SystemExit(f"--term {a.term} is not a rank of --size {a.size}")
    if a.term is not None and (a.kill is not None or a.replica_ranks > 1):
        raise SystemExit("--term goes without --kill and --replica-ranks (one process per replica)")
    first = 1 if a.holder else 0  # with --holder, rank 0 holds the rendezvous and replica i is rank i + 1
    killed = a.kill + first if a.kill is not None else None
    replace = killed is not None and killed != 0
    if a.replica_ranks > 1 and killed == 0:
        raise SystemExit("--replica-ranks: --kill 0 would restart replica 0, whose first rank holds the "
                         "rendezvous: kill another replica, or give --holder")
    deadline = time.monotonic() + a.bound
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rendezvous")
        env = dict(os.environ, CADENCE_JOB_SECRET=secrets.token_hex(32))
        # With a replacement coming, nobody leaves before it is in (the quorum full again).
        base = [sys.executable, os.path.abspath(__file__), "--size", str(a.size + first), "--rendezvous-file", path,
                "--steps", str(a.steps), "--period", str(a.period), "--outer", a.outer,
                "--fragments", str(a.fragments), "--delay", str(a.delay),
                "--heartbeat", str(a.heartbeat), "--want", str(a.size if replace else 0)]
        base += ["--holder"] if a.holder else []

        def argv(r: int) -> list[str]:
            own = ["--rank", str(r)] + (["--die-at", str(a.kill_after)] if r == killed else [])
            if a.replica_ranks == 1:
                return base + own
            return base[:1] + torchrun_args(a.replica_ranks, r) + base[1:] + own

        holder = [Proc(base + ["--rank", "0"], env)] if a.holder else []
        procs = {r: Proc(argv(r), env) for r in range(first, a.size + first)}
        killed_at = None
        try:
            if a.term is not None:  # SIGTERM once it reported --term-after outer steps
                termed = procs[a.term + first]
                termed.wait_for(lambda e: e["event"] == "sync" and e["outer_steps"] >= a.term_after, deadline)
                termed.p.send_signal(signal.SIGTERM)
            if killed is not None:
                victim = procs[killed]
                if a.replica_ranks > 1:  # its torchrun restarts the replica, which rejoins
                    victim.wait_for(lambda e: e["event"] == "start" and e["join"], deadline)
                    killed_at = time.monotonic()
                else:
                    victim.p.wait(timeout=max(1.0, deadline - time.monotonic()))
                    killed_at = time.monotonic()
                    if replace:
                        procs[killed] = Proc(base + ["--rank", str(killed), "--join"], env)
                        procs[killed].wait_for(lambda e: e["event"] == "start", deadline)
                    else:
                        del procs[killed]
            done = {r: p.wait_for(lambda e: e["event"] == "done", deadline) for r, p in procs.items()}
            for p in holder:  # it returns by itself once the replicas have left
                p.wait_for(lambda e: e["event"] == "done", deadline)
            for p in [*procs.values(), *holder]:
                p.p.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for p in [*procs.values(), *holder]:
                p.stop()
    survivors = [r for r in procs if r != killed]
    recovered = [e for r in survivors for e in procs[r].events
                 if e["event"] == "reconfig" and killed in e["lost"]]
    summary = {
        "size": a.size, "killed": a.kill, "killed_after_outer_steps": a.kill_after if a.kill is not None else None,
        "replica_ranks": a.replica_ranks, "holder": a.holder, "steps": a.steps, "period": a.period,
        "same_weights": (len({d["weights"] for d in done.values()}) == 1
                         and all(d["replica_same"] for d in done.values())),
        "same_state_hash": len({d["hash"] for d in done.values()}) == 1,
        "same_global_hash": len({d["global_hash"] for d in done.values()}) == 1,
        "members": done[survivors[0]]["members"],
        "outer_steps": {r: d["outer_steps"] for r, d in done.items()},
        "inner_steps": {r: d["inner_steps"] for r, d in done.items()},
        "outcomes": sorted({e["outcome"] for p in procs.values() for e in p.events if e["event"] == "sync"}),
        "loss_seen_by": sorted({e["rank"] for e in recovered}),
        "replaced": replace,
        "replacement_state_bytes": done[killed]["stats"]["state_received_bytes"] if replace else 0,
        "replacement_has_momentum": done[killed]["momentum"] if replace else None,
        "seconds_after_the_kill": round(time.monotonic() - killed_at, 3) if killed_at is not None else None,
        "terminated": a.term,
    }
    print(json.dumps(summary))
    ok = summary["same_weights"] and summary["same_state_hash"] and summary["same_global_hash"]
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", action="store_true", help="run the local demonstration (see above)")
    p.add_argument("--rank", type=int, help="this process's slot")
    p.add_argument("--size", type=int, default=3, help="slots in the job (default 3)")
    p.add_argument("--rendezvous-file", help="rank 0 writes its ZeroMQ address here, the others read it")
    p.add_argument("--join", action="store_true", help="a replacement: join the running job")
    p.add_argument("--insecure", action="store_true", help="no job secret (loopback only)")
    p.add_argument("--steps", type=int, default=6,
                   help="outer steps before the quorum's lowest rank asks the job to stop (default 6)")
    p.add_argument("--period", type=int, default=4, help="inner steps per outer step (fixed:H; default 4)")
    p.add_argument("--outer", default="nesterov:0.7:0.5",
                   help="the outer optimizer (default nesterov:0.7:0.5; 0.9 momentum diverges here at 4 inner steps)")
    p.add_argument("--fragments", type=int, default=1,
                   help="fragments of the model, each synced on its own (default 1; streaming DiLoCo with --delay)")
    p.add_argument("--delay", type=int, default=0,
                   help="inner steps each fragment's exchange overlaps (default 0; at most --period / --fragments); "
                        "with it --die-at waits for a fragment in flight")
    p.add_argument("--want", type=int, default=0,
                   help="go on past --steps until the quorum has had this many members for 2 outer steps")
    p.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat timeout in seconds (default 1)")
    p.add_argument("--join-timeout", type=float, default=120.0, help="--join: the wait to be admitted")
    p.add_argument("--die-at", type=int, help="SIGKILL this process once this many outer steps are applied")
    p.add_argument("--holder", action="store_true",
                   help="rank 0 only holds the rendezvous and the replicas are ranks 1..N-1, so any of them can be "
                        "replaced; --demo: a holder besides the --size replicas")
    p.add_argument("--kill", type=int, help="--demo: the rank (replica) that dies (default: none)")
    p.add_argument("--replica-ranks", type=int, default=1,
                   help="--demo: processes per replica (default 1); above 1, each replica is a torchrun job with "
                        "DDP inside, whose torchrun restarts it after --kill")
    p.add_argument("--kill-after", type=int, default=2, help="--demo: outer steps before the kill (default 2)")
    p.add_argument("--term", type=int,
                   help="--demo: the rank that receives SIGTERM and asks the job to stop (default: none)")
    p.add_argument("--term-after", type=int, default=2,
                   help="--demo: outer steps that --term's rank reports before its SIGTERM (default 2)")
    p.add_argument("--bound", type=float, default=240.0, help="--demo: seconds before it gives up (default 240)")
    a = p.parse_args()
    if a.delay > 0 and a.fragments > 0 and a.delay > a.period // a.fragments:
        # The member runs one exchange at a time: a fragment's must end by the next send point.
        p.error(f"--delay {a.delay}: fragments are sent --period / --fragments = {a.period // a.fragments} steps "
                f"apart and one exchange runs at a time; use --delay <= {a.period // a.fragments}")
    if a.demo:
        return demo(a)
    if a.rank is None or a.rendezvous_file is None:
        p.error("a process needs --rank and --rendezvous-file (or --demo)")
    return run_rank(a)


if __name__ == "__main__":
    sys.exit(main())
