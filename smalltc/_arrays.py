"""Array modules: NumPy/CuPy detection, GPU probing, what a kernel can take.

CuPy is optional. It may import on a machine without a GPU and fail only at
the first device call, so "is there a GPU" is answered by a device query.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["cupy_or_none", "gpu_available", "array_module", "is_cupy", "is_array",
           "c_contiguous", "usable", "data_range", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@functools.lru_cache(maxsize=None)
def cupy_or_none():
    """Return the ``cupy`` module, or ``None`` when it cannot be imported."""
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install
        return None
    return cupy


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when CuPy imports and a CUDA device answers a query."""
    cp = cupy_or_none()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CUDARuntimeError without a driver or device
        return False


@functools.lru_cache(maxsize=None)
def _cupy_ndarray():
    cp = cupy_or_none()
    return None if cp is None else cp.ndarray


def is_cupy(x) -> bool:
    nd = _cupy_ndarray()
    return nd is not None and isinstance(x, nd)


def is_array(x) -> bool:
    """Is ``x`` a NumPy or CuPy array (or an instance of a subclass)?"""
    return isinstance(x, np.ndarray) or is_cupy(x)


def array_module(*arrays):
    """The module (numpy or cupy) of ``arrays``; ``TypeError`` when mixed.

    Examples
    --------
    >>> import numpy as np
    >>> array_module(np.ones(2), np.ones(3)).__name__
    'numpy'
    """
    kinds = {"cupy" if is_cupy(a) else "numpy" for a in arrays if a is not None}
    if len(kinds) > 1:
        raise TypeError("operands mix NumPy and CuPy arrays; move them to one "
                        "device first (cupy.asarray / cupy.asnumpy)")
    if kinds == {"cupy"}:
        return cupy_or_none()
    return np


def c_contiguous(a) -> bool:
    """Is ``a`` C-contiguous? (CuPy's ``flags`` builds an object per access; its
    ``_c_contiguous`` attribute is the same answer without it.)"""
    if type(a) is np.ndarray:
        return a.flags.c_contiguous
    c = getattr(a, "_c_contiguous", None)
    return a.flags.c_contiguous if c is None else c


def usable(a) -> bool:
    """Can a kernel take array ``a`` as it is? CuPy: C-contiguous. NumPy: C-contiguous,
    aligned and writeable (``flags.carray``: the CPU kernels' Numba signatures take
    writeable aligned arrays only). (:class:`smalltc.Plan` compares the same attributes
    inline.)

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((3, 4))
    >>> usable(x), usable(x.T), usable(np.broadcast_to(x[0], (3, 4)))
    (True, False, False)
    """
    return a._c_contiguous if is_cupy(a) else a.flags.carray


def data_range(a):
    """``(lo, hi)`` byte addresses spanned by array ``a`` (hi exclusive)."""
    if is_cupy(a):
        ptr = a.data.ptr
        if a._c_contiguous:                  # the common case, first: no flags object
            return ptr, ptr + a.nbytes
    else:
        ptr = a.__array_interface__["data"][0]
        if a.flags.c_contiguous:
            return ptr, ptr + a.nbytes
    if a.size == 0:
        return ptr, ptr
    lo = hi = ptr
    for n, st in zip(a.shape, a.strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi + a.itemsize
