"""Fixtures of the binding tests (helpers are in binding_support.py)."""

import json

import pytest

from binding_support import DATA


def pytest_configure(config):
    """Every process a test starts fails, as pytest's own does, on a FutureWarning or
    DeprecationWarning raised from cadence code (warning_filters.py)."""
    try:
        import warning_filters
        warning_filters.install_in_environment()
    except ImportError:  # the bindings are not installed: the tests that need them skip
        pass


@pytest.fixture(scope="session")
def expected():
    """Answers of cadence-zipline and cadence-sim on the inputs in data/ (make_expected.py)."""
    return json.loads((DATA / "expected.json").read_text())
