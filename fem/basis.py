"""Nodal Lagrange bases on Gauss-Lobatto nodes, evaluated at any points.

The 1D basis of order ``p`` has ``nd = p + 1`` functions ``phi_i`` with
``phi_i(x_j) = delta_ij`` at the Gauss-Lobatto nodes ``x_j`` of
:func:`smalltc.fem.quadrature.gauss_lobatto` on ``[-1, 1]``. Values use the
second (true) barycentric formula, which is backward stable for any point;
derivatives are ``G = B @ Dn`` with ``Dn`` the nodal differentiation matrix,
exact because ``phi_j'`` has degree ``p - 1``.

``B1d[k, i] = phi_i(q_k)`` and ``G1d[k, i] = phi_i'(q_k)`` follow the layout
of docs/math.md section 1: quadrature points along rows, basis functions along
columns.

Orders are limited to ``p <= MAX_ORDER`` (256), at most ``MAX_ORDER + 1``
nodes. Measured at every ``p <= 256`` (``nq = p + 1`` and ``p + 2`` Gauss
points): the partition of unity holds to 1e-15 and the derivative identities
``sum_i phi_i' = 0``, ``sum_i x_i phi_i' = 1`` and ``int phi_i' = phi_i(1) -
phi_i(-1)`` to 4e-11, their error growing about like ``p**3`` (the
derivatives reach ``p (p + 1) / 4`` at the end points): 1e-10 from
``p = 343``. Near ``p = 790`` the barycentric weights overflow and the basis
turns to NaN.
"""

from typing import NamedTuple

import numpy as np

from .quadrature import gauss_lobatto, quadrature_rule

__all__ = [
    "MAX_ORDER",
    "Basis1D",
    "barycentric_weights",
    "differentiation_matrix",
    "lagrange_basis",
    "basis_1d",
]

#: The largest order of a basis: its derivative identities hold to ~1e-10 in float64.
MAX_ORDER = 256


def _as_nodes(nodes):
    x = np.asarray(nodes, dtype=np.float64)
    if x.ndim != 1 or x.size < 1:
        raise ValueError(f"nodes must be a non-empty 1D array, got shape {x.shape}")
    if x.size > MAX_ORDER + 1:
        raise ValueError(f"nodes has shape {x.shape}, at most ({MAX_ORDER + 1},): a basis of "
                         f"order p <= {MAX_ORDER} is accurate in float64")
    if not np.all(np.isfinite(x)):
        raise ValueError("nodes must be finite")
    if x.size > 1 and np.min(np.abs(np.subtract.outer(x, x)) + np.eye(x.size)) == 0.0:
        raise ValueError(f"nodes must be distinct, got {x}")
    return x


def barycentric_weights(nodes):
    """Barycentric weights ``lambda_j = 1 / prod_{k != j} (x_j - x_k)``.

    Scaled so that ``max |lambda_j| == 1`` (the barycentric formula is
    invariant under a common scale, and this avoids overflow).

    Parameters
    ----------
    nodes : array_like, shape (nd,)
        Distinct interpolation nodes.

    Returns
    -------
    ndarray, shape (nd,)

    Raises
    ------
    ValueError
        If the nodes are not a 1D array of at most ``MAX_ORDER + 1`` distinct
        finite numbers.

    Examples
    --------
    >>> print(barycentric_weights([-1.0, 0.0, 1.0]))
    [ 0.5 -1.   0.5]
    """
    lam = 1.0 / np.prod(_differences(_as_nodes(nodes)), axis=1)
    return lam / np.max(np.abs(lam))


def _differences(x):
    """``x_i - x_j`` of the nodes ``x``, shape (nd, nd), with ones on the diagonal."""
    diff = np.subtract.outer(x, x)
    np.fill_diagonal(diff, 1.0)
    return diff


def differentiation_matrix(nodes):
    """Nodal differentiation matrix ``Dn[i, j] = phi_j'(x_i)``.

    Off-diagonal entries are ``(lambda_j / lambda_i) / (x_i - x_j)``; the
    diagonal is minus the row sum of the others (the derivative of the
    constant 1 is 0), which is the numerically preferred form.

    Parameters
    ----------
    nodes : array_like, shape (nd,)
        Distinct interpolation nodes.

    Returns
    -------
    ndarray, shape (nd, nd)

    Examples
    --------
    >>> print(differentiation_matrix([-1.0, 1.0]))
    [[-0.5  0.5]
     [-0.5  0.5]]
    """
    x = _as_nodes(nodes)
    lam = barycentric_weights(x)
    dn = (lam[None, :] / lam[:, None]) / _differences(x)
    np.fill_diagonal(dn, 0.0)
    np.fill_diagonal(dn, -dn.sum(axis=1))
    return dn


def lagrange_basis(nodes, points):
    """Values and derivatives of the Lagrange basis of ``nodes`` at ``points``.

    Parameters
    ----------
    nodes : array_like, shape (nd,)
        Distinct interpolation nodes, ``nd <= MAX_ORDER + 1`` (257).
    points : array_like, shape (nq,)
        Evaluation points (anywhere; exact node hits are handled).

    Returns
    -------
    B : ndarray, shape (nq, nd)
        ``B[k, i] = phi_i(points[k])``.
    G : ndarray, shape (nq, nd)
        ``G[k, i] = phi_i'(points[k])``.

    Raises
    ------
    ValueError
        If ``nodes`` are not distinct and finite or more than ``MAX_ORDER + 1``,
        or ``points`` is not a finite 1D array.

    Examples
    --------
    >>> B, G = lagrange_basis([-1.0, 0.0, 1.0], [0.5])
    >>> print(B, G)
    [[-0.125  0.75   0.375]] [[ 0. -1.  1.]]
    """
    x = _as_nodes(nodes)
    t = np.asarray(points, dtype=np.float64)
    if t.ndim != 1:
        raise ValueError(f"points must be a 1D array, got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError("points must be finite")
    lam = barycentric_weights(x)
    diff = np.subtract.outer(t, x)  # (nq, nd)
    hit = diff == 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = lam / diff
        B = terms / terms.sum(axis=1, keepdims=True)
    rows = hit.any(axis=1)
    B[rows] = hit[rows].astype(np.float64)
    G = B @ differentiation_matrix(x)
    return B, G


class Basis1D(NamedTuple):
    """A 1D nodal basis tabulated at the points of a quadrature rule."""

    #: ``(nq, nd)`` basis values, ``B1d[k, i] = phi_i(qpoints[k])``.
    B1d: np.ndarray
    #: ``(nq, nd)`` derivatives with respect to the reference coordinate.
    G1d: np.ndarray
    #: ``(nq,)`` quadrature points on [-1, 1].
    qpoints: np.ndarray
    #: ``(nq,)`` quadrature weights, summing to 2.
    qweights: np.ndarray
    #: ``(nd,)`` Gauss-Lobatto nodes of the basis on [-1, 1].
    nodes: np.ndarray


def basis_1d(p, nq, quadrature="gauss"):
    """Order-``p`` Gauss-Lobatto nodal basis at an ``nq``-point rule.

    Parameters
    ----------
    p : int
        Polynomial order, ``1 <= p <= MAX_ORDER`` (256); the basis has
        ``nd = p + 1`` functions.
    nq : int
        Number of quadrature points, at most
        :data:`smalltc.fem.quadrature.MAX_POINTS` (2048).
    quadrature : str
        Rule name accepted by :func:`smalltc.fem.quadrature.quadrature_rule`.

    Returns
    -------
    Basis1D
        ``(B1d, G1d, qpoints, qweights, nodes)``.

    Raises
    ------
    ValueError
        If ``p`` is not an integer in ``[1, MAX_ORDER]`` or the rule rejects
        ``nq``.

    Examples
    --------
    >>> b = basis_1d(2, 3)
    >>> b.B1d.shape, b.G1d.shape
    ((3, 3), (3, 3))
    >>> print(np.round(b.B1d.sum(axis=1), 12))
    [1. 1. 1.]
    """
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if p > MAX_ORDER:
        raise ValueError(f"p must be <= {MAX_ORDER}, got p={p}: beyond it the float64 basis "
                         "derivatives lose accuracy (identities off by 1e-10 from p=343, NaN "
                         "from p~790)")
    nodes, _ = gauss_lobatto(int(p) + 1)
    qpoints, qweights = quadrature_rule(nq, quadrature)
    B, G = lagrange_basis(nodes, qpoints)
    return Basis1D(B, G, qpoints, qweights, nodes)
