"""The solver kernel families on the host: PCG, p-multigrid transfers, Schwarz.

The CPU side of :mod:`smalltc.backends.cuda.solver`:

=================  ====================  ===============================  ==================
family             spec                  what runs                        parameters
=================  ====================  ===============================  ==================
``pcg``            PcgSpec               Numba loops (this module): ``x``,  none
                                         ``r`` and ``r.r``, ``r.z`` in one
                                         pass, ``p`` in another
``pmg_transfer``   TransferSpec          ``pmg_transfer.py.j2`` (sizes at   none
                                         run time), then ``numpy.bincount``
``schwarz_fdm``    SchwarzSpec           ``schwarz_fdm.py.j2`` (a chunk of  ``lanes``
                                         elements a SIMD lane each), then
                                         ``numpy.bincount``
``vector_update``  VectorUpdateSpec      Numba loops (this module): each    none
                                         mode one pass over its vectors,
                                         the reference's operations in its
                                         order (bit-identical results)
``csr_spmv``       CsrSpmvSpec           the reference path                 none
=================  ====================  ===============================  ==================

Examples
--------
>>> from smalltc.spec import SchwarzSpec
>>> from smalltc.backends.cpu.target import TARGETS
>>> s = SchwarzSpec(dim=3, n=5, batch=10, dtype="float64", ndofs=100)
>>> c = SCHWARZ_FDM.context(s, None, TARGETS["avx512"])
>>> SCHWARZ_FDM.entry(s, c), SCHWARZ_FDM.public(c)
('stc_schwarz_fdm_3d_n5_f64_i32', {'lanes': 8})
"""
from __future__ import annotations

import time

import numba
import numpy as np

from ..base import Executor
from ..reference_solvers import pcg_loop, solver_executor, store_result
from .family import Family
from .runtime import NB_TYPES, SHORT, load_kernel
from .target import resolve
from .threads import coordinate, passive_openmp

__all__ = ["PCG", "TRANSFER", "SCHWARZ_FDM", "VECTOR_UPDATE", "CSR_SPMV", "SOLVER_FAMILIES"]


class _SolverFamily(Family):
    op = "?"

    def claims(self, spec):
        return spec.op == self.op

    def supports(self, spec):
        return True

    def space(self, spec, target=None):
        yield {}, None


class _Built(Executor):
    """The common attributes of a choice's executor."""

    def __init__(self, choice):
        self.choice, self.spec, self.ctx = choice, choice.spec, choice.ctx
        self.kernel, self.source, self.table = choice.entry, choice.source, choice.table
        self.params = dict(choice.family.public(choice.ctx), isa=choice.target.isa)


class _Compiled(_Built):
    """A choice's executor with its rendered kernel (compiled, or loaded from Numba's disk
    cache)."""

    def __init__(self, choice):
        super().__init__(choice)
        self.fn, self.compile_s = load_kernel(choice.template, choice.entry,
                                              **choice.ctx["render"])


# ---- families without parameters or templates --------------------------------------------

class _PlainFamily(_SolverFamily):
    """A family with no parameters and no template: its host code is Python (the array
    code of :mod:`..reference_solvers`, or the Numba loops of this module, run by
    :attr:`executor_class`)."""

    params = ()
    templates = ("",)
    executor_class = None

    def context(self, spec, params=None, target=None):
        return None if params else dict(dtype=spec.dtype, render={})

    def executor(self, choice):
        return self.executor_class(choice)


class _ArrayFamily(_PlainFamily):
    """An op whose host path is the array code of :mod:`..reference_solvers`."""

    def entry(self, spec, ctx):
        return solver_executor(spec).kernel

    def executor(self, choice):
        ex = solver_executor(choice.spec)
        ex.source = choice.source
        return ex


class CsrSpmvFamily(_ArrayFamily):
    name = op = "csr_spmv"


# ---- the vector updates ----------------------------------------------------------------
# One pass a mode over its vectors, the operations of vector_update_ref in its order (no
# fastmath: the same roundings, NaN and Inf propagate; the scalars in the vectors' dtype).
# ``masked`` False: ``f`` is a placeholder and not read. AMD EPYC Zen 4, 2 threads, "step"
# masked on 531,441 float64 DoFs: 0.33 ms against 2.06 ms for the array expressions (their
# temporaries and eight passes).

@numba.njit(parallel=True, fastmath=False, cache=True)
def vu_start(r, inv, f, d, dm, c1, masked):
    """``d = (inv r) c1``; ``dm = d f`` (masked)."""
    for i in numba.prange(r.size):
        di = inv[i] * r[i] * c1
        d[i] = di
        if masked:
            dm[i] = di * f[i]


@numba.njit(parallel=True, fastmath=False, cache=True)
def vu_step(y, r, x, d, dm, inv, f, c0, c1, beta, unit, xzero, masked, write_dm):
    """``r -= f y + (1 - f) d``; ``x = beta d`` or ``x += beta d``; ``d = c0 d + c1 inv
    r``; ``dm = f d`` (masked, ``dm`` not ``d``)."""
    one = beta == 1
    for i in numba.prange(r.size):
        di = d[i]
        if masked:
            ri = r[i] - y[i] * f[i] - (unit - f[i]) * di
        else:
            ri = r[i] - y[i]
        r[i] = ri
        if xzero:
            x[i] = di if one else di * beta
        else:
            x[i] = x[i] + di if one else x[i] + beta * di
        dn = di * c0 + inv[i] * ri * c1
        d[i] = dn
        if write_dm:
            dm[i] = dn * f[i]


@numba.njit(parallel=True, fastmath=False, cache=True)
def vu_residual(b, y, x, f, r, unit, masked):
    """``r = b - (f y + (1 - f) x)``."""
    for i in numba.prange(r.size):
        if masked:
            r[i] = b[i] - y[i] * f[i] - (unit - f[i]) * x[i]
        else:
            r[i] = b[i] - y[i]


@numba.njit(parallel=True, fastmath=False, cache=True)
def vu_last(d, x, f, xm, beta, xzero, masked):
    """``x = beta d`` or ``x += beta d``; ``xm = f x`` (masked)."""
    one = beta == 1
    for i in numba.prange(x.size):
        di = d[i]
        if xzero:
            xi = di if one else di * beta
        else:
            xi = x[i] + di if one else x[i] + beta * di
        x[i] = xi
        if masked:
            xm[i] = xi * f[i]


class VectorUpdateExecutor(_Built):
    """One update of :class:`~smalltc.spec.VectorUpdateSpec` in place, returning what
    :func:`smalltc.vector_update` returns (see the reference's
    :func:`~..reference_solvers.vector_update_ref`). Building it compiles (or loads) the
    mode's loop for the dtype."""

    def __init__(self, choice):
        super().__init__(choice)
        passive_openmp()
        coordinate()
        t = time.perf_counter()
        one = np.ones(1, dtype=self.spec.dtype)
        names = {"start": 2, "step": 6, "residual": 3, "last": 2}[self.spec.mode]
        ops = [one.copy() for _ in range(names)] + ([one.copy()] if self.spec.masked else [])
        self.run(ops, None, c0=1.0, c1=1.0, beta=1.0, xzero=False)
        self.compile_s = time.perf_counter() - t

    def run(self, operands, out=None, *, c0=0.0, c1=1.0, beta=1.0, xzero=False):
        masked = self.spec.masked
        f = operands[-1] if masked else operands[0]          # a placeholder unmasked
        xp = np
        # the scalars in the vectors' dtype, as NumPy's array expressions take them
        kind = np.dtype(self.spec.dtype).type
        c0, c1, beta, unit = kind(c0), kind(c1), kind(beta), kind(1)
        mode = self.spec.mode
        if mode == "start":
            r, inv = operands[:2]
            d = xp.empty_like(r) if out is None else out[0]
            if not masked:
                vu_start(r, inv, f, d, d, c1, False)
                return d, d
            dm = xp.empty_like(r) if out is None else out[1]
            vu_start(r, inv, f, d, dm, c1, True)
            return d, dm
        if mode == "step":
            y, r, x, d, dm, inv = operands[:6]
            vu_step(y, r, x, d, dm, inv, f, c0, c1, beta, unit, bool(xzero), masked,
                    masked and dm is not d)
            return None
        if mode == "residual":
            b, y, x = operands[:3]
            r = xp.empty_like(b) if out is None else out
            vu_residual(b, y, x, f, r, unit, masked)
            return r
        d, x = operands[:2]
        if not masked:
            vu_last(d, x, f, x, beta, bool(xzero), False)
            return x, x
        xm = xp.empty_like(x) if out is None else out
        vu_last(d, x, f, xm, beta, bool(xzero), True)
        return x, xm


class VectorUpdateFamily(_PlainFamily):
    """The vector updates of the Chebyshev smoother and the V-cycle (the Numba loops
    above)."""

    name = op = "vector_update"
    executor_class = VectorUpdateExecutor

    def entry(self, spec, ctx):
        return f"vector_update_{spec.mode}_{SHORT[spec.dtype]}{'_masked' if spec.masked else ''}"


# ---- Jacobi-PCG -------------------------------------------------------------------------

@numba.njit(parallel=True, fastmath=False, cache=True)
def pcg_update(x, r, p, Ap, inv, alpha, jacobi):
    """``x += alpha p``, ``r -= alpha Ap``; returns ``(r.r, r.z)`` (float64 sums)."""
    rr = 0.0
    rz = 0.0
    for i in numba.prange(x.size):
        x[i] += alpha * p[i]
        ri = r[i] - alpha * Ap[i]
        r[i] = ri
        zi = ri * inv[i] if jacobi else ri
        rr += float(ri) * float(ri)
        rz += float(ri) * float(zi)
    return rr, rz


@numba.njit(parallel=True, fastmath=False, cache=True)
def pcg_direction(p, r, inv, beta, jacobi):
    """``p = z + beta p``."""
    for i in numba.prange(p.size):
        p[i] = (r[i] * inv[i] if jacobi else r[i]) + beta * p[i]


@numba.njit(parallel=True, fastmath=False, cache=True)
def pcg_dot(a, b):
    """``a . b`` (float64 sum)."""
    s = 0.0
    for i in numba.prange(a.size):
        s += float(a[i]) * float(b[i])
    return s


class PcgExecutor(_Built):
    """Iterate on NumPy vectors (flat) until the stop test; returns ``(iterations, code,
    value)``. ``red``: sums the inner products across ranks."""

    def __init__(self, choice):
        super().__init__(choice)
        passive_openmp()        # spinning OpenMP and BLAS threads beside these loops
        coordinate()            # made them 4-100x slower (.threads)

    def run(self, operands, out=None, *, apply, tol, maxiter, bnorm, history, shape=None,
            check_every=8, red=None, precond=None):
        x, r = operands[:2]
        jacobi = self.spec.jacobi
        inv = operands[2] if jacobi else r            # a placeholder of the right type
        return pcg_loop(
            x, r, r * inv if jacobi else r, apply=apply, tol=tol, maxiter=maxiter,
            bnorm=bnorm, history=history, shape=shape, red=red, dot=pcg_dot,
            update=lambda p, Ap, alpha: pcg_update(x, r, p, Ap, inv, alpha, jacobi),
            direction=lambda p, beta, z=None: pcg_direction(
                p, r if z is None else z, inv, beta, jacobi), precond=precond)


class PcgFamily(_PlainFamily):
    """The fused PCG iteration (the Numba loops of this module)."""

    name = op = "pcg"
    executor_class = PcgExecutor

    def entry(self, spec, ctx):
        return f"pcg_update_{SHORT[spec.dtype]}{'_jacobi' if spec.jacobi else ''}"


# ---- the p-multigrid transfers ----------------------------------------------------------

class TransferFamily(_SolverFamily):
    """``pmg_transfer.py.j2``: the element part (sizes read from ``M`` at run time: one
    kernel a dimension, dtype and index type), then ``numpy.bincount``."""

    name = op = "pmg_transfer"
    params = ()
    templates = ("pmg_transfer.py.j2",)

    def context(self, spec, params=None, target=None):
        if params:
            return None
        a = f"{NB_TYPES[spec.dtype]}[:, ::1]"
        m = f"{spec.index_dtype}[:, ::1]"
        sig = f"void({a}, {a}, {m}, {a}, {m}, {a}, {a}, int64, int64)"
        return dict(dtype=spec.dtype, slp=True, render=dict(dim=spec.dim, dtype=spec.dtype,
                                                            vbits=0, signature=sig))

    def entry(self, spec, ctx):
        return f"stc_pmg_transfer_{spec.dim}d_{SHORT[spec.dtype]}_i{spec.index_dtype[3:]}"

    def executor(self, choice):
        return TransferExecutor(choice)


class TransferExecutor(_Compiled):
    """The element products ``U`` (threads over elements), then ``numpy.bincount`` over
    the output map; ``add``: added to ``out``."""

    def run(self, operands, out=None, add=False):
        M, x, imap, w_in, omap, w_out = operands
        s = self.spec
        E = s.batch
        im, om = imap.reshape(E, -1), omap.reshape(E, -1)
        U = np.empty(om.shape, dtype=s.dtype)
        if E:
            self.fn(M, x.reshape(1, -1), im, w_in.reshape(1, -1), om, w_out.reshape(1, -1), U,
                    E, max(1, min(E, numba.get_num_threads())))
        y = np.bincount(om.ravel(), weights=U.ravel(), minlength=s.n_out)
        return store_result(y.astype(s.dtype, copy=False), out, add)


# ---- the Schwarz fast-diagonalisation solve ---------------------------------------------

class SchwarzFamily(_SolverFamily):
    """``schwarz_fdm.py.j2``: ``lanes`` elements a chunk, a SIMD lane each (the
    heuristic: 8, the lanes of a 512-bit float64 vector; measured where it was written,
    not re-measured per target)."""

    name = op = "schwarz_fdm"
    params = ("lanes",)
    templates = ("schwarz_fdm.py.j2",)

    def context(self, spec, params=None, target=None):
        W = 8 if params is None else params.get("lanes")
        if params is not None and set(params) - {"lanes"} or W not in (1, 2, 4, 8, 16):
            return None
        a = f"{NB_TYPES[spec.dtype]}[:, ::1]"
        sig = f"void({a}, {a}, {spec.index_dtype}[:, ::1], {a}, {a}, int64, int64)"
        return dict(lanes=W, dtype=spec.dtype, slp=True,
                    render=dict(dim=spec.dim, n=spec.n, W=W, dtype=spec.dtype, vbits=0,
                                signature=sig))

    def entry(self, spec, ctx):
        tail = "" if ctx["lanes"] == 8 else f"_w{ctx['lanes']}"
        return (f"stc_schwarz_fdm_{spec.dim}d_n{spec.n}_{SHORT[spec.dtype]}_"
                f"i{spec.index_dtype[3:]}{tail}")

    def executor(self, choice):
        return SchwarzExecutor(choice)

    def space(self, spec, target=None):
        vl = resolve(target).lanes(spec.dtype)
        for W in (1, 2, 4, 8, 16):
            yield dict(lanes=W), (None if W <= 2 * vl else "lanes")


class SchwarzExecutor(_Compiled):
    """The weighted residual padded with a zero, the local solves of the chunks of
    elements, ``numpy.bincount`` over the index map, the weights again."""

    def __init__(self, choice):
        super().__init__(choice)
        self.W = choice.ctx["lanes"]

    def run(self, operands, out=None):
        S, inv, idx, r, w = operands
        s = self.spec
        E, n = s.batch, s.ndofs
        rp = np.zeros(n + 1, dtype=s.dtype)
        rp[:n] = r * w
        i2 = idx.reshape(E, -1)
        U = np.empty(i2.shape, dtype=s.dtype)
        chunks = -(-E // self.W)
        if E:
            self.fn(S.reshape(E, -1), rp.reshape(1, -1), i2, inv.reshape(E, -1), U, chunks,
                    max(1, min(chunks, numba.get_num_threads())))
        flat = idx.reshape(-1)
        if flat.dtype != np.intp:
            flat = flat.astype(np.intp)
        z = np.bincount(flat, weights=U.reshape(-1), minlength=n + 1)
        z = z[:n].astype(s.dtype, copy=False)
        z *= w
        return store_result(z, out)


VECTOR_UPDATE = VectorUpdateFamily()
PCG = PcgFamily()
TRANSFER = TransferFamily()
CSR_SPMV = CsrSpmvFamily()
SCHWARZ_FDM = SchwarzFamily()
#: the families of :mod:`smalltc.solver`'s specs, in the backend's order
SOLVER_FAMILIES = (VECTOR_UPDATE, PCG, TRANSFER, CSR_SPMV, SCHWARZ_FDM)
