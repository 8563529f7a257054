"""The reference paths of the solver kernels: NumPy/CuPy array code, the oracle of their tests.

One function per spec of :data:`smalltc.spec.SOLVER_OPS` (the Chebyshev/V-cycle vector
updates, the PCG iteration, the p-multigrid transfers, the CSR product, the Schwarz
fast-diagonalisation solve), each working on NumPy and CuPy arrays alike. On the host
these are also the CPU path where no compiled family exists (the vector updates, the CSR
product): array expressions, no temporaries beyond the ones written out.

Examples
--------
>>> import numpy as np
>>> from smalltc.spec import CsrSpmvSpec
>>> ip, ix = np.array([0, 1, 3], np.int32), np.array([0, 0, 1], np.int32)
>>> csr_spmv_ref(CsrSpmvSpec(batch=2, ncols=2, nnz=3, dtype="float64"), ip, ix,
...              np.array([2.0, 1.0, 3.0]), np.array([1.0, 1.0]))
array([2., 4.])
"""
from __future__ import annotations

import math

import numpy as np

from .._arrays import array_module

from .base import Executor

__all__ = ["vector_update_ref", "pcg_ref", "transfer_ref", "csr_spmv_ref", "schwarz_ref",
           "apply_axes", "solver_executor", "STOP_CODES", "pcg_loop", "preconditioned",
           "store_result"]

#: the stop codes of a PCG iteration (:func:`pcg_ref` and the compiled families)
STOP_CODES = {1: "converged", 2: "maxiter", 3: "pAp", 4: "rz", 5: "nonfinite"}


def _xp(x):
    return array_module(x)


def store_result(y, out, add=False):
    """``y`` itself when ``out`` is None, else ``out`` with ``y`` written into it (added
    to it with ``add``)."""
    if out is None:
        return y
    if add:
        out += y
    else:
        out[...] = y
    return out


# ---- the vector updates -----------------------------------------------------------------

def vector_update_ref(spec, *ops, out=None, c0=0.0, c1=1.0, beta=1.0, xzero=False):
    """One update of :class:`smalltc.spec.VectorUpdateSpec` (see its table): ``"start"``
    returns ``(d, dm)`` (``dm`` is ``d`` unmasked), ``"step"`` None (``r``, ``x``, ``d``,
    ``dm`` updated), ``"residual"`` ``r``, ``"last"`` ``(x, xm)`` (``x`` updated)."""
    f = ops[-1] if spec.masked else None
    xp = _xp(ops[0])
    mode = spec.mode
    if mode == "start":
        r, inv = ops[:2]
        d = xp.multiply(inv, r, out=None if out is None else out[0])
        d *= c1
        if f is None:
            return d, d
        return d, xp.multiply(d, f, out=None if out is None else out[1])
    if mode == "step":
        y, r, x, d, dm, inv = ops[:6]
        if f is None:
            r -= y
        else:
            r -= y * f
            r -= (1 - f) * d
        _add_scaled(xp, x, d, beta, xzero)
        d *= c0
        t = inv * r
        t *= c1
        d += t
        if f is not None and dm is not d:
            xp.multiply(d, f, out=dm)
        return None
    if mode == "residual":
        b, y, x = ops[:3]
        if f is None:
            return xp.subtract(b, y, out=out)
        r = xp.subtract(b, y * f, out=out)
        r -= (1 - f) * x
        return r
    d, x = ops[:2]
    _add_scaled(xp, x, d, beta, xzero)
    return x, (x if f is None else xp.multiply(x, f, out=out))


def _add_scaled(xp, x, d, beta, xzero):
    """``x = beta d`` (``xzero``) or ``x += beta d``, in place."""
    if beta == 1:
        if xzero:
            x[...] = d
        else:
            x += d
    elif xzero:
        xp.multiply(d, beta, out=x)
    else:
        x += beta * d


# ---- conjugate gradients ------------------------------------------------------------------

def _dot(xp, a, b):
    """``a . b`` summed in float64."""
    return float(xp.dot(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)))


def pcg_ref(spec, x, r, inv=None, *, apply, tol, maxiter, bnorm, history, shape=None,
            check_every=8, red=None, precond=None):
    """PCG iterations from ``x`` with residual ``r`` (both updated in place) until the stop
    test: ``history`` (relative residuals, its last entry the current one) gets one entry
    an iteration; ``apply`` takes and returns arrays of ``shape`` (default ``x``'s).
    Returns ``(iterations, code, value)``: the stop code (:data:`STOP_CODES`) and the
    scalar that caused it. ``red``: a reducer whose ``sums`` adds scalars across ranks.
    The preconditioner: Jacobi (``inv``), any ``precond`` (``r -> z`` on arrays of
    ``shape``), or none. The array expressions of the textbook iteration, inner products
    in float64."""
    xp = _xp(r)
    jacobi = inv is not None
    z = r * inv if jacobi else r

    def update(p, Ap, alpha):
        nonlocal x, r, z
        x += alpha * p
        r -= alpha * Ap
        z = r * inv if jacobi else r
        return _dot(xp, r, r), _dot(xp, r, z)

    def direction(p, beta, zp=None):
        p *= beta
        p += z if zp is None else zp

    return pcg_loop(x, r, z, apply=apply, tol=tol, maxiter=maxiter, bnorm=bnorm,
                    history=history, shape=shape, red=red,
                    dot=lambda a, b: _dot(xp, a, b), update=update, direction=direction,
                    precond=precond)


def pcg_loop(x, r, z, *, apply, tol, maxiter, bnorm, history, shape, red, dot, update,
             direction, precond=None):
    """The PCG iteration and its stop test around a backend's vector steps, from ``x``,
    the residual ``r`` and the preconditioned residual ``z``: ``dot(a, b)`` (a float64
    sum), ``update(p, Ap, alpha)`` (``x += alpha p``, ``r -= alpha Ap``; returns ``(r.r,
    r.z)``) and ``direction(p, beta[, z])`` (``p = z + beta p``). With ``precond`` (``r ->
    z`` on arrays of ``shape``) ``z`` is its result (``update``'s ``r.z`` unused) and is
    passed to ``direction``. Arguments and result as :func:`pcg_ref`'s (``shape`` None:
    ``x``'s)."""
    xp = _xp(r)
    dtype = r.dtype.type
    shape = x.shape if shape is None else tuple(shape)
    if precond is not None:
        z = preconditioned(xp, precond, r, shape)
    rz = dot(r, z)
    if red is not None:
        (rz,) = red.sums(rz)
    p = z.copy()
    it = 0
    while True:
        if history[-1] <= tol:
            return it, 1, history[-1]
        if it >= maxiter:
            return it, 2, history[-1]
        if not rz > 0:
            return it, 4, rz
        Ap = _apply_checked(xp, apply, p, shape)
        pAp = dot(p, Ap)
        if red is not None:
            (pAp,) = red.sums(pAp)
        if not pAp > 0:
            return it, 3, pAp
        rr, rz_new = update(p, Ap, dtype(rz / pAp))
        if precond is not None:
            z = preconditioned(xp, precond, r, shape)
            rz_new = dot(r, z)
        if red is not None:
            rr, rz_new = red.sums(rr, rz_new)
        it += 1
        history.append(math.sqrt(rr) / bnorm)
        if not math.isfinite(history[-1]):
            return it, 5, history[-1]
        if precond is None:
            direction(p, dtype(rz_new / rz))
        else:
            direction(p, dtype(rz_new / rz), z)
        rz = rz_new


def preconditioned(xp, precond, r, shape):
    """``precond(r)`` in ``shape``, flat, contiguous and in ``r``'s module and dtype;
    ``ValueError`` naming the preconditioner when its result has another shape."""
    z = precond(r.reshape(shape))
    if getattr(z, "shape", None) != shape:
        raise ValueError(f"the preconditioner returned an array of shape "
                         f"{getattr(z, 'shape', None)} for a vector of shape {shape}: "
                         f"precond(r) must return z in r's shape")
    return xp.ascontiguousarray(xp.asarray(z, dtype=r.dtype)).reshape(-1)


def _apply_checked(xp, apply, p, shape):
    """``apply(p)`` in ``shape``, flat; the shape checked."""
    Ap = xp.asarray(apply(p.reshape(shape)))
    if Ap.shape != shape:
        raise ValueError(f"the operator returned an array of shape {Ap.shape} for a "
                         f"vector of shape {shape}: apply(x) must return A x in x's shape")
    return Ap.reshape(-1)


# ---- the p-multigrid transfers ------------------------------------------------------------

def apply_axes(M, U, dim, first=1):
    """``U`` with ``M`` applied along its ``dim`` axes from ``first`` on (``out_k = sum_j
    M[k, j] in_j``), axis ``first`` first."""
    xp = _xp(U)
    for a in range(first, first + dim):
        U = xp.moveaxis(xp.tensordot(M, U, axes=([1], [a])), 0, a)
    return U


def _scatter(xp, idx, U, n):
    """``y[d] = sum of U over the entries with idx == d`` (float64 sums, ``bincount``)."""
    if xp is np:
        return np.bincount(idx.reshape(-1), weights=U.reshape(-1).astype(np.float64),
                           minlength=n)
    y = xp.zeros(n, dtype=np.float64)
    xp.add.at(y, idx.reshape(-1).astype(np.int64), U.reshape(-1).astype(np.float64))
    return y


def transfer_ref(spec, M, x, in_map, in_w, out_map, out_w, *, out=None, add=False):
    """:class:`smalltc.spec.TransferSpec`: gather the weighted input, ``M`` on every axis,
    the output weights, summed through ``out_map`` (float64 sums); into ``out`` (added to
    with ``add``)."""
    xp = _xp(x)
    v = (in_w * x)[in_map]
    U = apply_axes(M, v, spec.dim) * out_w[out_map]
    y = _scatter(xp, out_map, U, spec.n_out).astype(spec.dtype, copy=False)
    return store_result(y, out, add)


# ---- the CSR product ------------------------------------------------------------------

def csr_spmv_ref(spec, indptr, indices, data, x, *, out=None):
    """:class:`smalltc.spec.CsrSpmvSpec`: ``y = A x``, each row's products summed in
    float64."""
    xp = _xp(x)
    rows = xp.repeat(xp.arange(spec.batch), xp.diff(indptr.astype(np.int64)).tolist()
                     if xp is not np else np.diff(indptr))
    y = _scatter(xp, rows, data * x[indices], spec.batch).astype(spec.dtype, copy=False)
    return store_result(y, out)


# ---- the Schwarz local solves -------------------------------------------------------------

def _apply_1d(U, mats, n, dim):
    """``U`` (E, n, .., n) with ``mats[:, d]`` applied along each local axis ``d`` by
    batched GEMMs on transposed views: each contracts the slowest axis and leaves its
    result as the fastest, so ``dim`` of them bring the layout back."""
    xp = _xp(U)
    E = U.shape[0]
    V = U
    for d in range(dim):
        V = xp.swapaxes(V.reshape(E, n, -1), 1, 2) @ mats[:, d]
    return V.reshape(U.shape)


def schwarz_local(S, inv, U, n, dim):
    """``K_e^-1 U_e`` for every element (``U`` of shape (E, n, .., n)): ``S^T`` on every
    axis, the inverse eigenvalues, ``S`` on every axis."""
    xp = _xp(U)
    V = _apply_1d(U, S, n, dim)
    V *= inv
    return _apply_1d(V, xp.ascontiguousarray(xp.swapaxes(S, -1, -2)), n, dim)


def schwarz_ref(spec, S, inv, idx, r, w, *, out=None):
    """:class:`smalltc.spec.SchwarzSpec`: the weighted residual padded with a zero (index
    ``ndofs``), gathered, the local solves, summed through ``idx`` and weighted again."""
    xp = _xp(r)
    n = spec.ndofs
    rp = xp.zeros(n + 1, dtype=spec.dtype)
    rp[:n] = r * w
    U = schwarz_local(S, inv, rp[idx], spec.n, spec.dim)
    if xp is np:
        z = np.bincount(idx.reshape(-1).astype(np.intp), weights=U.reshape(-1),
                        minlength=n + 1)[:n].astype(spec.dtype, copy=False)
    else:
        zp = xp.zeros(n + 1, dtype=spec.dtype)
        xp.add.at(zp, idx.reshape(-1), U.reshape(-1))
        z = zp[:n]
    z *= w
    return store_result(z, out)


# ---- executors ------------------------------------------------------------------------

_PATHS = {
    "vector_update": ("array expressions ({spec.mode})", vector_update_ref),
    "pcg": ("array expressions, float64 inner products", pcg_ref),
    "pmg_transfer": ("gather, tensordot per axis, bincount", transfer_ref),
    "csr_spmv": ("row products, bincount", csr_spmv_ref),
    "schwarz_fdm": ("gather, batched GEMMs per axis, bincount", schwarz_ref),
}


class SolverRun(Executor):
    """A solver op's reference path: ``run(operands, out, **scalars)`` returns its result."""

    def __init__(self, spec, kernel, fn, generic=False):
        self.spec, self.kernel, self._fn = spec, kernel, fn
        if generic:
            self.specialized, self.source = False, "generic"

    def run(self, operands, out=None, **scalars):
        return self._fn(self.spec, *operands, out=out, **scalars) \
            if self.spec.op != "pcg" else self._fn(self.spec, *operands, **scalars)


def solver_executor(spec, backend=None):
    """The reference executor of a solver spec; ``backend``: the compiled backend that
    runs it this way (no family of its own for it), reported as its generic path."""
    what, fn = _PATHS[spec.op]
    kernel = f"reference {what.format(spec=spec)}"
    if backend is not None:
        kernel += f" (no {backend} kernel for {spec.op})"
    return SolverRun(spec, kernel, fn, generic=False)
