# The torchrun example runs end to end: 2 ranks rendezvousing over env:// (torchrun
# --standalone), every policy of its comparison, a few steps each (--smoke), and learns above
# chance. Generated data where Debian's dataset-fashion-mnist is not installed.
import pathlib
import re

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "python" / "torchrun_fashion_mnist.py"
DATA = pathlib.Path("/usr/share/datasets/fashion-mnist")


def test_torchrun_example_runs_every_policy():
    args = ["--smoke", "--device", "cpu"]
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        args.append("--synthetic")
    out = _spawn.torchrun(EXAMPLE, 2, *args, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    # conftest.py's PYTHONWARNINGS makes a deprecation in cadence code fail the ranks; none in
    # the example's own code either (DDP's broadcast_buffers was deprecated in torch 2.13)
    for category in ("FutureWarning", "DeprecationWarning"):
        assert category not in out.stderr, out.stderr
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^(ddp|torch-periodic:8|elastic:8)\s+(\S+(?: reached)?)\s+([0-9.]+)\s+(\d+)\s+(\d+)$",
        out.stdout, flags=re.M)}
    assert set(rows) == {"ddp", "torch-periodic:8", "elastic:8"}, out.stdout
    for policy, (_, accuracy, steps, merges) in rows.items():
        assert float(accuracy) > 0.3, (policy, out.stdout)  # ten classes: chance is 0.1
        assert int(steps) >= 2 * 4 and int(merges) >= 1, (policy, out.stdout)
