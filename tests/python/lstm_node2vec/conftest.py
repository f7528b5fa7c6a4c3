# Lets the tests import cadence.lstm_node2vec from the source tree (python/) before the package is installed.
import os
import sys

_PY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
if _PY not in sys.path:
    sys.path.insert(0, _PY)
