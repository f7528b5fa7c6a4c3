# cadence works without torch; cadence.torch and cadence.lstm_node2vec say what is missing (and
# the extra that installs it) when torch is absent; the source tree without its compiled part
# says to install the package.
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")

CODE = """
import sys
sys.modules["torch"] = None  # as if torch were not installed
import cadence
assert "torch" not in sys.modules or sys.modules["torch"] is None
cadence.make_controller("bsp", 2)
for package in ("cadence.torch", "cadence.lstm_node2vec"):
    try:
        __import__(package)
    except ImportError as e:
        print("ImportError:", e)
"""


def test_cadence_imports_without_torch_and_the_torch_subpackages_name_the_extra():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ImportError: cadence.torch needs PyTorch: pip install 'cadence-sync[torch]'" in out.stdout, out.stdout
    assert ("ImportError: cadence.lstm_node2vec needs PyTorch: pip install 'cadence-sync[lstm]'"
            in out.stdout), out.stdout


def test_source_tree_without_the_extension_says_to_pip_install():
    python_dir = pathlib.Path(__file__).resolve().parents[3] / "python"
    code = f"import sys; sys.path.insert(0, {str(python_dir)!r}); import cadence"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd="/")
    assert out.returncode != 0
    assert "ImportError: cadence: the compiled extension cadence._core is missing" in out.stderr, out.stderr
    assert "pip install ." in out.stderr
