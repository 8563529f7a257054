"""Preconditioned conjugate gradients and the Jacobi preconditioner.

:func:`cg` works on any array shape (``(ndofs,)`` or ``(ncomp, ndofs)``):
inner products are taken over all entries. It stops when the relative
residual ``||r_k|| / ||b||`` (Euclidean norms) reaches ``tol``, and raises
:class:`ConvergenceError` when it does not within ``maxiter`` iterations,
unless asked to return the unconverged result (then ``converged`` is False).

Both are array-module generic: with CuPy vectors (and an operator and
preconditioner that return CuPy arrays) the iteration runs on the GPU.

The iteration is *fused* (:mod:`smalltc.fem._cg_fused`): with no preconditioner or
a :func:`jacobi` one, the vector updates of an iteration take two passes plus the
inner product ``p.Ap`` (13 vector reads and writes instead of 18), and on the GPU
every scalar stays on the device: the host reads the state every ``check_every``
iterations instead of synchronising every iteration, and the kernels queued past
the stop do nothing, so the result is the one a check every iteration gives. Any
other preconditioner (a V-cycle) is applied between the fused updates; on the GPU
the host then stays one iteration ahead of the device and reads each iteration's
state behind it, so the device does not wait for the host between iterations. A
``callback`` or ``fused=False`` runs the plain loop, which copies the scalars to the
host each iteration.

Distributed (``comm=`` a reducer of :mod:`smalltc.fem.distributed`, which
builds on this module): the vectors are each
rank's local part in owner form (ghost entries zero, so a sum over the local
entries counts each node once, on its owner) and the operator returns that form;
every inner product is then summed across the ranks, and all ranks take the same
steps. The fused GPU iteration sums its per-block partial sums across the ranks
before reducing them, so its stop test runs on the device as before.
"""

import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np

from smalltc._arrays import array_module
from smalltc._errors import raise_pending

from . import _cg_fused
from ._device import to_host
from .operators import _like, linear_operator

__all__ = ["CGResult", "ConvergenceError", "Jacobi", "cg", "jacobi", "progress_log"]


@dataclass
class CGResult:
    """Outcome of :func:`cg`.

    Attributes
    ----------
    x : ndarray
        The final iterate, in the array module of ``b``.
    iterations : int
        Iterations done (operator applications, not counting the final
        true-residual check).
    residuals : ndarray, shape (iterations + 1,)
        Relative residual ``||r_k|| / ||b||`` of the recurrence, from
        ``k = 0``.
    converged : bool
        Whether ``residuals[-1] <= tol``.
    true_residual : float
        ``||b - A x|| / ||b||`` recomputed at the end.
    """

    x: np.ndarray
    iterations: int
    residuals: np.ndarray
    converged: bool
    true_residual: float


class ConvergenceError(RuntimeError):
    """CG did not reach its tolerance; ``.result`` holds the :class:`CGResult`."""

    def __init__(self, message, result):
        super().__init__(message)
        self.result = result


class Jacobi:
    """The Jacobi preconditioner ``r -> r / diag(A)`` (made by :func:`jacobi`).

    Calling it returns ``r * inv``; :func:`cg` folds it into its fused updates.

    Attributes
    ----------
    inv : array
        ``1 / diag(A)``, NumPy or CuPy.
    """

    def __init__(self, inv):
        self.inv = inv

    def __call__(self, r):
        return r * self.inv

    # SciPy's and CuPy's LinearOperator protocol, as smalltc.fem's operators: the
    # preconditioner of their solvers (scipy.sparse.linalg.cg(A, b, M=P))

    @property
    def shape(self):
        """``(n, n)``, ``n = inv.size``."""
        return (self.inv.size, self.inv.size)

    @property
    def dtype(self):
        return self.inv.dtype

    @property
    def xp(self):
        """``numpy`` or ``cupy``: where ``inv`` lives."""
        return array_module(self.inv)

    def matvec(self, r):
        """``r / diag(A)`` for one vector of shape ``(n,)`` or ``(n, 1)``, in r's shape and
        array module."""
        xp = self.xp
        z = xp.asarray(r).reshape(-1) * self.inv.reshape(-1)
        return _like(r, z.reshape(r.shape))

    def matmat(self, R):
        """``diag(A)^-1 R`` for ``R`` of shape ``(n, k)``."""
        return _like(R, self.xp.asarray(R) * self.inv.reshape(-1, 1))

    rmatvec, rmatmat = matvec, matmat

    def aslinearoperator(self):
        """This preconditioner as a SciPy (CuPy, for a CuPy ``inv``) ``LinearOperator``:
        the ``M=`` of ``scipy.sparse.linalg.cg`` (``cupyx.scipy.sparse.linalg.cg``).

        Examples
        --------
        >>> P = jacobi(np.array([2.0, 4.0])).aslinearoperator()
        >>> print(P.matvec(np.array([1.0, 1.0])))
        [0.5  0.25]
        """
        return linear_operator(self)

    def __repr__(self):
        return f"Jacobi(n={self.inv.size}, dtype={self.inv.dtype})"


def jacobi(diagonal):
    """Jacobi preconditioner ``r -> r / diag(A)``.

    Parameters
    ----------
    diagonal : array_like
        The diagonal of the operator, same shape as the vectors; every entry
        must be positive and finite (true for any SPD operator). NumPy or
        CuPy: the preconditioner works on vectors of the same module.

    Returns
    -------
    Jacobi
        A callable; :func:`cg` fuses it into its vector updates.

    Raises
    ------
    ValueError
        Naming the first non-positive or non-finite entry.

    Examples
    --------
    >>> P = jacobi(np.array([2.0, 4.0]))
    >>> print(P(np.array([1.0, 1.0])))
    [0.5  0.25]
    """
    xp = array_module(diagonal)
    d = xp.asarray(diagonal)
    if xp is not np:
        if _all_positive_on_device(d):
            return Jacobi(1.0 / d)
        d = to_host(d)                          # the message is made on the host
    bad = ~(np.isfinite(d) & (d > 0))
    if bool(bad.any()):
        d, bad = to_host(d), to_host(bad)
        i = np.unravel_index(np.flatnonzero(bad)[0], d.shape)
        raise ValueError(
            f"diagonal must be positive and finite for a Jacobi preconditioner; "
            f"entry {tuple(int(k) for k in i)} is {float(d[i])!r} ({int(bad.sum())} bad entries)"
        )
    return Jacobi(1.0 / xp.asarray(d))


_POSITIVE = {}


def _all_positive_on_device(d):
    """Whether every entry of the CuPy array ``d`` is positive and finite: one elementwise
    kernel (compiled once per dtype; a CuPy reduction compiles anew for new launch shapes,
    seconds inside a preconditioner's setup) raising a flag."""
    import cupy as cp
    kern = _POSITIVE.get(d.dtype.char)
    if kern is None:
        kern = _POSITIVE[d.dtype.char] = cp.ElementwiseKernel(
            "T d", "raw int32 flag",
            "if (!(isfinite((double)d) && d > 0)) atomicOr(&flag[0], 1);",
            "stc_all_positive")
    flag = cp.zeros(1, dtype=cp.int32)
    kern(d.ravel(), flag)
    return not int(flag.get()[0])


def progress_log(every=10, file=None):
    """A :func:`cg` ``callback`` that prints the iteration, the relative residual and the
    seconds since the first call, every ``every`` iterations (to ``file``, stderr by
    default).

    Examples
    --------
    >>> import sys
    >>> A = np.diag(np.arange(1.0, 41.0))
    >>> res = cg(lambda x: A @ x, np.ones(40), tol=1e-12, callback=progress_log(20, sys.stdout))
    ... # doctest: +ELLIPSIS
    cg: iteration 20, relative residual ...
    """
    start = []

    def log(it, relres):
        if not start:
            start.append(time.perf_counter())
        if it % every == 0:
            print(f"cg: iteration {it}, relative residual {relres:.3e}, "
                  f"{time.perf_counter() - start[0]:.2f} s", file=file or sys.stderr, flush=True)
    return log


def _dot(xp, a, b):
    """``<a, b>`` as a scalar of ``xp`` (a 0-d device array for CuPy: no sync)."""
    return xp.vdot(a.ravel(), b.ravel()).real


def _floats(xp, *scalars, red=None):
    """Python floats of ``scalars``, in one device-to-host copy for CuPy; summed over the
    ranks (in one reduction) when ``red`` is a Reducer."""
    if xp is np:
        out = tuple(float(s) for s in scalars)
    else:
        out = tuple(float(s) for s in xp.stack(scalars).get())
        raise_pending()                  # a bad map index the operator's kernels reported
    return out if red is None else red.sums(*out)


def _applied(apply, v, shape, xp):
    """``apply(v)`` as an array of ``xp``, ``ValueError`` naming the operator when its result
    does not have the vectors' shape."""
    Av = xp.asarray(apply(v))
    if Av.shape != shape:
        raise ValueError(f"the operator returned an array of shape {Av.shape} for a vector of "
                         f"shape {shape}: apply(x) must return A x in x's shape")
    return Av


def _asymmetry(apply, b, xp, red):
    """A note for the error of a failed solve when the operator is seen not to be symmetric:
    ``u.Av`` against ``v.Au`` for two random vectors (two more applications, made only
    when CG failed); empty when they agree (or in a distributed solve)."""
    if red is not None:
        return ""
    try:
        rng = np.random.default_rng(12345)
        u = xp.asarray(rng.standard_normal(b.shape).astype(b.dtype))
        v = xp.asarray(rng.standard_normal(b.shape).astype(b.dtype))
        a, c = _floats(xp, _dot(xp, u, apply(v)), _dot(xp, v, apply(u)))
    except Exception:                     # the note is a hint; never mask the real error
        return ""
    tol = 1e-6 if b.dtype == np.float64 else 1e-3
    if abs(a - c) <= tol * max(abs(a), abs(c), 1e-300) or not (np.isfinite(a) and np.isfinite(c)):
        return ""
    return (f"; the operator is not symmetric (u.Av = {a:.6e}, v.Au = {c:.6e} for random u, "
            f"v): CG needs a symmetric positive definite operator")


def _reducer(comm, xp):
    """None for a serial solve; else the Reducer of ``comm`` (made from an mpi4py
    communicator, CUDA-aware for CuPy vectors when MPI is)."""
    if comm is None:
        return None
    if hasattr(comm, "sums"):
        return comm
    raise TypeError(f"comm of smalltc.fem.solvers.cg must be a Reducer (with sums()), got "
                    f"{type(comm).__name__}; smalltc.fem.cg takes an mpi4py communicator")


def _everywhere(red, ok, message):
    """Raise ``ValueError(message)`` unless ``ok``; in a distributed solve on every rank
    (one reduction), the ranks that were fine saying how many were not."""
    if red is None:
        if not ok:
            raise ValueError(message)
        return
    (bad,) = red.sums(0.0 if ok else 1.0)
    if not ok:
        raise ValueError(message)
    if bad:
        raise ValueError(f"on {int(bad)} other rank(s): {message}")


def cg(apply, b, *, tol=1e-10, maxiter=None, precond=None, x0=None, raise_on_failure=True,
       fused=True, check_every=8, comm=None, callback=None):
    """Solve ``A x = b`` for symmetric positive definite ``A`` by (preconditioned) CG.

    CG requires ``A`` (and the preconditioner) to be symmetric positive definite; for
    another operator it fails to converge or breaks down. When it does, the error
    (and the warning of an unconverged result with ``raise_on_failure=False``) says
    whether ``A`` is seen not to be symmetric (``u.Av`` against ``v.Au`` for two random
    vectors: two more operator applications, made only after a failure).

    Parameters
    ----------
    apply : callable
        ``apply(x) -> A x``, same shape as ``x``.
    b : ndarray
        Right-hand side, NumPy or CuPy; the iteration runs in its module.
    tol : float
        Relative residual target, ``||b - A x|| <= tol * ||b||``.
    maxiter : int, optional
        Iteration limit; ``10 * b.size`` by default.
    precond : callable, optional
        ``precond(r) -> z ~ A^{-1} r``, symmetric positive definite (e.g.
        :func:`jacobi`; for vectors of shape ``(ncomp, ndofs)`` a Jacobi diagonal of
        ``ndofs`` entries applies to every component).
    x0 : ndarray, optional
        Initial guess (zero by default), copied into the module of ``b``.
    raise_on_failure : bool
        Raise :class:`ConvergenceError` if the tolerance is not reached
        (default); if false, return the result with ``converged=False``.
    fused : bool
        True (default): the fused iteration (:mod:`smalltc.fem._cg_fused`); False: the
        plain loop (for comparison).
    check_every : int
        GPU, fused iteration: the host reads the device's state (stop test,
        breakdowns) every this many iterations; the iterations queued past the
        stop do nothing, so the result does not depend on it. Larger values
        wait less; each costs up to ``check_every - 1`` extra operator
        applications at the end.
    comm : Reducer, optional
        A distributed solve (see the module's docstring): ``b``, ``x0`` and the
        vectors ``apply`` takes and returns are this rank's local parts in owner
        form, and inner products are summed over the ranks by ``comm.sums``
        (:class:`smalltc.fem.distributed.Reducer`; this module imports nothing of
        MPI, and ``smalltc.fem.cg`` also takes an mpi4py communicator). Every rank
        calls ``cg`` together; errors are raised on every rank. ``maxiter``
        defaults to ten times the global length.
    callback : callable, optional
        ``callback(iteration, relative_residual)`` after every iteration (a progress
        log for long solves, e.g. :func:`progress_log`); runs the plain loop.

    Returns
    -------
    CGResult

    Raises
    ------
    ConvergenceError
        When not converged within ``maxiter`` (and ``raise_on_failure``).
    ValueError
        For bad ``tol``/``maxiter``/``x0``, non-finite values, an operator that returns
        another shape than its argument's, or when the operator or preconditioner is
        seen not to be positive definite.

    Examples
    --------
    >>> A = np.array([[4.0, 1.0], [1.0, 3.0]])
    >>> res = cg(lambda x: A @ x, np.array([1.0, 2.0]), tol=1e-12)
    >>> print(np.round(res.x, 6), res.iterations, res.converged)
    [0.090909 0.636364] 2 True
    """
    xp = array_module(b)
    b = xp.asarray(b)
    red = _reducer(comm, xp)
    _everywhere(red, bool(xp.all(xp.isfinite(b))), "b contains non-finite values")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    if maxiter is None:
        maxiter = 10 * (b.size if red is None else int(red.sums(float(b.size))[0]))
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 0:
        raise ValueError(f"maxiter must be a non-negative integer, got {maxiter!r}")
    if isinstance(check_every, bool) or not isinstance(check_every, (int, np.integer)) \
            or check_every < 1:
        raise ValueError(f"check_every must be a positive integer, got {check_every!r}")
    if fused and callback is None and b.dtype in (np.float32, np.float64):
        return _fused_cg(apply, b, tol, maxiter, precond, x0, raise_on_failure, check_every, xp,
                         red)
    precond = (lambda r: r) if precond is None else precond
    x, r = _start(apply, b, x0, xp, red)
    z = precond(r)
    bb, rr, rz = _floats(xp, _dot(xp, b, b), _dot(xp, r, r), _dot(xp, r, z), red=red)
    bnorm = np.sqrt(bb)
    if bnorm == 0.0:
        return CGResult(xp.zeros_like(b), 0, np.zeros(1), True, 0.0)
    history = [np.sqrt(rr) / bnorm]
    p = z.copy()
    it = 0
    while history[-1] > tol and it < maxiter:
        if not rz > 0:
            raise ValueError(f"preconditioner is not positive definite: r^T z = {rz:.3e} at iteration {it}")
        Ap = _applied(apply, p, b.shape, xp)
        pAp = _dot(xp, p, Ap)
        if red is not None:          # the global p.Ap before the step
            (pAp,) = _floats(xp, pAp, red=red)
        alpha = rz / pAp  # stays on the device; checked with the next transfer
        x += alpha * p
        r -= alpha * Ap
        z = precond(r)
        if red is None:
            pAp, rr, rz_new = _floats(xp, pAp, _dot(xp, r, r), _dot(xp, r, z))
        else:
            rr, rz_new = _floats(xp, _dot(xp, r, r), _dot(xp, r, z), red=red)
        if not pAp > 0:
            raise ValueError(f"operator is not positive definite: p^T A p = {pAp:.3e} at "
                             f"iteration {it}" + _asymmetry(apply, b, xp, red))
        it += 1
        history.append(np.sqrt(rr) / bnorm)
        if not np.isfinite(history[-1]):
            raise ValueError(f"CG produced a non-finite residual at iteration {it}")
        if callback is not None:
            callback(it, float(history[-1]))
        p = z + (rz_new / rz) * p
        rz = rz_new
    rtrue = b - apply(x)
    (rt,) = _floats(xp, _dot(xp, rtrue, rtrue), red=red)
    result = CGResult(x, it, np.array(history), history[-1] <= tol, float(np.sqrt(rt) / bnorm))
    return _outcome(result, tol, raise_on_failure, apply, b, xp, red)


def _start(apply, b, x0, xp, red):
    """CG's first iterate and its residual: zero and a copy of ``b``, or ``x0`` (a copy,
    its shape checked on every rank) and ``b - A x0``."""
    if x0 is None:
        return xp.zeros_like(b), b.copy()
    x = xp.array(x0, dtype=b.dtype)
    _everywhere(red, x.shape == b.shape,
                f"x0 has shape {x.shape}, expected {b.shape} (the shape of b)")
    return x, b - _applied(apply, x, b.shape, xp)


def _outcome(result, tol, raise_on_failure, apply, b, xp, red):
    """``result``, or ConvergenceError (a RuntimeWarning without ``raise_on_failure``)
    when it did not converge, with the asymmetry note of :func:`_asymmetry`."""
    if result.converged:
        return result
    note = _asymmetry(apply, b, xp, red)
    msg = (f"CG did not converge in {result.iterations} iterations: relative residual "
           f"{result.residuals[-1]:.3e} > tol {tol:.3e}" + note)
    if raise_on_failure:
        raise ConvergenceError(msg, result)
    if note:                                       # unconverged, and A is not symmetric
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return result


def _fused_cg(apply, b, tol, maxiter, precond, x0, raise_on_failure, check_every, xp, red=None):
    """:func:`cg` through :mod:`._cg_fused` (the same stop tests and errors)."""
    x, r = _start(apply, b, x0, xp, red)
    if x0 is not None:
        r = xp.ascontiguousarray(r)
    inv, other = None, None
    if precond is not None and not isinstance(precond, Jacobi):
        other = precond
    elif precond is not None:
        inv = xp.asarray(precond.inv, dtype=b.dtype)
        if inv.size != b.size and b.ndim > 1 and inv.size == b.shape[-1]:
            inv = xp.broadcast_to(inv.reshape(-1), b.shape)   # one diagonal, every component
        inv = xp.ascontiguousarray(inv).reshape(-1)
        _everywhere(red, inv.size == b.size,
                    f"the Jacobi preconditioner has {inv.size} entries, b has shape {b.shape} "
                    f"(expected {b.size} entries, or {b.shape[-1]} for every component)")
    bb, rr = _floats(xp, _dot(xp, b, b), _dot(xp, r, r), red=red)
    bnorm = np.sqrt(bb)
    if bnorm == 0.0:
        return CGResult(xp.zeros_like(b), 0, np.zeros(1), True, 0.0)
    history = [np.sqrt(rr) / bnorm]
    xf, rf = x.reshape(-1), r.reshape(-1)
    it, code, value = _cg_fused.iterate(apply, b, xf, rf, inv, tol, maxiter, bnorm, history,
                                        check_every, red, other)
    if code == 3:
        raise ValueError(f"operator is not positive definite: p^T A p = {value:.3e} at "
                         f"iteration {it}" + _asymmetry(apply, b, xp, red))
    if code == 4:
        raise ValueError(f"preconditioner is not positive definite: r^T z = {value:.3e} at "
                         f"iteration {it}")
    if code == 5:
        raise ValueError(f"CG produced a non-finite residual at iteration {it}")
    rtrue = b - apply(x)
    (rt,) = _floats(xp, _dot(xp, rtrue, rtrue), red=red)
    result = CGResult(x, it, np.array(history), history[-1] <= tol, float(np.sqrt(rt) / bnorm))
    return _outcome(result, tol, raise_on_failure, apply, b, xp, red)
