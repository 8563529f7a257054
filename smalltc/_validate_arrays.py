"""The checks every spec builder of :mod:`smalltc._validate` shares: an operand as an
array, the common dtype of the operands, a real scalar, the 1D basis, the point data D,
the element-to-DoF map and a positive count. Every message names the operand, its shape
or dtype, and what was expected.
"""
from __future__ import annotations

import math

import numpy as np

from . import _interop
from ._arrays import SUPPORTED_DTYPES, is_array

__all__ = ["check_scalar"]


def _as_array(name, x):
    """``x`` as a NumPy or CuPy array: itself, a zero-copy view of a DLPack producer
    (torch, JAX: :func:`smalltc._interop.import_array`), or ``numpy.asarray`` of
    anything else (lists)."""
    if x is None:
        raise TypeError(f"{name} is None; expected an array")
    if is_array(x):
        return x
    if hasattr(x, "__dlpack__"):
        return _interop.import_array(name, x)
    try:
        return np.asarray(x)
    except Exception as err:
        raise TypeError(f"{name} cannot be converted to an array") from err


_NAMES = {dt: dt.name for dt in SUPPORTED_DTYPES}   # dtype.name is slow (Python-level)


def _dtype(named):
    """Common dtype of ``named`` (dict name -> array); error on mixes."""
    first = None
    for a in named.values():                 # the common case: one supported dtype
        first = a.dtype if first is None else first
        if a.dtype != first:
            break
    else:
        name = _NAMES.get(first)
        if name is not None:
            return name
    dts = {name: np.dtype(a.dtype) for name, a in named.items()}
    for name, dt in dts.items():
        if dt not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {dt}; smalltc supports float32 and float64")
    if len(set(dts.values())) > 1:
        got = ", ".join(f"{n} is {d}" for n, d in dts.items())
        raise TypeError(f"operands have mixed dtypes ({got}); convert them to one "
                        "dtype explicitly (no silent casts)")
    return next(iter(dts.values())).name


def _split_dtype(named, data_names):
    """``(dtype, qdtype)``: the common dtype of ``named``, or, where every data operand
    (``data_names``: D, Q) is float32 and every other float64, ``("float64",
    "float32")``: float32 point data read by float64 kernels (docs/math.md section 8).
    Any other mix raises as :func:`_dtype`."""
    try:
        return _dtype(named), None
    except TypeError:
        data = {n: a for n, a in named.items() if n in data_names}
        rest = {n: a for n, a in named.items() if n not in data_names}
        if data and rest and all(np.dtype(a.dtype) == np.float32 for a in data.values()) \
                and all(np.dtype(a.dtype) == np.float64 for a in rest.values()):
            return "float64", "float32"
        raise


def check_scalar(name, value):
    if isinstance(value, (str, bytes)):          # float("2") would take it
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a real number, got {value!r}") from err
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _check_b1d(B1d):
    if B1d.ndim != 2 or 0 in B1d.shape:
        raise ValueError(f"B1d has shape {tuple(B1d.shape)}, expected (nq, nd) "
                         "with nq, nd >= 1")
    return B1d.shape


def _check_d(D, nq):
    dim = D.ndim - 1
    if dim not in (1, 2, 3):
        raise ValueError(f"D has shape {tuple(D.shape)}, expected (E, nq), (E, nq, nq) "
                         f"or (E, nq, nq, nq) with nq={nq}")
    want = (D.shape[0],) + (nq,) * dim
    if tuple(D.shape) != want:
        raise ValueError(f"D has shape {tuple(D.shape)}, expected {want} for "
                         f"nq={nq}, dim={dim} (nq is B1d.shape[0])")
    return dim


def _check_map(elem_dofs, E, nd, dim, src="E from D, nd from B1d", name="elem_dofs"):
    """The element-to-DoF map: an integer array (int32 or int64) of shape (E, nd, ...)."""
    want = (E,) + (nd,) * dim
    if tuple(elem_dofs.shape) != want:
        raise ValueError(f"{name} has shape {tuple(elem_dofs.shape)}, expected {want} for "
                         f"E={E}, nd={nd}, dim={dim} ({src})")
    dt = np.dtype(elem_dofs.dtype)
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{name} has dtype {dt}, expected int32 or int64 (global DoF "
                        "indices)")
    return dt.name


def _positive_int(name, n, what):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name} must be a positive integer ({what}), got {n!r}")
    return int(n)
