"""Fused Jacobi-PCG iterations: the vector updates of an iteration in few passes.

:func:`smalltc.fem.cg` runs here when the preconditioner is None or a
:class:`~smalltc.fem.solvers.Jacobi` (so ``z = r / diag`` can be folded into the
updates) and the vectors are real floats:

* GPU (CuPy vectors): the kernels of ``templates/cuda/cg.cu.j2``. Every scalar of
  the iteration (``rz``, ``pAp``, ``alpha``, ``beta``, the residual history, the
  stop flag) stays in a device array, so the host queues iterations without
  waiting; it reads the state every ``check_every`` iterations. Kernels after the
  stop return at once, so the iterate is the one the stop test chose, as if the
  host had checked every iteration.
* CPU (NumPy vectors): Numba loops, ``x``, ``r`` updated and ``r.r``, ``r.z``
  summed in one pass, ``p`` in another.

Per iteration, besides the operator: ``p.Ap`` (reads 2 vectors), the update
(reads x, r, p, Ap and the inverse diagonal, writes x and r: 7 passes), the new
direction (reads r, the inverse diagonal and p, writes p: 4 passes): 13 vector
passes, against 18 for the unfused NumPy/CuPy expressions of
:func:`smalltc.fem.solvers.cg` (``x += alpha p`` alone reads two and writes one).

Distributed (``red``: a :class:`smalltc.fem.distributed.Reducer`): each rank runs
the same iteration on its local part; on the CPU the scalars ``p.Ap`` and ``(r.r,
r.z)`` are summed across the ranks, on the GPU the per-block partial sums (1024
or 2048 doubles) before the one-block kernels reduce them, so every rank's device
takes the same stop decision.
"""

import math

import numpy as np

__all__ = ["cg_cpu", "cg_gpu", "VECTOR_PASSES"]

#: vector reads + writes of one fused iteration besides the operator (see the docstring)
VECTOR_PASSES = 13

_NT, _NB = 256, 1024                       # the GPU kernels' block and fixed grid
_DONE_CODES = {1: "converged", 2: "maxiter", 3: "pAp", 4: "rz", 5: "nonfinite"}


def _numba_kernels():
    import numba

    @numba.njit(parallel=True, fastmath=False, cache=True)
    def update(x, r, p, Ap, inv, alpha, jacobi):
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
    def direction(p, r, inv, beta, jacobi):
        for i in numba.prange(p.size):
            p[i] = (r[i] * inv[i] if jacobi else r[i]) + beta * p[i]

    @numba.njit(parallel=True, fastmath=False, cache=True)
    def dot(a, b):
        s = 0.0
        for i in numba.prange(a.size):
            s += float(a[i]) * float(b[i])
        return s

    return update, direction, dot


_KERNELS = None


def cg_cpu(apply, b, x, r, inv, tol, maxiter, bnorm, history, red=None):
    """Iterate on NumPy vectors (flat views) until the stop test; returns
    ``(iterations, code, value)``: the stop code and the scalar that caused it.
    ``red``: sums the inner products across ranks (a distributed solve)."""
    global _KERNELS
    if _KERNELS is None:
        from smalltc.backends.cpu.threads import coordinate, passive_openmp
        passive_openmp()               # spinning OpenMP and BLAS threads beside these loops
        coordinate()                   # made them 4-100x slower (smalltc.backends.cpu.threads)
        _KERNELS = _numba_kernels()
    update, direction, dot = _KERNELS
    jacobi = inv is not None
    invv = inv if jacobi else r                 # a placeholder of the right type
    dtype = r.dtype.type
    z = r * inv if jacobi else r
    rz = dot(r, z)
    if red is not None:
        (rz,) = red.sums(rz)
    p = np.array(z, copy=True)
    it = 0
    while True:
        if history[-1] <= tol:
            return it, 1, history[-1]
        if it >= maxiter:
            return it, 2, history[-1]
        if not rz > 0:
            return it, 4, rz
        Ap = np.asarray(apply(p.reshape(b.shape)))
        if Ap.shape != b.shape:
            raise ValueError(f"the operator returned an array of shape {Ap.shape} for a "
                             f"vector of shape {b.shape}: apply(x) must return A x in x's shape")
        Ap = Ap.reshape(-1)
        pAp = dot(p, Ap)
        if red is not None:
            (pAp,) = red.sums(pAp)
        if not pAp > 0:
            return it, 3, pAp
        rr, rz_new = update(x, r, p, Ap, invv, dtype(rz / pAp), jacobi)
        if red is not None:
            rr, rz_new = red.sums(rr, rz_new)
        it += 1
        history.append(math.sqrt(rr) / bnorm)
        if not math.isfinite(history[-1]):
            return it, 5, history[-1]
        direction(p, r, invv, dtype(rz_new / rz), jacobi)
        rz = rz_new


_GPU = {}


def _gpu_kernels(dtype, jacobi):
    from smalltc.backends.cuda import runtime as RT
    key = (np.dtype(dtype).name, jacobi, RT.current_device_id())
    k = _GPU.get(key)
    if k is None:
        ctx = dict(dtype=np.dtype(dtype).name, threads=_NT, blocks=_NB, jacobi=int(jacobi))
        k = _GPU[key] = {e: RT.get_kernel("cg.cu.j2", e, ctx) for e in (
            "stc_cg_dot", "stc_cg_alpha", "stc_cg_update", "stc_cg_beta", "stc_cg_direction")}
    return k


def cg_gpu(apply, b, x, r, inv, tol, maxiter, bnorm, history, check_every=8, red=None):
    """Iterate on CuPy vectors (flat views); the host reads the device state every
    ``check_every`` iterations. Returns ``(iterations, code, value)``. ``red``: sums
    the partial sums across ranks (a distributed solve; each sum waits for the device)."""
    import cupy as cp

    from smalltc._errors import raise_pending
    jacobi = inv is not None
    k = _gpu_kernels(r.dtype, jacobi)
    n = np.int64(r.size)
    z = r * inv if jacobi else r
    p = z.copy()
    rz = float(cp.vdot(r, z).real)
    if red is not None:
        (rz,) = red.sums(rz)
    if history[-1] <= tol or maxiter == 0 or not rz > 0:
        code = 1 if history[-1] <= tol else 2 if maxiter == 0 else 4
        return 0, code, rz if code == 4 else history[-1]
    ST = cp.asarray([rz, 0, 0, 0, 0, bnorm, tol, maxiter, 0, 0, check_every],
                    dtype=cp.float64)
    hist = cp.zeros(check_every, dtype=cp.float64)   # the residuals since the last check
    part1 = cp.zeros(_NB, dtype=cp.float64)
    part2 = cp.zeros(2 * _NB, dtype=cp.float64)
    invv = inv if jacobi else r
    grid, one = (_NB,), (1,)
    done, seen = 0, 0
    while not done:
        for _ in range(check_every):
            Ap = cp.asarray(apply(p.reshape(b.shape)))
            if Ap.shape != b.shape:
                raise ValueError(f"the operator returned an array of shape {Ap.shape} for a "
                                 f"vector of shape {b.shape}: apply(x) must return A x in "
                                 "x's shape")
            Ap = Ap.reshape(-1)
            k["stc_cg_dot"](grid, (_NT,), (p, Ap, part1, ST, n))
            if red is not None:
                red.sum_array(part1)
            k["stc_cg_alpha"](one, (_NT,), (part1, ST))
            k["stc_cg_update"](grid, (_NT,), (x, r, p, Ap, invv, part2, ST, n))
            if red is not None:
                red.sum_array(part2)
            k["stc_cg_beta"](one, (_NT,), (part2, ST, hist))
            k["stc_cg_direction"](grid, (_NT,), (p, r, invv, ST, n))
        st, h = ST.get(), hist.get()
        raise_pending()              # a bad map index the operator's kernels reported
        done, it = int(st[9]), int(st[8])
        history.extend(h[(i - 1) % check_every] for i in range(seen + 1, it + 1))
        seen = it
    value = {3: st[1], 4: st[0]}.get(done, history[-1])
    return it, done, float(value)
