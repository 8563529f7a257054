"""L2 projection onto an H1 space: right-hand side, solve, and error.

The L2 projection ``u_h`` of ``f`` solves ``M u = b`` with ``M`` the mass
matrix and ``b_i = int f phi_i``; element-wise ``b_e = B^T (w |J| f(x_q))``
(:func:`smalltc.integrate`, summed through the DoF map). The error
``||u_h - f||`` is measured with a finer quadrature than the one used to build
``M`` and ``b``, so it is not blind to what the solve's rule cannot see: ``u_h``
at the points by :func:`smalltc.interpolate` through the map, the squared sums
reduced where they are computed, one float back.

User functions take ``x`` of shape ``(dim, ...)`` (coordinate axis first)
and return values of shape ``x.shape[1:]``.

Everything runs element chunk by chunk (:mod:`smalltc.fem.geometry`) on the
chosen ``device``: with ``device="gpu"`` (or ``"auto"`` on a machine with a GPU)
the geometry, ``D``, the right-hand side, the operator, the Jacobi preconditioner,
CG and the error run with CuPy on the GPU (the mesh nodes are copied there a chunk
at a time; ``f`` is called on device arrays); the solution comes back to the host.

This module knows nothing of MPI: ``smalltc.fem.l2_project(..., comm=)``
(:mod:`smalltc.fem.api`) sends a distributed projection to
:mod:`smalltc.fem.distributed`, which builds on this one.
"""

import logging
import time
from dataclasses import dataclass, field

import numpy as np

import smalltc
from smalltc._arrays import array_module

from ._device import device_name, resolve_device, synchronize, to_host
from .basis import basis_1d, lagrange_basis
from .geometry import (SOLUTION_MULTIPLE, _Field, _Maps, _apply_adjugate_t, _geometry,
                       _tensor_weights, mass_data)
from .operators import AssembledMassOperator, MassOperator
from .quadrature import gauss_lobatto, quadrature_rule
from .solvers import cg, jacobi
from .space import H1Space

__all__ = ["ProjectionResult", "load_vector", "l2_error", "l2_project"]

log = logging.getLogger("smalltc")

_OPERATORS = {"matrix-free": MassOperator, "assembled": AssembledMassOperator}


def _default_nq(p, nq, name="nq"):
    if nq is None:
        return p + 2
    if isinstance(nq, bool) or not isinstance(nq, (int, np.integer)) or nq < 1:
        raise ValueError(f"{name} must be a positive integer, got {nq!r}")
    return int(nq)


def _dof_map(space, xp):
    """The space's element-to-DoF map on module ``xp`` (kept by the space where it can)."""
    dof_map = getattr(space, "dof_map", None)
    return dof_map(xp) if dof_map is not None else xp.asarray(space.elem_dofs)


def load_vector(space, f, *, nq=None, quadrature="gauss", device="cpu"):
    """Right-hand side ``b_i = int f phi_i`` of the L2 projection.

    Parameters
    ----------
    space : H1Space
    f : callable or float
        ``f(x)`` with ``x`` of shape ``(dim, E, nq, ..., nq)`` (a chunk's elements).
    nq : int, optional
        Quadrature points per direction, ``p + 2`` by default.
    quadrature : str
        Rule name.
    device : {"cpu", "gpu", "auto"}
        Where ``b`` is computed, element chunk by chunk, and returned.

    Returns
    -------
    ndarray, shape (ndofs,)

    Raises
    ------
    ValueError
        If ``f`` fails or returns the wrong shape, or the mesh is tangled.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> b = load_vector(H1Space(box_mesh(1, 2), p=1), 1.0)
    >>> print(np.round(b, 12))
    [0.25 0.5  0.25]
    """
    return _load(space, f, _default_nq(space.p, nq), quadrature, resolve_device(device))


def _load(space, f, nq, quadrature, xp, name="f"):
    """``b = sum_e P_e^T B^T (w |J| f(x_q))`` on module ``xp``: per chunk of elements the
    geometry and ``f`` at its points, summed into ``b`` by :class:`_LoadSum`."""
    fq = _Field(f, name)
    points, weights = quadrature_rule(nq, quadrature)
    acc = _LoadSum(space, nq, quadrature, xp)
    for g in _geometry(space.mesh, points, xp, coords=fq.is_callable, adjugate=False, extra=3,
                       solution=space.ndofs):
        acc.add(g.lo, g.hi, g.detJ, fq(g.x) if fq.is_callable else fq.constant)
    return acc.result()


class _LoadSum:
    """The load vector ``b = sum_e P_e^T B^T h_e`` of point values ``h = w |J| f`` given
    chunk by chunk (:meth:`add`, elements in order), gathered into blocks whose points
    hold a few solution vectors (:data:`~smalltc.fem.geometry.SOLUTION_MULTIPLE`), each
    block summed into ``b`` by one :func:`smalltc.integrate` through the DoF map."""

    def __init__(self, space, nq, quadrature, xp):
        self.xp, self.E, self.n = xp, space.nelements, space.ndofs
        self.B1d = xp.asarray(basis_1d(space.p, nq, quadrature).B1d)
        self.w = xp.asarray(_tensor_weights(quadrature_rule(nq, quadrature)[1], space.dim))
        self.dofs = _dof_map(space, xp)
        self.block = max(1, -(-SOLUTION_MULTIPLE * self.n // self.w.size))
        self.out = self.part = self.buf = None
        self.b0 = 0

    def add(self, lo, hi, detJ, f):
        """The elements ``lo:hi`` (after those added before): ``|J|`` (hi - lo, q...) at
        the points and ``f`` there (an array of that shape, or a number)."""
        xp = self.xp
        if self.buf is None:
            self.buf = xp.empty((min(self.E, self.block + hi - lo),) + self.w.shape)
        h = self.buf[lo - self.b0:hi - self.b0]
        xp.multiply(detJ, self.w, out=h)
        if not (isinstance(f, float) and f == 1.0):
            h *= f
        if hi - self.b0 >= self.block or hi == self.E:
            args = (self.B1d, None, self.buf[:hi - self.b0], self.dofs[self.b0:hi])
            if self.out is None:
                self.out = smalltc.integrate(*args, ndofs=self.n)
            else:
                self.part = smalltc.integrate(*args, ndofs=self.n, out=self.part)
                self.out += self.part
            self.b0 = hi

    def result(self):
        """``b``, shape (ndofs,), once every element was added."""
        if self.b0 != self.E:
            raise RuntimeError(f"the load vector has {self.b0} of {self.E} elements")
        return self.out


def l2_error(space, u, f, *, nq=None, quadrature="gauss"):
    """``||u_h - f||_{L2}`` for a global vector ``u`` of ``space``.

    Parameters
    ----------
    space : H1Space
    u : ndarray, shape (ndofs,)
        NumPy, or CuPy (the error is then computed on the GPU).
    f : callable or float
        The exact function (or 0 for ``||u_h||``).
    nq : int, optional
        Points per direction, ``p + 4`` by default (finer than the solve's).
    quadrature : str
        Rule name.

    Returns
    -------
    float

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> V = H1Space(box_mesh(2, 2), p=1)
    >>> x = V.dof_coordinates()
    >>> print(round(l2_error(V, x[0] + 2 * x[1], lambda x: x[0] + 2 * x[1]), 12))
    0.0
    """
    return _error_and_norm(space, u, f, nq, quadrature, "nq")[0]


def _error_and_norm(space, u, f, nq, quadrature, name):
    """``(||u_h - f||, ||f||)`` at ``nq`` points per direction (``p + 4`` if None)."""
    err2, norm2 = _error_sums(space, u, f, nq, quadrature, name)
    return float(np.sqrt(err2)), float(np.sqrt(norm2))


def _error_sums(space, u, f, nq, quadrature, name="nq", *, fname="f", h1=False, gradient=None,
                l2=True, norm=True):
    """Squared sums over the elements of ``space`` (a block's, in a distributed run: the
    ranks' sums add up), on ``u``'s array module, chunk by chunk: ``(||u_h - f||^2,
    ||f||^2)`` with ``l2`` (``||f||^2`` None without ``norm``), then ``|u_h - f|_{H^1}^2``
    with ``h1`` (``gradient(x)``: ``f``'s gradient; without it, the gradient of ``f``'s
    order-``p + 2`` interpolant on each element). One float a sum comes back to the
    host."""
    nq = space.p + 4 if nq is None else _default_nq(space.p, nq, name)
    xp = array_module(u)
    u = xp.asarray(u, dtype=np.float64)
    if u.shape != (space.ndofs,):
        raise ValueError(f"u has shape {u.shape}, expected ({space.ndofs},) for this space")
    fq = _Field(f, fname)
    gq = None if gradient is None else _Field(gradient, f"{fname}[1]")
    dim, mesh = space.dim, space.mesh
    points, weights = quadrature_rule(nq, quadrature)
    b = basis_1d(space.p, nq, quadrature)
    B1d, G1d = xp.asarray(b.B1d), (xp.asarray(b.G1d) if h1 else None)
    w = xp.asarray(_tensor_weights(weights, dim))
    dofs = _dof_map(space, xp)
    interpolant = None
    if h1 and gq is None:
        r = space.p + 3
        gll = gauss_lobatto(r)[0]
        Bi, Gi = (xp.asarray(m) for m in lagrange_basis(gll, points))
        interpolant = (xp.asarray(lagrange_basis(mesh.geom_nodes, gll)[0]), Bi, Gi)
        if fq.is_callable:
            log.info("smalltc: the H1 error differentiates the order-%d interpolant of %s on "
                     "each element (%s has no gradient; pass %s=(u, grad_u) for the exact "
                     "one)", r - 1, fname, fname, fname)
    coords = (l2 and fq.is_callable) or gq is not None
    sums = xp.zeros(3)
    # the reference gradients' error e, mapped: |J^-T e|^2 w |J| = e^T Q e with Q the
    # diffusion operator's point data (w |J| J^-1 J^-T); with an exact gradient the
    # physical gradient J^-T e = adj^T e / |J| itself
    maps = _Maps(mesh, points, xp, coords=coords, adjugate=gq is not None,
                 extra=4 * dim + 8, solution=space.ndofs)
    for g in maps:
        H = smalltc.interpolate(B1d, G1d, u, dofs[g.lo:g.hi], what="both" if h1 else "values")
        if h1 and gq is not None:
            G = maps.data(g, "adjugate")
            n, q = G.shape[0], G.shape[2:]
            detJ = G[:, 0]
            adj = xp.moveaxis(G[:, 1:].reshape((n, dim, dim) + q), (1, 2), (0, 1))
        else:
            detJ = maps.data(g, "det")
        wdetJ = xp.multiply(detJ, w)
        x = g.x
        if l2:
            exact = fq(x) if fq.is_callable else fq.constant
            d = xp.subtract(H[:, 0] if h1 else H, exact)
            d *= d
            sums[0] += xp.vdot(d.ravel(), wdetJ.ravel())
            if norm:
                if fq.is_callable:
                    xp.multiply(exact, exact, out=d)
                else:
                    d.fill(exact * exact)
                sums[1] += xp.vdot(d.ravel(), wdetJ.ravel())
        if h1 and gq is not None:
            sums[2] += _h1_exact_chunk(x, detJ, adj, H[:, 1:], wdetJ, gq)
        elif h1:
            sums[2] += _h1_interpolant_chunk(g, H[:, 1:], w, fq, interpolant)
    s = to_host(sums)
    if not l2:
        return float(s[2])
    return (float(s[0]), float(s[1]) if norm else None) + ((float(s[2]),) if h1 else ())


def _h1_exact_chunk(x, detJ, adj, ref, wdetJ, gq):
    """``sum |grad u_h - grad f|^2 w |J|`` over a chunk's points: ``ref`` the reference
    gradients of ``u_h`` (n, dim, q...), mapped by ``J^-T = adj^T / |J|``; ``grad f``
    from ``gq`` at the points ``x``."""
    xp = array_module(ref)
    dim = ref.shape[1]
    t, tmp = xp.empty(detJ.shape), xp.empty(detJ.shape)
    s = xp.zeros(detJ.shape)
    exact = gq(x, (dim,) + detJ.shape)
    for i in range(dim):
        _apply_adjugate_t(adj, ref, i, t, tmp)              # |J| (J^-T ref)_i
        t /= detJ
        t -= exact[i]
        t *= t
        s += t
    return xp.vdot(s.ravel(), wdetJ.ravel())


def _h1_interpolant_chunk(g, ref, w, fq, interpolant):
    """``sum |grad u_h - grad I f|^2 w |J|`` over a chunk's points, ``I f`` the
    interpolant of ``f`` (its nodes' coordinates by ``Bx`` from the element's, its
    reference gradients at the points by ``(Bi, Gi)``; ``interpolant = (Bx, Bi, Gi)``):
    with ``e = ref - grad_ref I f`` (``ref`` the reference gradients of ``u_h``), the sum
    of ``e^T Q e``, ``Q = w |J| J^-1 J^-T`` (:func:`smalltc.geometry_data`'s diffusion
    data of the chunk)."""
    xp = array_module(ref)
    n, dim = ref.shape[:2]
    Bx, Bi, Gi = interpolant
    if fq.is_callable:
        xr = smalltc.interpolate(Bx, None, g.nodes, dim=dim)            # (n, dim, r...)
        target = (n,) + xr.shape[2:]
        ui = xp.ascontiguousarray(fq(xp.moveaxis(xr, 1, 0), target))
        e = smalltc.interpolate(Bi, Gi, ui, what="gradients")
        xp.subtract(ref, e, out=e)
    else:
        e = ref                                  # a constant's gradient is zero
    Q = smalltc.geometry_data(g.J, w, what="diffusion")
    e = [xp.ascontiguousarray(e[:, a]) for a in range(dim)]
    t = xp.empty_like(e[0])
    s, k = 0.0, 0
    for a in range(dim):
        for b in range(a, dim):
            xp.multiply(Q[:, k], e[a], out=t)
            s += (1.0 if a == b else 2.0) * xp.vdot(t.ravel(), e[b].ravel())
            k += 1
    return s


@dataclass
class ProjectionResult:
    """Outcome of :func:`l2_project`.

    Attributes
    ----------
    u : ndarray, shape (ndofs,)
        Coefficients of the projection (NumPy, on the host). Distributed: this
        rank's local vector, shape ``(space.nlocal,)``, ghosts holding their
        owners' values (``space.gather(u)`` assembles the global one).
    space : H1Space or DistributedH1Space
    iterations : int
        CG iterations.
    residual : float
        Final relative residual of CG.
    residuals : ndarray
        CG's relative residual history.
    l2_error : float
        ``||u_h - f||``.
    l2_norm : float
        ``||f||`` (same quadrature), for a relative error.
    timings : dict
        Seconds spent in ``"setup"`` (geometry, D, right-hand side,
        operator, copies to the device), ``"solve"`` and ``"error"``;
        distributed, also ``"halo"`` (the operator's exchanges during the
        solve), ``"halo_wait"`` (the part overlap did not hide) and
        ``"allreduce"`` (CG's sums across ranks).
    device : str
        ``"cpu"`` or ``"gpu"``: where the operator and CG ran.
    distribution : dict or None
        Distributed runs: ``rank``, ``ranks``, ``grid``, ``owned_dofs``,
        ``local_dofs``, ``global_dofs``, ``elements`` (the rank's),
        ``transport`` and ``transport_reason`` (how halo buffers reach MPI),
        ``gpu`` (the device id, or None). None for a serial run.
    """

    u: np.ndarray
    space: H1Space
    iterations: int
    residual: float
    residuals: np.ndarray
    l2_error: float
    l2_norm: float
    timings: dict = field(default_factory=dict)
    device: str = "cpu"
    distribution: dict = None

    @property
    def relative_l2_error(self):
        """``||u_h - f|| / ||f||``."""
        return self.l2_error / self.l2_norm if self.l2_norm > 0 else float("inf")


def l2_project(mesh, p, f, *, nq=None, operator="matrix-free", tol=1e-12, maxiter=None,
               precond="jacobi", quadrature="gauss", error_nq=None, backend="auto", device="auto",
               deterministic=False):
    """L2-project ``f`` onto the order-``p`` H1 space of ``mesh``.

    Builds ``D = w |J|`` and the right-hand side at ``nq`` points per
    direction, solves ``M u = b`` by CG with the chosen mass operator, and
    measures the error at ``error_nq`` points.

    Parameters
    ----------
    mesh : BoxMesh
    p : int
        Polynomial order.
    f : callable or float
        Function to project, ``f(x)`` with ``x`` of shape ``(dim, ...)``.
    nq : int, optional
        Points per direction for ``M`` and ``b``, ``p + 2`` by default.
    operator : {"matrix-free", "assembled"}
        :class:`~smalltc.fem.operators.MassOperator` (via
        :func:`smalltc.batched_contract`) or
        :class:`~smalltc.fem.operators.AssembledMassOperator` (via
        :func:`smalltc.assemble_mass`).
    tol : float
        CG relative residual target.
    maxiter : int, optional
        CG iteration limit.
    precond : {"jacobi", None}
        Preconditioner.
    quadrature : str
        Rule name.
    error_nq : int, optional
        Points per direction for the error, ``p + 4`` by default.
    backend : str
        Passed to the smalltc core.
    device : {"auto", "cpu", "gpu"}
        Where the operator and CG run: ``"cpu"`` with NumPy, ``"gpu"`` with
        CuPy, ``"auto"`` the GPU when one answers
        (:func:`smalltc._arrays.gpu_available`), else the CPU. The setup
        and the error run there too.
    deterministic : bool
        Passed to the fused operator (:func:`smalltc.mass_apply`): the same bits
        every run on a GPU.

    Returns
    -------
    ProjectionResult

    Raises
    ------
    ValueError
        For an unknown ``operator``, ``precond`` or ``device``, a bad ``f``,
        or a tangled mesh.
    RuntimeError
        For ``device="gpu"`` when no GPU is available.
    ConvergenceError
        If CG does not converge.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> res = l2_project(box_mesh(2, 2, distortion=0.05), 2, lambda x: x[0] ** 2 - x[1],
    ...                  device="cpu")
    >>> res.iterations > 0, res.l2_error < 1e-12, res.device
    (True, True, 'cpu')
    """
    if operator not in _OPERATORS:
        raise ValueError(f"operator must be one of {sorted(_OPERATORS)}, got {operator!r}")
    if precond not in ("jacobi", None):
        raise ValueError(f"precond must be 'jacobi' or None, got {precond!r}")
    xp = resolve_device(device)
    t0 = time.perf_counter()
    space = H1Space(mesh, p)
    nq = _default_nq(space.p, nq)
    D = mass_data(mesh, nq, quadrature=quadrature, device=device_name(xp))
    B1d = xp.asarray(basis_1d(space.p, nq, quadrature).B1d)
    b = _load(space, f, nq, quadrature, xp)
    kw = {"deterministic": deterministic} if operator == "matrix-free" else {}
    M = _OPERATORS[operator](space, D, B1d, backend=backend, **kw)
    P = jacobi(M.diagonal()) if precond == "jacobi" else None
    synchronize(xp)
    t1 = time.perf_counter()
    sol = cg(M, b, tol=tol, maxiter=maxiter, precond=P)  # ends with a host copy: synchronised
    u = to_host(sol.x)
    t2 = time.perf_counter()
    err, norm = _error_and_norm(space, xp.asarray(sol.x, dtype=np.float64), f, error_nq,
                                quadrature, "error_nq")
    t3 = time.perf_counter()
    return _result(
        sol,
        u=u,
        space=space,
        l2_error=err,
        l2_norm=norm,
        timings={"setup": t1 - t0, "solve": t2 - t1, "error": t3 - t2},
        device=device_name(xp),
    )


def _result(sol, **fields):
    """The :class:`ProjectionResult` of CG's result ``sol`` (its iterations and
    residuals) and the other ``fields``."""
    return ProjectionResult(iterations=sol.iterations, residual=float(sol.residuals[-1]),
                            residuals=sol.residuals, **fields)
