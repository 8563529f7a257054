"""Preconditioned conjugate gradients and the Jacobi preconditioner.

:func:`cg` works on any array shape (``(ndofs,)`` or ``(ncomp, ndofs)``):
inner products are taken over all entries. It stops when the relative
residual ``||r_k|| / ||b||`` (Euclidean norms) reaches ``tol``, and raises
:class:`ConvergenceError` when it does not within ``maxiter`` iterations,
unless asked to return the unconverged result (then ``converged`` is False).

Both are array-module generic: with CuPy vectors (and an operator and
preconditioner that return CuPy arrays) the iteration runs on the GPU. Inner
products stay on the device; each iteration copies three scalars to the host
in one transfer (one synchronisation), for the stopping test and the
positive-definiteness checks.
"""

from dataclasses import dataclass

import numpy as np

from smalltc._arrays import array_module

from ._device import to_host

__all__ = ["CGResult", "ConvergenceError", "cg", "jacobi"]


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
    callable

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
    bad = ~(xp.isfinite(d) & (d > 0))
    if bool(bad.any()):
        d, bad = to_host(d), to_host(bad)
        i = np.unravel_index(np.flatnonzero(bad)[0], d.shape)
        raise ValueError(
            f"diagonal must be positive and finite for a Jacobi preconditioner; "
            f"entry {tuple(int(k) for k in i)} is {float(d[i])!r} ({int(bad.sum())} bad entries)"
        )
    inv = 1.0 / d
    return lambda r: r * inv


def _dot(xp, a, b):
    """``<a, b>`` as a scalar of ``xp`` (a 0-d device array for CuPy: no sync)."""
    return xp.vdot(a.ravel(), b.ravel()).real


def _floats(xp, *scalars):
    """Python floats of ``scalars``, in one device-to-host copy for CuPy."""
    if xp is np:
        return tuple(float(s) for s in scalars)
    return tuple(float(s) for s in xp.stack(scalars).get())


def cg(apply, b, *, tol=1e-10, maxiter=None, precond=None, x0=None, raise_on_failure=True):
    """Solve ``A x = b`` for symmetric positive definite ``A`` by (preconditioned) CG.

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
        :func:`jacobi`).
    x0 : ndarray, optional
        Initial guess (zero by default), copied into the module of ``b``.
    raise_on_failure : bool
        Raise :class:`ConvergenceError` if the tolerance is not reached
        (default); if false, return the result with ``converged=False``.

    Returns
    -------
    CGResult

    Raises
    ------
    ConvergenceError
        When not converged within ``maxiter`` (and ``raise_on_failure``).
    ValueError
        For bad ``tol``/``maxiter``/``x0``, non-finite values, or when the
        operator or preconditioner is seen not to be positive definite.

    Examples
    --------
    >>> A = np.array([[4.0, 1.0], [1.0, 3.0]])
    >>> res = cg(lambda x: A @ x, np.array([1.0, 2.0]), tol=1e-12)
    >>> print(np.round(res.x, 6), res.iterations, res.converged)
    [0.090909 0.636364] 2 True
    """
    xp = array_module(b)
    b = xp.asarray(b)
    if not bool(xp.all(xp.isfinite(b))):
        raise ValueError("b contains non-finite values")
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a positive number, got {tol!r}")
    maxiter = 10 * b.size if maxiter is None else maxiter
    if isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer)) or maxiter < 0:
        raise ValueError(f"maxiter must be a non-negative integer, got {maxiter!r}")
    precond = (lambda r: r) if precond is None else precond
    if x0 is None:
        x = xp.zeros_like(b)
        r = b.copy()
    else:
        x = xp.array(x0, dtype=b.dtype)
        if x.shape != b.shape:
            raise ValueError(f"x0 has shape {x.shape}, expected {b.shape} (the shape of b)")
        r = b - apply(x)
    z = precond(r)
    bb, rr, rz = _floats(xp, _dot(xp, b, b), _dot(xp, r, r), _dot(xp, r, z))
    bnorm = np.sqrt(bb)
    if bnorm == 0.0:
        return CGResult(xp.zeros_like(b), 0, np.zeros(1), True, 0.0)
    history = [np.sqrt(rr) / bnorm]
    p = z.copy()
    it = 0
    while history[-1] > tol and it < maxiter:
        if not rz > 0:
            raise ValueError(f"preconditioner is not positive definite: r^T z = {rz:.3e} at iteration {it}")
        Ap = apply(p)
        pAp = _dot(xp, p, Ap)
        alpha = rz / pAp  # stays on the device; checked with the next transfer
        x += alpha * p
        r -= alpha * Ap
        z = precond(r)
        pAp, rr, rz_new = _floats(xp, pAp, _dot(xp, r, r), _dot(xp, r, z))
        if not pAp > 0:
            raise ValueError(f"operator is not positive definite: p^T A p = {pAp:.3e} at iteration {it}")
        it += 1
        history.append(np.sqrt(rr) / bnorm)
        if not np.isfinite(history[-1]):
            raise ValueError(f"CG produced a non-finite residual at iteration {it}")
        p = z + (rz_new / rz) * p
        rz = rz_new
    rtrue = b - apply(x)
    (rt,) = _floats(xp, _dot(xp, rtrue, rtrue))
    result = CGResult(x, it, np.array(history), history[-1] <= tol, float(np.sqrt(rt) / bnorm))
    if not result.converged and raise_on_failure:
        raise ConvergenceError(
            f"CG did not converge in {it} iterations: relative residual "
            f"{history[-1]:.3e} > tol {tol:.3e}",
            result,
        )
    return result
