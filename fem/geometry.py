"""Element maps at quadrature points: coordinates, Jacobians, and the mass data D.

For any mesh with per-element geometry nodes ``X_e`` of order ``g`` in tensor
order (the mesh protocol: ``dim``, ``nelements``, ``geom_order``,
``geom_nodes``, ``nodes``; :class:`~smalltc.fem.mesh.BoxMesh` and
:class:`~smalltc.fem.unstructured.UnstructuredMesh` both satisfy it) and the
order-``g`` Lagrange basis ``Bg``/``Gg`` on its ``geom_nodes`` at the
tensor-product points ``q``:

* ``x_e(q) = (Bg (x) Bg (x) Bg) X_e``,
* ``J_e[a, b](q) = d x_a / d xi_b``, the derivative along reference axis
  ``b`` replacing ``Bg`` by ``Gg`` on that axis,
* ``D_e(q) = w(q) * rho(x_e(q)) * det J_e(q)`` with ``w`` the tensor
  product of the 1D weights: the ``D`` of docs/math.md section 1 for the mass
  operator.
* ``Q_e^{ab}(q) = w(q) * kappa(x_e(q)) * det J_e(q) * (J_e^{-1} J_e^{-T})_{ab}``,
  packed as the upper triangle row by row on axis 1: the ``Q`` of the
  diffusion operator (docs/math.md section 7).

User functions (``rho`` here, ``f`` in projections) are called as
``f(x)`` with ``x`` of shape ``(dim, E, nq, ..., nq)``, so ``x[0]`` is the
first coordinate, and return an array broadcastable to ``(E, nq, ..., nq)``.
"""

from numbers import Real
from typing import NamedTuple

import numpy as np

from smalltc._arrays import array_module

from ._device import resolve_device, to_host
from .basis import lagrange_basis
from .quadrature import quadrature_rule
from .tensor import apply_tensor, interp

__all__ = [
    "QuadratureData",
    "map_points",
    "jacobian",
    "det_jacobian",
    "check_jacobian",
    "quadrature_data",
    "evaluate_field",
    "mass_data",
    "diffusion_data",
]


def _as_points(points):
    t = np.asarray(points, dtype=np.float64)
    if t.ndim != 1 or t.size < 1:
        raise ValueError(f"points must be a non-empty 1D array of reference coordinates, got shape {t.shape}")
    return t


def map_points(mesh, points):
    """Physical coordinates of the tensor-product reference points in every element.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    points : array_like, shape (nq,)
        1D reference points on [-1, 1].

    Returns
    -------
    ndarray, shape (E, dim, nq, ..., nq)

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> print(map_points(box_mesh(1, 2), [0.0])[:, 0])
    [[0.25]
     [0.75]]
    """
    Bg, _ = lagrange_basis(mesh.geom_nodes, _as_points(points))
    return interp(Bg, mesh.nodes, mesh.dim)


def jacobian(mesh, points):
    """Jacobian of every element map at the tensor-product reference points.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    points : array_like, shape (nq,)

    Returns
    -------
    ndarray, shape (E, dim, dim, nq, ..., nq)
        ``J[e, a, b] = d x_a / d xi_b``.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> J = jacobian(box_mesh(2, (2, 4)), [0.0])
    >>> print(J[0, :, :, 0, 0])
    [[0.25  0.   ]
     [0.    0.125]]
    """
    Bg, Gg = lagrange_basis(mesh.geom_nodes, _as_points(points))
    dim = mesh.dim
    cols = [apply_tensor([Gg if a == b else Bg for a in range(dim)], mesh.nodes) for b in range(dim)]
    return np.stack(cols, axis=2)


def det_jacobian(J):
    """Determinant of Jacobians laid out as ``(E, dim, dim, ...)``.

    Parameters
    ----------
    J : ndarray, shape (E, dim, dim, ...) with dim in 1, 2, 3

    Returns
    -------
    ndarray, shape (E, ...)

    Raises
    ------
    ValueError
        If axes 1 and 2 are not an equal size of 1, 2 or 3.

    Examples
    --------
    >>> J = np.array([[[2.0, 1.0], [0.0, 3.0]]])
    >>> print(det_jacobian(J))
    [6.]
    """
    J = array_module(J).asarray(J)
    if J.ndim < 3 or J.shape[1] != J.shape[2] or J.shape[1] not in (1, 2, 3):
        raise ValueError(f"J has shape {J.shape}, expected (E, dim, dim, ...) with dim in 1, 2, 3")
    dim = J.shape[1]
    if dim == 1:
        return J[:, 0, 0].copy()
    if dim == 2:
        return J[:, 0, 0] * J[:, 1, 1] - J[:, 0, 1] * J[:, 1, 0]
    return (
        J[:, 0, 0] * (J[:, 1, 1] * J[:, 2, 2] - J[:, 1, 2] * J[:, 2, 1])
        - J[:, 0, 1] * (J[:, 1, 0] * J[:, 2, 2] - J[:, 1, 2] * J[:, 2, 0])
        + J[:, 0, 2] * (J[:, 1, 0] * J[:, 2, 1] - J[:, 1, 1] * J[:, 2, 0])
    )


def check_jacobian(detJ, mesh_shape=None):
    """Raise if any Jacobian determinant is not positive (a tangled mesh).

    Parameters
    ----------
    detJ : ndarray, shape (E, ...)
    mesh_shape : tuple of int, optional
        Elements per direction; when given, the message also names the
        element's multi-index.

    Raises
    ------
    ValueError
        Naming the first bad element, its smallest ``|J|``, and how many
        elements are bad.

    Examples
    --------
    >>> check_jacobian(np.array([[1.0, 0.5], [0.2, -0.1]]), mesh_shape=(2, 1))
    Traceback (most recent call last):
    ...
    ValueError: tangled mesh: |J| <= 0 at 1 quadrature point(s) of element 1 (multi-index (1, 0)) (min |J| = -0.1); 1 bad element(s) in all
    """
    detJ = np.asarray(detJ)
    flat = detJ.reshape(detJ.shape[0], -1)
    bad = ~(flat > 0)  # also catches NaN
    if bad.any():
        elems = np.flatnonzero(bad.any(axis=1))
        e = int(elems[0])
        where = f"element {e}"
        if mesh_shape is not None:
            where += f" (multi-index {tuple(int(i) for i in np.unravel_index(e, mesh_shape))})"
        raise ValueError(
            f"tangled mesh: |J| <= 0 at {int(bad[e].sum())} quadrature point(s) of {where} "
            f"(min |J| = {np.min(flat[e]):.3g}); {elems.size} bad element(s) in all"
        )


class QuadratureData(NamedTuple):
    """Geometry of a mesh at a tensor-product quadrature rule."""

    #: ``(nq,)`` 1D reference points on [-1, 1].
    points: np.ndarray
    #: ``(nq,)`` 1D weights.
    weights: np.ndarray
    #: ``(dim, E, nq, ..., nq)`` physical coordinates (coordinate axis first).
    x: np.ndarray
    #: ``(E, nq, ..., nq)`` Jacobian determinants, all positive.
    detJ: np.ndarray
    #: ``(E, nq, ..., nq)`` tensor weights times ``detJ``.
    wdetJ: np.ndarray


def quadrature_data(mesh, nq, *, quadrature="gauss"):
    """Coordinates, ``|J|`` and ``w |J|`` of a mesh at an ``nq``-point rule per direction.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    nq : int
        Points per direction.
    quadrature : str
        Rule name for :func:`smalltc.fem.quadrature.quadrature_rule`.

    Returns
    -------
    QuadratureData

    Raises
    ------
    ValueError
        If the mesh is tangled (some ``|J| <= 0``), or for a bad rule.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> qd = quadrature_data(box_mesh(3, 2, distortion=0.05), 3)
    >>> qd.x.shape, qd.wdetJ.shape
    ((3, 8, 3, 3, 3), (8, 3, 3, 3))
    >>> print(round(float(qd.wdetJ.sum()), 12))   # the volume of the unit cube
    1.0
    """
    points, weights = quadrature_rule(nq, quadrature)
    x = np.moveaxis(map_points(mesh, points), 1, 0)
    detJ = det_jacobian(jacobian(mesh, points))
    check_jacobian(detJ, getattr(mesh, "shape", None))
    w = weights
    for _ in range(mesh.dim - 1):
        w = np.multiply.outer(w, weights)
    return QuadratureData(points, weights, x, detJ, w[None] * detJ)


def evaluate_field(func, x, name="f"):
    """Call a user function at quadrature points and check what it returns.

    Parameters
    ----------
    func : callable or number
        ``func(x) -> array`` broadcastable to ``x.shape[1:]``; a number is
        a constant.
    x : ndarray, shape (dim, E, nq, ..., nq)
    name : str
        The argument's name, for error messages.

    Returns
    -------
    ndarray of float64, shape ``x.shape[1:]``

    Raises
    ------
    ValueError
        If the result has the wrong shape or non-finite values, or the
        call fails.
    TypeError
        If ``func`` is neither callable nor a number.

    Examples
    --------
    >>> x = np.zeros((2, 1, 2, 2))
    >>> evaluate_field(lambda x: x[0] + 1.0, x).shape
    (1, 2, 2)
    """
    target = x.shape[1:]
    if callable(func):
        try:
            val = np.asarray(func(x), dtype=np.float64)
        except Exception as err:
            raise ValueError(f"{name}(x) failed for x of shape {x.shape} (coordinate axis first)") from err
    elif isinstance(func, Real) and not isinstance(func, bool):
        val = np.asarray(func, dtype=np.float64)
    else:
        raise TypeError(f"{name} must be callable or a real number, got {type(func).__name__}")
    try:
        val = np.broadcast_to(val, target)
    except ValueError as err:
        raise ValueError(
            f"{name}(x) returned shape {val.shape}, expected {target} for x of shape {x.shape}"
        ) from err
    if not np.all(np.isfinite(val)):
        raise ValueError(f"{name}(x) returned non-finite values")
    return val


def _jacobian_chunks(xp, mesh, nq, quadrature, chunk=1 << 18):
    """``(lo, J, detJ, w)`` for ``chunk`` elements at a time, computed on module ``xp`` (on
    the GPU: cuBLAS GEMMs, only the element nodes copied there): ``J`` of the elements
    ``lo:lo + len(J)`` (:func:`jacobian`'s layout), ``w`` the tensor weights. A tangled
    element raises :func:`check_jacobian`'s error (its message made on the host)."""
    points, weights = quadrature_rule(nq, quadrature)
    Bg, Gg = (xp.asarray(a) for a in lagrange_basis(mesh.geom_nodes, _as_points(points)))
    dim = mesh.dim
    w = weights
    for _ in range(dim - 1):
        w = np.multiply.outer(w, weights)
    w = xp.asarray(w)
    for lo in range(0, mesh.nelements, chunk):
        nodes = xp.asarray(mesh.nodes[lo:lo + chunk])
        cols = [apply_tensor([Gg if a == b else Bg for a in range(dim)], nodes)
                for b in range(dim)]
        J = xp.stack(cols, axis=2)
        detJ = det_jacobian(J)
        if not bool((detJ > 0).all()):                 # the message is made on the host
            bad = to_host(detJ)
            bad = np.concatenate([np.ones((lo,) + bad.shape[1:]), bad])
            check_jacobian(bad, getattr(mesh, "shape", None))
        yield lo, J, detJ, w


def _wdetj_on(xp, mesh, nq, quadrature):
    """``w |J|`` computed on module ``xp`` (:func:`_jacobian_chunks`)."""
    out = xp.empty((mesh.nelements,) + (nq,) * mesh.dim)
    for lo, J, detJ, w in _jacobian_chunks(xp, mesh, nq, quadrature):
        out[lo:lo + len(J)] = w[None] * detJ
    return out


def _packed_q(J, detJ, scale, out):
    """``out[:, c] = scale / |J| (adj J adj J^T)_{ab}`` (``= scale |J| (J^-1 J^-T)_{ab}``)
    for the upper triangle ``(a, b)``, row by row; any array module."""
    dim = J.shape[1]
    adj = _adjugate(J)                                   # adj[a, i] = |J| (J^-1)[a, i]
    s = scale / detJ
    c = 0
    for a in range(dim):
        for b in range(a, dim):
            out[:, c] = sum(adj[:, a, i] * adj[:, b, i] for i in range(dim)) * s
            c += 1
    return out


def mass_data(mesh, nq, rho=None, *, quadrature="gauss", dtype=np.float64, device="cpu"):
    """Quadrature data ``D = w * rho(x) * |J|`` of the mass operator.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    nq : int
        Quadrature points per direction.
    rho : callable or float, optional
        Density ``rho(x)`` (see the module docstring for the calling
        convention); 1 when omitted.
    quadrature : str
        Rule name, ``"gauss"`` by default.
    dtype : numpy dtype
        float64 (default) or float32; computed in float64, then cast.
    device : {"cpu", "gpu", "auto"}
        Where ``D`` is computed and returned (NumPy or CuPy). With a constant
        ``rho`` (or none) only ``|J|`` is computed, element chunk by chunk,
        there (no coordinates: a 2^18-element 3D mesh in seconds); a callable
        ``rho`` needs the coordinates, computed on the host (the result is
        copied).

    Returns
    -------
    ndarray, shape (E, nq, ..., nq)
        The ``D`` of docs/math.md section 1, in the array module of ``device``.

    Raises
    ------
    ValueError
        If the mesh is tangled (naming the element), ``rho`` is bad, or
        ``dtype`` is not float32/float64.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> D = mass_data(box_mesh(2, 2, distortion=0.1), 4, rho=2.0, dtype=np.float32)
    >>> D.shape, D.dtype
    ((4, 4, 4), dtype('float32'))
    >>> print(round(float(D.sum()), 5))   # rho times the area
    2.0
    """
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dt}")
    xp = resolve_device(device)
    if not callable(rho):
        scale = 1.0 if rho is None else float(evaluate_field(rho, np.zeros((mesh.dim, 1)), "rho")
                                              .ravel()[0])
        return xp.ascontiguousarray(_wdetj_on(xp, mesh, nq, quadrature) * scale, dtype=dt)
    qd = quadrature_data(mesh, nq, quadrature=quadrature)
    D = qd.wdetJ if rho is None else qd.wdetJ * evaluate_field(rho, qd.x, "rho")
    return xp.asarray(np.ascontiguousarray(D, dtype=dt))


def diffusion_data(mesh, nq, kappa=None, *, quadrature="gauss", dtype=np.float64,
                   device="cpu"):
    """Quadrature data ``Q`` of the diffusion operator, packed.

    ``Q^{ab} = w * kappa(x) * |J| * (J^{-1} J^{-T})_{ab}`` at every tensor-product
    point (``J[a, b] = d x_a / d xi_b``, :func:`jacobian`), so that ``u^T K u`` is
    ``int kappa |grad u|^2`` (docs/math.md section 7). The symmetric ``dim x dim``
    matrix is stored as its upper triangle, row by row (3D: 11, 12, 13, 22, 23, 33;
    2D: 11, 12, 22; 1D: 11), on axis 1.

    Parameters
    ----------
    mesh : BoxMesh
    nq : int
        Quadrature points per direction.
    kappa : callable or float, optional
        Diffusion coefficient ``kappa(x)``, ``x`` of shape ``(dim, E, nq, ..., nq)``
        (as ``rho`` of :func:`mass_data`); 1 when omitted.
    quadrature : str
        Rule name, ``"gauss"`` by default; ``"gll"`` with ``nq = p + 1`` is the
        collocated form (BP5).
    dtype : numpy dtype
        float64 (default) or float32; computed in float64, then cast.
    device : {"cpu", "gpu", "auto"}
        Where ``Q`` is returned and, for a constant ``kappa``, computed (on a GPU only
        the element nodes are copied; a callable ``kappa`` is evaluated on the host).

    Returns
    -------
    ndarray, shape (E, dim (dim + 1) / 2, nq, ..., nq)

    Raises
    ------
    ValueError
        If the mesh is tangled (naming the element), ``kappa`` is bad, or ``dtype``
        is not float32/float64.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> Q = diffusion_data(box_mesh(2, 2), 3)          # squares of side 1/2: J = I / 4
    >>> Q.shape
    (4, 3, 3, 3)
    >>> print(np.round(Q[0, :, 1, 1], 6))              # w = (8/9)^2, |J| = 1/16, J^-2 = 16
    [0.790123 0.       0.790123]
    """
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dt}")
    xp = resolve_device(device)
    dim = mesh.dim
    nsym = dim * (dim + 1) // 2
    if not callable(kappa):           # computed where Q is returned, a chunk at a time
        k = 1.0 if kappa is None else float(evaluate_field(kappa, np.zeros((dim, 1)), "kappa")
                                            .ravel()[0])
        Q = xp.empty((mesh.nelements, nsym) + (nq,) * dim, dtype=dt)
        for lo, J, detJ, w in _jacobian_chunks(xp, mesh, nq, quadrature):
            part = _packed_q(J, detJ, w[None] * k, xp.empty((len(J), nsym) + J.shape[3:]))
            Q[lo:lo + len(J)] = part
        return Q
    points, weights = quadrature_rule(nq, quadrature)
    J = jacobian(mesh, points)                           # (E, dim, dim, nq, ...)
    detJ = det_jacobian(J)
    check_jacobian(detJ, getattr(mesh, "shape", None))
    w = weights
    for _ in range(dim - 1):
        w = np.multiply.outer(w, weights)
    scale = w[None] * evaluate_field(kappa, np.moveaxis(map_points(mesh, points), 1, 0),
                                     "kappa")
    Q = _packed_q(J, detJ, scale, np.empty((J.shape[0], nsym) + J.shape[3:]))
    return xp.asarray(np.ascontiguousarray(Q, dtype=dt))


def _adjugate(J):
    """``adj(J)`` of Jacobians laid out as ``(E, dim, dim, ...)``: ``J adj(J) = |J| I``."""
    xp = array_module(J)
    dim = J.shape[1]
    if dim == 1:
        return xp.ones_like(J)
    adj = xp.empty_like(J)
    if dim == 2:
        adj[:, 0, 0], adj[:, 1, 1] = J[:, 1, 1], J[:, 0, 0]
        adj[:, 0, 1], adj[:, 1, 0] = -J[:, 0, 1], -J[:, 1, 0]
        return adj
    for a in range(3):
        for i in range(3):
            r = [k for k in range(3) if k != i]      # the cofactor of J[i, a]
            s = [k for k in range(3) if k != a]
            adj[:, a, i] = ((-1) ** (a + i)) * (J[:, r[0], s[0]] * J[:, r[1], s[1]]
                                                - J[:, r[0], s[1]] * J[:, r[1], s[0]])
    return adj
