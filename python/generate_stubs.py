"""Regenerates python/cadence/_core.pyi from the installed extension (run after changing the
bindings): nanobind's stubgen, then the exception classes written out (the extension creates
them at import, so stubgen can only re-export them) and the numpy import the signatures use.

    python python/generate_stubs.py   # with the package installed in the running interpreter
"""

import pathlib
import re
import subprocess
import sys

# The installed package, not python/cadence/ next to this script (which has no extension).
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != pathlib.Path(__file__).resolve().parent]
import cadence._core as core  # noqa: E402

out = pathlib.Path(__file__).resolve().parent / "cadence" / "_core.pyi"
subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-m", "cadence._core", "-o", str(out), "-q", "--include-private"],
               check=True)
text = out.read_text()
errors = []
for name in dir(core):
    obj = getattr(core, name)
    if isinstance(obj, type) and issubclass(obj, BaseException):
        bases = ", ".join(b.__name__ if b.__module__ == "builtins" else b.__name__ for b in obj.__bases__)
        doc = (obj.__doc__ or "").strip()
        errors.append((obj.__mro__.index(BaseException), name, f'class {name}({bases}):\n    """{doc}"""\n'))
# Bases before subclasses (Error first).
errors.sort(key=lambda e: (e[0], e[1]))
text = re.sub(r"from cadence import \([^)]*\)\n", "import builtins\n\n\n" +
              "\n".join(e[2] for e in errors), text, count=1)
text = text.replace("class TimeoutError(Error, TimeoutError)", "class TimeoutError(Error, builtins.TimeoutError)")
out.write_text(text)
print(f"wrote {out}")
