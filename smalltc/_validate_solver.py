"""Operand checks of the solver kernels (:mod:`smalltc.solver`): arrays to a spec, or a
clear error naming the operand, its shape and the expected one.

Examples
--------
>>> import numpy as np
>>> spec, xp = csr_spmv_spec(np.array([0, 1], np.int32), np.array([0], np.int32),
...                          np.ones(1), np.ones(3))
>>> str(spec)
'csr_spmv n=1 nnz=1 float64'
>>> pcg_spec(np.ones(3), np.ones(4), None)
Traceback (most recent call last):
...
ValueError: r has shape (4,), expected (3,) (the length of x)
"""
from __future__ import annotations

import weakref

import numpy as np

from ._arrays import array_module, is_array
from ._validate import _dtype
from .maps import check_range, map_info
from .spec import (INDEX_DTYPES, VECTOR_MODES, CsrSpmvSpec, PcgSpec, SchwarzSpec,
                   TransferSpec, VectorUpdateSpec)

__all__ = ["vector_update_spec", "pcg_spec", "transfer_spec", "csr_spmv_spec",
           "schwarz_spec", "check_maps"]


def _arrays(named):
    """``named`` (name -> array, None left out) checked to be NumPy or CuPy arrays of one
    module; returns the module."""
    xp = None
    for name, a in named.items():
        if not is_array(a):
            raise TypeError(f"{name} must be a NumPy or CuPy array, got {type(a).__name__}")
        m = array_module(a)
        if xp is None:
            xp, first = m, name
        elif m is not xp:
            raise TypeError(f"{name} is a {m.__name__} array but {first} is a {xp.__name__} "
                            "array; pass arrays of one library")
    return xp


def _vectors(named, n=None, of=None):
    """Every array of ``named`` one-dimensional of length ``n`` (the first's by default)."""
    for name, a in named.items():
        if n is None:
            n, of = (a.shape[0] if a.ndim == 1 else None), name
            if n is None:
                raise ValueError(f"{name} has shape {tuple(a.shape)}, expected a vector (n,)")
        if tuple(a.shape) != (n,):
            raise ValueError(f"{name} has shape {tuple(a.shape)}, expected ({n},) (the "
                             f"length of {of})")
    return n


def _index(name, a):
    dt = np.dtype(a.dtype).name
    if dt not in INDEX_DTYPES:
        raise TypeError(f"{name} has dtype {dt}; expected int32 or int64")
    return dt


def vector_update_spec(mode, vectors, free=None):
    """The :class:`~smalltc.spec.VectorUpdateSpec` of ``vectors`` (in the mode's operand
    order, without the mask) and ``free``."""
    if mode not in VECTOR_MODES:
        raise ValueError(f"mode must be one of {VECTOR_MODES}, got {mode!r}")
    names = VectorUpdateSpec.OPERANDS[mode]
    if len(vectors) != len(names):
        raise TypeError(f"mode {mode!r} takes {len(names)} vectors ({', '.join(names)}), got "
                        f"{len(vectors)}")
    named = dict(zip(names, vectors))
    if free is not None:
        named["f"] = free
    xp = _arrays(named)
    n = _vectors(named)
    return VectorUpdateSpec(mode=mode, batch=n, dtype=_dtype(named),
                            masked=free is not None), xp


def pcg_spec(x, r, inv=None):
    """The :class:`~smalltc.spec.PcgSpec` of the flat vectors (``inv`` None: no Jacobi)."""
    named = dict(x=x, r=r)
    if inv is not None:
        named["inv"] = inv
    xp = _arrays(named)
    n = _vectors(named)
    return PcgSpec(batch=n, dtype=_dtype(named), jacobi=inv is not None), xp


def transfer_spec(M, x, in_map, in_w, out_map, out_w):
    """The :class:`~smalltc.spec.TransferSpec` of a transfer's operands."""
    named = dict(M=M, x=x, in_map=in_map, in_w=in_w, out_map=out_map, out_w=out_w)
    xp = _arrays(named)
    if M.ndim != 2:
        raise ValueError(f"M has shape {tuple(M.shape)}, expected (nout, nin)")
    nout, nin = M.shape
    dim = in_map.ndim - 1
    if dim not in (1, 2, 3) or tuple(in_map.shape[1:]) != (nin,) * dim:
        raise ValueError(f"in_map has shape {tuple(in_map.shape)}, expected (E,) + ({nin},) "
                         "* dim, dim 1-3 (nin from M)")
    E = in_map.shape[0]
    if tuple(out_map.shape) != (E,) + (nout,) * dim:
        raise ValueError(f"out_map has shape {tuple(out_map.shape)}, expected "
                         f"{(E,) + (nout,) * dim} (E from in_map, nout from M)")
    it = _index("in_map", in_map)
    if _index("out_map", out_map) != it:
        raise TypeError(f"in_map is {it} but out_map is {out_map.dtype}; pass one index dtype")
    n_in = _vectors(dict(x=x, in_w=in_w))
    n_out = _vectors(dict(out_w=out_w))
    dtype = _dtype(dict(M=M, x=x, in_w=in_w, out_w=out_w))
    return TransferSpec(dim=dim, nin=nin, nout=nout, batch=E, dtype=dtype, n_in=n_in,
                        n_out=n_out, index_dtype=it), xp


def csr_spmv_spec(indptr, indices, data, x):
    """The :class:`~smalltc.spec.CsrSpmvSpec` of a CSR matrix's arrays and ``x``."""
    named = dict(indptr=indptr, indices=indices, data=data, x=x)
    xp = _arrays(named)
    if indptr.ndim != 1 or indptr.shape[0] < 1:
        raise ValueError(f"indptr has shape {tuple(indptr.shape)}, expected (nrows + 1,)")
    nnz = _vectors(dict(indices=indices, data=data))
    ncols = _vectors(dict(x=x))
    it = _index("indptr", indptr)
    if _index("indices", indices) != it:
        raise TypeError(f"indptr is {it} but indices is {indices.dtype}; pass one index "
                        "dtype")
    return CsrSpmvSpec(batch=indptr.shape[0] - 1, ncols=ncols, nnz=nnz,
                       dtype=_dtype(dict(data=data, x=x)), index_dtype=it), xp


def schwarz_spec(S, inv, idx, r, w):
    """The :class:`~smalltc.spec.SchwarzSpec` of a Schwarz application's operands."""
    named = dict(S=S, inv=inv, idx=idx, r=r, w=w)
    xp = _arrays(named)
    if S.ndim != 4 or S.shape[2] != S.shape[3] or S.shape[1] not in (1, 2, 3):
        raise ValueError(f"S has shape {tuple(S.shape)}, expected (E, dim, n, n), dim 1-3")
    E, dim, n, _ = S.shape
    want = (E,) + (n,) * dim
    for name, a in (("inv", inv), ("idx", idx)):
        if tuple(a.shape) != want:
            raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {want} (E, dim, "
                             "n from S)")
    ndofs = _vectors(dict(r=r, w=w))
    dtype = _dtype(dict(S=S, inv=inv, w=w))
    rdtype = None
    if r.dtype != dtype:
        if not (dtype == "float32" and r.dtype == np.float64):
            raise TypeError(f"r has dtype {r.dtype} but S, inv and w are {dtype}; r may be "
                            "float64 with float32 local solves, else of their dtype")
        rdtype = "float64"
    return SchwarzSpec(dim=dim, n=n, batch=E, dtype=dtype, ndofs=ndofs,
                       index_dtype=_index("idx", idx), rdtype=rdtype), xp


def check_maps(spec, operands):
    """The index operands' ranges, checked once per array object
    (:func:`smalltc.maps.map_info`); CSR: ``indptr`` non-decreasing from 0 to ``nnz``."""
    if spec.op == "pmg_transfer":
        pairs = (("in_map", operands[2], spec.n_in, "x"),
                 ("out_map", operands[4], spec.n_out, "y"))
    elif spec.op == "schwarz_fdm":
        pairs = (("idx", operands[2], spec.ndofs + 1, "r (and its pad)"),)
    elif spec.op == "csr_spmv":
        indptr = operands[0]
        key = (id(indptr), spec.nnz)
        seen = _CSR_SEEN.get(key)
        if seen is None or seen() is not indptr:
            ip = indptr.get() if hasattr(indptr, "get") else indptr
            if ip[0] != 0 or ip[-1] != spec.nnz or (np.diff(ip) < 0).any():
                raise ValueError(f"indptr must rise from 0 to nnz={spec.nnz} (the length of "
                                 f"indices), got {ip[0]} .. {ip[-1]}")
            if len(_CSR_SEEN) > 256:
                _CSR_SEEN.clear()
            _CSR_SEEN[key] = weakref.ref(indptr)
        pairs = (("indices", operands[1], spec.ncols, "x"),)
    else:
        return
    for name, m, n, vec in pairs:
        if m.size:
            try:
                map_info(m, n)
            except ValueError:
                check_range(m, n, name=name, vector=vec)
                raise


#: the indptr arrays checked: (id, nnz) -> a weak reference
_CSR_SEEN: dict = {}
