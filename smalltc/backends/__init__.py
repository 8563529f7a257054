"""Backend registry.

``backend="auto"`` picks, for the arrays' module (NumPy or CuPy), the
available backend of highest priority: ``cuda`` for CuPy arrays, ``cpu``
(Numba) for NumPy arrays, and ``reference`` (NumPy/CuPy einsum, the oracle of
every test) when nothing faster is there.

Examples
--------
>>> from smalltc import backends
>>> backends.get("reference").name
'reference'
>>> "reference" in backends.names()
True
"""
from __future__ import annotations

import importlib
import logging

from .base import Backend, Executor, Unsupported

__all__ = ["Backend", "Executor", "Unsupported", "register", "get", "names",
           "candidates"]

log = logging.getLogger("smalltc")

_REGISTRY: dict[str, Backend] = {}
# Optional backends, imported on first use: (name, module, the array modules it takes).
# A module that fails to import leaves its backend out and says why in the log. A
# question about one array module imports only the backends that take it (a GPU run
# does not import Numba's CPU backend).
_LAZY = [("cpu", "smalltc.backends.cpu", ("numpy",)),
         ("cuda", "smalltc.backends.cuda", ("cupy",))]


def register(backend: Backend) -> Backend:
    _REGISTRY[backend.name] = backend
    return backend


def _load_lazy(xp_name=None, name=None):
    """Import the optional backends not loaded yet: all of them, or those taking arrays
    of module ``xp_name``, or the one called ``name``."""
    for entry in list(_LAZY):
        backend, module, takes = entry
        if (xp_name is not None and xp_name not in takes) or \
                (name is not None and name != backend):
            continue
        _LAZY.remove(entry)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                log.info("smalltc: backend %r unavailable: %s", backend, err)
        except Exception as err:  # a broken optional dependency
            log.warning("smalltc: backend %r failed to load: %s", backend, err)


def names():
    """Names of all registered backends (available or not)."""
    _load_lazy()
    return sorted(_REGISTRY)


def get(name: str) -> Backend:
    _load_lazy(name=name)
    if name not in _REGISTRY:
        _load_lazy()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(_REGISTRY)}") from None


def candidates(xp_name: str, requested: str = "auto"):
    """Backends to try, best first, for arrays of module ``xp_name``."""
    _load_lazy(xp_name=xp_name)
    if requested != "auto":
        b = get(requested)
        if xp_name not in b.array_modules:
            raise TypeError(f"backend {requested!r} takes {' or '.join(b.array_modules)} "
                            f"arrays, got {xp_name} arrays")
        if not b.available():
            raise RuntimeError(f"backend {requested!r} is not available here: {b.describe()}")
        return [b]
    found = [b for b in _REGISTRY.values()
             if xp_name in b.array_modules and b.available()]
    return sorted(found, key=lambda b: -b.priority)


from . import reference  # noqa: E402,F401  (always registered)
