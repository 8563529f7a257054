"""Element maps at quadrature points: coordinates, Jacobians, and the operators' point data.

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

``x`` and ``J`` come from :func:`smalltc.interpolate` on the element nodes (the values,
and the gradients: the columns of ``J``); ``|J|``, the adjugate ``adj J = |J| J^{-1}``
(closed-form cofactors, so no matrix is ever inverted), ``D`` and ``Q`` from one pass of
:func:`smalltc.geometry_data` over ``J``, which also reports each element's smallest
``|J|`` (a tangled element). Everything runs element chunk by chunk on
the array module of the requested device (NumPy, or CuPy: only the chunk's nodes are
copied to the GPU, the results stay there), chunks sized to a few times the caller's
vector (and to the caches on the CPU, to the free memory on a GPU).

User functions (``rho`` here, ``f`` in projections) are called as
``f(x)`` with ``x`` of shape ``(dim, E, nq, ..., nq)`` (``E`` the elements of one
chunk), so ``x[0]`` is the first coordinate, and return an array broadcastable to
``(E, nq, ..., nq)``. On a GPU ``x`` is a CuPy array (NumPy's ufuncs such as
``np.sin`` take it; CuPy's first such call imports ``cupyx.scipy``, about 0.4 s once a
process, which ``xp = cupy.get_array_module(x); xp.sin(...)`` avoids); a function that
raises on it is called on host copies instead, and that is logged once.
"""

import logging
from numbers import Real
from typing import NamedTuple

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import resolve_device, to_device, to_host
from .basis import lagrange_basis
from .quadrature import quadrature_rule

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

log = logging.getLogger("smalltc")

#: bytes a chunk's working set may take on the CPU (about the caches of one core's share)
CPU_CHUNK_BYTES = 1 << 22
#: fewest elements a chunk holds (the calls' fixed costs)
MIN_CHUNK_ELEMENTS = 64
#: solution vectors a GPU chunk's working set (at least GPU_MIN_CHUNK_BYTES, at most a
#: quarter of the free memory) and a load vector's block of point values may hold
SOLUTION_MULTIPLE = 4
#: the least working set of a GPU chunk (the launches' and copies' fixed costs a chunk:
#: on an H100 at ~2M DoFs, 1 GiB against 256 MiB took a Poisson solve's error pass from
#: 0.21 to 0.07 s at p = 2 and the whole call 1.2-1.8x faster at p = 2, 4, 7, for
#: ~0.6 GiB more of the memory pool; 4 GiB gained 0-15% more for 2-3 GiB more)
GPU_MIN_CHUNK_BYTES = 1 << 30


def _as_points(points):
    t = np.asarray(points, dtype=np.float64)
    if t.ndim != 1 or t.size < 1:
        raise ValueError(f"points must be a non-empty 1D array of reference coordinates, got shape {t.shape}")
    return t


def _tensor_weights(weights, dim):
    """``w[k1, ..., kd] = weights[k1] ... weights[kd]`` (``()``-shaped 1 for ``dim = 0``)."""
    if dim == 0:
        return np.ones(())
    w = np.asarray(weights, dtype=np.float64)
    for _ in range(dim - 1):
        w = np.multiply.outer(w, weights)
    return w


def _job(mesh, nq):
    """A pass over ``mesh`` at ``nq`` points a direction as one evaluation job: NumPy's
    reference path in every chunk where the mesh is small, the kernels where it is large
    (:func:`smalltc.evaluation_job`), whatever the chunks' sizes."""
    return smalltc.evaluation_job(mesh.nelements * nq ** mesh.dim)


def _chunk_elements(xp, nelements, floats_per_element, solution=None):
    """Elements a chunk holds: its working set (``floats_per_element`` float64 an element)
    within the CPU's caches, or on a GPU within :data:`SOLUTION_MULTIPLE` times the
    ``solution`` vector's length (floats; at least :data:`GPU_MIN_CHUNK_BYTES`) and a
    quarter of the free device memory."""
    per = 8 * max(1, int(floats_per_element))
    if xp is np:
        budget = CPU_CHUNK_BYTES
    else:
        free = int(xp.cuda.Device().mem_info[0])
        want = max(SOLUTION_MULTIPLE * 8 * int(solution or 0), GPU_MIN_CHUNK_BYTES)
        budget = min(want, free // 4)
    return int(max(1, min(nelements, max(MIN_CHUNK_ELEMENTS, budget // per))))


def _map_basis(mesh, points, xp=np):
    """``(Bg, Gg)`` of the mesh's geometry at ``points``, in module ``xp``."""
    Bg, Gg = lagrange_basis(mesh.geom_nodes, _as_points(points))
    return xp.asarray(Bg), xp.asarray(Gg)


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
    Bg, _ = _map_basis(mesh, points)
    dim, E = mesh.dim, mesh.nelements
    out = np.empty((E, dim) + (Bg.shape[0],) * dim)
    step = _chunk_elements(np, E, 3 * dim * Bg.shape[0] ** dim)
    with _job(mesh, Bg.shape[0]):
        for lo in range(0, E, step):
            smalltc.interpolate(Bg, None, mesh.nodes[lo:lo + step], dim=dim,
                                out=out[lo:lo + step])
    return out


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
    Bg, Gg = _map_basis(mesh, points)
    dim, E = mesh.dim, mesh.nelements
    out = np.empty((E, dim, dim) + (Bg.shape[0],) * dim)
    step = _chunk_elements(np, E, 3 * dim * dim * Bg.shape[0] ** dim)
    with _job(mesh, Bg.shape[0]):
        for lo in range(0, E, step):
            smalltc.interpolate(Bg, Gg, mesh.nodes[lo:lo + step], what="gradients", dim=dim,
                                out=out[lo:lo + step])
    return out


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
    return _det(J)


def _tangled_message(e, npoints, smallest, nbad, mesh_shape=None):
    where = f"element {e}"
    if mesh_shape is not None:
        where += f" (multi-index {tuple(int(i) for i in np.unravel_index(e, mesh_shape))})"
    return (f"tangled mesh: |J| <= 0 at {npoints} quadrature point(s) of {where} "
            f"(min |J| = {smallest:.3g}); {nbad} bad element(s) in all")


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
    detJ = to_host(detJ)
    flat = detJ.reshape(detJ.shape[0], -1)
    bad = ~(flat > 0)  # also catches NaN
    if bad.any():
        elems = np.flatnonzero(bad.any(axis=1))
        e = int(elems[0])
        raise ValueError(_tangled_message(e, int(bad[e].sum()), np.min(flat[e]), elems.size,
                                          mesh_shape))


# --- the pointwise step: |J| and adj(J) in closed form -------------------------------------

def _det(J, adj=None):
    """``|J|`` of ``J`` (n, dim, dim, q...) (any strides); with ``adj`` (its adjugate,
    :func:`_adjugate`) by the first row's cofactors, which it holds."""
    xp = array_module(J)
    dim = J.shape[1]
    if dim == 1:
        return J[:, 0, 0].copy()
    if dim == 2:
        det = xp.multiply(J[:, 0, 0], J[:, 1, 1])
        det -= J[:, 0, 1] * J[:, 1, 0]
        return det
    if adj is None:
        adj = xp.empty((3, 1) + J.shape[:1] + J.shape[3:])
        _cofactors(J, adj, cols=(0,))
    det = xp.multiply(J[:, 0, 0], adj[0, 0])
    tmp = xp.multiply(J[:, 0, 1], adj[1, 0])
    det += tmp
    xp.multiply(J[:, 0, 2], adj[2, 0], out=tmp)
    det += tmp
    return det


def _cofactors(J, adj, cols=(0, 1, 2)):
    """``adj[a, i] = (-1)^(a+i) M_{ia}`` (the cofactor of ``J[i, a]``) for ``i`` in
    ``cols`` (``adj[:, j]`` for the ``j``-th of them), 3D; one temporary."""
    xp = array_module(J)
    tmp = xp.empty(adj.shape[2:])
    for j, i in enumerate(cols):
        r = [k for k in range(3) if k != i]
        for a in range(3):
            s = [k for k in range(3) if k != a]
            t = adj[a, j]
            xp.multiply(J[:, r[0], s[0]], J[:, r[1], s[1]], out=t)
            xp.multiply(J[:, r[0], s[1]], J[:, r[1], s[0]], out=tmp)
            if (a + i) % 2:
                xp.subtract(tmp, t, out=t)                # 0, not -0, for a zero cofactor
            else:
                t -= tmp


def _adjugate(J):
    """``adj(J)`` of Jacobians ``(n, dim, dim, q...)`` as ``(dim, dim, n, q...)``:
    ``adj[a, i] = |J| (J^-1)[a, i]`` (``J adj(J) = |J| I``)."""
    xp = array_module(J)
    dim = J.shape[1]
    adj = xp.empty((dim, dim) + J.shape[:1] + J.shape[3:])
    if dim == 1:
        adj.fill(1.0)
    elif dim == 2:
        adj[0, 0], adj[1, 1] = J[:, 1, 1], J[:, 0, 0]
        xp.subtract(0.0, J[:, 0, 1], out=adj[0, 1])       # 0, not -0, for a zero entry
        xp.subtract(0.0, J[:, 1, 0], out=adj[1, 0])
    else:
        _cofactors(J, adj)
    return adj


def _apply_adjugate_t(adj, ref, i, out, tmp):
    """``out = sum_b adj[b, i] ref[:, b]``: component ``i`` of ``|J| J^-T g`` for the
    reference gradient ``ref`` (n, dim, q...); ``tmp`` a temporary of ``out``'s shape."""
    xp = array_module(adj)
    xp.multiply(adj[0, i], ref[:, 0], out=out)
    for b in range(1, adj.shape[0]):
        xp.multiply(adj[b, i], ref[:, b], out=tmp)
        out += tmp
    return out


# --- the geometry of a mesh, chunk by chunk -------------------------------------------------

def _floats_per_point(dim, coords, adjugate):
    """Float64 values a point of :func:`_geometry` holds at once (its interpolation with
    the reference path's temporaries, the adjugate and ``|J|``, two temporaries)."""
    slots = dim * (dim + (1 if coords else 0))
    return 3 * slots + (dim * dim if adjugate else 0) + 3


class _Jacobians(NamedTuple):
    """The element maps of the elements ``lo:hi`` at the points, on one array module."""

    lo: int
    hi: int
    #: ``(n, dim, ng, ..., ng)`` the elements' nodes (on the device)
    nodes: object
    #: ``(dim, n, q...)`` coordinates (a view), or None
    x: object
    #: ``(n, dim, dim, q...)`` ``J[e, a, b] = dx_a/dxi_b`` (C-contiguous)
    J: object


class _Maps:
    """The chunks of a mesh's element maps at the tensor-product ``points`` on module
    ``xp`` (iterate: :class:`_Jacobians`), and their pointwise geometry with the check of
    its report (:meth:`data`)."""

    def __init__(self, mesh, points, xp, *, coords=True, adjugate=False, extra=0,
                 solution=None):
        self.mesh, self.xp, self.coords = mesh, xp, coords
        self.Bg, self.Gg = _map_basis(mesh, points, xp)
        K = self.Bg.shape[0] ** mesh.dim
        self.step = _chunk_elements(xp, mesh.nelements,
                                    K * (_floats_per_point(mesh.dim, coords, adjugate)
                                         + extra), solution)

    def __iter__(self):
        """The chunks, one evaluation job (:func:`smalltc.evaluation_job`: the consumer's
        evaluations of a chunk, made while it holds it, count to the mesh's points)."""
        xp, dim, E = self.xp, self.mesh.dim, self.mesh.nelements
        placed = _placed_nodes(self.mesh, xp)
        with _job(self.mesh, self.Bg.shape[0]):
            for lo in range(0, E, self.step):
                hi = min(E, lo + self.step)
                nodes = (placed[lo:hi] if placed is not None
                         else to_device(self.mesh.nodes[lo:hi], xp))
                J = smalltc.interpolate(self.Bg, self.Gg, nodes, what="gradients", dim=dim)
                x = None
                if self.coords:
                    x = xp.moveaxis(smalltc.interpolate(self.Bg, None, nodes, dim=dim), 1, 0)
                yield _Jacobians(lo, hi, nodes, x, J)

    def data(self, g, what, weights=None, coef=None, out=None):
        """:func:`smalltc.geometry_data` of chunk ``g`` (into ``out``), then the check: a
        tangled element raises :func:`check_jacobian`'s error (the message made on the
        host, counting every bad element of the mesh)."""
        jmin = self.xp.empty(g.hi - g.lo)
        res = smalltc.geometry_data(g.J, weights, what=what, coef=coef, jmin=jmin, out=out)
        if not bool(jmin.min() > 0):                        # NaN too
            self._raise_tangled(g, jmin)
        return res

    def _raise_tangled(self, g, jmin):
        """:func:`check_jacobian`'s error for the first bad element of chunk ``g``, after
        counting the bad elements of the chunks after it."""
        mesh, xp = self.mesh, self.xp
        elems = np.flatnonzero(~(to_host(jmin) > 0))
        e = int(elems[0])
        nbad = elems.size
        d = _det(to_host(g.J[e:e + 1])).reshape(-1)
        for lo2 in range(g.hi, mesh.nelements, self.step):
            nodes = to_device(mesh.nodes[lo2:lo2 + self.step], xp)
            J = smalltc.interpolate(self.Bg, self.Gg, nodes, what="gradients", dim=mesh.dim)
            m = xp.empty(J.shape[0])
            smalltc.geometry_data(J, what="det", jmin=m)
            nbad += int((~(to_host(m) > 0)).sum())
        raise ValueError(_tangled_message(g.lo + e, int((~(d > 0)).sum()), np.min(d), nbad,
                                          getattr(mesh, "shape", None)))


def _placed_nodes(mesh, xp):
    """A box mesh's nodes placed on the device ``xp`` (no host array made, nothing
    copied) where the host has not placed them yet; else None (chunks are copied)."""
    if xp is np or getattr(mesh, "placement", None) is None or mesh.placed:
        return None
    return mesh.nodes_on(xp)


class _GeoChunk(NamedTuple):
    """The geometry of the elements ``lo:hi`` at the points, on one array module."""

    lo: int
    hi: int
    #: ``(n, dim, ng, ..., ng)`` the elements' nodes (on the device)
    nodes: object
    #: ``(dim, n, q...)`` coordinates (a view), or None
    x: object
    #: ``(n, dim, dim, q...)`` ``J[e, a, b] = dx_a/dxi_b``
    J: object
    #: ``(n, q...)`` ``|J|`` (positive: checked; a view)
    detJ: object
    #: ``(dim, dim, n, q...)`` ``adj J = |J| J^-1`` (a view), or None
    adj: object


def _geometry(mesh, points, xp, *, coords=True, adjugate=True, extra=0, solution=None):
    """Yield the :class:`_GeoChunk` of every chunk of elements at the tensor-product
    ``points``, computed on module ``xp``; ``extra``: further floats a point the consumer
    holds (for the chunk size). A tangled element raises :func:`check_jacobian`'s error."""
    maps = _Maps(mesh, points, xp, coords=coords, adjugate=adjugate, extra=extra,
                 solution=solution)
    dim = mesh.dim
    for g in maps:
        G = maps.data(g, "adjugate" if adjugate else "det")
        adj = None
        if adjugate:
            n, q = G.shape[0], G.shape[2:]
            adj = xp.moveaxis(G[:, 1:].reshape((n, dim, dim) + q), (1, 2), (0, 1))
            G = G[:, 0]
        yield _GeoChunk(g.lo, g.hi, g.nodes, g.x, g.J, G, adj)


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


def quadrature_data(mesh, nq, *, quadrature="gauss", device="cpu"):
    """Coordinates, ``|J|`` and ``w |J|`` of a mesh at an ``nq``-point rule per direction.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    nq : int
        Points per direction.
    quadrature : str
        Rule name for :func:`smalltc.fem.quadrature.quadrature_rule`.
    device : {"cpu", "gpu", "auto"}
        Where the arrays are computed and returned (NumPy or CuPy).

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
    xp = resolve_device(device)
    points, weights = quadrature_rule(nq, quadrature)
    dim, E = mesh.dim, mesh.nelements
    q = (len(points),) * dim
    x, detJ = xp.empty((dim, E) + q), xp.empty((E,) + q)
    maps = _Maps(mesh, points, xp)
    for g in maps:
        x[:, g.lo:g.hi] = g.x
        maps.data(g, "det", out=detJ[g.lo:g.hi])
    return QuadratureData(points, weights, x, detJ, xp.asarray(_tensor_weights(weights, dim))
                          * detJ)


# --- user functions at the points ------------------------------------------------------------

class _Field:
    """A user's function (or number) ``name``, called chunk by chunk on the points' array
    module; where it raises on a device array it is called on host copies from then on
    (logged once)."""

    def __init__(self, func, name):
        if not callable(func) and not (isinstance(func, Real) and not isinstance(func, bool)):
            raise TypeError(f"{name} must be callable or a real number, got {type(func).__name__}")
        self.func, self.name, self.host = func, name, False
        self.constant = None if callable(func) else float(func)
        if self.constant is not None and not np.isfinite(self.constant):
            raise ValueError(f"{name}(x) returned non-finite values")

    @property
    def is_callable(self):
        return self.constant is None

    def _call(self, x, args):
        xp = array_module(x)
        if xp is not np and not self.host:
            try:
                return xp.asarray(self.func(x, *args), dtype=np.float64)
            except Exception as err:
                why = err
            else:
                why = None
            host = self._host_call(x, args)
            self.host = True
            log.warning("smalltc: %s(x) raised %s on a device array; calling it on host "
                        "copies of the points (slower: write it with NumPy ufuncs, which "
                        "take CuPy arrays)", self.name, type(why).__name__)
            return xp.asarray(host)
        if xp is not np:
            return xp.asarray(self._host_call(x, args))
        return self._host_call(x, args)

    def _host_call(self, x, args):
        try:
            return np.asarray(self.func(to_host(x), *(to_host(a) for a in args)),
                              dtype=np.float64)
        except Exception as err:
            raise ValueError(f"{self.name}(x) failed for x of shape {x.shape} (coordinate "
                             "axis first)") from err

    def __call__(self, x, target=None, *args):
        """The values at ``x`` (dim, n, q...), broadcast to ``target`` (``x.shape[1:]`` by
        default), float64, on ``x``'s module; checked for shape and finiteness."""
        xp = array_module(x)
        target = tuple(x.shape[1:]) if target is None else tuple(target)
        if self.constant is not None:
            return xp.full(target, self.constant)
        val = self._call(x, args)
        try:       # a full-shaped result as it is (a broadcast view is read-only: a copy)
            val = val if tuple(val.shape) == target else xp.broadcast_to(val, target)
        except ValueError as err:
            raise ValueError(f"{self.name}(x) returned shape {tuple(val.shape)}, expected "
                             f"{target} for x of shape {tuple(x.shape)}") from err
        if not bool(xp.isfinite(val).all()):
            raise ValueError(f"{self.name}(x) returned non-finite values")
        return val


def evaluate_field(func, x, name="f"):
    """Call a user function at quadrature points and check what it returns.

    Parameters
    ----------
    func : callable or number
        ``func(x) -> array`` broadcastable to ``x.shape[1:]``; a number is
        a constant.
    x : ndarray, shape (dim, E, nq, ..., nq)
        NumPy or CuPy (a function that raises on a CuPy array is called on a host
        copy; the result is on ``x``'s device).
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
    return _Field(func, name)(x)


# --- the operators' point data -----------------------------------------------------------------

def _check_dtype(dtype):
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"dtype must be float64 or float32, got {dt}")
    return dt


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
        float64 (default) or float32; computed in float64, rounded once.
    device : {"cpu", "gpu", "auto"}
        Where ``D`` is computed, element chunk by chunk, and returned (NumPy or
        CuPy): on a GPU only the chunks' element nodes are copied there, and a
        callable ``rho`` is called on device arrays.

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
    dt = _check_dtype(dtype)
    xp = resolve_device(device)
    field = _Field(1.0 if rho is None else rho, "rho")
    points, weights = quadrature_rule(nq, quadrature)
    w = _tensor_weights(weights, mesh.dim)
    D = xp.empty((mesh.nelements,) + w.shape, dtype=dt)
    w = xp.asarray(w if field.is_callable else w * field.constant)
    maps = _Maps(mesh, points, xp, coords=field.is_callable)
    for g in maps:
        maps.data(g, "mass", w, field(g.x) if field.is_callable else None, D[g.lo:g.hi])
    return D


def diffusion_data(mesh, nq, kappa=None, *, quadrature="gauss", dtype=np.float64,
                   device="cpu"):
    """Quadrature data ``Q`` of the diffusion operator, packed.

    ``Q^{ab} = w * kappa(x) * |J| * (J^{-1} J^{-T})_{ab}`` at every tensor-product
    point (``J[a, b] = d x_a / d xi_b``, :func:`jacobian`), so that ``u^T K u`` is
    ``int kappa |grad u|^2`` (docs/math.md section 7). The symmetric ``dim x dim``
    matrix is stored as its upper triangle, row by row (3D: 11, 12, 13, 22, 23, 33;
    2D: 11, 12, 22; 1D: 11), on axis 1. ``|J| J^{-1}`` is the adjugate, in closed form.

    Parameters
    ----------
    mesh : BoxMesh or UnstructuredMesh
    nq : int
        Quadrature points per direction.
    kappa : callable or float, optional
        Diffusion coefficient ``kappa(x)``, ``x`` of shape ``(dim, E, nq, ..., nq)``
        (as ``rho`` of :func:`mass_data`); 1 when omitted.
    quadrature : str
        Rule name, ``"gauss"`` by default; ``"gll"`` with ``nq = p + 1`` is the
        collocated form (BP5).
    dtype : numpy dtype
        float64 (default) or float32; computed in float64, rounded once.
    device : {"cpu", "gpu", "auto"}
        Where ``Q`` is computed, element chunk by chunk, and returned (as for
        :func:`mass_data`).

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
    dt = _check_dtype(dtype)
    xp = resolve_device(device)
    field = _Field(1.0 if kappa is None else kappa, "kappa")
    points, weights = quadrature_rule(nq, quadrature)
    dim = mesh.dim
    nsym = dim * (dim + 1) // 2
    w = _tensor_weights(weights, dim)
    Q = xp.empty((mesh.nelements, nsym) + w.shape, dtype=dt)
    w = xp.asarray(w if field.is_callable else w * field.constant)
    maps = _Maps(mesh, points, xp, coords=field.is_callable)
    for g in maps:
        maps.data(g, "diffusion", w, field(g.x) if field.is_callable else None,
                  Q[g.lo:g.hi])
    return Q
