# A FutureWarning or DeprecationWarning raised from cadence code fails a test, in pytest's own
# process and in every process a test starts (ranks, torchrun): the filters attribute a warning to
# the module whose code raised it, so torch's deprecations of what cadence calls fail the suite
# that CI runs on the newest torch, and a warning from someone else's code does not.
import subprocess
import sys
import types
import warnings

import pytest

pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")

import warning_filters  # noqa: E402

RAISE = "import warnings\ndef f(category):\n    warnings.warn('deprecated', category, stacklevel=1)\n"


def _module(name):
    m = types.ModuleType(name)
    exec(compile(RAISE, f"<{name}>", "exec"), m.__dict__)
    return m


@pytest.mark.parametrize("category", [FutureWarning, DeprecationWarning])
def test_a_deprecation_raised_from_cadence_code_fails_the_test(category):
    with pytest.raises(category):
        _module("cadence.torch._probe").f(category)


def test_the_same_warning_from_other_code_only_warns():
    with pytest.warns(FutureWarning):
        _module("someone_else").f(FutureWarning)


def test_float_of_a_tensor_requiring_grad_in_cadence_code_fails_the_test():
    code = ("import warnings\ndef f():\n    warnings.warn('Converting a tensor with requires_grad=True "
            "to a scalar may lead to unexpected behavior.', UserWarning)\n")
    m = types.ModuleType("cadence.lstm_node2vec.models")
    exec(compile(code, "<models>", "exec"), m.__dict__)
    with pytest.raises(UserWarning):
        m.f()


@pytest.mark.parametrize("module, fails", [("cadence.torch._elastic", True), ("cadence._sim", True),
                                           ("someone_else", False)])
def test_processes_started_by_tests_fail_on_them_too(module, fails):
    # PYTHONWARNINGS, set by conftest.py for the whole session, names every cadence module
    assert "error::FutureWarning:cadence.torch._elastic" in warning_filters.environment_filters()
    code = (f"import types\nm = types.ModuleType({module!r})\nexec(compile({RAISE!r}, 'probe', 'exec'), "
            "m.__dict__)\nm.f(FutureWarning)\nprint('returned')")
    with warnings.catch_warnings():
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (out.returncode != 0) == fails, out.stderr
    assert ("FutureWarning: deprecated" in out.stderr) and (("returned" in out.stdout) != fails)
