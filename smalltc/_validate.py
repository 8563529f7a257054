"""Operand checks: turn user arrays into a spec, or raise a clear error.

Every message names the operand, its shape or dtype, and what was expected.
The ``*_spec`` functions run when a plan is built. A plan's call compares its
operands with the spec itself and calls the ``check_*`` functions here only
when a comparison fails: they raise the error that names the operand, or
pass, and the call then converts what it documents it converts.

The checks live in modules by family, all of them read from here: the shared checks
(``smalltc._validate_arrays``), the FEM operators (``smalltc._validate_operators``), the
evaluation at the points (``smalltc._validate_evaluation``); the GEMM, the contractions and
the checks a plan's call makes are here.
"""
from __future__ import annotations

import math

import numpy as np

from ._arrays import array_module, c_contiguous, data_range, is_array, is_cupy, usable
from ._validate_arrays import _as_array, _dtype, check_scalar
from ._validate_evaluation import basis_spec, geometry_spec
from ._validate_operators import (OPERATOR_LEVELS, action_spec, assembly_spec, force_spec,
                                  mass_apply_spec, mass_diagonal_spec, mixed_spec,
                                  operator_spec, vertex_operator_spec)
from .spec import ContractSpec, GemmSpec

__all__ = ["action_spec", "assembly_spec", "gemm_spec", "contract_spec", "mass_apply_spec",
           "mass_diagonal_spec", "operator_spec", "force_spec", "mixed_spec", "basis_spec",
           "geometry_spec", "OPERATOR_LEVELS",
           "check_operands", "check_out", "reshape_like", "as_usable", "check_scalar"]


def gemm_spec(A, B, C, *, alpha, beta, trans_a, trans_b):
    """Check the operands of ``batched_gemm``; return ``(spec, xp, ops)``."""
    A, B = _as_array("A", A), _as_array("B", B)
    named = {"A": A, "B": B}
    beta = check_scalar("beta", beta)
    check_scalar("alpha", alpha)
    if beta != 0.0:
        if C is None:
            raise ValueError(f"beta={beta} needs C; pass C or use beta=0")
        C = _as_array("C", C)
        named["C"] = C
    xp = array_module(*named.values())
    dtype = _dtype(named)
    for name, x in (("A", A), ("B", B)):
        if x.ndim not in (2, 3) or 0 in x.shape[-2:]:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected (batch, rows, "
                             "cols) or (rows, cols) for an operand shared by the batch")
    m, ka = (A.shape[-1], A.shape[-2]) if trans_a else (A.shape[-2], A.shape[-1])
    kb, n = (B.shape[-1], B.shape[-2]) if trans_b else (B.shape[-2], B.shape[-1])
    if ka != kb:
        raise ValueError(f"inner dimensions differ: op(A) is {m} x {ka} (A has shape "
                         f"{tuple(A.shape)}, trans_a={trans_a}) but op(B) is {kb} x {n} "
                         f"(B has shape {tuple(B.shape)}, trans_b={trans_b})")
    batches = {x.shape[0] for x in (A, B) if x.ndim == 3}
    if len(batches) > 1:
        raise ValueError(f"batch counts differ: A has shape {tuple(A.shape)}, "
                         f"B has shape {tuple(B.shape)}")
    if not batches:
        raise ValueError("A and B are both 2D; at least one must be a batch "
                         "(batch, rows, cols) array (use numpy.matmul for one product)")
    spec = GemmSpec(batch=batches.pop(), m=m, n=n, k=ka, dtype=dtype, trans_a=bool(trans_a),
                    trans_b=bool(trans_b), shared_a=A.ndim == 2, shared_b=B.ndim == 2,
                    beta_zero=beta == 0.0)
    if not spec.beta_zero and tuple(C.shape) != spec.out_shape:
        raise ValueError(f"C has shape {tuple(C.shape)}, expected {spec.out_shape}")
    return spec, xp, ((A, B) if spec.beta_zero else (A, B, C))   # the operands of spec.inputs


def contract_spec(kind, X, Y, extents=None):
    """Check the operands of ``contract``; return ``(spec, xp, ops)``.

    ``extents`` (dict with keys i, s, j, k, l; optional) reshapes the
    operands first (a view, no copy, when they are contiguous).
    """
    if kind not in ("8a", "8b", "9"):
        raise ValueError(f"kind must be '8a', '8b' or '9', got {kind!r}")
    X, Y = _as_array("X", X), _as_array("Y", Y)
    xp = array_module(X, Y)
    dtype = _dtype({"X": X, "Y": Y})
    xcore = 2 if kind == "9" else 3
    if extents is not None:
        missing = {"i", "s", "j", "k", "l"} - set(extents)
        if missing:
            raise ValueError(f"extents lacks {sorted(missing)}; give i, s, j, k, l")
        e = {key: int(v) for key, v in extents.items()}
        if kind == "9" and e["i"] != e["j"]:
            raise ValueError(f"kind '9' needs i == j (B is [s, n]); got extents {e}")
        xc = (e["s"], e["i"]) if kind == "9" else (e["i"], e["s"], e["j"])
        yc = (e["k"], e["s"], e["l"])
        X = _reshape("X", X, xc, xcore)
        Y = _reshape("Y", Y, yc, 3)
    if X.ndim not in (xcore, xcore + 1):
        want = "[s, n]" if kind == "9" else "[i, s, j]"
        raise ValueError(f"X has shape {tuple(X.shape)}, expected {want} or with a "
                         "leading batch axis")
    if Y.ndim not in (3, 4):
        raise ValueError(f"Y has shape {tuple(Y.shape)}, expected [k, s, l] or with a "
                         "leading batch axis")
    if kind == "9" and X.ndim != 2:
        raise ValueError(f"X (B) has shape {tuple(X.shape)}; kernel '9' takes one B[s, n] "
                         "shared by the batch")
    xs, ys = X.shape[-xcore:], Y.shape[-3:]
    s_x = xs[0] if kind == "9" else xs[1]
    if s_x != ys[1]:
        raise ValueError(f"contracted extents differ: X has shape {tuple(X.shape)} "
                         f"(s={s_x}), Y has shape {tuple(Y.shape)} (s={ys[1]})")
    batches = {x.shape[0] for x, c in ((X, xcore), (Y, 3)) if x.ndim == c + 1}
    if len(batches) != 1:
        raise ValueError(f"X has shape {tuple(X.shape)} and Y has shape {tuple(Y.shape)}: "
                         "exactly one batch count is needed (at least one batched operand, "
                         "equal counts)")
    i, j = (xs[1], xs[1]) if kind == "9" else (xs[0], xs[2])
    spec = ContractSpec(kind=kind, batch=batches.pop(), i=i, s=s_x, j=j, k=ys[0],
                        l=ys[2], dtype=dtype, shared_x=X.ndim == xcore,
                        shared_y=Y.ndim == 3)
    return spec, xp, (X, Y)


def _reshape(name, x, core, ncore):
    n = math.prod(core)
    total = math.prod(x.shape)
    if total == n:
        return x.reshape(core)
    if n and total % n == 0:
        return x.reshape((total // n,) + core)
    raise ValueError(f"{name} has shape {tuple(x.shape)} ({total} entries), which cannot "
                     f"be seen as {core} or (batch,) + {core}")


def check_operands(inputs, operands, xp):
    """At call time: each operand is an array of module ``xp`` with the planned shape
    and dtype. ``inputs`` holds ``(name, shape, numpy dtype)`` per operand."""
    for (name, shape, dtype), x in zip(inputs, operands):
        if x is None:
            raise TypeError(f"{name} is None; expected an array")
        if not isinstance(x, xp.ndarray):
            what = f"{type(x).__module__.split('.')[0]} array" if is_array(x) else \
                type(x).__name__
            raise TypeError(f"{name} is a {what}, but this plan was built for {xp.__name__} "
                            "arrays")
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, but this plan was "
                             f"built for {tuple(shape)}")
        if x.dtype != dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, but this plan was built for "
                            f"{dtype}")


def check_out(out, shape, dtype, xp, inputs):
    """Validate a user ``out`` array: an array of module ``xp``, shape, dtype,
    C-contiguous, writeable, apart from the ``inputs`` (``(name, array)`` pairs)."""
    if not is_array(out):
        raise TypeError(f"out must be a {xp.__name__} array of shape {tuple(shape)}, got "
                        f"{type(out).__name__}")
    if (xp.__name__ == "cupy") != is_cupy(out):
        raise TypeError(f"out is a {type(out).__module__.split('.')[0]} array but the "
                        f"operands are {xp.__name__} arrays")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    if not c_contiguous(out):
        raise ValueError("out must be C-contiguous")
    if isinstance(out, np.ndarray):
        if not out.flags.writeable:
            raise ValueError("out is read-only (its writeable flag is False); pass a "
                             "writeable array")
        if not out.flags.aligned:
            raise ValueError(f"out is not aligned to its dtype ({dtype}); pass an array "
                             "that NumPy allocated")
    if out.size == 0:
        return
    if is_cupy(out):
        lo, hi = data_range(out)
    for name, x in inputs:
        if x.size == 0:
            continue
        if is_cupy(out):
            xlo, xhi = data_range(x)
            hit = xlo < hi and lo < xhi
        else:
            hit = np.may_share_memory(out, x)    # bounds check, in C
        if hit:
            raise ValueError(f"out overlaps the input {name}; pass a separate buffer")


def reshape_like(name, x, shape):
    """``x`` seen with ``shape`` when the sizes agree (a view when possible)."""
    if not is_array(x) or tuple(x.shape) == tuple(shape) or math.prod(x.shape) != \
            math.prod(shape):
        return x
    return x.reshape(shape)


def as_usable(xp, x):
    """``x`` itself when a kernel can take it as it is, else a C-contiguous copy (same
    answer): a strided view, or a read-only or unaligned NumPy array."""
    if usable(x):
        return x
    return xp.array(x, order="C", copy=True)
