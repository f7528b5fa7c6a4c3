"""Runs a function on N local processes joined by one torch.distributed process group, every wait
bounded: the harness of cadence.lstm_node2vec's distributed runs and of tests/python/torch.

The rendezvous is a file in a fresh temporary directory (no port can collide), which each rank
also finds in ``os.environ[DIR_ENV]`` (the tests name events there). A rank still running at the
deadline is killed. torch is imported only in the call.
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import time
import traceback

#: The environment variable that holds the run's temporary directory, in every rank.
DIR_ENV = "CADENCE_SPAWN_DIR"


def _entry(fn, rank, world, init_file, backend, pg_timeout, results, shared, args):
    import torch.distributed as dist

    os.environ[DIR_ENV] = os.path.dirname(init_file)
    try:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        out = ("ok", fn(rank, world, *shared, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out = ("error", traceback.format_exc())
    results.put((rank, out))
    results.close()
    results.join_thread()
    # Skip the interpreter's teardown of the process group: after a rank was killed or stalled
    # it can block on the dead peer, and nothing here needs it.
    os._exit(0)


def run(fn, world, *args, timeout=60.0, pg_timeout=30.0, backend="gloo", expect_killed=(), shared=None):
    """``fn(rank, world, *shared(ctx), *args)`` on ``world`` spawned processes, each in a process
    group of ``backend``; ``shared(ctx)``, called here, makes values the ranks share (a
    ``ctx.Value``). Returns ``(results, hung)``: per rank ``("ok", value)``, ``("error",
    traceback)``, ``("killed", exit code)`` for a rank of ``expect_killed`` that returned nothing,
    or None for another rank that returned nothing; and the ranks still running at ``timeout``
    seconds, which were killed."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    values = tuple(shared(ctx)) if shared is not None else ()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_entry, args=(fn, r, world, init_file, backend, pg_timeout, results,
                                                  values, args), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        expected = world - len(expect_killed)
        try:
            while len(got) < expected:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, out = results.get(timeout=min(left, 1.0))
                    got[rank] = out
                except queue.Empty:
                    if all(not p.is_alive() for p in procs) and results.empty():
                        break
        finally:
            for p in procs:
                p.join(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            hung = [r for r, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    out = []
    for r in range(world):
        if r in got:
            out.append(got[r])
        elif r in expect_killed:
            out.append(("killed", procs[r].exitcode))
        else:
            out.append(None)
    return out, hung
