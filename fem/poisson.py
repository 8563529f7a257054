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
seminorm ``||grad(u_h - u)||``) at ``p + 4`` Gauss points per direction. The
exact gradient is taken from ``exact=(u, grad_u)`` when given, else by complex-
step differentiation of ``u`` (exact to rounding for functions NumPy evaluates
on complex input: polynomials, sin, exp, ...), else by fourth-order central
differences.
"""

import importlib
import time
from dataclasses import dataclass, field

import numpy as np

from ._device import device_name, resolve_device, synchronize, to_host
from .basis import basis_1d
from .boundary import ConstrainedOperator, DirichletBC, boundary_load, dirichlet_bc
from .geometry import evaluate_field, jacobian, quadrature_data
from .projection import l2_error, load_vector
from .solvers import cg, jacobi
from .space import H1Space
from .tensor import apply_tensor, interp

__all__ = ["PoissonProblem", "PoissonResult", "poisson_problem", "solve_poisson", "h1_error",
           "exact_gradient"]


def _diffusion_operator():
    op = getattr(importlib.import_module(__package__), "diffusion_operator", None)
    if op is None:
        raise RuntimeError("smalltc.fem.diffusion_operator is not available in this build "
                           "(the diffusion operator of the generalised operator family)")
    return op


def exact_gradient(u, x):
    """Gradient of a user function ``u`` at points ``x`` (dim, ...): shape (dim, ...).

    Complex-step differentiation where ``u`` takes complex input (exact to
    rounding), else fourth-order central differences.

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
    exact : callable or (callable, callable)
        ``u(x)``, or ``(u, grad_u)`` with ``grad_u(x)`` of shape ``(dim, ...)``.
    nq : int, optional
        Points per direction, ``p + 4`` by default.

    Returns
    -------
    float

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> V = H1Space(box_mesh(2, 2, distortion=0.05), p=2)
    >>> x = V.dof_coordinates()
    >>> h1_error(V, x[0] * x[1], lambda x: x[0] * x[1]) < 1e-12      # in the space
    True
    """
    nq = space.p + 4 if nq is None else int(nq)
    func, grad = exact if isinstance(exact, tuple) else (exact, None)
    u = to_host(u).astype(np.float64)
    if u.shape != (space.ndofs,):
        raise ValueError(f"u has shape {u.shape}, expected ({space.ndofs},) for this space")
    qd = quadrature_data(space.mesh, nq, quadrature=quadrature)
    b = basis_1d(space.p, nq, quadrature)
    dim = space.dim
    ue = space.gather(u)
    ref = np.stack([apply_tensor([b.G1d if c == a else b.B1d for c in range(dim)], ue)
                    for a in range(dim)], axis=1)                       # (E, dim, q...)
    J = jacobian(space.mesh, qd.points)                                 # (E, dim, dim, q...)
    Jt = np.moveaxis(J, (1, 2), (-2, -1))
    ginv = np.linalg.inv(Jt)                                            # [b, i] = dxi_b/dx_i
    phys = np.einsum("e...bi,eb...->ie...", ginv, ref)                  # (dim, E, q...)
    ex = (np.asarray(grad(qd.x), dtype=np.float64) if grad is not None
          else exact_gradient(func, qd.x))
    diff = phys - np.broadcast_to(ex, phys.shape)
    return float(np.sqrt(np.sum(qd.wdetJ * np.sum(diff * diff, axis=0))))


def _split_regions(data, name):
    if data is None:
        return None
    if isinstance(data, dict):
        return dict(data)
    return {None: data}


@dataclass
class PoissonProblem:
    """The parts of a Poisson problem (made by :func:`poisson_problem`).

    Attributes
    ----------
    space : H1Space
    operator : the diffusion operator ``K`` (unconstrained)
    load : ndarray, shape (ndofs,)
        ``b = int f phi + int_Gamma_N h phi`` on the host.
    bc : DirichletBC
    A : ConstrainedOperator
        ``K`` with the Dirichlet DoFs eliminated.
    b : array, shape (ndofs,)
        The lifted right-hand side, on the operator's device.
    precond : Jacobi, Chebyshev, PMultigrid or None
    """

    space: H1Space
    operator: object
    load: np.ndarray
    bc: DirichletBC
    A: ConstrainedOperator
    b: object
    precond: object
    device: str = "cpu"

    def solve(self, tol=1e-10, maxiter=None, **cg_kw):
        """CG on ``A u = b``; returns the :class:`~smalltc.fem.solvers.CGResult`, its ``x``
        with the Dirichlet values set exactly (CG reaches them to its tolerance)."""
        sol = cg(self.A, self.b, tol=tol, maxiter=maxiter, precond=self.precond, **cg_kw)
        sol.x = self.bc.apply(sol.x)
        return sol


def _as_mesh(mesh):
    if hasattr(mesh, "nodes"):
        return mesh
    from .unstructured import read_mesh
    return read_mesh(mesh)


def poisson_problem(mesh, p, f, *, dirichlet=None, neumann=None, kappa=None, nq=None,
                    precond="jacobi", quadrature="gauss", device="auto", pmg_options=None):
    """Set up ``-div(kappa grad u) = f`` with its boundary conditions (no solve).

    Parameters are those of :func:`solve_poisson`.

    Returns
    -------
    PoissonProblem

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> prob = poisson_problem(box_mesh(2, 2), 2, 1.0, device="cpu")
    >>> sol = prob.solve()
    >>> bool(sol.converged), prob.bc.dofs.size
    (True, 16)
    """
    if precond not in PRECONDS:
        raise ValueError(f"precond must be one of {list(PRECONDS)}, got {precond!r}")
    if pmg_options and precond != "pmg":
        raise ValueError(f"pmg_options are for precond='pmg', got precond={precond!r}")
    mesh = _as_mesh(mesh)
    xp = resolve_device(device)
    space = H1Space(mesh, p)
    nq = space.p + 2 if nq is None else int(nq)
    neu = _split_regions(neumann, "neumann") or {}
    dir_ = _split_regions(dirichlet, "dirichlet")
    if dir_ is None:
        dir_ = {None: 0.0} if not neu else None
    if dir_ is None:
        raise ValueError("no Dirichlet condition: the problem is singular with Neumann data "
                         "alone; give dirichlet= for some boundary region")
    if None in neu:
        raise ValueError("neumann must be a dict region -> h (the regions where it applies)")
    for r in neu:
        mesh.boundary_facets(r)                   # KeyError naming an unknown region
    bc = _dirichlet(space, dir_, list(neu))
    if bc.dofs.size == 0:
        raise ValueError("the Dirichlet regions hold no DoFs: the problem is singular")
    K = _diffusion_operator()(space, nq, kappa, quadrature=quadrature,
                              device=device_name(xp))
    load = load_vector(space, f, nq=nq, quadrature=quadrature)
    if neu:
        load = load + boundary_load(space, neu, nq=nq, quadrature=quadrature)
    A = ConstrainedOperator(K, bc)
    b = bc.lift(K, xp.asarray(load))
    P = _preconditioner(precond, A, kappa, pmg_options)
    return PoissonProblem(space, K, load, bc, A, b, P, device_name(xp))


#: the ``precond`` choices of :func:`solve_poisson`
PRECONDS = ("jacobi", "chebyshev", "pmg", None)


def _preconditioner(name, A, kappa, pmg_options=None):
    """The preconditioner ``name`` of the constrained operator ``A``: Jacobi, Chebyshev
    (:func:`~smalltc.fem.chebyshev.chebyshev`) or p-multigrid (:func:`~smalltc.fem.pmg`,
    its levels built like ``A``'s operator, with ``kappa`` and ``pmg_options``)."""
    if name == "jacobi":
        return jacobi(A.diagonal())
    if name == "chebyshev":
        from .chebyshev import chebyshev
        return chebyshev(A)
    if name == "pmg":
        from .multigrid import pmg
        return pmg(A, kappa=kappa, **dict(pmg_options or {}))
    return None


def _dirichlet(space, regions, neumann_regions):
    """The DirichletBC of ``regions`` (None: the boundary's facets outside the Neumann
    regions)."""
    if None not in regions or not neumann_regions:
        return dirichlet_bc(space, regions)
    g = regions.pop(None)
    mesh = space.mesh
    nf = 2 * space.dim
    e, f = mesh.boundary_facets(None)
    skip = [re * nf + rf for re, rf in map(mesh.boundary_facets, neumann_regions)]
    keep = ~np.isin(e * nf + f, np.concatenate(skip))
    dofs = np.unique(space.facet_dofs(e[keep], f[keep]))
    values = np.zeros(space.ndofs)
    x = space._dof_coordinates
    values[dofs] = evaluate_field(g, x[:, dofs], "dirichlet")
    rest = dirichlet_bc(space, regions) if regions else None
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
        Seconds in ``"setup"``, ``"solve"``, ``"error"``.
    device : str
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


def solve_poisson(mesh, p, f, *, dirichlet=None, neumann=None, kappa=None, exact=None, nq=None,
                  precond="jacobi", tol=1e-10, maxiter=None, quadrature="gauss", device="auto",
                  pmg_options=None):
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

    Returns
    -------
    PoissonResult

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
    l2 = h1 = None
    if exact is not None:
        func = exact[0] if isinstance(exact, tuple) else exact
        l2 = l2_error(prob.space, u, func)
        h1 = h1_error(prob.space, u, exact)
    t3 = time.perf_counter()
    return PoissonResult(u, prob.space, sol.iterations, float(sol.residuals[-1]), l2, h1, prob,
                         {"setup": t1 - t0, "solve": t2 - t1, "error": t3 - t2}, prob.device)
