# cadence works without torch; cadence.torch says what is missing when torch is absent.
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
try:
    import cadence.torch
except ImportError as e:
    print("ImportError:", e)
"""


def test_cadence_imports_without_torch_and_cadence_torch_names_it():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ImportError: cadence.torch needs PyTorch" in out.stdout, out.stdout
