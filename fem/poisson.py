"""The Poisson problem ``-div(kappa grad u) = f`` end to end, and its parts.

:func:`poisson_problem` builds the pieces a FEM code has: the space, the
diffusion operator ``K`` (:func:`smalltc.fem.diffusion_operator`, matrix-free),
the load vector ``b = int f phi + int_Gamma_N h phi``, the Dirichlet
constraints, the constrained operator and lifted right-hand side
(:mod:`smalltc.fem.boundary`) and the Jacobi preconditioner;
:func:`solve_poisson` solves it by CG and measures the errors against an exact
solution. Both take a mesh object or a mesh file (read by
:func:`~smalltc.fem.read_mesh`).

Boundary conditions: ``dirichlet`` is a function (or number) for the whole
boundary except the Neumann regions, or a dict region -> function; ``neumann``
is a function ``h(x)`` or ``h(x, n)`` (``n`` the outward unit normal) for
``kappa du/dn`` on the boundary regions of a dict region -> function. With
neither, ``u = 0`` on the whole boundary. A problem without Dirichlet DoFs is
singular and refused.

The errors: ``l2_error = ||u_h - u||`` and ``h1_error = |u_h - u|_{H^1}`` (the
seminorm ``||grad(u_h - u)||``) at ``p + 4`` Gauss points per direction, in one
pass over element chunks on the solve's device (:func:`smalltc.interpolate` of the
solution through the DoF map; the sums reduced there). The exact gradient is
``grad_u`` of ``exact=(u, grad_u)``; with ``exact=u`` alone it is the gradient of
``u``'s order-``p + 2`` Gauss-Lobatto interpolant on each element (``u`` called once
a chunk at the interpolant's nodes; the difference is of order ``h^(p+2)``, below the
error ``h^p`` it measures), which is logged.

The operator's point data and the load vector come from one pass over the element
maps (each chunk's Jacobians and coordinates made once). Every phase is timed
(:attr:`PoissonResult.timings`): the space, the operator (the shared geometry, its point
data), the load vector (its own part of that pass), the boundary conditions, the
preconditioner, the solve and the errors.
"""

import time
from dataclasses import dataclass, field

import numpy as np

import smalltc

from ._device import device_name, resolve_device, synchronize, to_host
from .boundary import ConstrainedOperator, DirichletBC, boundary_load, dirichlet_bc
from .chebyshev import chebyshev
from .geometry import _Field, _Maps, _tensor_weights, evaluate_field
from .multigrid import pmg
from .operators import _build, _operator_basis
from .projection import _error_sums, _LoadSum
from .quadrature import quadrature_rule
from .solvers import cg, jacobi
from .space import H1Space
from .unstructured import read_mesh

__all__ = ["PoissonProblem", "PoissonResult", "poisson_problem", "solve_poisson", "h1_error",
           "exact_gradient"]


def _operator_and_load(space, nq, kappa, f, quadrature, xp):
    """The diffusion operator ``K`` and the load vector ``int f phi`` in one pass over the
    element maps: each chunk's Jacobians (and coordinates, for a callable ``kappa`` or
    ``f``) computed once, its ``Q`` (:func:`smalltc.geometry_data`, into the operator's
    array) and its ``w |J| f`` (:class:`~smalltc.fem.projection._LoadSum`) from them; the
    same values as :func:`~smalltc.fem.operators.diffusion_operator` and
    :func:`~smalltc.fem.projection.load_vector` make apart. Returns ``(K, b, seconds of
    the load's own work)``."""
    kq, fq = _Field(1.0 if kappa is None else kappa, "kappa"), _Field(f, "f")
    points, weights = quadrature_rule(nq, quadrature)
    w = _tensor_weights(weights, space.dim)
    wq = xp.asarray(w if kq.is_callable else w * kq.constant)
    nsym = space.dim * (space.dim + 1) // 2
    Q = xp.empty((space.nelements, nsym) + w.shape)
    acc = _LoadSum(space, nq, quadrature, xp)
    maps = _Maps(space.mesh, points, xp, coords=kq.is_callable or fq.is_callable,
                 extra=nsym + 3, solution=space.ndofs)
    load_s = 0.0
    for g in maps:
        maps.data(g, "diffusion", wq, kq(g.x) if kq.is_callable else None, Q[g.lo:g.hi])
        t = time.perf_counter()
        detJ = smalltc.geometry_data(g.J, what="det")
        acc.add(g.lo, g.hi, detJ, fq(g.x) if fq.is_callable else fq.constant)
        load_s += time.perf_counter() - t
    B1d, G1d = _operator_basis(space, nq, quadrature, xp)
    K = _build(space, "diffusion", Q, B1d, G1d, assembled=False, backend="auto", fused=True,
               deterministic=False)
    return K, acc.result(), load_s


def exact_gradient(u, x):
    """Gradient of a user function ``u`` at points ``x`` (dim, ...): shape (dim, ...).

    Complex-step differentiation where ``u`` takes complex input (exact to
    rounding), else fourth-order central differences; on the host. For a Neumann
    flux ``h(x, n) = grad u . n`` from a known solution (the errors of
    :func:`solve_poisson` differentiate an interpolant of ``u`` instead).

    Examples
    --------
    >>> g = exact_gradient(lambda x: x[0] ** 2 * x[1], np.array([[1.0], [3.0]]))
    >>> print(np.round(g.ravel(), 12))
    [6. 1.]
    """
    x = np.asarray(x, dtype=np.float64)
    dim = x.shape[0]
    out = np.empty(x.shape)
    try:
        h = 1e-30
        for a in range(dim):
            xc = x.astype(np.complex128)
            xc[a] += 1j * h
            val = np.asarray(u(xc))
            if not np.iscomplexobj(val):
                raise TypeError("real result")
            out[a] = np.broadcast_to(val.imag / h, x.shape[1:])
        if np.all(np.isfinite(out)):
            return out
    except Exception:
        pass
    scale = max(1.0, float(np.abs(x).max()))
    h = 1e-3 * scale
    for a in range(dim):
        def at(s):
            xs = x.copy()
            xs[a] += s * h
            return evaluate_field(u, xs, "exact")
        out[a] = (8 * (at(1) - at(-1)) - (at(2) - at(-2))) / (12 * h)
    return out


def h1_error(space, u, exact, *, nq=None, quadrature="gauss"):
    """``|u_h - u|_{H^1} = ||grad u_h - grad u||_{L2}`` for a global vector ``u``.

    Parameters
    ----------
    space : H1Space
    u : array, shape (ndofs,)
        NumPy, or CuPy (the error is then computed on the GPU).
    exact : callable or (callable, callable)
        ``u(x)``, or ``(u, grad_u)`` with ``grad_u(x)`` of shape ``(dim, ...)``. With
        ``u`` alone, ``grad u`` is the gradient of its order-``p + 2`` interpolant on
        each element (logged).
    nq : int, optional
        Points per direction, ``p + 4`` by default.
    quadrature : str
        Rule name.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``u`` is not a vector of the space, or ``exact`` fails or returns the wrong
        shape (naming ``exact`` or ``exact[1]``).

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> V = H1Space(box_mesh(2, 2, distortion=0.05), p=2)
    >>> x = V.dof_coordinates()
    >>> h1_error(V, x[0] * x[1], lambda x: x[0] * x[1]) < 1e-12      # in the space
    True
    >>> h1_error(V, x[0] * x[1], (lambda x: x[0] * x[1], lambda x: x[::-1])) < 1e-12
    True
    """
    func, grad = _split_exact(exact)
    return float(np.sqrt(_error_sums(space, u, func, nq, quadrature, fname="exact", h1=True,
                                     gradient=grad, l2=False)))


def _split_exact(exact):
    """``(u, grad_u or None)`` of ``exact``."""
    if isinstance(exact, tuple):
        if len(exact) != 2:
            raise ValueError(f"exact must be u or a pair (u, grad_u), got a tuple of "
                             f"{len(exact)}")
        return exact
    return exact, None


def _split_regions(data, name):
    if data is None:
        return None
    if isinstance(data, dict):
        return dict(data)
    return {None: data}


def _conditions(dirichlet, neumann):
    """The boundary conditions of :func:`poisson_problem` as two dicts region -> data,
    ``(dirichlet, neumann)``: ``{None: 0.0}`` (``u = 0`` on the whole boundary) without
    either; raises for Neumann data alone (a singular problem) and a Neumann function
    with no region."""
    neu = _split_regions(neumann, "neumann") or {}
    dir_ = _split_regions(dirichlet, "dirichlet")
    if dir_ is None:
        dir_ = {None: 0.0} if not neu else None
    if dir_ is None:
        raise ValueError("no Dirichlet condition: the problem is singular with Neumann data "
                         "alone; give dirichlet= for some boundary region")
    if None in neu:
        raise ValueError("neumann must be a dict region -> h (the regions where it applies)")
    return dir_, neu


def _check_pmg_options(precond, pmg_options):
    """Refuse ``pmg_options`` for a preconditioner other than ``"pmg"``."""
    if pmg_options and precond != "pmg":
        raise ValueError(f"pmg_options are for precond='pmg', got precond={precond!r}")


def _check_constrained(ndofs):
    """Refuse a problem whose Dirichlet regions hold ``ndofs == 0`` DoFs (singular)."""
    if ndofs == 0:
        raise ValueError("the Dirichlet regions hold no DoFs: the problem is singular")


def _errors(exact, sums):
    """``(l2_error, h1_error)`` against ``exact`` (``(None, None)`` without it) from
    ``sums(u, grad_u)``: the squared sums of
    :func:`~smalltc.fem.projection._error_sums` (``err2, norm2, h12``)."""
    if exact is None:
        return None, None
    func, grad = _split_exact(exact)
    err2, _, h12 = sums(func, grad)
    return float(np.sqrt(err2)), float(np.sqrt(h12))


@dataclass
class PoissonProblem:
    """The parts of a Poisson problem (made by :func:`poisson_problem`).

    Attributes
    ----------
    space : H1Space
    operator : the diffusion operator ``K`` (unconstrained)
    load : array, shape (ndofs,)
        ``b = int f phi + int_Gamma_N h phi``, on the operator's device.
    bc : DirichletBC
    A : ConstrainedOperator
        ``K`` with the Dirichlet DoFs eliminated.
    b : array, shape (ndofs,)
        The lifted right-hand side, on the operator's device.
    precond : Jacobi, Chebyshev, PMultigrid or None
    device : str
        ``"cpu"`` or ``"gpu"``: where the operator, the vectors and the setup ran.
    timings : dict
        Seconds of the setup's phases: ``"space"`` (the mesh read, the space),
        ``"operator"`` (the geometry, point data, the operator), ``"load"`` (``f`` at
        the points and the sums: the rest of the pass the two share), ``"bc"``
        (the Dirichlet values, the lifted right-hand side), ``"preconditioner"``.
    """

    space: H1Space
    operator: object
    load: object
    bc: DirichletBC
    A: ConstrainedOperator
    b: object
    precond: object
    device: str = "cpu"
    timings: dict = field(default_factory=dict)

    def solve(self, tol=1e-10, maxiter=None, **cg_kw):
        """CG on ``A u = b``; returns the :class:`~smalltc.fem.solvers.CGResult`, its ``x``
        with the Dirichlet values set exactly (CG reaches them to its tolerance)."""
        sol = cg(self.A, self.b, tol=tol, maxiter=maxiter, precond=self.precond, **cg_kw)
        sol.x = self.bc.apply(sol.x)
        return sol


def _distributed(mesh, comm):
    """Is this call for the distributed layer (``comm`` given, or a distributed mesh)?"""
    return comm is not None or all(hasattr(mesh, a) for a in ("comm", "local"))


def _as_mesh(mesh):
    if hasattr(mesh, "nodes"):
        return mesh
    return read_mesh(mesh)


def poisson_problem(mesh, p, f, *, dirichlet=None, neumann=None, kappa=None, nq=None,
                    precond="jacobi", quadrature="gauss", device="auto", pmg_options=None,
                    comm=None):
    """Set up ``-div(kappa grad u) = f`` with its boundary conditions (no solve).

    Parameters are those of :func:`solve_poisson` (``comm`` too: the problem of this
    rank's part, :func:`smalltc.fem.distributed.poisson.poisson_problem_distributed`).

    Returns
    -------
    PoissonProblem
        A :class:`~smalltc.fem.distributed.poisson.DistributedPoissonProblem` with
        ``comm`` or a distributed mesh (local vectors; ``solve`` is collective).

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> prob = poisson_problem(box_mesh(2, 2), 2, 1.0, device="cpu")
    >>> sol = prob.solve()
    >>> bool(sol.converged), prob.bc.dofs.size
    (True, 16)
    """
    if _distributed(mesh, comm):
        from .distributed.poisson import poisson_problem_distributed  # loaded for comm= (cycle)
        return poisson_problem_distributed(
            mesh, p, f, dirichlet=dirichlet, neumann=neumann, kappa=kappa, nq=nq,
            precond=precond, quadrature=quadrature, device=device, pmg_options=pmg_options,
            comm=comm)
    if precond not in PRECONDS:
        raise ValueError(f"precond must be one of {list(PRECONDS)}, got {precond!r}")
    _check_pmg_options(precond, pmg_options)
    clock = _Clock(resolve_device(device))
    xp = clock.xp
    mesh = _as_mesh(mesh)
    space = H1Space(mesh, p)
    nq = space.p + 2 if nq is None else int(nq)
    dir_, neu = _conditions(dirichlet, neumann)
    for r in neu:
        mesh.boundary_facets(r)                   # KeyError naming an unknown region
    clock.lap("space")
    bc = _dirichlet(space, dir_, list(neu), device_name(xp))
    _check_constrained(bc.dofs.size)
    clock.lap("bc")
    K, load, load_s = _operator_and_load(space, nq, kappa, f, quadrature, xp)
    clock.lap("operator")
    clock.move("operator", "load", load_s)
    if neu:
        load += boundary_load(space, neu, nq=nq, quadrature=quadrature, device=device_name(xp))
    clock.lap("load")
    A = ConstrainedOperator(K, bc)
    b = bc.lift(K, load)
    clock.lap("bc")
    P = _preconditioner(precond, A, kappa, pmg_options)
    clock.lap("preconditioner")
    return PoissonProblem(space, K, load, bc, A, b, P, device_name(xp), clock.laps)


class _Clock:
    """Seconds of the phases of a run, each ended by :meth:`lap` (after the device's
    queued work: the phases are the device's too)."""

    def __init__(self, xp):
        self.xp, self.laps = xp, {}
        self._t = time.perf_counter()

    def lap(self, name):
        synchronize(self.xp)
        t = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + t - self._t
        self._t = t

    def move(self, src, dst, seconds):
        """Count ``seconds`` of phase ``src`` under ``dst`` (the part of a shared pass
        that is ``dst``'s own work)."""
        self.laps[src] -= seconds
        self.laps[dst] = self.laps.get(dst, 0.0) + seconds


#: the ``precond`` choices of :func:`solve_poisson`
PRECONDS = ("jacobi", "chebyshev", "pmg", None)


def _preconditioner(name, A, kappa, pmg_options=None):
    """The preconditioner ``name`` of the constrained operator ``A``: Jacobi, Chebyshev
    (:func:`~smalltc.fem.chebyshev.chebyshev`) or p-multigrid (:func:`~smalltc.fem.pmg`,
    its levels built like ``A``'s operator, with ``kappa`` and ``pmg_options``)."""
    if name == "jacobi":
        return jacobi(A.diagonal())
    if name == "chebyshev":
        return chebyshev(A)
    if name == "pmg":
        return pmg(A, kappa=kappa, **dict(pmg_options or {}))
    return None


def _dirichlet(space, regions, neumann_regions, device=None):
    """The DirichletBC of ``regions`` (None: the boundary's facets outside the Neumann
    regions); callables evaluated on ``device`` (:func:`~.boundary.dirichlet_bc`)."""
    if None not in regions or not neumann_regions:
        return dirichlet_bc(space, regions, device=device)
    g = _Field(regions.pop(None), "dirichlet[None]")
    mesh = space.mesh
    nf = 2 * space.dim
    e, f = mesh.boundary_facets(None)
    skip = [re * nf + rf for re, rf in map(mesh.boundary_facets, neumann_regions)]
    keep = ~np.isin(e * nf + f, np.concatenate(skip))
    dofs = np.unique(space.facet_dofs(e[keep], f[keep]))
    values = np.zeros(space.ndofs)
    if g.is_callable:
        xp = np if device is None else resolve_device(device)
        every, x = space.boundary_coordinates(None, xp)
        x = x[:, xp.asarray(np.searchsorted(every, dofs))]
        values[dofs] = to_host(g(x))
    else:
        values[dofs] = g.constant
    rest = dirichlet_bc(space, regions, device=device) if regions else None
    mask = np.zeros(space.ndofs, dtype=bool)
    mask[dofs] = True
    if rest is not None:
        values[rest.dofs] = rest.values
        mask[rest.dofs] = True
    idx = np.flatnonzero(mask)
    return DirichletBC(space, idx, values[idx])


@dataclass
class PoissonResult:
    """Outcome of :func:`solve_poisson`.

    Attributes
    ----------
    u : ndarray, shape (ndofs,)
        The solution's coefficients (NumPy, on the host).
    space : H1Space
    iterations : int
    residual : float
        CG's final relative residual.
    l2_error, h1_error : float or None
        ``||u_h - u||`` and ``|u_h - u|_{H^1}`` when ``exact`` was given.
    problem : PoissonProblem
        The parts: operator, load vector, constraints, preconditioner.
    timings : dict
        Seconds in ``"setup"`` (all of :func:`poisson_problem`), its phases (``"space"``,
        ``"operator"``, ``"load"``, ``"bc"``, ``"preconditioner"``: see
        :class:`PoissonProblem`), ``"solve"`` (CG) and ``"error"`` (both errors, one
        pass).
    device : str
    distribution : dict or None
        A distributed solve's (``comm=``): this rank's share (``rank``, ``ranks``,
        ``owned_dofs``, ``local_dofs``, ``global_dofs``, ``elements``, the halo's
        ``transport``, ``gpu``); None for a serial solve.
    """

    u: np.ndarray
    space: H1Space
    iterations: int
    residual: float
    l2_error: float = None
    h1_error: float = None
    problem: PoissonProblem = None
    timings: dict = field(default_factory=dict)
    device: str = "cpu"
    distribution: dict = None


def solve_poisson(mesh, p, f, *, dirichlet=None, neumann=None, kappa=None, exact=None, nq=None,
                  precond="jacobi", tol=1e-10, maxiter=None, quadrature="gauss", device="auto",
                  pmg_options=None, comm=None, timings=None):
    """Solve ``-div(kappa grad u) = f`` with Dirichlet and Neumann conditions.

    Parameters
    ----------
    mesh : BoxMesh, UnstructuredMesh, str or os.PathLike
        A mesh, or a mesh file (:func:`~smalltc.fem.read_mesh`).
    p : int
        Order of the space.
    f : callable or float
        ``f(x)``, ``x`` of shape ``(dim, ...)`` (coordinate axis first).
    dirichlet : callable, float or dict, optional
        ``g(x)`` on the whole boundary except the Neumann regions, or a dict
        region -> ``g``. Default: ``u = 0`` on the whole boundary (when
        ``neumann`` is not given).
    neumann : dict, optional
        Region -> ``h(x)`` or ``h(x, n)``: ``kappa du/dn = h`` there.
    kappa : callable or float, optional
        The coefficient (1 by default), passed to the diffusion operator.
    exact : callable or (callable, callable), optional
        The exact solution (and its gradient), for the errors.
    nq : int, optional
        Gauss points per direction, ``p + 2`` by default.
    precond : {"jacobi", "chebyshev", "pmg", None}
        Jacobi; Chebyshev smoothing (:func:`~smalltc.fem.chebyshev`); the p-multigrid
        V-cycle (:func:`~smalltc.fem.pmg`: its iterations hardly grow with p or the
        mesh); or none.
    pmg_options : dict, optional
        With ``precond="pmg"``: keyword arguments of :func:`~smalltc.fem.pmg` (e.g.
        ``relaxation="schwarz"``, ``smoother``, ``degree``).
    tol : float
        CG's relative residual target.
    maxiter : int, optional
    quadrature : str
    device : {"auto", "cpu", "gpu"}
        Where the operator and CG run.
    comm : mpi4py communicator, optional
        Solve over its ranks (collective; every rank passes the same arguments):
        ``mesh`` the whole box mesh, a
        :class:`~smalltc.fem.distributed.DistributedMesh` (then ``comm`` may be left
        out), or a file or unstructured mesh (partitioned by METIS on rank 0).
        ``precond`` is ``"jacobi"``, ``"pmg"`` or None; on GPUs each rank takes one
        (:func:`~smalltc.fem.distributed.select_gpu`).
        See :func:`smalltc.fem.distributed.poisson.solve_poisson_distributed`.
    timings : {None, "phases"}
        With ``comm``: ``"phases"`` also times CG's operator and preconditioner
        applications, the halo exchanges and the reductions in ``result.timings``
        (synchronising the device around each, so only when asked).

    Returns
    -------
    PoissonResult
        Distributed: ``u`` is this rank's local vector and ``distribution`` says
        what it held; the iterations and errors are global.

    Raises
    ------
    FileNotFoundError, ValueError
        For a missing or unsupported mesh file.
    KeyError
        For an unknown region (naming the mesh's regions).
    ValueError
        For a problem with no Dirichlet DoFs, bad data.

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> u = lambda x: x[0] ** 2 + x[1]                   # -laplace(u) = -2
    >>> res = solve_poisson(box_mesh(2, 2, distortion=0.05), 2, -2.0, dirichlet=u,
    ...                     exact=u, device="cpu")
    >>> res.l2_error < 1e-9
    True
    """
    if _distributed(mesh, comm):
        from .distributed.poisson import solve_poisson_distributed  # loaded for comm= (cycle)
        return solve_poisson_distributed(
            mesh, p, f, dirichlet=dirichlet, neumann=neumann, kappa=kappa, exact=exact, nq=nq,
            precond=precond, tol=tol, maxiter=maxiter, quadrature=quadrature, device=device,
            pmg_options=pmg_options, comm=comm, timings=timings)
    if timings is not None:
        raise ValueError(f"timings={timings!r} times the phases of a distributed solve "
                         "(comm=); a serial solve's result.timings has its phases already")
    t0 = time.perf_counter()
    prob = poisson_problem(mesh, p, f, dirichlet=dirichlet, neumann=neumann, kappa=kappa, nq=nq,
                           precond=precond, quadrature=quadrature, device=device,
                           pmg_options=pmg_options)
    xp = prob.A.xp
    synchronize(xp)
    t1 = time.perf_counter()
    sol = prob.solve(tol=tol, maxiter=maxiter)
    u = to_host(sol.x)
    t2 = time.perf_counter()
    l2, h1 = _errors(exact, lambda func, grad: _error_sums(
        prob.space, xp.asarray(sol.x, dtype=np.float64), func, None, quadrature,
        fname="exact", h1=True, gradient=grad, norm=False))
    t3 = time.perf_counter()
    timings = {"setup": t1 - t0, **prob.timings, "solve": t2 - t1, "error": t3 - t2}
    return PoissonResult(u, prob.space, sol.iterations, float(sol.residuals[-1]), l2, h1, prob,
                         timings, prob.device)
