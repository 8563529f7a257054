"""The optional dependencies, and the doctests that need one skipping where it is missing.

A test that needs an optional module asks for it with :func:`needs` (``pytest.importorskip``
with :data:`REASON`'s text), in the test or at the top of its file; a docstring example
cannot, so :func:`pytest_collection_modifyitems` (the repository's top ``conftest.py``
imports it) skips a doctest whose examples import a missing optional module, and turns the
failure of one that reaches it indirectly (``fem.pmg``'s default AMG coarse solve needs
pyamg) into a skip naming the module. Only a module of :data:`REASON` that does not import
here is skipped for: with every optional module installed, every doctest runs.
"""
import ast
import functools
import importlib.util

import pytest

__all__ = ["REASON", "missing", "needs", "pytest_collection_modifyitems"]

#: optional module -> what installs it (pyproject.toml's extras)
REASON = {
    "cupy": "an NVIDIA GPU with CuPy (pip install 'smalltc[gpu]')",
    "gmsh": "gmsh (pip install 'smalltc[gmsh]')",
    "jax": "JAX (pip install 'smalltc[interop]')",
    "matplotlib": "matplotlib (pip install 'smalltc[plot]')",
    "meshio": "meshio (pip install meshio)",
    "mpi4py": "mpi4py (pip install 'smalltc[mpi]')",
    "pyamg": "pyamg (pip install 'smalltc[amg]')",
    "scipy": "SciPy (pip install 'smalltc[amg]')",
    "torch": "torch (pip install 'smalltc[interop]')",
}


@functools.lru_cache(maxsize=None)
def missing(name) -> bool:
    """True when the optional module ``name`` (a top-level name of :data:`REASON`) is not
    installed (found without importing it)."""
    return name in REASON and importlib.util.find_spec(name) is None


def _imported(source):
    """Top-level names of the modules a docstring example imports."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _missing_in(exc):
    """The missing optional module an exception (or its cause) reports, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ImportError) and exc.name and missing(exc.name.split(".")[0]):
            return exc.name.split(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def _skipping_missing(runtest):
    """``runtest`` of a doctest item, with a failure for a missing optional module a skip."""
    @functools.wraps(runtest)
    def run():
        try:
            runtest()
        except Exception as err:    # doctest.UnexpectedException, or several of them
            failures = getattr(err, "failures", [err])   # (--doctest-continue-on-failure)
            found = {_missing_in(getattr(f, "exc_info", (None, None))[1]) for f in failures}
            if None in found:
                raise
            pytest.skip("needs " + ", ".join(REASON[n] for n in sorted(found)))
    return run


def pytest_collection_modifyitems(config, items):
    for item in items:
        test = getattr(item, "dtest", None)          # a doctest item
        if test is None:
            continue
        gone = sorted({name for example in test.examples for name in _imported(example.source)
                       if missing(name)})
        if gone:
            item.add_marker(pytest.mark.skip(reason="needs " + ", ".join(REASON[n]
                                                                          for n in gone)))
        else:
            item.runtest = _skipping_missing(item.runtest)


def needs(*names):
    """Skip the calling test (or, called at a file's top, the file) unless every named
    optional module imports: ``pytest.importorskip`` with :data:`REASON` as the reason."""
    for name in names:
        pytest.importorskip(name, reason=f"needs {REASON[name]}")
