"""The warnings that fail a test, by the module they are attributed to: a FutureWarning or a
DeprecationWarning raised from cadence code (torch deprecating something the package calls),
and torch's warning about float() on a tensor that requires grad. pyproject.toml's
`filterwarnings` makes them errors in pytest's own process; conftest.py puts the same filters in
PYTHONWARNINGS for every process a test starts (spawned ranks, torchrun, the LSTM runs), one
entry per cadence module, since an environment filter names a module exactly."""

import os
import pathlib

CATEGORIES = ("FutureWarning", "DeprecationWarning")
GRAD_SCALAR = ("Converting a tensor with requires_grad", "UserWarning")


def cadence_modules():
    """The installed cadence package's module names (from its files: importing them would need
    torch)."""
    import cadence

    root = pathlib.Path(cadence.__file__).resolve().parent
    names = []
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def environment_filters():
    """PYTHONWARNINGS entries that make the warnings above errors in cadence's modules."""
    entries = []
    for module in cadence_modules():
        entries += [f"error::{c}:{module}" for c in CATEGORIES]
        entries.append(f"error:{GRAD_SCALAR[0]}:{GRAD_SCALAR[1]}:{module}")
    return entries


def install_in_environment():
    old = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(([old] if old else []) + environment_filters())
