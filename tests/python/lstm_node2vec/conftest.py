# Finds cadence.lstm_node2vec: installed (pip install .), or in the source tree's python/ when the
# package is not installed (then python/cadence is a namespace package holding lstm_node2vec).
import os
import sys

_PY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))

try:
    import cadence.lstm_node2vec  # noqa: F401
except ImportError:
    if _PY not in sys.path:
        sys.path.insert(0, _PY)
    pkg = sys.modules.get("cadence")
    if pkg is not None and hasattr(pkg, "__path__"):
        # an installed cadence without this subpackage: let it find the source tree's copy
        pkg.__path__.append(os.path.join(_PY, "cadence"))
