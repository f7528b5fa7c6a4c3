"""Regenerates the extensions' stubs from the installed package (run after changing the bindings):
nanobind's stubgen, then the exception classes written out (the extension creates them at
import, so stubgen can only re-export them) and the numpy import the signatures use.

    python python/generate_stubs.py           # writes python/cadence/_core.pyi
    python python/generate_stubs.py --check   # exits 1, printing a diff, when it drifted

Run it with the package installed in the running interpreter. `_thrust.pyi` and `_membership.pyi`
(python/src/, installed by CMake beside their modules only when `cadence._thrust` and
`cadence._membership` are built) are written by hand
with tighter types than stubgen infers; --check prints its diff for information only.
tests/python/test_stubs.py runs the check in CI, comparing what the stubs declare (names, bases,
signatures; names only for _thrust and _membership) rather than their formatting, which varies between nanobind
versions.
"""

import argparse
import difflib
import importlib
import pathlib
import re
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
#: module -> the committed stub
STUBS = {"cadence._core": HERE / "cadence" / "_core.pyi",
         "cadence._thrust": HERE / "src" / "_thrust.pyi",
         "cadence._membership": HERE / "src" / "_membership.pyi"}
#: stubs written by hand: never overwritten, and their diff does not fail --check
BY_HAND = {"cadence._thrust", "cadence._membership"}


def _installed():
    """Import the installed package, not python/cadence/ beside this script (no extension)."""
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != HERE]


def render(module: str) -> str:
    """The stub of `module` as this script writes it."""
    mod = importlib.import_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "stub.pyi"
        subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-m", module, "-o", str(out), "-q",
                        "--include-private"], check=True)
        text = out.read_text()
    errors = []
    for name in dir(mod):
        obj = getattr(mod, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            bases = ", ".join(b.__name__ for b in obj.__bases__)
            doc = (obj.__doc__ or "").strip()
            errors.append((obj.__mro__.index(BaseException), name, f'class {name}({bases}):\n    """{doc}"""\n'))
    if errors:
        # Bases before subclasses (Error first).
        errors.sort(key=lambda e: (e[0], e[1]))
        text = re.sub(r"from cadence(?:\.\w+)? import \([^)]*\)\n", "import builtins\n\n\n" +
                      "\n".join(e[2] for e in errors), text, count=1)
        text = text.replace("class TimeoutError(Error, TimeoutError)",
                            "class TimeoutError(Error, builtins.TimeoutError)")
    return text


def built_modules():
    out = []
    for module in STUBS:
        try:
            importlib.import_module(module)
            out.append(module)
        except ImportError:
            pass
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on drift")
    args = p.parse_args()
    _installed()
    drift = 0
    for module in built_modules():
        text, path = render(module), STUBS[module]
        if not args.check:
            if module not in BY_HAND:
                path.write_text(text)
                print(f"wrote {path}")
            continue
        old = path.read_text() if path.exists() else ""
        if old != text:
            drift |= module not in BY_HAND
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                       str(path), f"{module} as built"))
    return drift


if __name__ == "__main__":
    sys.exit(main())
