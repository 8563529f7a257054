"""What a user would run today instead of smalltc, on the same inputs.

- GEMM: ``numpy.matmul`` (CPU); cuBLAS strided-batched GEMM through
  ``cupy.matmul`` (GPU; for ``beta != 0`` followed by a scale-and-add, as a
  CuPy user would write it); ``torch.bmm`` / ``torch.baddbmm`` when torch is
  installed. (A direct ``cublas<t>gemmStridedBatched`` call through CuPy's
  low-level binding crashed the process on an H100 with CuPy 14.2: left out.)
- Action: the sum-factorised ``einsum`` chain (NumPy or CuPy), as in
  :func:`smalltc.backends.reference.action_einsum`.
- Assembly and the pairwise steps: ``einsum`` (NumPy or CuPy).

Every factory returns a list of :class:`~smalltc.bench.cases.Impl`; one that
cannot be built here (no torch, an old CuPy) is left out and says why in
:func:`skipped`.

Examples
--------
>>> import numpy as np
>>> from smalltc.bench.cases import Case, make_inputs
>>> c = Case("gemm", "gemm", dict(m=2, n=2, k=2, batch=3, beta=0.0), "float64")
>>> [b.name for b in baselines(c, make_inputs(c, np), np)][:1]
['numpy.matmul']
"""
from __future__ import annotations

import os

import numpy as np

from ..backends.reference import (GEMM_ASSEMBLY_MAX_ND, action_einsum, assembly_einsum,
                                  contract_einsum, operator_assembly_einsum,
                                  operator_assembly_gemm)
from .cases import Impl, case_spec, out_shape, step_spec

__all__ = ["baselines", "skipped", "torch_or_none"]

_SKIPPED: dict = {}


def skipped() -> dict:
    """Baselines left out in this process, and why."""
    return dict(_SKIPPED)


def _enabled(name):
    """Baselines can be switched off, e.g. ``SMALLTC_BENCH_NO=torch``."""
    off = os.environ.get("SMALLTC_BENCH_NO", "")
    if name in {w.strip() for w in off.split(",")}:
        _SKIPPED[name] = f"switched off by SMALLTC_BENCH_NO={off}"
        return False
    return True


def torch_or_none():
    if not _enabled("torch"):
        return None
    try:
        import torch
    except Exception as err:  # not installed, or broken
        _SKIPPED["torch"] = f"torch not importable: {err}"
        return None
    return torch


def baselines(case, ops, xp) -> list:
    """The baselines of ``case`` on operands ``ops`` (module ``xp``)."""
    gpu = xp.__name__ == "cupy"
    if case.op == "gemm":
        found = _xp_gemm(case, ops, xp)
        found += _torch_gemm(case, ops, xp)
        return found
    name = "cupy.einsum" if gpu else "numpy.einsum"
    s = case.sizes
    if case.op == "action":
        B, D, V = ops
        return [Impl(f"{name} chain", lambda: action_einsum(B, D, V, s["dim"]),
                     what=f"sum-factorised {name} chain (2*dim einsums + multiply)")]
    if case.op == "assembly":
        spec = case_spec(case)
        if spec.qfunc != "mass":
            return _operator_assembly(spec, ops, name, gpu)
        B, D = ops
        return [Impl(name, lambda: assembly_einsum(B, D, s["dim"]),
                     what=f"{name}(..., optimize=True)")]
    kind = step_spec(case).kind
    X, Y = ops
    return [Impl(name, lambda: contract_einsum(kind, X, Y), what=f"{name} of kernel ({kind})")]


def _operator_assembly(spec, ops, name, gpu):
    """The stiffness assembly's baselines: the reference path a backend without a kernel
    runs (one einsum per (a, b) pair; for nd^dim <= 27 one GEMM of Q with the dense
    gradients' products, which that path takes there)."""
    a = dict(zip([o.name for o in spec.inputs], ops))
    args = (spec.qfunc, a.get("B1d"), a["G1d"], a.get("D"), a.get("Q"), spec.dim)
    out = [Impl(name, lambda: operator_assembly_einsum(*args),
                what=f"{name}(..., optimize=True) per (a, b) pair")]
    if spec.nd ** spec.dim <= GEMM_ASSEMBLY_MAX_ND:
        lib = "cupy" if gpu else "numpy"
        out.append(Impl(f"{lib}.matmul", lambda: operator_assembly_gemm(*args),
                        what=f"{lib}.matmul of Q with the dense gradients' products"))
    return out


def _beta(case):
    return float(case.sizes.get("beta", 0.0))


def _xp_gemm(case, ops, xp):
    """``xp.matmul`` on the stacked arrays (NumPy's BLAS loop or cuBLAS
    strided-batched), then the scale and the add of C a user would write."""
    A, B = ops[:2]
    gpu = xp.__name__ == "cupy"
    lib = "cupy" if gpu else "numpy"
    out = xp.empty(out_shape(case), dtype=case.dtype)
    alpha, beta = float(case.sizes.get("alpha", 1.0)), _beta(case)
    if beta == 0.0 and alpha == 1.0:
        name = "cublas" if gpu else "numpy.matmul"
        what = "cupy.matmul (cuBLAS strided-batched GEMM)" if gpu else "numpy.matmul on 3D arrays"
        return [Impl(name, lambda: xp.matmul(A, B, out=out), out=out, what=what)]
    C = ops[2] if beta != 0.0 else None

    def run():
        xp.matmul(A, B, out=out)
        if alpha != 1.0:
            xp.multiply(out, alpha, out=out)
        if C is not None:
            xp.add(out, C if beta == 1.0 else beta * C, out=out)
        return out
    return [Impl(f"{lib}.matmul+add" if gpu else "numpy.matmul", run, out=out,
                 what=f"{lib}.matmul, then scale and add C")]


def _torch_gemm(case, ops, xp):
    torch = torch_or_none()
    if torch is None:
        return []
    gpu = xp.__name__ == "cupy"
    conv = torch.from_dlpack if gpu else torch.from_numpy
    try:
        A, B = (conv(x) for x in ops[:2])
        C = conv(ops[2]) if len(ops) > 2 else None
    except Exception as err:
        _SKIPPED["torch"] = f"torch cannot take the arrays: {err}"
        return []
    alpha, beta = float(case.sizes.get("alpha", 1.0)), _beta(case)
    batch = case.batch
    out = torch.empty(out_shape(case), dtype=A.dtype, device=A.device)
    to_array = (lambda t: xp.from_dlpack(t)) if gpu else (lambda t: t.numpy())
    if C is not None:
        A3 = A if A.ndim == 3 else A.expand(batch, *A.shape)
        B3 = B if B.ndim == 3 else B.expand(batch, *B.shape)
        return [Impl("torch.baddbmm", lambda: torch.baddbmm(C, A3, B3, beta=beta, alpha=alpha,
                                                            out=out),
                     out=None, to_array=to_array, what="torch.baddbmm")]
    if A.ndim == 3 and B.ndim == 3 and alpha == 1.0:
        return [Impl("torch.bmm", lambda: torch.bmm(A, B, out=out), to_array=to_array,
                     what="torch.bmm")]
    return [Impl("torch.matmul", lambda: torch.mul(torch.matmul(A, B), alpha)
                 if alpha != 1.0 else torch.matmul(A, B, out=out), to_array=to_array,
                 what="torch.matmul (broadcast shared operand)")]
