# The cadence.torch tests need torch with torch.distributed and gloo; they skip, saying why, when
# it is missing (the package itself imports without torch).
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

torch = pytest.importorskip("torch", reason="cadence.torch tests need PyTorch (Debian: python3-torch)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this PyTorch build has no torch.distributed gloo backend", allow_module_level=True)
pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")
