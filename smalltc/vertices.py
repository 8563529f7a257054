"""The vertex geometry: point data recomputed from an element's vertices (docs/math.md
section 8).

A trilinear (3D), bilinear (2D) or linear (1D) element is described by its ``2^dim``
vertices ``X[e, v, i]`` (``v`` in tensor order, the last axis fastest: ``v = (v_1, ...,
v_dim)`` with ``v_a`` 0 at ``xi_a = -1`` and 1 at ``xi_a = +1``; ``i`` the coordinate) and
one coefficient ``coef[e]`` (rho for mass, kappa for diffusion). At each quadrature point
``J_{ia} = sum_v X[v, i] dN_v / dxi_a`` with ``N_v`` the tensor products of
``(1 - xi) / 2`` and ``(1 + xi) / 2``, and

- mass: ``D = w coef |det J|``,
- diffusion: ``Q = w coef |det J| J^-1 J^-T`` (packed upper triangle, as stored Q).

The quadrature is the one the operators' ``B1d`` and ``G1d`` are evaluated at: Gauss-Legendre
with ``nq`` points, Gauss-Lobatto on the nodes when collocated (``fem.basis_1d(p, nq)`` and
``fem.basis_1d(p, p + 1, "gll")``). The kernels hold these 1D values and weights as constants.
:func:`point_data` is the unfused form (``J`` by :func:`smalltc.interpolate` of the vertices,
then :func:`smalltc.geometry_data`): the reference backend's path and the tests' oracle.

>>> import numpy as np
>>> X = np.array([[[0., 0.], [0., 2.], [1., 0.], [1., 2.]]])   # [0, 1] x [0, 2]
>>> D = point_data("mass", X, np.ones(1), 3)
>>> round(float(D.sum()), 12)                                   # the area
2.0
"""
from __future__ import annotations

import functools

import numpy as np

from ._arrays import array_module
from .quadrature import rule_1d

__all__ = ["rule_1d", "point_data", "vertices_of_mesh", "check_vertices"]


def _linear_basis(x, xp):
    """``N`` and ``dN`` (nq, 2) of the vertices on [-1, 1] at the points ``x``: ``(1 - x) /
    2``, ``(1 + x) / 2`` and their derivatives, on module ``xp``."""
    N = np.stack([(1 - x) / 2, (1 + x) / 2], axis=1)
    dN = np.tile([-0.5, 0.5], (len(x), 1))
    return xp.asarray(N), xp.asarray(dN)


def _vertex_field(X):
    """The vertices ``X`` (E, 2^dim, dim) as element vectors (E, dim, 2, ..., 2), float64."""
    E, _, dim = X.shape
    Xr = X.astype(np.float64).reshape((E,) + (2,) * dim + (dim,))
    return array_module(X).ascontiguousarray(array_module(X).moveaxis(Xr, -1, 1))


def point_data(qfunc, X, coef, nq, collocated=False):
    """D (mass) or Q (diffusion) at the quadrature points, from the vertices ``X`` (E,
    2^dim, dim) and the coefficient ``coef`` (E,), in ``X``'s dtype (computed in
    float64); NumPy or CuPy (``X``'s library). ``J`` is :func:`smalltc.interpolate` of the
    vertices in the linear basis, the point data :func:`smalltc.geometry_data` of it with
    ``|det J|`` (either orientation).

    >>> X = np.array([[[0., 0.], [0., .5], [.5, 0.], [.5, .5]]])   # a square of side 1/2
    >>> Q = point_data("diffusion", X, np.ones(1), 3)
    >>> print(np.round(Q[0, :, 1, 1], 6))       # as fem.diffusion_data(box_mesh(2, 2), 3)
    [0.790123 0.       0.790123]
    """
    xp = array_module(X)
    E, _, dim = X.shape
    x, w = rule_1d(nq, collocated)
    N, dN = _linear_basis(x, xp)
    from .evaluation import interpolate      # a cycle: the checks import check_vertices
    from .geometry import geometry_data  # the same cycle
    J = interpolate(N, dN, _vertex_field(X), what="gradients", dim=dim)   # (E, i, a, q..)
    W = functools.reduce(np.multiply.outer, [w] * dim)
    c = xp.ascontiguousarray(xp.broadcast_to(
        coef.astype(xp.float64).reshape((E,) + (1,) * dim), (E,) + (nq,) * dim))
    return geometry_data(J, W, what=qfunc, coef=c, dtype=X.dtype, absdet=True,
                         jmin=xp.empty(E))


def _lagrange_values(nodes, points):
    """``B[k, i]``: the Lagrange basis of ``nodes`` at ``points``, by the product formula
    (exact at the nodes).

    >>> _lagrange_values(np.array([-1.0, 0.0, 1.0]), np.array([-1.0, 0.5]))
    array([[ 1.   ,  0.   , -0.   ],
           [-0.125,  0.75 ,  0.375]])
    """
    n = len(nodes)
    B = np.ones((len(points), n))
    for i in range(n):
        for j in range(n):
            if j != i:
                B[:, i] *= (points - nodes[j]) / (nodes[i] - nodes[j])
    return B


def check_vertices(X, coef, E=None, dim_hint=None):
    """Check the vertex operands: ``X`` (E, 2^dim, dim) with dim 1..3 and ``coef`` (E,);
    return dim. Errors name the operand, its shape and what was expected."""
    if X.ndim != 3 or X.shape[2] not in (1, 2, 3) or X.shape[1] != 2 ** X.shape[2]:
        raise ValueError(f"X (vertices) has shape {tuple(X.shape)}, expected (E, 2^dim, dim): "
                         "(E, 8, 3) in 3D, (E, 4, 2) in 2D, (E, 2, 1) in 1D, vertices in "
                         "tensor order")
    dim = X.shape[2]
    if dim_hint is not None and dim != dim_hint:
        raise ValueError(f"X (vertices) has shape {tuple(X.shape)}: dim {dim}, but the other "
                         f"operands are {dim_hint}D")
    if E is not None and X.shape[0] != E:
        raise ValueError(f"X (vertices) has shape {tuple(X.shape)}, expected E={E} elements "
                         "on axis 0")
    if tuple(coef.shape) != (X.shape[0],):
        raise ValueError(f"coef has shape {tuple(coef.shape)}, expected ({X.shape[0]},): one "
                         "coefficient an element (E from X; or pass a scalar)")
    return dim


def vertices_of_mesh(mesh, check_nq=None):
    """``X`` (E, 2^dim, dim) of a mesh whose elements are the multilinear images of their
    vertices (a box mesh; any mesh with order-1 geometry), in the tensor order of the
    mesh's element numbering. ``check_nq``: verify at that many Gauss points per axis that
    the mesh's own map is the multilinear one; a curved (higher-order) geometry raises
    ValueError.

    >>> from smalltc.fem import box_mesh
    >>> vertices_of_mesh(box_mesh(2, 2), check_nq=3)[0]
    array([[0. , 0. ],
           [0. , 0.5],
           [0.5, 0. ],
           [0.5, 0.5]])
    """
    from .evaluation import interpolate      # a cycle: the checks import check_vertices
    nodes, geo = np.asarray(mesh.geom_nodes, dtype=np.float64), np.asarray(mesh.nodes)
    dim = mesh.dim

    def map_points(points):                                         # (E, dim, nq, ...)
        return interpolate(_lagrange_values(nodes, points), None, geo, dim=dim)
    P = map_points(np.array([-1.0, 1.0]))                          # (E, dim, 2, ...)
    E, dim = P.shape[0], P.shape[1]
    X = np.ascontiguousarray(np.moveaxis(P.reshape(E, dim, 2 ** dim), 1, 2))
    if check_nq:
        x, _ = rule_1d(check_nq)
        own = map_points(x)                                         # (E, dim, nq, ...)
        N = np.stack([(1 - x) / 2, (1 + x) / 2], axis=1)
        ks, vs = "klm"[:dim], "uvw"[:dim]
        expr = ",".join(f"{k}{v}" for k, v in zip(ks, vs)) + f",e{vs}i->ei{ks}"
        lin = np.einsum(expr, *[N] * dim, X.reshape((E,) + (2,) * dim + (dim,)), optimize=True)
        err = np.abs(lin - own).max() / max(np.abs(own).max(), 1e-300)
        if err > 1e-12:
            raise ValueError(f"the mesh's geometry is not the multilinear map of its vertices "
                             f"(relative difference {err:.2e} at the quadrature points): the "
                             "vertex geometry needs order-1 (straight-sided, trilinear or "
                             "bilinear) elements; use the stored point data for curved ones")
    return X

