# Runs a function on n processes joined by a gloo process group (file:// rendezvous in a fresh
# temporary directory, so no port can collide), with every wait bounded: returns each rank's
# result or its formatted exception; a rank still running at the deadline is killed and the
# test fails naming it. post()/wait() are named events between the ranks of a run (empty files
# in that directory), so a fault test waits for the state it needs instead of sleeping;
# roundtrip() passes a state_dict through torch.save and torch.load as a checkpoint file would;
# torchrun() runs an example under torchrun.
import datetime
import io
import os
import subprocess
import sys
import queue
import tempfile
import time
import traceback

import torch.multiprocessing as mp


_EVENTS = "CADENCE_TEST_EVENTS"


def post(name):
    """Posts event `name` for every rank of this run (idempotent)."""
    open(os.path.join(os.environ[_EVENTS], name), "w").close()


def posted(name):
    return os.path.exists(os.path.join(os.environ[_EVENTS], name))


def wait(name, timeout=60.0):
    """Waits until `name` is posted; raises after `timeout` s, which only catches a hang."""
    until = time.monotonic() + timeout
    while not posted(name):
        if time.monotonic() > until:
            raise AssertionError(f"event {name!r} was not posted within {timeout} s")
        time.sleep(0.002)


def roundtrip(sd):
    """`sd` as a checkpoint file gives it back: torch.save, then torch.load(weights_only=True)
    (plain data and tensors only) on torch 2."""
    import torch

    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(buf, weights_only=True)
    return torch.load(buf)  # 1.13's weights_only reads no float


def torchrun(script, nproc, *args, timeout=240, cwd=None):
    """`torchrun --standalone --nproc_per_node nproc script args...` (through this interpreter),
    one thread per rank; the finished process (stdout, stderr, returncode)."""
    import torch

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    if int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11):
        # torch 1.13's torchrun cannot parse its own default "--redirects 0" under Python 3.11
        # (enum.IntFlag no longer iterates over 0); any explicit non-zero value works
        cmd += ["-r", "2", "-t", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd + [str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def _entry(fn, rank, n, init_file, pg_timeout, results, args):
    import torch.distributed as dist

    os.environ[_EVENTS] = os.path.dirname(init_file)
    out = None
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        out = ("ok", fn(rank, n, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out = ("error", traceback.format_exc())
    results.put((rank, out))
    results.close()
    results.join_thread()
    # Skip the interpreter's teardown of the process group: after a test kills or stalls a rank
    # it can block on the dead peer, and nothing here needs it.
    os._exit(0)


def run(fn, n, *args, timeout=60.0, pg_timeout=30.0, expect_killed=()):
    """fn(rank, n, *args) on n processes; returns a list of ("ok", value) or ("error", text),
    or ("killed", exitcode) for the ranks in expect_killed."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_entry, args=(fn, r, n, init_file, pg_timeout, results, args),
                             daemon=True) for r in range(n)]
        for p in procs:
            p.start()
        got = {}
        deadline = time.monotonic() + timeout
        expected = n - len(expect_killed)
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
    missing = [r for r in range(n) if r not in got and r not in expect_killed]
    if hung or missing:
        raise AssertionError(f"ranks {missing} returned nothing; ranks {hung} were still running "
                             f"after {timeout} s and were killed; results: {got}")
    out = []
    for r in range(n):
        if r in expect_killed and r not in got:
            out.append(("killed", procs[r].exitcode))
        else:
            out.append(got[r])
    return out


def values(results):
    """The ranks' return values; fails with every rank's traceback when one raised."""
    errors = [f"rank {r}:\n{v}" for r, (k, v) in enumerate(results) if k == "error"]
    if errors:
        raise AssertionError("\n".join(errors))
    return [v for _, v in results]
