"""Chebyshev smoothing of the Jacobi-preconditioned operator, and its eigenvalue bound.

A polynomial smoother needs only the operator's action and its diagonal ``D``:
``k`` steps cost ``k - 1`` applications from a zero guess (``k`` from a nonzero one)
and a few vector updates, with no inner products, so it runs on a GPU as fast as the
operator does. It is an SPD preconditioner by itself (:func:`chebyshev`) and the
smoother of every level of :func:`smalltc.fem.pmg`.

Two kinds, both polynomials in ``D^-1 A`` whose spectrum lies in ``(0, lambda_max]``:

``"fourth"`` (default)
    The fourth-kind Chebyshev polynomials of Lottes (2022), "Optimal polynomial
    smoothers for multigrid V-cycles": the error polynomial ``1 - t p(t)`` is small on
    the upper part of ``(0, lambda_max]`` and tends to 1 as ``t -> 0``, with no lower
    bound to choose. Step ``i`` (``d_0 = 4 / (3 lambda) D^-1 r``)::

        x += d_{i-1};  r -= A d_{i-1}
        d_i = (2i - 1) / (2i + 3) d_{i-1} + (8i + 4) / ((2i + 3) lambda) D^-1 r

``"fourth-opt"``
    The same recurrence with Lottes' optimised weights: the iterate is ``x = sum_i
    beta_i d_i`` (the residual recurrence is unchanged), with ``beta_i`` (degrees 1 to
    8, :data:`OPT_FOURTH_BETAS`) chosen in that paper to minimise its V-cycle
    convergence bound; they grow from ~1 to 1.1-1.5 on the last step, so the top of the
    spectrum is damped harder at the same cost.

``"first"``
    The classic Chebyshev iteration on ``[lower * lambda, lambda]`` (Saad, Iterative
    Methods, Alg. 12.1), damping that interval uniformly.

``lambda_max`` is estimated at setup by ``steps`` iterations of Jacobi-PCG on a random
right-hand side: the CG coefficients give the Lanczos tridiagonal matrix, whose largest
eigenvalue (a Ritz value, never above the true one) is multiplied by ``safety`` (1.1).
A bound given by hand below that Ritz value would make the smoother amplify the top of
the spectrum (and a V-cycle lose definiteness): it is refused with a ``ValueError``,
as is an operator whose Lanczos matrix shows a non-positive eigenvalue.

``D^-1`` can be any SPD preconditioner ``M^-1`` (``Chebyshev(..., preconditioner=P)``,
``P`` a callable ``r -> M^-1 r``: e.g. :class:`smalltc.fem.schwarz.Schwarz`, the
overlapping Schwarz smoother of NekRS's p-multigrid): the polynomials are then in ``M^-1
A``, the same Lanczos (PCG with ``M``) estimates its ``lambda_max``, and each step applies
``M^-1`` once after the fused vector update (:class:`PreconditionedVectorOps`).

Everything is array-module generic: NumPy, or CuPy for an operator whose applications
return CuPy arrays (the pseudo-random start vector is an integer hash of the entries'
numbers, made where the vectors are: the CPU and the GPU start from the same bits).
"""

import math

import numpy as np

import smalltc
from smalltc._arrays import array_module

from .operators import _like, linear_operator
from .solvers import jacobi

__all__ = ["Chebyshev", "chebyshev", "estimate_lambda_max", "start_vector", "KINDS",
           "OPT_FOURTH_BETAS", "VectorOps", "PreconditionedVectorOps"]

#: the polynomial kinds :class:`Chebyshev` builds
KINDS = ("fourth", "first", "fourth-opt")

#: the weights ``beta_1 .. beta_k`` of the optimised fourth-kind smoother of degree ``k``,
#: tabulated in Lottes (2022), "Optimal polynomial smoothers for multigrid V-cycles"
#: (arXiv:2202.08830; PETSc's ``KSPCHEBYSHEV`` ``opt_fourth`` kind uses the same table)
OPT_FOURTH_BETAS = {
    1: (1.12500000000000,),
    2: (1.02387287570313, 1.26408905371085),
    3: (1.00842544782028, 1.08867839208730, 1.33753125909618),
    4: (1.00391310427285, 1.04035811188593, 1.14863498546254, 1.38268869241000),
    5: (1.00212930146164, 1.02173711549260, 1.07872433192603, 1.19810065292663,
        1.41322542791682),
    6: (1.00128517255940, 1.01304293035233, 1.04678215124113, 1.11616489419675,
        1.23829020218444, 1.43524297106744),
    7: (1.00083464397912, 1.00843949430122, 1.03008707768713, 1.07408384092003,
        1.15036186707366, 1.27116474046139, 1.45186658649364),
    8: (1.00057246631197, 1.00577427662415, 1.02050187922941, 1.05019803444565,
        1.10115572984941, 1.18086042806856, 1.29838585382576, 1.46486073151099),
}


def _as_apply(operator):
    """``x -> A x`` for a fem operator (callable) or a sparse/dense matrix (``@``)."""
    if callable(operator):
        return operator
    if hasattr(operator, "__matmul__") or hasattr(operator, "dot"):
        return lambda x: operator @ x
    raise TypeError(f"operator must be callable or a matrix, got {type(operator).__name__}")


def start_vector(keys, dtype=np.float64, seed=0):
    """Pseudo-random entries in ``[-0.5, 0.5)``, one a key: SplitMix64's finaliser of
    ``keys`` (unsigned 64-bit integers, NumPy or CuPy) and ``seed``, its top 53 bits as a
    fraction. Integer arithmetic only, so NumPy and CuPy give the same bits, and a key (a
    DoF's global number) gets the same entry on any number of ranks.

    Examples
    --------
    >>> v = start_vector(np.arange(4, dtype=np.uint64))
    >>> bool(np.all(np.abs(v) < 0.5)), len(set(v.tolist()))
    (True, 4)
    """
    xp = array_module(keys)
    u = xp.uint64
    z = keys.astype(u)                                 # a copy, updated in place
    t = xp.empty_like(z)
    with np.errstate(over="ignore"):
        z += u((int(seed) + 1) * 0x9E3779B97F4A7C15 % 2**64)
        for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
            z ^= xp.right_shift(z, u(shift), out=t)
            z *= u(mult)
        z ^= xp.right_shift(z, u(31), out=t)
    z >>= u(11)
    v = z.astype(xp.float64)
    v *= 0.5 ** 53
    v -= 0.5
    return v.astype(dtype, copy=False)


def estimate_lambda_max(apply, inv_diag, *, steps=10, seed=0, preconditioner=None, start=None,
                        dot=None, free=None):
    """Largest eigenvalue of ``D^-1 A`` (``M^-1 A``) from ``steps`` Jacobi-PCG (PCG with
    ``M``) Lanczos iterations.

    Parameters
    ----------
    apply : callable
        ``x -> A x`` for vectors of ``inv_diag``'s shape and module.
    inv_diag : array
        ``1 / diag(A)`` (NumPy or CuPy).
    steps : int
        CG iterations (fewer when CG converges first).
    seed : int
        Seed of the pseudo-random right-hand side (:func:`start_vector`: made where the
        vectors are, the same bits on the host and a GPU).
    preconditioner : callable, optional
        ``r -> M^-1 r``, SPD, in place of ``inv_diag * r`` (which then gives only the
        vectors' shape, dtype and module).
    start : array, optional
        The right-hand side, in place of the random one.
    dot : callable, optional
        ``(a, b) -> float``, the inner product (e.g. summed across MPI ranks); the
        vectors' own ``vdot`` by default.
    free : array, optional
        The free mask ``f`` (1 free, 0 constrained, in ``inv_diag``'s dtype) of a
        constrained operator ``A_c v = f A(f v) + (1 - f) v``
        (:class:`~smalltc.fem.multigrid.Constrained`): ``apply`` is then the raw ``A``
        and the estimate is of ``A_c`` (``A``'s output is overwritten on the constrained
        DoFs).

    Returns
    -------
    float
        The largest Ritz value, a lower bound of ``lambda_max(D^-1 A)`` (``M^-1 A``).

    Raises
    ------
    ValueError
        When ``A`` or the Lanczos matrix is seen not to be positive definite.

    Examples
    --------
    >>> A = np.diag([1.0, 2.0, 4.0])
    >>> round(estimate_lambda_max(lambda x: A @ x, np.ones(3)), 6)
    4.0
    >>> round(estimate_lambda_max(lambda x: A @ x, np.ones(3),
    ...                           preconditioner=lambda r: r / np.diag(A)), 6)
    1.0
    >>> round(estimate_lambda_max(lambda x: A @ x, np.ones(3),            # A_c = diag(1, 2, 1)
    ...                           free=np.array([1.0, 1.0, 0.0])), 6)
    2.0
    """
    xp = array_module(inv_diag)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    if start is None:
        r = start_vector(xp.arange(inv_diag.size, dtype=xp.uint64), inv_diag.dtype,
                         seed).reshape(inv_diag.shape)
    else:
        r = start.copy()                  # updated in place below
    # a GPU's own inner products stay on it (0-d arrays): the steps are queued without a
    # wait, the scalars read once at the end and the stop tests applied to them there
    deferred = dot is None and xp is not np
    if dot is None:
        def dot(a, b):
            s = xp.vdot(a, b).real
            return s.astype(np.float64) if deferred else float(s)
    # In place, on r, p and one work vector t (z = D^-1 r, f p, alpha A p): the arithmetic
    # of r = r - alpha A p, p = z + beta p, with no new vector a step besides A p's
    t = xp.empty_like(r)
    if preconditioner is None:
        def prec(v):
            return xp.multiply(v, inv_diag, out=t)
    else:
        prec = preconditioner
    if free is not None:
        fixed = free == 0
        raw = apply

        def apply(v):                     # f A(f v) + (1 - f) v, f in {0, 1}: v where fixed
            Av = raw(xp.multiply(v, free, out=t))
            xp.copyto(Av, v, where=fixed)
            return Av
    z = prec(r)
    p = z.copy()
    rz = dot(r, z)
    rzs, paps = [rz], []
    for it in range(int(steps)):
        Ap = apply(p)
        pAp = dot(p, Ap)
        paps.append(pAp)
        if not deferred and not pAp > 0:
            break
        alpha = rz / pAp
        r -= xp.multiply(Ap, alpha.astype(r.dtype) if deferred else alpha, out=t)
        del Ap
        z = prec(r)
        rz_new = dot(r, z)
        rzs.append(rz_new)
        if not deferred and not rz_new > 1e-28 * rz:    # converged: T is complete
            break
        beta = rz_new / rz
        p *= beta.astype(p.dtype) if deferred else beta
        p += z
        rz = rz_new
    if deferred:
        scalars = xp.stack(rzs + paps).get()
        rzs, paps = scalars[:len(rzs)].tolist(), scalars[len(rzs):].tolist()
    alphas, betas = [], []
    for it, pAp in enumerate(paps):
        if not pAp > 0:
            raise ValueError(f"the operator is not positive definite: p^T A p = {pAp:.3e} at "
                             f"Lanczos step {it} of the eigenvalue estimate")
        alphas.append(rzs[it] / pAp)
        if not rzs[it + 1] > 1e-28 * rzs[it]:          # converged (an invariant subspace)
            break
        betas.append(rzs[it + 1] / rzs[it])
    m = len(alphas)
    T = np.zeros((m, m))
    for j in range(m):
        T[j, j] = 1.0 / alphas[j] + (betas[j - 1] / alphas[j - 1] if j else 0.0)
        if j + 1 < m:
            T[j, j + 1] = T[j + 1, j] = math.sqrt(betas[j]) / alphas[j]
    ev = np.linalg.eigvalsh(T)
    if not ev[0] > 0 or not np.all(np.isfinite(ev)):
        raise ValueError(f"the {'Jacobi-' if preconditioner is None else ''}preconditioned "
                         f"operator is not positive definite: "
                         f"Lanczos eigenvalue estimates {ev[0]:.3e} .. {ev[-1]:.3e}")
    return float(ev[-1])


class VectorOps:
    """The vector updates of a Chebyshev smoothing (and a V-cycle's residual) on one
    level, in place, through :func:`smalltc.vector_update`: NumPy array operations on the
    host, one fused kernel each on the GPU (``templates/cuda/pmg_vector.cu.j2``).

    ``free`` is the free mask ``f`` of a constrained operator ``A_c v = f A(f v) + (1 -
    f) v`` (None: no constraints); ``y`` below is always the raw ``A(f v)``.

    Parameters
    ----------
    inv_diag : array
        ``1 / diag(A_c)`` (NumPy or CuPy).
    free : array or None
        The mask (1 free, 0 constrained) in ``inv_diag``'s dtype and module.

    Examples
    --------
    >>> ops = VectorOps(np.full(3, 0.5), None)
    >>> d, dm = ops.start(np.array([2.0, 4.0, 6.0]), 1.0)
    >>> print(d, dm is d)
    [1. 2. 3.] True
    """

    def __init__(self, inv_diag, free=None):
        self.inv, self.xp = inv_diag, array_module(inv_diag)
        self.gpu = self.xp is not np
        self.n, self.dtype = int(inv_diag.size), inv_diag.dtype
        if free is not None:
            free = self.xp.asarray(free, dtype=self.dtype)
        self.free = free
        self.fixed = None if free is None else 1 - free

    def empty_like(self, v):
        """A new vector (uninitialised)."""
        return self.xp.empty_like(v)

    def start(self, r, c1):
        """``d = c1 D^-1 r``; returns ``(d, f d)`` (the same array without a mask on the
        host)."""
        return smalltc.vector_update("start", r, self.inv, free=self.free, c1=c1)

    def step(self, y, r, x, d, dm, c0, c1, xzero, beta=1.0):
        """``r -= A_c d`` (``y = A(f d)``), ``x += beta d`` (``x = beta d`` when
        ``xzero``), ``d = c0 d + c1 D^-1 r``, ``dm = f d``: all in place."""
        smalltc.vector_update("step", y, r, x, d, dm, self.inv, free=self.free, c0=c0, c1=c1,
                              beta=beta, xzero=bool(xzero))

    def last(self, d, x, xzero, beta=1.0):
        """``x += beta d`` (``x = beta d`` when ``xzero``); returns ``(x, f x)``."""
        return smalltc.vector_update("last", d, x, free=self.free, beta=beta,
                                     xzero=bool(xzero))

    def residual(self, b, y, x):
        """``r = b - A_c x`` from ``y = A(f x)``: a new vector."""
        return smalltc.vector_update("residual", b, y, x, free=self.free)


class PreconditionedVectorOps(VectorOps):
    """:class:`VectorOps` with an SPD preconditioner ``M^-1`` (a callable ``r -> M^-1 r``,
    the identity on constrained DoFs) in place of ``D^-1``: the step's fused update runs
    with no ``D^-1 r`` term, then ``d += c1 M^-1 r`` and ``dm = f d``.

    Examples
    --------
    >>> ops = PreconditionedVectorOps(np.ones(3), None, lambda r: r / 2)
    >>> d, dm = ops.start(np.array([2.0, 4.0, 6.0]), 1.0)
    >>> print(d)
    [1. 2. 3.]
    """

    def __init__(self, inv_diag, free, preconditioner):
        super().__init__(inv_diag, free)
        if not callable(preconditioner):
            raise TypeError(f"preconditioner must be callable (r -> M^-1 r), got "
                            f"{type(preconditioner).__name__}")
        self.preconditioner = preconditioner

    def _apply(self, r):
        """``M^-1 r`` in the vectors' dtype (a preconditioner may work in another)."""
        return self.xp.asarray(self.preconditioner(r)).astype(self.dtype, copy=False)

    def start(self, r, c1):
        d = self._apply(r) * c1
        if self.free is None:
            return d, (d.copy() if self.gpu else d)
        return d, d * self.free

    def step(self, y, r, x, d, dm, c0, c1, xzero, beta=1.0):
        super().step(y, r, x, d, dm, c0, 0.0, xzero, beta)
        t = self._apply(r)
        t *= c1
        d += t
        if dm is not d:
            if self.free is None:
                dm[...] = d
            else:
                self.xp.multiply(d, self.free, out=dm)


class _Preconditioner:
    """SciPy's and CuPy's LinearOperator protocol on top of ``__call__`` (``r -> z``),
    ``n`` and ``dtype`` (set by the subclass) and ``xp``."""

    @property
    def shape(self):
        """``(n, n)``."""
        return (self.n, self.n)

    def matvec(self, r):
        """``z = P r`` for one vector of shape ``(n,)`` or ``(n, 1)``, in r's shape and
        module (a GPU preconditioner copies a NumPy ``r`` to the device and back)."""
        z = self(self.xp.asarray(r).reshape(-1))
        return _like(r, z.reshape(r.shape))

    def matmat(self, R):
        """``P R`` for ``R`` of shape ``(n, k)``, column by column."""
        R_ = self.xp.asarray(R)
        return _like(R, self.xp.stack([self(R_[:, j]) for j in range(R_.shape[1])], axis=1))

    #: symmetric: the adjoint is itself
    rmatvec, rmatmat = matvec, matmat

    def aslinearoperator(self):
        """This preconditioner as a SciPy (CuPy, on the GPU) ``LinearOperator``: the
        ``M=`` of ``scipy.sparse.linalg.cg`` (``cupyx.scipy.sparse.linalg.cg``)."""
        return linear_operator(self)


class Chebyshev(_Preconditioner):
    """Chebyshev smoother (and preconditioner) of ``D^-1 A``; made by :func:`chebyshev`.

    Parameters
    ----------
    operator : callable or matrix
        ``A``: a fem operator (``A(x)``) or a SciPy/CuPy sparse matrix (``A @ x``).
    diagonal : array, optional
        ``diag(A)``; ``operator.diagonal()`` by default. Positive and finite.
    degree : int
        Polynomial degree ``k >= 1``: ``k - 1`` applications of ``A`` per smoothing
        from zero (:meth:`__call__`), ``k`` from a nonzero guess (:meth:`smooth`).
    kind : {"fourth", "first", "fourth-opt"}
        See the module's docstring ("fourth-opt": degrees 1 to 8).
    lambda_max : float, optional
        Upper bound of the spectrum of ``D^-1 A``; estimated when not given. A given
        bound is checked against the Lanczos estimate (``check``).
    lower : float
        First kind: the smoothed interval is ``[lower * lambda_max, lambda_max]``.
    safety : float
        Factor applied to the estimated ``lambda_max``.
    steps : int
        Lanczos (CG) steps of the estimate.
    check : bool
        Estimate even when ``lambda_max`` is given and refuse a bound below the estimate.
    preconditioner : callable, optional
        An SPD ``r -> M^-1 r`` in place of ``D^-1`` (e.g. :class:`smalltc.fem.schwarz.Schwarz`;
        for a constrained operator, the identity on its constrained DoFs): the polynomial
        is then in ``M^-1 A``, whose ``lambda_max`` the same Lanczos (PCG with ``M``)
        estimates. One application of it per step.

    Attributes
    ----------
    lambda_max : float
        The bound used. ``estimate``: the Lanczos estimate (None when not computed).
    inv_diag : array
        ``1 / diag(A)``.

    Raises
    ------
    ValueError
        For a bad ``degree``/``kind``/``lower``/``safety``, a diagonal that is not
        positive and finite, an operator that is not positive definite, or a given
        ``lambda_max`` below the estimated one.

    Examples
    --------
    >>> A = np.diag(np.arange(1.0, 11.0)) + 0.1
    >>> S = Chebyshev(A, degree=3)
    >>> S.lambda_max > 1.0, S.kind
    (True, 'fourth')
    >>> x = S(np.ones(10))               # three steps from zero: z ~ A^-1 r
    >>> bool(np.linalg.norm(A @ x - 1) < np.linalg.norm(np.ones(10)))
    True
    >>> S = Chebyshev(A, degree=3, preconditioner=lambda r: np.linalg.solve(A, r))
    >>> x = S(np.ones(10))               # M = A: M^-1 A = I, one point in the spectrum
    >>> round(S.estimate, 6), bool(np.linalg.norm(A @ x - 1) < 0.1 * np.sqrt(10))
    (1.0, True)
    """

    def __init__(self, operator, diagonal=None, *, degree=2, kind="fourth", lambda_max=None,
                 lower=0.3, safety=1.1, steps=10, check=True, preconditioner=None):
        if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
            raise ValueError(f"degree must be an integer >= 1, got {degree!r}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
        if not (0 < lower < 1):
            raise ValueError(f"lower must be in (0, 1), got {lower!r}")
        if not (np.isfinite(safety) and safety >= 1):
            raise ValueError(f"safety must be a number >= 1, got {safety!r}")
        self.operator = operator
        self.apply = _as_apply(operator)
        # a constrained operator (multigrid.Constrained: A_c v = f A(f v) + (1 - f) v):
        # the smoothing steps apply the raw A to f v and fold the rest into their updates
        inner, free = getattr(operator, "operator", None), getattr(operator, "free", "none")
        if callable(inner) and not isinstance(free, str):
            self._raw, self._free = inner, free
        else:
            self._raw, self._free = self.apply, None
        self._ops = None
        if diagonal is None:
            if not hasattr(operator, "diagonal"):
                raise TypeError("operator has no diagonal(): pass diagonal=")
            diagonal = operator.diagonal()
        try:
            self.inv_diag = jacobi(diagonal).inv
        except ValueError as err:
            raise ValueError(f"Chebyshev smoother: {err}") from err
        self.xp = array_module(self.inv_diag)
        self.n, self.dtype = int(self.inv_diag.size), self.inv_diag.dtype
        if kind == "fourth-opt" and int(degree) not in OPT_FOURTH_BETAS:
            raise ValueError(f"kind 'fourth-opt' has weights for degrees "
                             f"{min(OPT_FOURTH_BETAS)}..{max(OPT_FOURTH_BETAS)}, got degree "
                             f"{degree}")
        self.degree, self.kind, self.lower, self.safety = int(degree), kind, float(lower), \
            float(safety)
        if preconditioner is not None and not callable(preconditioner):
            raise TypeError(f"preconditioner must be callable (r -> M^-1 r), got "
                            f"{type(preconditioner).__name__}")
        self.preconditioner = preconditioner
        self.estimate = None
        if lambda_max is None or check:
            self.estimate = estimate_lambda_max(self._raw, self.inv_diag, steps=steps,
                                                preconditioner=preconditioner,
                                                free=self._free)
        if lambda_max is None:
            lambda_max = safety * self.estimate
        elif not (np.isfinite(lambda_max) and lambda_max > 0):
            raise ValueError(f"lambda_max must be a positive number, got {lambda_max!r}")
        elif check and lambda_max < self.estimate * (1 - 1e-8):
            raise ValueError(
                f"lambda_max={lambda_max:.4g} is below the estimated largest eigenvalue "
                f"{self.estimate:.4g} of D^-1 A (a lower bound of the true one): the smoother "
                f"would amplify the top of the spectrum and the solve could diverge; leave "
                f"lambda_max=None to use {safety:g} x the estimate")
        self.lambda_max = float(lambda_max)

    def __call__(self, r):
        """``z = p(D^-1 A) D^-1 r``: :meth:`smooth` from a zero guess (``degree - 1``
        applications of ``A``); SPD for a valid bound, so a CG preconditioner."""
        return self.smooth(r)

    def coefficients(self):
        """The step scalars: ``[(c0_i, c1_i)]`` for ``i = 0 .. degree - 1`` with
        ``d_0 = c1_0 D^-1 r`` and ``d_i = c0_i d_{i-1} + c1_i D^-1 r_i``.

        Examples
        --------
        >>> S = Chebyshev(np.eye(3) * 2, degree=2, lambda_max=1.0, check=False)
        >>> [(round(a, 4), round(b, 4)) for a, b in S.coefficients()]
        [(0.0, 1.3333), (0.2, 2.4)]
        """
        lam, k = self.lambda_max, self.degree
        if self.kind in ("fourth", "fourth-opt"):
            out = [(0.0, 4.0 / (3.0 * lam))]
            for i in range(1, k):
                out.append(((2 * i - 1) / (2 * i + 3), (8 * i + 4) / ((2 * i + 3) * lam)))
            return out
        a, bnd = self.lower * lam, lam
        theta, delta = (bnd + a) / 2, (bnd - a) / 2
        sigma = theta / delta
        rho = 1.0 / sigma
        out = [(0.0, 1.0 / theta)]
        for _ in range(1, k):
            rho_new = 1.0 / (2 * sigma - rho)
            out.append((rho_new * rho, 2 * rho_new / delta))
            rho = rho_new
        return out

    def weights(self):
        """The weights ``beta_i`` of the steps' directions in the iterate, ``x = x_0 +
        sum_i beta_i d_i``: Lottes' for ``"fourth-opt"``, ones otherwise.

        Examples
        --------
        >>> S = Chebyshev(np.eye(3) * 2, degree=2, kind="fourth-opt", lambda_max=1.0,
        ...               check=False)
        >>> [round(b, 4) for b in S.weights()]
        [1.0239, 1.2641]
        """
        if self.kind == "fourth-opt":
            return list(OPT_FOURTH_BETAS[self.degree])
        return [1.0] * self.degree

    def smooth(self, b, x=None, r=None):
        """``degree`` Chebyshev steps on ``A x = b`` from ``x`` (zero when None).

        ``r``: the residual ``b - A x`` when the caller has it (saves an application).
        Returns the new ``x`` (a new array; ``x``, ``b`` and ``r`` are not modified).
        """
        if x is None:
            r = b
        elif r is None:
            r = b - self.apply(x)
        x, _ = self._smooth(r.copy(), None if x is None else x.copy())
        return x

    def _smooth(self, r, x=None):
        """The steps on vectors the caller gives up (``r`` and ``x`` are overwritten):
        returns ``(x, f * x)`` (``f``: the free mask of a constrained operator, see
        :class:`VectorOps`; the second is what the raw operator takes next). One
        fused vector update per step on a GPU."""
        ops = self.vector_ops
        coef, beta = self.coefficients(), self.weights()
        d, dm = ops.start(r, coef[0][1])
        xzero = x is None
        if xzero:
            x = ops.empty_like(r)
        for (c0, c1), b in zip(coef[1:], beta):
            ops.step(self._raw(dm), r, x, d, dm, c0, c1, xzero, b)
            xzero = False
        return ops.last(d, x, xzero, beta[-1])

    @property
    def vector_ops(self):
        """The :class:`VectorOps` of this smoother's operator (made on first use)."""
        if self._ops is None:
            if self.preconditioner is None:
                self._ops = VectorOps(self.inv_diag, self._free)
            else:
                self._ops = PreconditionedVectorOps(self.inv_diag, self._free,
                                                    self.preconditioner)
        return self._ops

    def __repr__(self):
        est = "" if self.estimate is None else f", estimate={self.estimate:.4g}"
        lo = f", lower={self.lower:g}" if self.kind == "first" else ""
        pre = "" if self.preconditioner is None else \
            f", preconditioner={type(self.preconditioner).__name__}"
        return (f"Chebyshev(kind={self.kind!r}, degree={self.degree}, "
                f"lambda_max={self.lambda_max:.4g}{est}{lo}{pre}, n={self.n})")


def chebyshev(operator, degree=4, **kwargs):
    """Chebyshev preconditioner of ``operator``: ``degree`` steps of the smoother from
    zero per application (see :class:`Chebyshev` for the options).

    Parameters
    ----------
    operator : callable or matrix
        A fem operator (with ``diagonal()``) or a sparse matrix.
    degree : int
        Polynomial degree (``degree - 1`` operator applications per preconditioning).
    **kwargs
        ``diagonal``, ``kind``, ``lambda_max``, ``lower``, ``safety``, ``steps``,
        ``check``: as for :class:`Chebyshev`.

    Returns
    -------
    Chebyshev

    Examples
    --------
    >>> from smalltc import fem
    >>> M = fem.mass_operator(fem.H1Space(fem.box_mesh(2, 4), p=2))
    >>> b = M(np.ones(M.shape[0]))
    >>> res = fem.cg(M, b, tol=1e-10, precond=chebyshev(M, degree=3))
    >>> bool(res.converged), bool(np.allclose(res.x, 1.0))
    (True, True)
    """
    return Chebyshev(operator, degree=degree, **kwargs)
