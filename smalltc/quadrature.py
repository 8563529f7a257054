"""Gauss-Legendre and Gauss-Lobatto quadrature rules on [-1, 1].

Every rule lives on the reference interval ``[-1, 1]``; weights therefore
sum to 2. Nodes are returned in increasing order and are symmetric about 0
to the last bit (each rule is computed on one half and mirrored). The
kernels that hold a rule as constants (the backends' vertex-geometry
kernels, :mod:`smalltc.vertices`) take it from :func:`rule_1d`;
:mod:`smalltc.fem` builds its bases on these rules and re-exports their
names.

Both rules are found by Newton's method on Legendre polynomials, evaluated
by the three-term recurrence, from asymptotic initial guesses, in
``O(n**2)`` operations. Counts are limited to ``n <= MAX_POINTS`` (2048):
measured against the same iteration in extended precision, the points are
exact to 1e-16 at every count, and the weights' relative error grows from
1e-14 at ``n = 64`` through 7e-11 at ``n = 2048`` to 2e-10 at ``n = 3000``
(the end weights, where ``1 - x**2`` cancels); larger counts also take
seconds to minutes.
"""

import functools

import numpy as np

__all__ = ["gauss_legendre", "gauss_lobatto", "quadrature_rule", "rule_1d", "RULES",
           "MAX_POINTS"]

#: Accepted spellings of the rule names, mapped to the canonical name.
RULES = {
    "gauss": "gauss",
    "gauss-legendre": "gauss",
    "gl": "gauss",
    "lobatto": "lobatto",
    "gauss-lobatto": "lobatto",
    "gll": "lobatto",
}

_MAX_NEWTON = 100

#: The largest count of either rule: weights accurate to ~1e-10 (relative) in float64.
MAX_POINTS = 2048


def _legendre(n, x):
    """Return ``(P_n(x), P_{n-1}(x))`` by the three-term recurrence (n >= 1)."""
    p_prev = np.ones_like(x)
    p = x.copy()
    for k in range(2, n + 1):
        p_prev, p = p, ((2 * k - 1) * x * p - (k - 1) * p_prev) / k
    return p, p_prev


def _legendre_dp(n, x):
    """Return ``(P_n(x), P_n'(x))`` (n >= 1, x strictly inside (-1, 1))."""
    p, p_prev = _legendre(n, x)
    return p, n * (x * p - p_prev) / (x * x - 1.0)


def _check_count(n, minimum, rule):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an integer, got {type(n).__name__} {n!r} for {rule}")
    if n < minimum:
        raise ValueError(f"n must be >= {minimum} for {rule}, got n={n}")
    if n > MAX_POINTS:
        raise ValueError(f"n must be <= {MAX_POINTS} for {rule}, got n={n} (beyond it the "
                         "float64 weights lose accuracy, ~1e-10 relative at n=3000)")
    return int(n)


def _symmetrize(x, w):
    """Mirror nodes and weights so that x[i] == -x[n-1-i] and w[i] == w[n-1-i]."""
    x = 0.5 * (x - x[::-1])
    w = 0.5 * (w + w[::-1])
    if x.size % 2 == 1:
        x[x.size // 2] = 0.0
    return x, w


def _newton(step, x, rule, n):
    """Run ``x <- x - step(x)`` until the update is at rounding level."""
    for _ in range(_MAX_NEWTON):
        dx = step(x)
        x = x - dx
        if np.max(np.abs(dx)) <= 4.0 * np.finfo(np.float64).eps:
            return x - step(x)  # one polishing step
    raise RuntimeError(
        f"Newton iteration for the {rule} rule with n={n} did not converge in "
        f"{_MAX_NEWTON} steps (last update {np.max(np.abs(dx)):.3e})"
    )


def gauss_legendre(n):
    """Gauss-Legendre points and weights on [-1, 1].

    The ``n``-point rule integrates polynomials of degree ``2n - 1`` exactly.

    Parameters
    ----------
    n : int
        Number of points, ``1 <= n <= MAX_POINTS`` (2048).

    Returns
    -------
    points : ndarray, shape (n,), float64
        Increasing, symmetric about 0, strictly inside (-1, 1).
    weights : ndarray, shape (n,), float64
        Positive, summing to 2.

    Raises
    ------
    TypeError
        If ``n`` is not an integer.
    ValueError
        If ``n < 1`` or ``n > MAX_POINTS``.

    Examples
    --------
    >>> x, w = gauss_legendre(3)
    >>> print(np.round(x, 6), np.round(w, 6))
    [-0.774597  0.        0.774597] [0.555556 0.888889 0.555556]
    >>> print(round(float(w @ x**4), 12))  # int_{-1}^{1} x^4 dx = 2/5
    0.4
    """
    n = _check_count(n, 1, "Gauss-Legendre")
    if n == 1:
        return np.zeros(1), np.full(1, 2.0)
    k = np.arange(n, 0, -1, dtype=np.float64)
    # Tricomi's asymptotic guess for the k-th zero; increasing order.
    x = np.cos(np.pi * (4.0 * k - 1.0) / (4.0 * n + 2.0)) * (1.0 - (n - 1.0) / (8.0 * n**3))

    def step(x):
        p, dp = _legendre_dp(n, x)
        return p / dp

    x = _newton(step, x, "Gauss-Legendre", n)
    _, dp = _legendre_dp(n, x)
    w = 2.0 / ((1.0 - x * x) * dp * dp)
    return _symmetrize(x, w)


def gauss_lobatto(n):
    """Gauss-Lobatto(-Legendre) points and weights on [-1, 1].

    The ``n``-point rule includes both end points and integrates polynomials
    of degree ``2n - 3`` exactly. Its points are the nodes of the nodal
    Lagrange bases in :mod:`smalltc.fem.basis`.

    Parameters
    ----------
    n : int
        Number of points, ``2 <= n <= MAX_POINTS`` (2048).

    Returns
    -------
    points : ndarray, shape (n,), float64
        Increasing, symmetric about 0, ``points[0] == -1``, ``points[-1] == 1``.
    weights : ndarray, shape (n,), float64
        Positive, summing to 2.

    Raises
    ------
    TypeError
        If ``n`` is not an integer.
    ValueError
        If ``n < 2`` or ``n > MAX_POINTS``.

    Examples
    --------
    >>> x, w = gauss_lobatto(4)
    >>> print(np.round(x, 6), np.round(w, 6))
    [-1.       -0.447214  0.447214  1.      ] [0.166667 0.833333 0.833333 0.166667]
    """
    n = _check_count(n, 2, "Gauss-Lobatto")
    N = n - 1  # the interior points are the zeros of P_N'
    # Chebyshev-Gauss-Lobatto guess, increasing order.
    x = -np.cos(np.pi * np.arange(n, dtype=np.float64) / N)

    def step(x):
        # Newton on (1 - x^2) P_N'(x) written with P_N and P_{N-1}; the end
        # points are fixed points of this map.
        p, p_prev = _legendre(N, x)
        return (x * p - p_prev) / (n * p)

    x = _newton(step, x, "Gauss-Lobatto", n)
    x[0], x[-1] = -1.0, 1.0
    p, _ = _legendre(N, x)
    w = 2.0 / (N * n * p * p)
    return _symmetrize(x, w)


def quadrature_rule(n, rule="gauss"):
    """Points and weights of a named rule on [-1, 1].

    Parameters
    ----------
    n : int
        Number of points, at most ``MAX_POINTS`` (2048).
    rule : str
        ``"gauss"`` (alias ``"gauss-legendre"``, ``"gl"``) or ``"lobatto"``
        (alias ``"gauss-lobatto"``, ``"gll"``).

    Returns
    -------
    points, weights : ndarray, shape (n,)

    Raises
    ------
    ValueError
        For an unknown rule name or a count the rule does not allow.

    Examples
    --------
    >>> x, w = quadrature_rule(2, "lobatto")
    >>> print(x, w)
    [-1.  1.] [1. 1.]
    """
    try:
        name = RULES[str(rule).lower()]
    except KeyError as err:
        raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule!r}") from err
    return gauss_legendre(n) if name == "gauss" else gauss_lobatto(n)


@functools.lru_cache(maxsize=None)
def rule_1d(nq, collocated=False):
    """The rule a kernel holds as constants: ``nq`` Gauss-Legendre points and weights, or
    Gauss-Lobatto when ``collocated`` (the basis nodes), as read-only float64 arrays computed
    once per ``(nq, collocated)``.

    Examples
    --------
    >>> x, w = rule_1d(2)
    >>> print(np.round(x * np.sqrt(3), 12), w)
    [-1.  1.] [1. 1.]
    >>> rule_1d(3, collocated=True)[0]
    array([-1.,  0.,  1.])
    >>> rule_1d(3)[1].flags.writeable
    False
    """
    x, w = quadrature_rule(int(nq), "gll" if collocated else "gauss")
    x.flags.writeable = w.flags.writeable = False
    return x, w
