"""A torch job that survives the loss of any process: model averaging over cadence.membership.

Each process trains its own replica of a small model and averages the weights with the others
every --period steps through cadence.torch.FaultTolerantAverager: a transaction over ZeroMQ that
either completes on every member or is run again on the survivors when a member is lost. A
replacement started with --join takes a lost rank's slot and receives the weights and the
optimizer's momentum from a member; nothing is read from a checkpoint.

One process (what a scheduler starts on each host; rank 0 writes the rendezvous address to the
shared file, the others read it; the job secret from $CADENCE_JOB_SECRET, 64 hex digits):

    python fault_tolerant_averaging.py --rank R --size N --rendezvous-file /shared/job.addr
    python fault_tolerant_averaging.py --rank R --size N --rendezvous-file /shared/job.addr --join

With --holder, rank 0 is no replica: it only holds the rendezvous (cadence.membership.
hold_rendezvous), printing one JSON line per registration or loss it sees and a done line once
the job is over, and the replicas are ranks 1..N-1 (Member(..., holder=True)), so any of them can
be lost and restarted, the first one included:

    python fault_tolerant_averaging.py --holder --rank 0 --size N --rendezvous-file /shared/job.addr
    python fault_tolerant_averaging.py --holder --rank R --size N --rendezvous-file /shared/job.addr

The demonstration on this machine (--demo): starts --size processes on loopback, kills
--kill with SIGKILL after --kill-after syncs, starts a replacement in its slot (not rank 0's:
rank 0 holds the rendezvous, so after its loss the others go on without it), and prints one
JSON object: whether every process ended with the same weights, the quorum, the state the
replacement received. Exit status 0 when every process ended with the same weights. With
--holder it starts the holder as rank 0 besides the --size replicas (replica i is rank i+1; the
job has --size + 1 slots), and --kill 0 is replaced like any other.

    python examples/python/fault_tolerant_averaging.py --demo --size 3 --kill 1
    python examples/python/fault_tolerant_averaging.py --demo --size 3 --kill 0 --holder

A replica of several processes (DDP inside it) is one torchrun job per replica, --rank the
replica's id; its agent restarts the replica when one of its processes fails, and the restarted
replica rejoins while the others go on (not replica 0 unless --holder: without it, replica 0's
first rank holds the rendezvous):

    torchrun --nproc_per_node 2 --max_restarts 3 fault_tolerant_averaging.py --rank R --size N \
        --rendezvous-file /shared/job.addr
    python examples/python/fault_tolerant_averaging.py --demo --size 2 --replica-ranks 2 --kill 1
    python examples/python/fault_tolerant_averaging.py --demo --size 3 --replica-ranks 2 --kill 0 --holder

(Three replicas there: a quorum of two that loses its first member, its leader, keeps only half
of itself without the leader, and stops rather than risk a split.)

Each process (each replica's first) prints one JSON line per event (start, sync, reconfig,
done) on stdout. Do not start the replicas as one torchrun job: its agent would restart them
all when one process fails, where here the others go on (docs/python-torch.md, "Surviving a
lost process").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


def init_replica_group() -> None:
    """The replica's gloo group, from torchrun's environment, under a store prefix of its own per
    restart: recent torch's gloo group otherwise found the previous attempt's addresses in the
    store after a restart and failed to connect (3 runs in 4 with torch 2.15)."""
    import datetime

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent and rank == 0, timeout=datetime.timedelta(seconds=60))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"cadence/attempt{attempt}", store), rank=rank,
                            world_size=world)


def run_holder(a: argparse.Namespace) -> int:
    """Rank 0 with --holder: holds the rendezvous until every replica has left (a heartbeat
    timeout with none alive leaves room for a restart), one JSON line per event."""
    import cadence.membership as membership

    report = membership.hold_rendezvous(a.size, rendezvous_file=a.rendezvous_file, insecure=a.insecure,
                                        heartbeat=a.heartbeat, exit_when_empty=2 * a.heartbeat,
                                        on_event=lambda line: emit(event="rendezvous", rank=0, line=line))
    emit(event="done", rank=0, holder=True, **report)
    return 0


def run_rank(a: argparse.Namespace) -> int:
    if a.holder and a.rank == 0:
        return run_holder(a)
    import torch

    import cadence.membership as membership
    import cadence.torch as ct

    torch.set_num_threads(1)
    torch.manual_seed(0)  # every replica starts from the same weights
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    # Started by torchrun: this process is one of the replica's (DDP inside it); its first rank
    # holds the replica's member (--rank is the replica's id) and speaks for it.
    group, first, restarted, net = None, True, False, model
    if "LOCAL_RANK" in os.environ:
        import torch.distributed as dist

        init_replica_group()
        group, first = dist.group.WORLD, dist.get_rank() == 0
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
    avg = ct.FaultTolerantAverager(model, member, period=a.period, optimizer=opt, replica_group=group)
    avg.join() if join else avg.start()
    pids = [os.getpid()]
    if group is not None:
        pids = [None] * dist.get_world_size()
        dist.all_gather_object(pids, os.getpid())
    if first:
        emit(event="start", rank=a.rank, join=join, members=member.quorum["ranks"], step=avg.syncs, pids=pids)
    seed = 1000 + a.rank + 100 * int(join) + 10000 * (dist.get_rank() if group is not None else 0)
    g = torch.Generator().manual_seed(seed)  # each process its own data
    target = torch.linspace(-1, 1, 8)
    while not avg.stopping:
        x = torch.randn(64, 8, generator=g)
        y = (x @ target).unsqueeze(1) + 0.01 * torch.randn(64, 1, generator=g)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        held = a.hold_file is not None and os.path.exists(a.hold_file)
        report = avg.step(stop=avg.syncs >= a.steps and not held)  # the replica's first rank's counts
        if report is not None and first:
            emit(event="sync", rank=a.rank, step=report["committed"], outcome=report["outcome"],
                 members=member.quorum["ranks"], loss=round(float(loss.detach()), 6))
    avg.finish()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]
    momentum = all(opt.state[p].get("momentum_buffer") is not None for p in model.parameters())
    replica = [(digest, momentum)]
    if group is not None:
        replica = [None] * dist.get_world_size()
        dist.all_gather_object(replica, (digest, momentum))
    if first:
        emit(event="done", rank=a.rank, step=avg.syncs, members=member.quorum["ranks"],
             hash=f"{member.state_hash:016x}", weights=digest, stats=member.stats(),
             replica_same=len({d for d, _ in replica}) == 1, momentum=all(m for _, m in replica))
        member.close()
    if group is not None:
        dist.destroy_process_group()
    return 0


class Proc:
    """A rank started by the demonstration: a thread reads its JSON lines as they come (a full
    pipe would stall the rank, and the others would count it lost)."""

    def __init__(self, argv: list[str], env: dict) -> None:
        # Its own session: a torchrun agent and its workers are stopped together (stop()).
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self.events: list[dict] = []
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            e = json.loads(line)
            self.events.append(e)
            self.queue.put(e)
        self.queue.put(None)

    def stop(self) -> None:
        """Kills what is left of it (its whole session)."""
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()

    def wait_for(self, pred, deadline: float) -> dict:
        while True:
            try:
                e = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("the demonstration ran past --bound seconds") from None
            if e is None:
                raise RuntimeError(f"a rank ended before the awaited event (exit {self.p.wait()})")
            if pred(e):
                return e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_args(nproc: int, replica: int) -> list[str]:
    """torchrun on this interpreter: one agent, nproc processes, one restart, its rendezvous on a
    port of its own (--standalone takes port 29400 in torch 1.13, where two replicas' agents on
    one host would meet)."""
    import torch

    args = ["-m", "torch.distributed.run", "--nnodes", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"localhost:{free_port()}", "--rdzv_id", f"replica{replica}",
            "--monitor_interval", "0.1", "--max_restarts", "1", "--nproc_per_node", str(nproc)]
    if int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11):
        args += ["-r", "2", "-t", "2"]  # torch 1.13's torchrun cannot parse its default "--redirects 0" on 3.11
    return args


def demo(a: argparse.Namespace) -> int:
    if not 0 <= a.kill < a.size:
        raise SystemExit(f"--kill {a.kill} is not a rank of --size {a.size}")
    # Without --holder, rank 0 holds the ZeroMQ rendezvous: once it is lost the others go on,
    # but no process can join any more (docs/status.md), so its slot is not refilled. With it,
    # rank 0 is the holder and replica i is rank i + 1: every replica's slot is refilled.
    first = 1 if a.holder else 0
    killed = a.kill + first  # the victim's rank
    replace = killed != 0
    if a.replica_ranks > 1 and killed == 0:
        raise SystemExit("--replica-ranks: --kill 0 would restart replica 0, whose first rank holds the "
                         "rendezvous: kill another replica, or give --holder")
    deadline = time.monotonic() + a.bound
    with tempfile.TemporaryDirectory() as tmp:
        path, hold = os.path.join(tmp, "rendezvous"), os.path.join(tmp, "hold")
        open(hold, "w").close()  # the others go on until the replacement is in
        env = dict(os.environ, CADENCE_JOB_SECRET=secrets.token_hex(32))
        base = [sys.executable, os.path.abspath(__file__), "--size", str(a.size + first), "--rendezvous-file", path,
                "--hold-file", hold, "--steps", str(a.steps), "--period", str(a.period),
                "--heartbeat", str(a.heartbeat)] + (["--holder"] if a.holder else [])
        def argv(r: int) -> list[str]:
            if a.replica_ranks == 1:
                return base + ["--rank", str(r)]
            # Each replica its own torchrun (DDP inside it), restarted by its agent once.
            return base[:1] + torchrun_args(a.replica_ranks, r) + base[1:] + ["--rank", str(r)]

        holder = [Proc(base + ["--rank", "0"], env)] if a.holder else []
        procs = {r: Proc(argv(r), env) for r in range(first, a.size + first)}
        try:
            victim = procs[killed]
            started = victim.wait_for(lambda e: e["event"] == "start", deadline)
            victim.wait_for(lambda e: e["event"] == "sync" and e["step"] >= a.kill_after, deadline)
            killed_at = time.monotonic()
            if a.replica_ranks > 1:
                # A process of the replica other than its first: the replica fails as a whole
                # and its torchrun starts it again, which rejoins.
                os.kill(started["pids"][1], signal.SIGKILL)
                victim.wait_for(lambda e: e["event"] == "start" and e["join"], deadline)
            else:
                victim.p.send_signal(signal.SIGKILL)
                victim.p.wait()
                if replace:
                    new = Proc(base + ["--rank", str(killed), "--join"], env)
                    procs[killed] = new
                    new.wait_for(lambda e: e["event"] == "start", deadline)
                else:
                    del procs[killed]
            os.unlink(hold)
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
        "size": a.size, "killed": a.kill, "killed_after_syncs": a.kill_after,
        "replica_ranks": a.replica_ranks, "holder": a.holder,
        "same_weights": len({d["weights"] for d in done.values()}) == 1 and all(d["replica_same"] for d in done.values()),
        "same_state_hash": len({d["hash"] for d in done.values()}) == 1,
        "members": done[survivors[0]]["members"],
        "syncs": {r: d["step"] for r, d in done.items()},
        "loss_seen_by": sorted({e["rank"] for e in recovered}),
        "replaced": replace,
        "replacement_state_bytes": done[killed]["stats"]["state_received_bytes"] if replace else 0,
        "replacement_has_momentum": done[killed]["momentum"] if replace else None,
        "seconds_after_the_kill": round(time.monotonic() - killed_at, 3),
    }
    print(json.dumps(summary))
    return 0 if summary["same_weights"] and summary["same_state_hash"] else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", action="store_true", help="run the local demonstration (see above)")
    p.add_argument("--rank", type=int, help="this process's slot")
    p.add_argument("--size", type=int, default=3, help="slots in the job (default 3)")
    p.add_argument("--rendezvous-file", help="rank 0 writes its ZeroMQ address here, the others read it")
    p.add_argument("--join", action="store_true", help="a replacement: join the running job")
    p.add_argument("--insecure", action="store_true", help="no job secret (loopback only)")
    p.add_argument("--steps", type=int, default=8, help="syncs before the job may stop (default 8)")
    p.add_argument("--period", type=int, default=2, help="local steps between syncs (default 2)")
    p.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat timeout in seconds (default 1)")
    p.add_argument("--join-timeout", type=float, default=120.0, help="--join: the wait to be admitted")
    p.add_argument("--hold-file", help="go on past --steps while this file exists")
    p.add_argument("--holder", action="store_true",
                   help="rank 0 only holds the rendezvous (cadence.membership.hold_rendezvous) and the replicas are "
                        "ranks 1..N-1, so any of them can be replaced; --demo: a holder besides the --size replicas")
    p.add_argument("--kill", type=int, default=1, help="--demo: the rank (replica) killed (default 1)")
    p.add_argument("--replica-ranks", type=int, default=1,
                   help="--demo: processes per replica (default 1); above 1, each replica is a torchrun job with "
                        "DDP inside, and --kill kills one of its processes, which its torchrun restarts")
    p.add_argument("--kill-after", type=int, default=3, help="--demo: syncs before the kill (default 3)")
    p.add_argument("--bound", type=float, default=240.0, help="--demo: seconds before it gives up (default 240)")
    a = p.parse_args()
    if a.demo:
        return demo(a)
    if a.rank is None or a.rendezvous_file is None:
        p.error("a process needs --rank and --rendezvous-file (or --demo)")
    return run_rank(a)


if __name__ == "__main__":
    sys.exit(main())
