# A process that used cadence.torch ends cleanly even when its helper threads were inside a store
# call at exit: a daemon thread coming back from C++ while the interpreter finalizes is ended by
# pthread_exit, whose unwinding through torch's noexcept frames aborted the process ("terminate
# called without an active exception", seen once at the end of the torchrun example).
import os
import subprocess
import sys

SCRIPT = r"""
import datetime, sys
import torch.distributed as dist
from cadence.torch._common import Stragglers
store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
s = Stragglers("exit-test", None, 0, 2, 0, store=store)
for seq in range(1, 2001):
    s.arrive(seq)           # the poster is busy with these when the interpreter exits
gone = Stragglers("exit-test", None, 1, 2, 1, store=store)
gone.arrive(1)
del gone                    # its poster ends when it is collected
print("done", flush=True)
"""


def test_exit_while_arrivals_are_posted():
    env = dict(os.environ)
    for run in range(5):  # without the exit hook every run aborted (20 of 20 in a bare loop)
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0 and out.stdout.strip() == "done", (
            f"run {run}: exit code {out.returncode}\n{out.stdout}\n{out.stderr}")
        assert "terminate called" not in out.stderr, out.stderr
