"""Boundary conditions: Dirichlet by elimination, Neumann through a boundary load vector.

Dirichlet conditions ``u = g`` on the DoFs of the boundary (or of named regions
of it) are imposed by *elimination*, keeping the operator symmetric positive
definite and the vectors full length:

* :class:`ConstrainedOperator` wraps any operator ``A`` with the linear-operator
  protocol of :mod:`smalltc.fem` (``shape``, ``dtype``, ``xp``, ``__call__``,
  ``diagonal()``): ``A_c x = P A P x + (I - P) x`` with ``P`` the diagonal 0/1
  mask of the free DoFs: on the free DoFs it is ``A_II``, on the constrained
  ones the identity;
* :meth:`DirichletBC.lift` moves the known values to the right-hand side:
  ``b_c = P (b - A g) + (I - P) g`` with ``g`` the values on the constrained
  DoFs (zero elsewhere). The solution of ``A_c u = b_c`` is ``g`` on the
  constrained DoFs and solves ``A_II u_I = b_I - A_IC g_C`` on the others.

The values are nodal interpolation of a function at the DoFs' coordinates.

Neumann data ``kappa du/dn = h`` on boundary facets enter the load vector as
``int_facets h phi_i ds`` (:func:`boundary_load`): for each boundary facet, a
tensor-product Gauss rule on the facet, the surface measure
``ds = |det J| |J^-T e_a| dxi`` of the element map on the facet ``xi_a = +-1``.

All of it works with NumPy or CuPy vectors (the mask follows the operator's
module), so :func:`smalltc.fem.cg`, SciPy's and CuPy's solvers take the
constrained operator as they take any operator of :mod:`smalltc.fem`.
"""

import inspect

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import DeviceCache, resolve_device, to_device, to_host
from .basis import lagrange_basis
from .geometry import _adjugate, _chunk_elements, _det, _Field, _placed_nodes, _tensor_weights
from .operators import _like, linear_operator
from .projection import _dof_map
from .quadrature import gauss_lobatto, quadrature_rule
from .topology import facet_slices

__all__ = ["DirichletBC", "ConstrainedOperator", "dirichlet_bc", "boundary_load"]


def _regions_of(data):
    """A Dirichlet/Neumann argument as a list of (region or None, function)."""
    if data is None:
        return []
    if isinstance(data, dict):
        return list(data.items())
    return [(None, data)]


class DirichletBC:
    """Dirichlet constraints of a space: DoF indices and their values.

    Build it with :func:`dirichlet_bc`. The DoFs and values are copied to a device once
    (per array module, device and dtype) and kept there with the mask: :meth:`mask`,
    :meth:`vector`, :meth:`lift` and :meth:`apply` build their results on the device of
    their arrays.

    Attributes
    ----------
    space : H1Space
    dofs : ndarray of int64, shape (nc,)
        Sorted constrained DoFs.
    values : ndarray of float64, shape (nc,)
        Their values.
    """

    def __init__(self, space, dofs, values):
        dofs = np.asarray(dofs, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if dofs.ndim != 1 or values.shape != dofs.shape:
            raise ValueError(f"dofs {dofs.shape} and values {values.shape} must be 1D of one length")
        if dofs.size and (dofs.min() < 0 or dofs.max() >= space.ndofs):
            raise ValueError(f"dofs must lie in [0, {space.ndofs}), got [{dofs.min()}, {dofs.max()}]")
        self.space, self.dofs, self.values = space, dofs, values
        self._device = DeviceCache()

    def __repr__(self):
        return f"DirichletBC(ndofs={self.space.ndofs}, constrained={self.dofs.size})"

    def _on(self, xp, dtype):
        """The DoFs and their values (as ``dtype``) in ``xp``, copied there once."""
        dofs = self._device.get(xp, "dofs", lambda: xp.asarray(self.dofs))
        values = self._device.get(xp, ("values", np.dtype(dtype).str),
                                  lambda: xp.asarray(self.values.astype(dtype)))
        return dofs, values

    def mask(self, xp=np, dtype=np.float64):
        """The free-DoF mask ``P`` (1 free, 0 constrained), shape (ndofs,), in ``xp``: made
        there once per dtype and kept (the same array on every call)."""
        def make():
            m = xp.ones(self.space.ndofs, dtype=dtype)
            m[self._on(xp, dtype)[0]] = 0
            return m
        return self._device.get(xp, ("mask", np.dtype(dtype).str), make)

    def vector(self, xp=np, dtype=np.float64):
        """``g``: the values on the constrained DoFs, zero elsewhere, in ``xp`` (a new
        array, filled on the device from the kept DoFs and values)."""
        dofs, values = self._on(xp, dtype)
        g = xp.zeros(self.space.ndofs, dtype=dtype)
        g[dofs] = values
        return g

    def constrain(self, op):
        """``op`` with these DoFs eliminated: a :class:`ConstrainedOperator`."""
        return ConstrainedOperator(op, self)

    def lift(self, op, b):
        """The right-hand side of the constrained system: ``P (b - A g) + (I - P) g``.

        Parameters
        ----------
        op : operator
            The unconstrained operator ``A`` (anything callable on vectors).
        b : array, shape (ndofs,)
            The load vector; its array module and dtype are kept.

        Returns
        -------
        array, shape (ndofs,)
        """
        xp = getattr(op, "xp", np)
        b = xp.asarray(b)
        dtype = b.dtype if b.dtype in (np.float32, np.float64) else np.float64
        P = self.mask(xp, dtype)
        g = self.vector(xp, dtype)
        return P * (xp.asarray(b, dtype=dtype) - xp.asarray(op(g), dtype=dtype)) + (1 - P) * g

    def apply(self, x):
        """``x`` with the constrained entries set to their values (a copy)."""
        xp = array_module(x)
        x = xp.array(x, copy=True)
        dofs, values = self._on(xp, x.dtype)
        x[dofs] = values
        return x


def dirichlet_bc(space, data, *, region=None, device=None):
    """Dirichlet constraints from values on boundary regions.

    Parameters
    ----------
    space : H1Space
    data : callable, number, or dict
        ``g(x)`` (``x`` of shape ``(dim, n)``, coordinate axis first) or a
        number, for the whole boundary (or ``region``); or a dict region name
        -> ``g`` (``None`` as a key: the whole boundary). Where regions meet,
        the later region's value wins.
    region : str, optional
        With a single ``g``: the region it applies to.
    device : {"cpu", "gpu", "auto"}, optional
        Where a callable ``g`` is evaluated: the boundary DoFs' coordinates are
        computed on that device and ``g`` is called there (a ``g`` that raises on a
        device array is called on host copies); the values come back to the host.
        Default: the host. A number needs no coordinates on any device.

    Returns
    -------
    DirichletBC

    Raises
    ------
    KeyError
        For an unknown region (naming the mesh's regions).
    ValueError
        If ``g`` fails or returns non-finite values or the wrong shape.

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> V = H1Space(box_mesh(2, 2), p=1)
    >>> bc = dirichlet_bc(V, {"xmin": 0.0, "xmax": lambda x: x[1]})
    >>> bc.dofs.tolist(), bc.values.tolist()
    ([0, 1, 2, 6, 7, 8], [0.0, 0.0, 0.0, 0.0, 0.5, 1.0])
    """
    items = [(region, data)] if not isinstance(data, dict) else list(data.items())
    xp = np if device is None else resolve_device(device)
    values = np.zeros(space.ndofs)
    constrained = np.zeros(space.ndofs, dtype=bool)
    for name, g in items:
        field = _Field(g, f"dirichlet[{name!r}]")
        if field.is_callable:                            # the boundary elements' maps only
            dofs, x = space.boundary_coordinates(name, xp)
            values[dofs] = to_host(field(x))
        else:
            dofs = space.boundary_dofs(name)
            values[dofs] = field.constant
        constrained[dofs] = True
    dofs = np.flatnonzero(constrained)
    return DirichletBC(space, dofs, values[dofs])


class ConstrainedOperator:
    """``A_c = P A P + (I - P)``: an operator with Dirichlet DoFs eliminated.

    Parameters
    ----------
    op : operator
        Anything with ``shape``, ``dtype``, ``xp`` and ``__call__`` (the
        operators of :mod:`smalltc.fem`, or your own); ``diagonal()`` if the
        Jacobi preconditioner is wanted.
    bc : DirichletBC

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh, mass_operator, cg
    >>> V = H1Space(box_mesh(1, 4), p=1)
    >>> M = mass_operator(V)
    >>> bc = dirichlet_bc(V, 1.0)
    >>> A = ConstrainedOperator(M, bc)
    >>> u = cg(A, bc.lift(M, M(np.ones(V.ndofs))), tol=1e-12).x
    >>> bool(np.allclose(u, 1.0))
    True
    """

    def __init__(self, op, bc):
        self.op, self.bc = op, bc
        self.xp = getattr(op, "xp", np)
        self.dtype = np.dtype(getattr(op, "dtype", np.float64))
        self.shape = tuple(getattr(op, "shape", (bc.space.ndofs, bc.space.ndofs)))
        if self.shape != (bc.space.ndofs, bc.space.ndofs):
            raise ValueError(f"operator has shape {self.shape}, the constraints' space has "
                             f"{bc.space.ndofs} DoFs")
        self.space = bc.space
        self._P = bc.mask(self.xp, self.dtype)

    @property
    def device(self):
        return "cpu" if self.xp is np else "gpu"

    def __call__(self, x):
        return self.apply(x)

    def apply(self, x):
        """``P A (P x) + (I - P) x``."""
        x = self.xp.asarray(x, dtype=self.dtype)
        P = self._P
        y = self.op(x * P)
        return P * y + (1 - P) * x

    def diagonal(self):
        """``P diag(A) + (I - P)``."""
        P = self._P
        return P * self.xp.asarray(self.op.diagonal(), dtype=self.dtype) + (1 - P)

    def matvec(self, x):
        return _like(x, self.apply(x.reshape(-1)).reshape(x.shape))

    def matmat(self, X):
        return _like(X, self.xp.stack([self.apply(c) for c in self.xp.asarray(X).T], axis=1))

    rmatvec, rmatmat = matvec, matmat

    def aslinearoperator(self):
        """As SciPy's (CuPy's, on the GPU) ``LinearOperator``."""
        return linear_operator(self)

    def __repr__(self):
        return f"ConstrainedOperator({self.op!r}, constrained={self.bc.dofs.size})"


def _flux_field(h, name):
    """``h`` as a :class:`~smalltc.fem.geometry._Field` called with ``(x, n)`` where it
    takes two positional parameters, else with ``x``; and whether it takes ``n``."""
    if callable(h):
        try:
            params = [q for q in inspect.signature(h).parameters.values()
                      if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        if len(params) >= 2:
            return _Field(h, name), True
    return _Field(h, name), False


def _facet_geometry(X, a, Bg, Gg, Be, Ge):
    """``x`` (dim, n, q...) and ``J`` (n, dim, dim, q...) on the facet ``xi_a = end`` of the
    elements with nodes ``X`` (n, dim, ng, ..., ng): :func:`smalltc.interpolate` along axis
    ``a`` to the end (the facet's nodes and their normal derivatives, ``Be``/``Ge``), then
    on the facet's ``dim - 1`` axes (``Bg``/``Gg``)."""
    xp = array_module(X)
    n, dim, ng = X.shape[0], X.shape[1], X.shape[2]
    V = xp.ascontiguousarray(xp.moveaxis(X, 2 + a, -1)).reshape(n, -1, ng)
    T = smalltc.interpolate(Be, Ge, V, what="both", dim=1)              # (n, comps, 2, 1)
    face = (n, dim) + (ng,) * (dim - 1)
    Xf = xp.ascontiguousarray(T[:, :, 0, 0]).reshape(face)
    Xn = xp.ascontiguousarray(T[:, :, 1, 0]).reshape(face)
    if dim == 1:
        return xp.moveaxis(Xf, 1, 0), Xn[:, :, None]
    Hf = smalltc.interpolate(Bg, Gg, Xf, what="both", dim=dim - 1)      # (n, dim, dim, q...)
    J = xp.empty((n, dim, dim) + Hf.shape[3:])
    J[:, :, a] = smalltc.interpolate(Bg, None, Xn, dim=dim - 1)
    for j, b in enumerate(c for c in range(dim) if c != a):
        J[:, :, b] = Hf[:, :, 1 + j]
    return xp.moveaxis(Hf[:, :, 0], 1, 0), J


def boundary_load(space, data, region=None, *, nq=None, quadrature="gauss", device="cpu"):
    """Neumann load vector ``b_i = int_Gamma h phi_i ds`` over boundary facets.

    On each facet ``xi_a = +-1`` of a boundary element, at a tensor-product rule of
    the facet: ``x`` and ``J`` by :func:`smalltc.interpolate` of the element's nodes,
    ``ds = |J| |J^-T e_a|`` and the outward normal ``n = +-J^-T e_a / |J^-T e_a|``
    from the adjugate (``|J| J^-1``, closed form), then :func:`smalltc.integrate` of
    ``w h ds`` into the facet's DoFs; element chunk by chunk on ``device``.

    Parameters
    ----------
    space : H1Space
    data : callable, number, or dict
        ``h(x)`` or ``h(x, n)`` (``x`` and the outward unit normal ``n`` of
        shape ``(dim, F, nq, ...)``), for the whole boundary (or ``region``);
        or a dict region name -> ``h``.
    region : str, optional
        With a single ``h``: the region.
    nq : int, optional
        Gauss points per facet direction, ``p + 2`` by default.
    quadrature : str
    device : {"cpu", "gpu", "auto"}
        Where the vector is computed and returned (``h`` is called on its arrays).

    Returns
    -------
    ndarray, shape (ndofs,)

    Raises
    ------
    ValueError
        If ``h`` fails, or returns the wrong shape or non-finite values (naming
        ``neumann[region]``).

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> V = H1Space(box_mesh(2, 2, upper=(2.0, 1.0)), p=2)
    >>> b = boundary_load(V, 1.0, "xmax")         # the length of the side x = 2
    >>> print(round(float(b.sum()), 12))
    1.0
    >>> b = boundary_load(V, lambda x, n: n[0])    # outward normals: + on xmax, - on xmin
    >>> abs(float(b.sum())) < 1e-12
    True
    """
    items = [(region, data)] if not isinstance(data, dict) else list(data.items())
    nq = space.p + 2 if nq is None else int(nq)
    xp = resolve_device(device)
    dim, mesh = space.dim, space.mesh
    pts, wts = quadrature_rule(nq, quadrature)
    Bg, Gg = (xp.asarray(m) for m in lagrange_basis(mesh.geom_nodes, pts))
    B1d = xp.asarray(lagrange_basis(gauss_lobatto(space.nd)[0], pts)[0])
    w = xp.asarray(_tensor_weights(wts, dim - 1))
    dofs = _dof_map(space, xp)
    out = xp.zeros(space.ndofs)
    per = nq ** (dim - 1) * (4 * dim * (dim + 1) + 10)
    sides = {name: mesh.boundary_facets(name) for name, _ in items}
    placed = _placed_nodes(mesh, xp)       # a box mesh's nodes made on the device, once
    with smalltc.evaluation_job(sum(e.size for e, _ in sides.values()) * nq ** (dim - 1)):
        for name, h in items:
            field, with_normal = _flux_field(h, f"neumann[{name!r}]")
            elems, facets = sides[name]
            for f in np.unique(facets):
                a, side = divmod(int(f), 2)
                sign = 1.0 if side else -1.0
                Be, Ge = (xp.asarray(m) for m in lagrange_basis(mesh.geom_nodes, [sign]))
                sel = elems[facets == f]
                face = (slice(None),) + facet_slices(dim, space.nd, f)
                step = _chunk_elements(xp, sel.size, per, space.ndofs)
                for lo in range(0, sel.size, step):
                    part = sel[lo:lo + step]
                    nodes = (placed[xp.asarray(part)] if placed is not None
                             else to_device(mesh.nodes[part], xp))
                    x, J = _facet_geometry(nodes, a, Bg, Gg, Be, Ge)
                    adj = _adjugate(J)
                    det = _det(J, adj)
                    c = sign / det                    # J^-T e_a = adj[a, :] / |J|
                    nrm = xp.stack([adj[a, i] * c for i in range(dim)])  # (dim, n, q...)
                    length = xp.sqrt((nrm * nrm).sum(axis=0))
                    ds = xp.abs(det) * length         # |J| |J^-T e_a|
                    nrm /= length
                    vals = field(x, None, nrm) if with_normal else field(x)
                    q = w * ds * vals
                    idx = xp.ascontiguousarray(dofs[xp.asarray(part)][face])
                    if dim == 1:
                        out += xp.bincount(idx.reshape(-1), weights=q.reshape(-1),
                                           minlength=space.ndofs)
                    else:
                        out += smalltc.integrate(B1d, None, q, idx, ndofs=space.ndofs)
    return out
