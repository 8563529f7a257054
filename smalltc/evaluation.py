"""The basis application: fields evaluated at the quadrature points, and its transpose.

CEED's ``EVAL_INTERP`` and ``EVAL_GRAD`` and their transposes, the two sides of every
operator (docs/math.md section 7) on their own: :func:`interpolate` takes a field (a
global vector through the element-to-DoF map, or element vectors) to its values and/or
reference gradients at the tensor-product points, :func:`integrate` takes values at the
points back to the basis (``sum_k B[k, i] H[k]``, with ``G`` for the gradient slots),
summed into a global vector through the map. FEM codes build everything that is not the
operator from these: geometry (``x`` and ``J`` from the mesh nodes), load vectors, errors,
output sampling.

Both run their entry of :mod:`smalltc.ops` through :func:`smalltc.plan.call` (the plan
cache, other libraries' arrays, ``out``, ``stream``), like the operators of
:mod:`smalltc.api`.
"""
from __future__ import annotations

from .ops import INTEGRATE, INTERPOLATE
from .plan import call

__all__ = ["interpolate", "integrate"]


def interpolate(B1d, G1d, x, elem_dofs=None, *, what="values", dim=None, out=None,
                backend="auto", stream=None):
    """Evaluate a field at the tensor-product quadrature points of every element.

    ``H[e, c, s, k1, ..., kd]`` is, for slot ``s`` of ``what``, the value
    ``sum_j B[k1, j1] ... B[kd, jd] V[e, c, j]`` or the reference derivative along axis
    ``a`` (``G1d`` in place of ``B1d`` on that axis) of component ``c`` of element ``e``,
    ``V[e, c, j] = x[c, elem_dofs[e, j]]`` gathered through the map (fused, every index
    checked) or given as element vectors. Sum-factorised: ``O(nq nd^dim)`` a point
    instead of ``nd^dim``.

    Parameters
    ----------
    B1d : array, shape (nq, nd)
        The 1D basis at the points, ``B1d[k, j] = phi_j(x_k)``.
    G1d : array, shape (nq, nd), or None
        Its derivative on [-1, 1]; needed exactly when ``what`` asks for gradients.
    x : array
        With ``elem_dofs``: the global vector, ``(ndofs,)`` or ``(ncomp, ndofs)``.
        Without: element vectors ``(E, nd, ..., nd)`` or ``(E, ncomp, nd, ..., nd)``
        (the component axis needs ``dim``).
    elem_dofs : int32 or int64 array, shape (E, nd, ..., nd), optional
        The element-to-DoF map; its rank sets the dimension.
    what : {"values", "gradients", "both"}
        The values (no slot axis), the ``dim`` reference derivatives ``d/dxi_a`` (a slot
        axis of ``dim``), or both (``1 + dim`` slots, the value first).
    dim : int, optional
        The dimension, where the map does not give it and element vectors have a
        component axis.
    out : array, optional
        The result buffer (overwritten).
    backend, stream : as for :func:`smalltc.batched_contract`.

    Returns
    -------
    H : array, shape (E, [ncomp,] [nslots,] nq, ..., nq)
        ``ncomp`` only where ``x`` has a component axis, ``nslots`` unless
        ``what="values"``.

    Raises
    ------
    ValueError
        Shapes that do not fit together (naming the operand, its shape and the expected
        one), an unknown ``what``, ``G1d`` missing or not wanted, a map index outside
        ``x`` (every call checks).
    TypeError
        Mixed dtypes or array libraries, a map that is not int32/int64.

    Examples
    --------
    The coordinate ``x`` of two linear elements on [0, 1], and its derivative on
    [-1, 1] (the Jacobian ``dx/dxi = 1/4``), at the midpoints:

    >>> import numpy as np, smalltc
    >>> B = np.array([[0.5, 0.5]]); G = np.array([[-0.5, 0.5]])
    >>> m = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> H = smalltc.interpolate(B, G, np.array([0.0, 0.5, 1.0]), m, what="both")
    >>> H.shape
    (2, 2, 1)
    >>> print(H[:, :, 0])
    [[0.25 0.25]
     [0.75 0.25]]
    """
    return call(INTERPOLATE, (B1d, G1d, x, elem_dofs), (what, dim), out, stream, backend)


def integrate(B1d, G1d, H, elem_dofs=None, *, what="values", ndofs=None, dim=None, out=None,
              backend="auto", stream=None):
    """Integrate values at the quadrature points against the basis: the transpose of
    :func:`interpolate`.

    ``U[e, c, i] = sum_s sum_k E_s[k, i] H[e, c, s, k]`` with ``E_s`` the tensor product
    of ``B1d`` (the value slot) or of ``G1d`` on axis ``a`` and ``B1d`` on the others
    (the derivative slot ``a``); with ``elem_dofs``, ``y[c, elem_dofs[e, i]]`` sums
    ``U[e, c, i]`` over the elements (float64 sums in the reference path, atomics on a
    GPU). With quadrature weights and ``|J|`` folded into ``H`` this is ``int f phi``
    (``what="values"``) or ``int g . grad phi`` (``"gradients"``, ``g`` in reference
    coordinates).

    Parameters
    ----------
    B1d, G1d : arrays, shape (nq, nd)
        As for :func:`interpolate`.
    H : array, shape (E, [ncomp,] [nslots,] nq, ..., nq)
        The point values, laid out as :func:`interpolate` returns them.
    elem_dofs : int32 or int64 array, shape (E, nd, ..., nd), optional
        The element-to-DoF map: the results are summed into a global vector.
    what : {"values", "gradients", "both"}
        The slots of ``H``.
    ndofs : int, optional
        With ``elem_dofs``: the global vector's length (or given by ``out``).
    dim : int, optional
        As for :func:`interpolate` (needed without a map when ``H`` has a component axis).
    out : array, optional
        The result, overwritten (not added to).
    backend, stream : as for :func:`smalltc.batched_contract`.

    Returns
    -------
    y : array, shape (ndofs,) or (ncomp, ndofs) with ``elem_dofs``, else the element
        vectors (E, [ncomp,] nd, ..., nd)

    Raises
    ------
    ValueError, TypeError
        As :func:`interpolate`; ``ndofs`` missing with ``elem_dofs``.

    Examples
    --------
    ``int phi_i`` on two linear elements of length 1/2 (one midpoint rule a
    element, weight 2, ``|J| = 1/4``):

    >>> import numpy as np, smalltc
    >>> B = np.array([[0.5, 0.5]])
    >>> m = np.array([[0, 1], [1, 2]], dtype=np.int32)
    >>> print(smalltc.integrate(B, None, np.full((2, 1), 0.5), m, ndofs=3))
    [0.25 0.5  0.25]
    """
    if elem_dofs is not None and ndofs is None and out is not None:
        ndofs = getattr(out, "shape", (None,))[-1]           # y's length from out
    return call(INTEGRATE, (B1d, G1d, H, elem_dofs), (what, ndofs, dim), out, stream, backend)
