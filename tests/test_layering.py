"""The layers of the package, read from the source: every import statement (those inside
functions included) and every ``importlib.import_module("...")`` with a literal name.

Bottom up, each layer imports only those below it:

============================  ==========================================================
layer                         may not import
============================  ==========================================================
core (``smalltc/``)           ``smalltc.fem``, ``smalltc.bench``, ``smalltc.tuning``,
                              ``smalltc.app``
FEM (``fem/``)                ``smalltc.backends`` (only the core's public functions),
                              ``smalltc.bench``, ``smalltc.tuning``, ``smalltc.app``
tuner (``tuning/``)           ``smalltc.fem``, ``smalltc.bench``, ``smalltc.app``
benchmarks (``smalltc/bench``)  ``smalltc.app``
============================  ==========================================================

The application layer (``smalltc/app``, with ``smalltc/__main__.py``) may import anything.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# pyproject.toml's package-dir: the package each source folder installs as
PACKAGE_DIRS = {"smalltc": "smalltc", "smalltc.fem": "fem", "smalltc.tuning": "tuning"}
APP = ("smalltc/app/", "smalltc/__main__.py")
BENCH = "smalltc/bench/"


def module_name(path, root=ROOT):
    """``(dotted name, is a package __init__)`` of a source file under ``root``."""
    rel = path.relative_to(root)
    for package, folder in PACKAGE_DIRS.items():
        if rel.parts[0] == folder:
            parts = list(rel.with_suffix("").parts[1:])
            init = parts[-1] == "__init__"
            return ".".join([package] + (parts[:-1] if init else parts)), init
    raise ValueError(f"{rel} is in none of the package folders {sorted(PACKAGE_DIRS.values())}")


def imported_modules(source, module, is_package=False):
    """Every module ``source`` (the text of ``module``) imports, as ``(name, line)``: absolute
    and relative imports anywhere in the file (functions, classes, ``if`` blocks),
    ``from X import Y`` giving both ``X`` and ``X.Y`` (Y may be a submodule), and
    ``importlib.import_module`` / ``__import__`` calls with a literal name."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.append((target, node.lineno))
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
                   or isinstance(node.func, ast.Name) and node.func.id in ("import_module",
                                                                           "__import__"))):
            out.append((node.args[0].value, node.lineno))
    return out


def violations(path, forbidden, root=ROOT):
    """``"file:line imports name"`` for each import of ``path`` inside a forbidden package."""
    module, is_package = module_name(path, root)
    rel = path.relative_to(root).as_posix()
    found = {}                                 # one entry a line: ``from X import Y`` names X
    for name, line in imported_modules(path.read_text(), module, is_package):
        if any(name == f or name.startswith(f + ".") for f in forbidden):
            found.setdefault(line, f"{rel}:{line} imports {name}")
    return list(found.values())


def sources(folder):
    return sorted((ROOT / folder).rglob("*.py"))


def _layer(path):
    rel = path.relative_to(ROOT).as_posix()
    if rel.startswith(APP) or rel in APP:
        return "app"
    if rel.startswith(BENCH):
        return "bench"
    return {"smalltc": "core", "fem": "fem", "tuning": "tuning"}[rel.split("/")[0]]


FORBIDDEN = {
    "core": ("smalltc.fem", "smalltc.bench", "smalltc.tuning", "smalltc.app"),
    "fem": ("smalltc.bench", "smalltc.tuning", "smalltc.app"),
    "tuning": ("smalltc.fem", "smalltc.bench", "smalltc.app"),
    "bench": ("smalltc.app",),
    "app": (),
}
FILES = [p for folder in PACKAGE_DIRS.values() for p in sources(folder)]
# files allowed to break a rule for a stated reason (strict xfail: the day one stops
# breaking it, the entry must go)
KNOWN = {}


def _param(path):
    rel = path.relative_to(ROOT).as_posix()
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN[rel])] if rel in KNOWN else []
    return pytest.param(path, id=rel, marks=marks)


def test_the_layers_cover_every_source_file():
    assert len(FILES) > 100
    assert {_layer(p) for p in FILES} == set(FORBIDDEN)
    assert all((ROOT / folder / "__init__.py").is_file() for folder in PACKAGE_DIRS.values())


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
def test_no_import_of_a_higher_layer(path):
    assert violations(path, FORBIDDEN[_layer(path)]) == []


def test_fem_imports_no_backend_module():
    found = [v for p in sources("fem") for v in violations(p, ("smalltc.backends",))]
    assert found == []


@pytest.mark.parametrize("source, module, is_package, expected", [
    ("import smalltc.fem.mesh", "smalltc.x", False, ["smalltc.fem.mesh"]),
    ("def f():\n    from .fem import mesh\n", "smalltc.x", False,
     ["smalltc.fem", "smalltc.fem.mesh"]),
    ("from . import fem", "smalltc", True, ["smalltc", "smalltc.fem"]),
    ("class A:\n    def m(self):\n        from ...bench.cases import Case\n",
     "smalltc.backends.cpu.action", False, ["smalltc.bench.cases", "smalltc.bench.cases.Case"]),
    ("from .. import roofline", "smalltc.tuning.cpu", False, ["smalltc", "smalltc.roofline"]),
    ("if x:\n    importlib.import_module('smalltc.tuning.cli')\n", "smalltc.y", False,
     ["smalltc.tuning.cli"]),
    ("import numpy as np", "smalltc.y", False, ["numpy"]),
])
def test_every_kind_of_import_is_seen(source, module, is_package, expected):
    assert [name for name, _ in imported_modules(source, module, is_package)] == expected


def test_a_function_level_import_of_the_fem_layer_is_a_violation(tmp_path):
    (tmp_path / "smalltc").mkdir()
    bad = tmp_path / "smalltc" / "bad.py"
    bad.write_text("import numpy\n\n\ndef f():\n    from .fem.geometry import map_points\n")
    rel = bad.relative_to(tmp_path).as_posix()
    assert violations(bad, FORBIDDEN["core"], tmp_path) == [f"{rel}:5 imports smalltc.fem.geometry"]
