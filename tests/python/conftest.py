"""Fixtures of the binding tests (helpers are in binding_support.py)."""

import json

import pytest

from binding_support import DATA


@pytest.fixture(scope="session")
def expected():
    """Answers of cadence-zipline and cadence-sim on the inputs in data/ (make_expected.py)."""
    return json.loads((DATA / "expected.json").read_text())
