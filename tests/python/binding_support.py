"""Helpers of the binding tests: the checked-in C++ answers' folder, the push-history file reader
(the format cadence-zipline reads), and where a build's command-line tools are. A module of its
own (not conftest.py): the lstm_node2vec tests have a conftest too, and `from conftest import`
would find whichever was imported first."""

import os
import pathlib
import shutil
import subprocess

import numpy as np

DATA = pathlib.Path(__file__).resolve().parent / "data"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def read_history(path):
    """Rows of a push-history file ('id:t1,t2,...,' per line), ordered by id as the tools order
    them; int64 unless any timestamp has a '.' or an exponent (then float64), as the tools."""
    text = pathlib.Path(path).read_text()
    decimal = any(c in text for c in ".eE")
    rows = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        wid, _, times = line.partition(":")
        values = [v for v in times.split(",") if v]
        rows[int(wid)] = np.array([float(v) if decimal else int(v) for v in values],
                                  dtype=np.float64 if decimal else np.int64)
    return [rows[k] for k in sorted(rows)]


def find_tool(name):
    """A built C++ tool: $CADENCE_BUILD_DIR/bin/<name>, else build/bin/<name> (the README's
    build), else the newest build*/bin/<name> in the repository; None when there is no build.
    (A newest-first pick alone took build-cuda/'s tools, which need a GPU, on a machine without.)"""
    env = os.environ.get("CADENCE_BUILD_DIR")
    candidates = [pathlib.Path(env) / "bin" / name] if env else []
    candidates.append(ROOT / "build" / "bin" / name)
    candidates += sorted(ROOT.glob(f"build*/bin/{name}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def membership_or_skip():
    """cadence.membership, or a skip of the calling test module where the bindings were built
    without it because libzmq is absent; where libzmq is installed, its absence is an error (the
    build should have found it)."""
    import pytest

    try:
        import cadence.membership as membership
    except ImportError as e:  # built without libzmq
        libzmq = shutil.which("pkg-config") is not None and subprocess.run(
            ["pkg-config", "--exists", "libzmq"], check=False).returncode == 0
        if libzmq:
            raise AssertionError(f"libzmq is installed here but cadence._membership was not built: {e}") from e
        pytest.skip(f"cadence.membership is not built ({e})", allow_module_level=True)
    return membership


def run_with_late_resume(target, size, path, events=("went_on", "abort"), bound=60.0):
    """Runs target(rank, size, path, ready, *events, results) in `size` spawned processes, where
    `ready` is a barrier of them all, `events` are multiprocessing Events named in that order
    ("went_on" and "abort" among them) and each process puts (rank, "ok" or "error", value) on
    `results`. The last process stops itself (SIGSTOP); it is resumed (SIGCONT) once "went_on"
    is set, that is once the others went on without it. Returns (values by rank, the events by
    name); every wait is bounded by `bound` seconds, and a process left is killed."""
    import multiprocessing as mp
    import signal

    ctx = mp.get_context("spawn")
    ev = {name: ctx.Event() for name in events}
    ready, results = ctx.Barrier(size), ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, size, path, ready, *ev.values(), results)) for r in range(size)]
    for p in procs:
        p.start()
    out = {}
    try:
        assert ev["went_on"].wait(bound) or ev["abort"].is_set(), \
            f"the others never went on without process {size - 1}"
        os.kill(procs[-1].pid, signal.SIGCONT)  # a late resume: the quorum went on without it
        while len(out) < size:
            rank, status, value = results.get(timeout=bound)
            assert status == "ok", f"process {rank} failed:\n{value}"
            out[rank] = value
        for p in procs:
            p.join(bound)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return out, ev
