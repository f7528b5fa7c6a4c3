"""The committed .pyi stubs declare what the built extensions export: `_core.pyi` the same names,
bases and signatures as python/generate_stubs.py produces from the extension now (formatting and
docstrings, which vary with the nanobind version, are not compared); `_thrust.pyi`, written by
hand with tighter types than stubgen infers (and device_system's value depends on the build),
the same names, as `_membership.pyi` is. Each is checked only when its module is built, and a
wheel holds it only then."""

import ast
import importlib.util
import pathlib

import pytest

pytest.importorskip("cadence", reason="the cadence bindings are not installed (pip install .)")
pytest.importorskip("nanobind.stubgen", reason="nanobind (a build requirement) is not installed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("generate_stubs", ROOT / "python" / "generate_stubs.py")
generate_stubs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(generate_stubs)


def shape(source: str):
    """What a stub declares: per top-level name (and per class member), its kind, bases or
    signature; docstrings and layout left out."""

    def sig(fn):
        return (ast.unparse(fn.args), ast.unparse(fn.returns) if fn.returns else None,
                [ast.unparse(d) for d in fn.decorator_list])

    def body(stmts):
        out = []
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(("def", s.name, sig(s)))
            elif isinstance(s, ast.ClassDef):
                out.append(("class", s.name, [ast.unparse(b) for b in s.bases], body(s.body)))
            elif isinstance(s, ast.AnnAssign):
                out.append(("var", ast.unparse(s.target), ast.unparse(s.annotation)))
            elif isinstance(s, ast.Assign):
                out.append(("assign", [ast.unparse(t) for t in s.targets]))
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                out.append(("import", ast.unparse(s)))
        return sorted(out, key=repr)

    return body(ast.parse(source).body)


MODULES = list(generate_stubs.STUBS)
#: what is compared: the full shape, or the declared names only (a hand-written stub)
NAMES_ONLY = {"cadence._thrust", "cadence._membership"}


def names(source: str):
    return sorted((s[0], s[1]) if s[0] != "assign" else (s[0], tuple(s[1])) for s in shape(source)
                  if s[0] != "import")


@pytest.mark.parametrize("module", MODULES)
def test_committed_stub_declares_what_the_extension_exports(module):
    generate_stubs._installed()
    if module not in generate_stubs.built_modules():
        pytest.skip(f"{module} is not built here")
    committed = generate_stubs.STUBS[module]
    assert committed.exists(), f"{committed} is missing: run python python/generate_stubs.py"
    compare = names if module in NAMES_ONLY else shape
    assert compare(committed.read_text()) == compare(generate_stubs.render(module)), (
        f"{committed} no longer matches {module}: " + (
            "update it by hand" if module in NAMES_ONLY else "run python python/generate_stubs.py"))


def test_thrust_stub_ships_only_with_thrust():
    import cadence

    installed = pathlib.Path(cadence.__file__).parent
    has_thrust = "thrust" in cadence.zipline_variants()
    assert (installed / "_thrust.pyi").exists() == has_thrust
    assert not (ROOT / "python" / "cadence" / "_thrust.pyi").exists()  # not in the pure-Python tree
