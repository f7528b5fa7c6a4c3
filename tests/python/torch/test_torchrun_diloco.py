# examples/python/torchrun_diloco.py under torchrun, 4 ranks: DDP inside 2 replica groups of 2,
# DiLoCo across them on the ElasticBSP schedule with int8 outer gradients (error feedback), the
# last replica slower. --check makes every rank compare its weights with every other rank's
# after each outer step (an all-gather over the world; the job fails on a difference), so the
# run passing means identical weights within and across the replicas at every outer step. One
# launch for the DDP, torchrun and policy-timed parts (torch start-up is most of its cost).
import pathlib
import re

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "torchrun_diloco.py"


def test_diloco_with_ddp_inside_replicas_under_torchrun_keeps_every_rank_identical():
    out = _spawn.torchrun(EXAMPLE, 4, "--replica-size", 2, "--schedule", "elastic:6", "--codec", "int8",
                          "--steps", 60, "--straggle", 0.004, "--check")
    assert out.returncode == 0, out.stdout + out.stderr
    for category in ("FutureWarning", "DeprecationWarning"):
        assert category not in out.stderr, out.stderr
    m = re.search(r"^diloco elastic:6:last:fast codec int8 \(DDP inside 2 replica groups of 2\): accuracy "
                  r"([0-9.]+) in [0-9.]+ s, (\d+) inner steps, (\d+) outer steps, (\d+) bytes sent, weights "
                  r"identical on all 4 ranks after (\d+) outer steps$", out.stdout, flags=re.M)
    assert m, out.stdout + out.stderr
    accuracy, inner, outer, sent, checks = float(m.group(1)), *map(int, m.groups()[1:])
    assert accuracy > 0.3, out.stdout  # ten classes: chance is 0.1
    assert outer >= 5 and checks == outer, out.stdout
    assert inner > outer, out.stdout  # the fast replica ran more than one inner step per outer step
    assert sent > 0, out.stdout
