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

Imports sit at module level. A function imports a module itself only for an optional
dependency (:data:`OPTIONAL`) or for a reason said in a comment on the import's line:
``# cycle: ...`` (the module imports this one), ``# optional ...`` (it loads an optional
dependency), ``# loaded when ...`` / ``# loaded for ...`` (a layer loaded only where it is
used, such as the MPI layer for ``comm=``).
"""
import ast
import pathlib
import re

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


def _from_target(node, package):
    """The absolute name of the module of ``from X import ...`` (``node``, an ``ImportFrom``)
    in ``package`` (a list of names)."""
    if not node.level:
        return node.module
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


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
            target = _from_target(node, package)
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


# optional dependencies: a function imports them where they are used, so that its module
# loads without them (or without their import time)
OPTIONAL = ("cupy", "cupyx", "numba", "llvmlite", "matplotlib", "scipy", "pyamg", "meshio",
            "mpi4py", "pymetis", "gmsh", "torch", "jax", "tqdm", "threadpoolctl")
# the reason a function imports a module itself, in a comment on the import's lines
REASON = re.compile(r"#.*\b(cycle|optional|loaded (when|for))\b")
#: (file, module) imported inside a function there with no reason on its line, and why
ALLOWED = {
    ("smalltc/backends/cuda/force.py", "smalltc.backends.cpu.force"):
        "optional: the CPU backend's step list loads Numba",
}


def function_imports(source, module, is_package=False):
    """The imports inside functions (methods and nested functions too) of ``source`` (the
    text of ``module``), as ``(names, first line, last line)``; ``names``: the modules
    imported, absolute (``from . import a, b``: ``pkg.a``, ``pkg.b``)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out, seen = [], set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                target = _from_target(node, package)
                names = [f"{target}.{alias.name}" for alias in node.names] if node.module is None \
                    else [target]
            out.append((names, node.lineno, node.end_lineno))
    return out


def function_import_violations(path, root=ROOT):
    """``"file:line imports name inside a function"`` for each import inside a function of
    ``path`` of a module that is not optional, with no reason on its lines."""
    module, is_package = module_name(path, root)
    rel = path.relative_to(root).as_posix()
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for names, first, last in function_imports(source, module, is_package):
        if any(REASON.search(line) for line in lines[first - 1:last]):
            continue
        for name in names:
            if name.split(".")[0] not in OPTIONAL and (rel, name) not in ALLOWED:
                found.append(f"{rel}:{first} imports {name} inside a function (move it to the "
                             "module's imports, or say why not: # cycle: / # optional / "
                             "# loaded when)")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_at_module_level(path):
    assert function_import_violations(path) == []


def test_each_allowed_function_import_is_there():
    for (rel, name), _ in ALLOWED.items():
        module, is_package = module_name(ROOT / rel)
        found = function_imports((ROOT / rel).read_text(), module, is_package)
        assert any(name in names for names, _, _ in found), (rel, name)


@pytest.mark.parametrize("body, expected", [
    ("    import json\n", [(5, "json")]),
    ("    from .maps import check_range\n", [(5, "smalltc.maps")]),
    ("    from . import maps, plan\n", [(5, "smalltc.maps"), (5, "smalltc.plan")]),
    ("    class A:\n        def m(self):\n            import time\n", [(7, "time")]),
    ("    from .solver import (plan,\n                         call)  # cycle: it imports this\n", []),
    ("    from . import solver  # cycle: smalltc.solver imports this module\n", []),
    ("    from .backends import cpu  # optional: loads Numba\n", []),
    ("    from .fem.distributed import comm  # loaded for comm=\n", []),
    ("    import json  # json\n", [(5, "json")]),
    ("    import cupy as cp\n    from numba.core import config\n", []),
    ("    from matplotlib.ticker import MaxNLocator\n", []),
])
def test_a_function_level_import_needs_a_reason(tmp_path, body, expected):
    (tmp_path / "smalltc").mkdir()
    bad = tmp_path / "smalltc" / "bad.py"
    bad.write_text("import numpy\n\n\ndef f():\n" + body)
    rel = bad.relative_to(tmp_path).as_posix()
    found = function_import_violations(bad, tmp_path)
    assert [v.split(" (")[0] for v in found] == [
        f"{rel}:{line} imports {name} inside a function" for line, name in expected]
