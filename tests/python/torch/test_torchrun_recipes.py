# examples/python/torchrun_recipes.py under torchrun, 4 ranks: the hierarchy (DDP inside replica
# groups of 2, and FSDP2 where torch has it), the communication hook, and the two restarts: a first
# launch stops the checkpointed jobs early (--stop-at, as if killed), a second resumes them from
# the checkpoints and finishes. Every recipe learns above chance.
import pathlib
import re

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing
from test_torch_recipes import HAS_FSDP2  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python" / "torchrun_recipes.py"


def _rows(out):
    assert out.returncode == 0, out.stdout + out.stderr
    for category in ("FutureWarning", "DeprecationWarning"):
        assert category not in out.stderr, out.stderr
    return {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^(hierarchy|hook|restart|ps-restart)\s+(accuracy [0-9.]+|stopped)\s+[0-9.]+ s\s+(.*)$",
        out.stdout, flags=re.M)}


def test_the_recipes_run_and_a_stopped_job_resumes_from_its_checkpoints(tmp_path):
    common = ["--steps", 240, "--checkpoint-dir", tmp_path, "--save-every", 3]
    first = _rows(_spawn.torchrun(EXAMPLE, 4, "--recipe", "restart", "--recipe", "ps-restart",
                                  "--stop-at", 4, *common))
    assert first["restart"] == ("stopped", "stopped at barrier 4 (--stop-at)"), first
    assert first["ps-restart"][0] == "stopped", first
    assert len(list(tmp_path.glob("*.pt"))) == 8  # a checkpoint per rank and job

    fsdp = ["--fsdp"] if HAS_FSDP2 else []
    rows = _rows(_spawn.torchrun(EXAMPLE, 4, *fsdp, *common))
    assert set(rows) == {"hierarchy", "hook", "restart", "ps-restart"}, rows
    for recipe, (score, _) in rows.items():
        assert float(score.split()[1]) > 0.3, (recipe, rows)  # ten classes: chance is 0.1
    assert rows["hierarchy"][1].startswith(f"2 replica groups of 2 ({'FSDP2' if fsdp else 'DDP'} inside)")
    assert rows["restart"][1].startswith("resumed at barrier 3,"), rows  # the last save before 4
    # the BSP server saved after round 3 (9 pushes); each worker after its 4th push
    assert rows["ps-restart"][1].startswith("resumed at 9 pushes,"), rows
    resumed = re.search(r"resumed workers (\[.*\])", rows["ps-restart"][1]).group(1)
    assert sorted(w for w, _, at in eval(resumed)) == [0, 1, 2] and all(at == 4 for _, _, at in eval(resumed))
    assert list(tmp_path.glob("*.pt")) == []  # finished jobs leave no checkpoint behind
