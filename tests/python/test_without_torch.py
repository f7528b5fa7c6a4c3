# Without torch: `import cadence` works, and the two subpackages that need torch say so with the
# line that installs it, instead of a bare ModuleNotFoundError. scripts/test-python.sh runs this
# file in a plain venv that has only the package, numpy and pytest (with CADENCE_EXPECT_NO_TORCH=1,
# so that finding torch there fails instead of skipping); where torch is installed the file skips
# (test_torch_import.py checks the same messages there, with torch hidden). Every check runs in a
# fresh interpreter outside the repository: pytest puts tests/python on sys.path, where the
# folder tests/python/torch/ would import as a namespace package named torch.
import os
import subprocess
import sys

import pytest


def _run(*args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd="/")


if _run("-c", "import torch").returncode == 0:
    if os.environ.get("CADENCE_EXPECT_NO_TORCH") == "1":
        raise RuntimeError(f"torch is importable from {sys.executable}, which should have none")
    pytest.skip("torch is installed here: scripts/test-python.sh runs this file in a venv without it",
                allow_module_level=True)


def test_cadence_works_without_torch():
    out = _run("-c", "import sys, cadence\nc = cadence.make_controller('ssp:1', 2)\n"
                     "print(c.push(0, 1.0).proceed, 'torch' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False"]


@pytest.mark.parametrize("package, extra", [("cadence.torch", "torch"), ("cadence.lstm_node2vec", "lstm")])
def test_a_package_that_needs_torch_names_the_extra_that_installs_it(package, extra):
    out = _run("-c", f"import {package}")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: {package} needs PyTorch: pip install 'cadence-sync[{extra}]'"), \
        out.stderr


def test_the_lstm_command_ends_with_the_install_line():
    out = _run("-m", "cadence.lstm_node2vec", "--json")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cadence.lstm_node2vec needs PyTorch: pip install 'cadence-sync[lstm]'"), \
        out.stderr
