"""Loaded by pytest before any collection, of the test files and of the modules' doctests
alike (``pytest --doctest-modules fem/multigrid.py`` included): a doctest that needs a
missing optional module (pyamg, meshio, mpi4py, ...) skips, naming it
(tests/optional_deps.py)."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "tests"))

from optional_deps import pytest_collection_modifyitems  # noqa: E402,F401
