# What the cadence.torch tests share. run() runs a function on n processes joined by a gloo
# process group (cadence._spawn, the package's own harness: file:// rendezvous in a fresh
# temporary directory, every wait bounded) and fails the test naming the ranks that returned
# nothing or hung; values() gives their results or every rank's traceback. post()/wait() are
# named events between the ranks of a run (empty files in the run's directory), so a fault test
# waits for the state it needs instead of sleeping. roundtrip() passes a state_dict through
# torch.save and torch.load as a checkpoint file would; torchrun() runs an example under
# torchrun; error() turns a call's exception into plain data a rank can return; need_gloo()
# skips a test module, saying why, where torch, its gloo backend or the bindings are missing;
# stalled_sync() and check_torch_recipe() are scenarios two test files share; diloco_model()
# and plain() are the DiLoCo tests' model and their view of tensors as lists.
import io
import os
import subprocess
import sys
import time

import pytest


def _events():
    from cadence._spawn import DIR_ENV  # the run's directory, set in every rank

    return os.environ[DIR_ENV]


def need_gloo():
    """The torch module, or a module-level skip naming what is missing (no conftest.py here:
    tests/python/conftest.py is imported as "conftest" by the binding tests)."""
    torch = pytest.importorskip("torch", reason="cadence.torch tests need PyTorch (Debian: python3-torch)")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this PyTorch build has no torch.distributed gloo backend", allow_module_level=True)
    pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")
    return torch


def post(name):
    """Posts event `name` for every rank of this run (idempotent)."""
    open(os.path.join(_events(), name), "w").close()


def posted(name):
    return os.path.exists(os.path.join(_events(), name))


def wait(name, timeout=60.0):
    """Waits until `name` is posted; raises after `timeout` s, which only catches a hang."""
    until = time.monotonic() + timeout
    while not posted(name):
        if time.monotonic() > until:
            raise AssertionError(f"event {name!r} was not posted within {timeout} s")
        time.sleep(0.002)


def error(fn):
    """(exception type name, whether it is a ValueError, message) of what fn() raised; None if
    it returned."""
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, isinstance(e, ValueError), str(e))


def stalled_sync(rank, n, sync, stalled=2):
    """sync() on every rank, rank `stalled` joining only after every other rank's sync raised
    (a rank that stalls past their timeout): (exception type name, message, seconds it took),
    or None when it returned. The late rank's call either fails on its own timeout or completes
    against the others' abandoned collective; never a hang."""
    if rank == stalled:
        for r in range(n):
            if r != stalled:
                wait(f"stall.threw.{r}")
    t0 = time.monotonic()
    try:
        sync()
        out = None
    except Exception as e:  # noqa: BLE001
        out = (type(e).__name__, str(e), time.monotonic() - t0)
    if rank != stalled:
        post(f"stall.threw.{rank}")
    return out


def check_torch_recipe(seen, steps=10, warmup=4, merges=(4, 7)):
    """`seen`, per rank, is (merged, digest of the parameters) after each step of a DDP model
    under a PeriodicModelAverager(3, warmup) in torch's post-local SGD recipe: the same steps
    merge on every rank (torch's schedule), and the ranks hold the same parameters exactly in
    the warm-up (DDP's gradient all-reduce) and after a merge."""
    for step in range(steps):
        merged = seen[0][step][0]
        assert all(s[step][0] == merged for s in seen)
        assert merged == (step in merges), step
        same = len({s[step][1] for s in seen}) == 1
        assert same == (step < warmup or step in merges), step


def diloco_model():
    """The DiLoCo tests' model: Linear(3, 2) then Linear(2, 1), parameter i filled with i + 1,
    the same on every rank."""
    import torch

    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            p.fill_(float(i + 1))
    return m


def plain(tensors):
    """Each tensor as a flat list of Python numbers (comparable and picklable)."""
    return [t.detach().reshape(-1).tolist() for t in tensors]


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

    # the agent checks its workers every 0.1 s, not torch 1.13's 5 s: a finished job ends at once
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--monitor_interval", "0.1",
           "--nproc_per_node", str(nproc)]
    if int(torch.__version__.split(".")[0]) < 2 and sys.version_info >= (3, 11):
        # torch 1.13's torchrun cannot parse its own default "--redirects 0" under Python 3.11
        # (enum.IntFlag no longer iterates over 0); any explicit non-zero value works
        cmd += ["-r", "2", "-t", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd + [str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def run(fn, n, *args, timeout=60.0, pg_timeout=30.0, expect_killed=()):
    """fn(rank, n, *args) on n processes; returns a list of ("ok", value) or ("error", text),
    or ("killed", exitcode) for the ranks in expect_killed."""
    from cadence import _spawn

    out, hung = _spawn.run(fn, n, *args, timeout=timeout, pg_timeout=pg_timeout,
                           expect_killed=expect_killed)
    missing = [r for r, o in enumerate(out) if o is None]
    if hung or missing:
        got = {r: o for r, o in enumerate(out) if o is not None}
        raise AssertionError(f"ranks {missing} returned nothing; ranks {hung} were still running "
                             f"after {timeout} s and were killed; results: {got}")
    return out


def values(results):
    """The ranks' return values; fails with every rank's traceback when one raised."""
    errors = [f"rank {r}:\n{v}" for r, (k, v) in enumerate(results) if k == "error"]
    if errors:
        raise AssertionError("\n".join(errors))
    return [v for _, v in results]
