"""The reference backend: readable ``einsum`` code, the oracle of every test.

Works on NumPy and CuPy arrays alike (the CuPy form is the "einsum chain"
baseline a Python user would write today). Not fast; exact semantics.
"""
from __future__ import annotations

import functools
import string

import numpy as np

from . import register
from .base import Backend, Executor, Unsupported

__all__ = ["ReferenceBackend", "action_einsum", "assembly_einsum", "contract_einsum",
           "mass_apply_unfused", "mass_diagonal_unfused"]


def _xp(x):
    from .._arrays import array_module
    return array_module(x)


def action_einsum(B1d, D, V, dim):
    """``U = B^T D B V`` as a sum-factorised einsum chain (``...`` = batch, comp)."""
    xp = _xp(V)
    comp = V.ndim - 1 - dim  # 0 or 1
    t = V
    # B applied along each of the last dim axes (interpolate to quadrature points)
    for ax in range(dim):
        t = _apply_axis(xp, B1d, t, V.ndim - dim + ax, transpose=False)
    t = t * (D[:, None] if comp else D)
    for ax in range(dim):
        t = _apply_axis(xp, B1d, t, V.ndim - dim + ax, transpose=True)
    return t


def _apply_axis(xp, B1d, t, axis, transpose):
    letters = string.ascii_lowercase[:t.ndim]
    src = letters[axis]
    new = "z"
    b = (new + src) if not transpose else (src + new)   # B[k, j] or B^T: B[k, i]
    out = letters[:axis] + new + letters[axis + 1:]
    return xp.einsum(f"{b},{letters}->{out}", B1d, t)


def assembly_einsum(B1d, D, dim):
    """``M_e = B^T D_e B``, flattened in C order."""
    xp = _xp(D)
    E, nq = D.shape[0], B1d.shape[0]
    nd = B1d.shape[1]
    ks, i_s, js = "abc"[:dim], "ikm"[:dim], "jln"[:dim]
    terms = [f"{k}{i}" for k, i in zip(ks, i_s)] + [f"{k}{j}" for k, j in zip(ks, js)]
    expr = ",".join(terms) + f",e{ks}->e{i_s}{js}"
    M = xp.einsum(expr, *([B1d] * (2 * dim)), D, optimize=True)
    return M.reshape(E, nd ** dim, nd ** dim)


def contract_einsum(kind, X, Y):
    """Kernels (8a), (8b), (9); a 2D/3D operand without batch axis is shared."""
    xp = _xp(Y)
    if kind == "9":
        return xp.einsum("si,sj,...ksl->...kilj", X, X, Y, optimize=True)
    out = "...ijkl" if kind == "8a" else "...iklj"
    return xp.einsum(f"...isj,...ksl->{out}", X, Y)


def _scatter_add(xp, emap, v, ndofs):
    """``y[c, d] = sum of v[e, c, i] over the (e, i) with emap[e, i] == d``, float64 sums
    (``bincount``) whatever ``v``'s dtype, so the oracle's own rounding stays small. On
    the host (NumPy's ``bincount`` adds in a fixed order: the same bits every run; CuPy's
    uses atomics, so CuPy arrays are summed on the host and copied back)."""
    to_host = (lambda a: a.get()) if xp.__name__ == "cupy" else (lambda a: a)
    flat = to_host(emap.reshape(-1))
    out = np.empty((v.shape[1], ndofs), dtype=v.dtype)
    for c in range(v.shape[1]):
        w = to_host(v[:, c].reshape(-1)).astype(np.float64)
        out[c] = np.bincount(flat, weights=w, minlength=ndofs).astype(v.dtype)
    return xp.asarray(out)


def mass_apply_unfused(B1d, D, x, elem_dofs, dim):
    """``y = sum_e R_e^T B^T D_e B R_e x``: gather (fancy indexing), the einsum chain,
    scatter-add (``bincount``). ``x`` is ``(ndofs,)`` or ``(ncomp, ndofs)``."""
    xp = _xp(x)
    ndofs = x.shape[-1]
    xc = x.reshape(-1, ndofs)
    E = elem_dofs.shape[0]
    V = xp.moveaxis(xc[:, elem_dofs], 0, 1)                # (E, ncomp, nd, ...)
    U = action_einsum(B1d, D, V, dim).reshape(E, xc.shape[0], -1)
    return _scatter_add(xp, elem_dofs.reshape(E, -1), U, ndofs).reshape(x.shape)


def mass_diagonal_unfused(B1d, D, elem_dofs, ndofs, dim):
    """The global mass matrix's diagonal: ``sum_k prod_a B[k_a, i_a]^2 D_e[k]`` per element
    entry (the transposed half of the action with B squared), scatter-added."""
    xp = _xp(D)
    t = D
    for ax in range(dim):
        t = _apply_axis(xp, B1d * B1d, t, 1 + ax, transpose=True)
    E = D.shape[0]
    return _scatter_add(xp, elem_dofs.reshape(E, -1), t.reshape(E, 1, -1), ndofs)[0]


class _Run(Executor):
    def __init__(self, kernel, fn):
        self.kernel, self._fn = kernel, fn

    def run(self, operands, out, **scalars):
        res = self._fn(*operands, **scalars)
        out[...] = res.reshape(out.shape)


def _gemm(spec, A, B, C=None, alpha=1.0, beta=0.0):
    xp = _xp(A)
    a = xp.swapaxes(A, -1, -2) if spec.trans_a else A
    b = xp.swapaxes(B, -1, -2) if spec.trans_b else B
    r = xp.matmul(a, b)
    if alpha != 1.0:
        r = r * alpha
    if not spec.beta_zero:
        r = r + beta * C
    return xp.broadcast_to(r, spec.out_shape)


#: op -> (what runs, formatted with the spec; the result of (spec, *operands, **scalars))
_PATHS = {
    "action": ("einsum chain (sum-factorised)",
               lambda spec, B, D, V: action_einsum(B, D, V, spec.dim)),
    "assembly": ("einsum (optimize=True)", lambda spec, B, D: assembly_einsum(B, D, spec.dim)),
    "contract": ("einsum ({spec.kind})", lambda spec, X, Y: contract_einsum(spec.kind, X, Y)),
    "gemm": ("matmul", _gemm),
    "mass_apply": ("gather, einsum chain, scatter-add (unfused)",
                   lambda spec, B, D, x, m: mass_apply_unfused(B, D, x, m, spec.dim)),
    "mass_diagonal": ("einsum with B^2, scatter-add (unfused)",
                      lambda spec, B, D, m: mass_diagonal_unfused(B, D, m, spec.ndofs, spec.dim)),
}


class ReferenceBackend(Backend):
    """NumPy/CuPy ``einsum`` and ``matmul``: every spec, no tuning parameters."""

    name = "reference"
    array_modules = ("numpy", "cupy")
    priority = 0

    def build(self, spec, params=None):
        if params not in (None, "heuristic"):
            raise ValueError(f"the reference backend has no tuning parameters; got params "
                             f"{params}")
        path = _PATHS.get(spec.op)
        if path is None:
            raise Unsupported(f"reference backend has no path for {spec}")
        kernel, fn = path
        return _Run(kernel.format(spec=spec), functools.partial(fn, spec))


register(ReferenceBackend())
