"""L2 projection onto an H1 space: right-hand side, solve, and error.

The L2 projection ``u_h`` of ``f`` solves ``M u = b`` with ``M`` the mass
matrix and ``b_i = int f phi_i``; element-wise ``b_e = B^T (w |J| f(x_q))``
(the transposed interpolation), then scatter-add. The error ``||u_h - f||``
is measured with a finer quadrature than the one used to build ``M`` and
``b``, so it is not blind to what the solve's rule cannot see.

User functions take ``x`` of shape ``(dim, ...)`` (coordinate axis first)
and return values of shape ``x.shape[1:]``.

:func:`l2_project` sets up on the host (mesh, geometry, ``D``, right-hand
side, all NumPy, once) and solves on the chosen ``device``: with
``device="gpu"`` (or ``"auto"`` on a machine with a GPU) ``B1d``, ``D`` and
``b`` are copied to the GPU, and the operator, the Jacobi preconditioner and
CG run there with CuPy; the solution comes back to the host for the error.

This module knows nothing of MPI: ``smalltc.fem.l2_project(..., comm=)``
(:mod:`smalltc.fem.api`) sends a distributed projection to
:mod:`smalltc.fem.distributed`, which builds on this one.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from ._device import device_name, resolve_device, synchronize, to_host
from .basis import basis_1d
from .geometry import evaluate_field, quadrature_data
from .operators import AssembledMassOperator, MassOperator
from .solvers import cg, jacobi
from .space import H1Space
from .tensor import interp, interp_t

__all__ = ["ProjectionResult", "load_vector", "l2_error", "l2_project"]

_OPERATORS = {"matrix-free": MassOperator, "assembled": AssembledMassOperator}


def _default_nq(p, nq, name="nq"):
    if nq is None:
        return p + 2
    if isinstance(nq, bool) or not isinstance(nq, (int, np.integer)) or nq < 1:
        raise ValueError(f"{name} must be a positive integer, got {nq!r}")
    return int(nq)


def load_vector(space, f, *, nq=None, quadrature="gauss"):
    """Right-hand side ``b_i = int f phi_i`` of the L2 projection.

    Parameters
    ----------
    space : H1Space
    f : callable or float
        ``f(x)`` with ``x`` of shape ``(dim, E, nq, ..., nq)``.
    nq : int, optional
        Quadrature points per direction, ``p + 2`` by default.
    quadrature : str
        Rule name.

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
    nq = _default_nq(space.p, nq)
    qd = quadrature_data(space.mesh, nq, quadrature=quadrature)
    return _load(space, qd, basis_1d(space.p, nq, quadrature).B1d, f)


def _load(space, qd, B1d, f):
    """``b = scatter(B^T (w |J| f(x_q)))`` from precomputed quadrature data."""
    return space.scatter(interp_t(B1d, qd.wdetJ * evaluate_field(f, qd.x), space.dim))


def l2_error(space, u, f, *, nq=None, quadrature="gauss"):
    """``||u_h - f||_{L2}`` for a global vector ``u`` of ``space``.

    Parameters
    ----------
    space : H1Space
    u : ndarray, shape (ndofs,)
        NumPy, or CuPy (copied to the host).
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


def _error_sums(space, u, f, nq, quadrature, name):
    """``(||u_h - f||^2, ||f||^2)`` over the elements of ``space`` (a block's, in a
    distributed run: the ranks' sums add up)."""
    nq = space.p + 4 if nq is None else _default_nq(space.p, nq, name)
    u = to_host(u)
    if u.shape != (space.ndofs,):
        raise ValueError(f"u has shape {u.shape}, expected ({space.ndofs},) for this space")
    qd = quadrature_data(space.mesh, nq, quadrature=quadrature)
    B1d = basis_1d(space.p, nq, quadrature).B1d
    uq = interp(B1d, space.gather(u.astype(np.float64)), space.dim)
    fq = evaluate_field(f, qd.x)
    diff = uq - fq
    return float(np.sum(qd.wdetJ * diff * diff)), float(np.sum(qd.wdetJ * fq * fq))


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
        stays on the host either way.
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
    qd = quadrature_data(mesh, nq, quadrature=quadrature)
    B1d = basis_1d(space.p, nq, quadrature).B1d
    b = xp.asarray(_load(space, qd, B1d, f))
    kw = {"deterministic": deterministic} if operator == "matrix-free" else {}
    M = _OPERATORS[operator](space, xp.asarray(qd.wdetJ), xp.asarray(B1d), backend=backend, **kw)
    P = jacobi(M.diagonal()) if precond == "jacobi" else None
    synchronize(xp)
    t1 = time.perf_counter()
    sol = cg(M, b, tol=tol, maxiter=maxiter, precond=P)  # ends with a host copy: synchronised
    u = to_host(sol.x)
    t2 = time.perf_counter()
    err, norm = _error_and_norm(space, u, f, error_nq, quadrature, "error_nq")
    t3 = time.perf_counter()
    return ProjectionResult(
        u=u,
        space=space,
        iterations=sol.iterations,
        residual=float(sol.residuals[-1]),
        residuals=sol.residuals,
        l2_error=err,
        l2_norm=norm,
        timings={"setup": t1 - t0, "solve": t2 - t1, "error": t3 - t2},
        device=device_name(xp),
    )
