"""A process that exits without closing its cadence.membership.Member (nor finishing its
DiLoCo), while a streaming fragment's C++ thread is in flight, ends cleanly: membership.py's exit
hook closes the member before the interpreter finalizes, joining that thread (which calls the
on_change, on_event and blob callbacks with the GIL, and so must not outlive Python). Without the
hook the member and its DiLoCo, held in a cycle through C++, are never closed: their sockets stay
open until the process dies and nanobind reports them leaked at exit."""

import subprocess
import sys

import pytest

from binding_support import membership_or_skip

membership_or_skip()

SCRIPT = r"""
import numpy as np
import cadence.membership as membership
m = membership.Member(0, 1, rendezvous="tcp://127.0.0.1:0", insecure=True, heartbeat=0.5)
changes = []
m.on_change(changes.append)
m.add_blob("steps", lambda: b"0", lambda data: None)
w = np.full(8, 2.0, dtype=np.float32)
outer = membership.DiLoCo(m, [w], "fixed:4,fragments=2,delay=1,outer=sgd:1")
outer.start()
while not outer.in_flight:
    w += 1
    if outer.step_done(0.001):
        outer.sync()
print("done", outer.in_flight, flush=True)   # and exit: no close(), no finish()
"""


def test_exit_with_a_streaming_diloco_member_open_closes_it():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done True", (
        f"exit code {out.returncode}\n{out.stdout}\n{out.stderr}")
    assert "terminate called" not in out.stderr, out.stderr
    assert "leaked instance" not in out.stderr, f"the member was not closed at exit:\n{out.stderr}"
