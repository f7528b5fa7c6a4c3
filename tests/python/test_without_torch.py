# Without torch: `import cadence` works, and the two subpackages that need torch say so with the
# line that installs it, instead of a bare ModuleNotFoundError. scripts/test-python.sh runs this
# file in a plain venv that has only the package, numpy and pytest; where torch is installed the
# file skips (test_torch_import.py checks the same messages there, with torch hidden).
import subprocess
import sys

import pytest

try:
    import torch  # noqa: F401
    pytest.skip("torch is installed here: scripts/test-python.sh runs this file in a venv without it",
                allow_module_level=True)
except ImportError:
    pass

import cadence  # noqa: E402


def test_cadence_works_without_torch():
    c = cadence.make_controller("ssp:1", 2)
    assert c.push(0, 1.0).proceed
    assert "torch" not in sys.modules


@pytest.mark.parametrize("package, extra", [("cadence.torch", "torch"), ("cadence.lstm_node2vec", "lstm")])
def test_a_package_that_needs_torch_names_the_extra_that_installs_it(package, extra):
    with pytest.raises(ImportError) as e:
        __import__(package)
    assert f"{package} needs PyTorch" in str(e.value)
    assert f"pip install 'cadence-sync[{extra}]'" in str(e.value)


def test_the_lstm_command_ends_with_the_install_line():
    out = subprocess.run([sys.executable, "-m", "cadence.lstm_node2vec", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cadence.lstm_node2vec needs PyTorch: pip install 'cadence-sync[lstm]'"), \
        out.stderr
