"""The pointwise geometry: determinants, adjugates and the operators' point data from the
Jacobians at the quadrature points, in one pass.

FEM codes build the point data of their operators from the element maps: with ``J[e, a,
b] = dx_a/dxi_b`` at the tensor-product points (:func:`smalltc.interpolate` of the
coordinate field, ``what="gradients"``), ``|J|``, ``adj J = |J| J^-1`` (closed form:
cofactors, no matrix inverted), the mass data ``D = w c |J|`` and the diffusion data
``Q = w c adj J adj J^T / |J|`` (packed upper triangle; docs/math.md section 7). One
kernel reads ``J`` (and a coefficient) once and writes what is asked, and each element's
smallest ``|J|``, so a caller finds an inverted element without another pass.

A thin wrapper that runs its entry of :mod:`smalltc.ops` through
:func:`smalltc.plan.call`, like the operators of :mod:`smalltc.api`;
:class:`smalltc.spec.GeometrySpec` describes the operation.
"""
from __future__ import annotations

from numbers import Real

import numpy as np

from ._arrays import array_module
from .ops import GEOMETRY
from .plan import call

__all__ = ["geometry_data", "inverted_message"]


def inverted_message(jmin):
    """The error of an inverted (or degenerate) element: the first element whose smallest
    ``|J|`` is not positive (NaN too), and how many there are.

    >>> inverted_message(np.array([0.5, -0.25, 0.0]))
    'J is inverted or degenerate: |J| <= 0 in element 1 (min |J| = -0.25); 2 element(s) in all'
    """
    m = np.asarray(jmin.get() if hasattr(jmin, "get") else jmin)
    bad = np.flatnonzero(~(m > 0))
    return (f"J is inverted or degenerate: |J| <= 0 in element {int(bad[0])} (min |J| = "
            f"{m[bad[0]]:.3g}); {bad.size} element(s) in all")


def _tensor_weights(xp, weights, dim, coef):
    """The weights as the plan takes them: the tensor product ``(nq,) * dim`` of 1D
    weights (or a tensor given), times a constant coefficient, float64 on ``xp``."""
    w = weights
    if getattr(w, "ndim", np.ndim(w)) == 1 and dim > 1:
        w1 = w = np.asarray(w.get() if hasattr(w, "get") else w, dtype=np.float64)
        for _ in range(dim - 1):
            w = np.multiply.outer(w, w1)
    if isinstance(coef, Real) and not isinstance(coef, bool):
        w = (w.get() if hasattr(w, "get") else np.asarray(w, dtype=np.float64)) * float(coef)
    if array_module(w) is not xp or getattr(w, "dtype", None) != np.float64:
        w = xp.asarray(w, dtype=np.float64)
    return w


def geometry_data(J, weights=None, *, what="mass", coef=None, dtype=None, jmin=None,
                  absdet=False, out=None, backend="auto", stream=None):
    """Determinants, adjugates or the operators' point data from Jacobians, in one pass.

    At every point ``k`` of element ``e``, with ``w`` the tensor product of the 1D
    ``weights`` and ``c`` the coefficient (1 without one):

    ============  ========================  ================================================
    ``what``      slots a point             values
    ============  ========================  ================================================
    "det"         1 (no slot axis)          ``|J|``
    "adjugate"    ``1 + dim^2``             ``|J|``, then ``adj J`` row by row
    "inverse"     ``1 + dim^2``             ``|J|``, then ``J^-1`` row by row
    "mass"        1 (no slot axis)          ``D = w c |J|``
    "diffusion"   ``dim (dim + 1) / 2``     ``Q = w c adj J adj J^T / |J|``, packed upper
                                            triangle row by row (3D: 11 12 13 22 23 33)
    "both"        ``1 + dim (dim + 1) / 2`` ``D``, then ``Q``
    ============  ========================  ================================================

    ``adj J = |J| J^-1`` in closed form (cofactors); the arithmetic is float64 and each
    output is rounded once to its dtype.

    Parameters
    ----------
    J : array, shape (E, dim, dim, nq, ..., nq)
        ``J[e, a, b] = dx_a/dxi_b`` (``dim`` 1 to 3): :func:`smalltc.interpolate`'s
        gradients of the coordinate field. float64 or float32.
    weights : array_like, shape (nq,) or (nq, ..., nq), optional
        The 1D quadrature weights (their tensor product is taken), or the tensor
        weights; needed for "mass", "diffusion", "both".
    what : str
        See the table.
    coef : number or array of shape (E, nq, ..., nq), optional
        The coefficient (density, conductivity) at the points, J's dtype; a number is a
        constant (multiplying the tensor weights).
    dtype : "float64" or "float32", optional
        The outputs' dtype (default ``out``'s, else J's).
    jmin : array of float64, shape (E,), optional
        Written with each element's smallest ``|J|`` (NaN where a point's is NaN). When
        None the function checks itself and raises for an inverted element.
    absdet : bool
        ``|det J|`` in place of ``det J`` in D and Q (elements of either orientation).
    out : array, optional
        The result (overwritten).
    backend, stream : as for :func:`smalltc.batched_contract`.

    Returns
    -------
    array, shape (E, [slots,] nq, ..., nq)

    Raises
    ------
    ValueError
        Shapes that do not fit (naming the operand), an unknown ``what``, weights missing
        or not wanted, and, without ``jmin``, an element with ``|J| <= 0`` (naming the
        first).
    TypeError
        Dtypes other than float32/float64, mixed array libraries.

    Examples
    --------
    Two squares of side 1/2 (``J = I / 4`` at each of 2 x 2 Gauss points, weights 1):

    >>> import numpy as np, smalltc
    >>> J = np.zeros((2, 2, 2, 2, 2)); J[:, 0, 0] = J[:, 1, 1] = 0.25
    >>> D = smalltc.geometry_data(J, [1.0, 1.0], what="mass", coef=2.0)
    >>> float(D.sum())                           # 2 x the area, 1/2
    1.0
    >>> Q = smalltc.geometry_data(J, [1.0, 1.0], what="diffusion")
    >>> Q.shape, Q[0, :, 0, 0].tolist()          # |J| J^-1 J^-T = I
    ((2, 3, 2, 2), [1.0, 0.0, 1.0])
    >>> jmin = np.empty(2)
    >>> J[1, 0, 0] = -0.25
    >>> smalltc.geometry_data(J, what="det", jmin=jmin)[1, 0, 0], jmin.tolist()
    (np.float64(-0.0625), [0.0625, -0.0625])
    >>> smalltc.geometry_data(J, what="det")
    Traceback (most recent call last):
    ...
    ValueError: J is inverted or degenerate: |J| <= 0 in element 1 (min |J| = -0.0625); 1 element(s) in all
    """
    xp = array_module(J) if hasattr(J, "shape") else np
    if weights is not None:
        weights = _tensor_weights(xp, weights, getattr(J, "ndim", 0) - 3, coef)
    elif isinstance(coef, Real) and not isinstance(coef, bool):
        raise ValueError(f"coef={coef} scales the weights; what={what!r} takes none")
    if isinstance(coef, Real) and not isinstance(coef, bool):
        coef = None
    check = jmin is None
    if check:
        jmin = xp.empty((J.shape[0],) if hasattr(J, "shape") else (0,), dtype=np.float64)
    if dtype is None and out is not None:
        dtype = out.dtype
    dtype = None if dtype is None else np.dtype(dtype).name
    res = call(GEOMETRY, (J, weights, coef, jmin), (what, bool(absdet), dtype), out, stream,
               backend)
    if check and res.shape[0] and not bool((jmin > 0).all()):
        raise ValueError(inverted_message(jmin))
    return res
