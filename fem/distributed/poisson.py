"""The Poisson problem across MPI ranks: :func:`smalltc.fem.solve_poisson` and
:func:`smalltc.fem.poisson_problem` with ``comm=``.

Every rank, on its elements (:mod:`.space`, :mod:`.unstructured`): the diffusion
operator (:class:`~.operators.DistributedOperator`, the fused
:func:`smalltc.diffusion_apply` with the halo exchange overlapped), its part of the
load vector (``int f phi`` and the Neumann facets of its elements on the whole
mesh's boundary, summed onto the owners by the reverse exchange), the Dirichlet
constraints, then Jacobi-CG with inner products summed across the ranks and the
L2 and H1 errors summed across them.

Vectors are local vectors in owner form (:mod:`.space`: ghosts zero) during the
solve. The Dirichlet DoFs are those of each rank's boundary facets, made to agree
across the ranks (a node an owner does not see on the boundary but a neighbour
does is constrained, with the neighbour's value); the constrained operator
``P A P + (I - P)`` then keeps owner form, and the lifted right-hand side has its
ghosts zeroed. After CG the solution's ghosts are filled from their owners and the
Dirichlet values set exactly (the serial :meth:`DirichletBC.apply`).

With one rank the result is the serial one to rounding (the same operator calls,
the same CG); with several, to CG's tolerance (the sums run in another order).
"""

import time
from dataclasses import dataclass

import numpy as np

from .._device import device_name, resolve_device, synchronize, to_host
from ..boundary import ConstrainedOperator, DirichletBC, boundary_load
from ..poisson import (PoissonProblem, PoissonResult, _check_constrained, _check_pmg_options,
                       _Clock, _conditions, _dirichlet, _errors)
from ..projection import _error_sums, _load
from ..solvers import Jacobi, cg, jacobi
from .comm import Reducer, agree, check_launch, collective, comm_path, load_mpi, make_reducer
from .comm import select_gpu, spelling
from .multigrid import distributed_pmg
from .operators import distributed_diffusion_operator
from .phases import (Counters, Timed, ahead_done, check_timings, compile_ahead, distribution,
                     halos_of, reducers_of)
from .space import DistributedH1Space, distribute_mesh, is_distributed_mesh, mesh_fingerprint
from .unstructured import partition_mesh

__all__ = ["DistributedPoissonProblem", "poisson_problem_distributed",
           "solve_poisson_distributed", "distributed_dirichlet_bc"]

#: the preconditioners of a distributed solve
PRECONDS = ("jacobi", "pmg", None)

#: what ``pmg_options`` may hold in a distributed solve
PMG_OPTIONS = ("orders", "degree", "coarse", "coarse_tol", "graph", "exchanges")


def _spell(data):
    """``data`` (a number, a callable or a dict region -> either) as every rank spells it."""
    if isinstance(data, dict):
        return {str(k): spelling(v) for k, v in data.items()}
    if isinstance(data, (tuple, list)):
        return tuple(spelling(v) for v in data)
    return spelling(data)


class DistributedConstrainedOperator(ConstrainedOperator):
    """:class:`~smalltc.fem.boundary.ConstrainedOperator` of a distributed operator:
    the same action (owner form in, owner form out), its diagonal with ghosts 1 (for
    :func:`~smalltc.fem.solvers.jacobi`)."""

    def diagonal(self):
        P = self._P
        return P * self.xp.asarray(self.op.diagonal(ghost_value=1.0), dtype=self.dtype) + (1 - P)


def distributed_dirichlet_bc(space, regions, neumann_regions=(), device=None):
    """The Dirichlet constraints of a distributed space, in its local numbering.

    Each rank finds the DoFs of its boundary facets (its local mesh's
    ``boundary_facets`` are the whole mesh's boundary: :class:`~.space.BlockMesh`)
    as the serial path does; then the ranks agree: a node is constrained when any
    rank holding it says so, with its owner's value (or, where the owner does not
    see it on the boundary, the value of the ranks that do). Collective.

    Parameters
    ----------
    space : DistributedH1Space
    regions : dict
        Region -> ``g`` (a number or a callable), ``None`` for the boundary outside
        ``neumann_regions`` (as :func:`smalltc.fem.solve_poisson` takes them).
    neumann_regions : sequence of str
    device : {"cpu", "gpu", "auto"}, optional
        Where the callables are evaluated and the ranks' agreement is computed (the
        halo of that device); the constraints come back to the host. Default: the
        host.

    Returns
    -------
    DirichletBC
        On ``space.local`` (local DoFs, ghosts included).

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> V = DistributedH1Space(distribute_mesh(box_mesh(2, 2), MPI.COMM_SELF), p=1)
    >>> distributed_dirichlet_bc(V, {"xmin": 0.0, "xmax": lambda x: x[1]}).dofs.tolist()
    [0, 1, 2, 6, 7, 8]
    """
    bc = collective(space.comm, _dirichlet, space.local, dict(regions), list(neumann_regions),
                    device, what="the Dirichlet values")
    xp = np if device is None else resolve_device(device)
    n = space.nlocal
    dofs = xp.asarray(bc.dofs)
    flag = xp.zeros(n)
    flag[dofs] = 1.0
    value = xp.zeros(n)
    value[dofs] = xp.asarray(bc.values)
    count = space.owner_form(flag.copy(), xp)              # holders that constrain each node
    total = space.owner_form(value * flag, xp)             # the sum of their values
    owned = space.owned_mask(xp)
    mine = owned & (flag > 0)
    others = owned & (flag == 0) & (count > 0)
    final = xp.where(mine, value, 0.0)                     # the owner's own value, exactly
    final[others] = total[others] / count[others]
    on = (mine | others).astype(np.float64)
    space.consistent_form(final, xp)
    space.consistent_form(on, xp)
    dofs = xp.flatnonzero(on > 0)
    return DirichletBC(space.local, to_host(dofs), to_host(final[dofs]))


@dataclass
class DistributedPoissonProblem(PoissonProblem):
    """:class:`~smalltc.fem.poisson.PoissonProblem` of a distributed solve: ``space`` a
    :class:`~.space.DistributedH1Space`, the vectors local (owner form), ``comm`` the
    :class:`~.comm.Reducer` of CG's inner products. :meth:`solve` returns the
    solution as a local vector with its ghosts filled and the Dirichlet values set."""

    comm: object = None
    distribution: dict = None

    def solve(self, tol=1e-10, maxiter=None, phases=None, **cg_kw):
        """CG on the ranks; ``phases`` (a dict) gets the seconds of the operator's
        applications (``"apply"``, its exchanges included), of the preconditioner's
        (``"precond_apply"``: the V-cycles; a Jacobi preconditioner is folded into the
        fused CG's updates and has none) and of the p-multigrid's coarse solves
        (``"coarse"``), each synchronised on a GPU (:class:`~.phases.Timed`); a V-cycle
        replayed as a CUDA graph runs launch by launch while they are timed."""
        A, P = self.A, self.precond
        coarse = getattr(P, "coarse", None)
        eager = getattr(P, "eager", None)
        if phases is not None:
            A = Timed(A, phases, "apply", A.xp)
            if P is not None and not isinstance(P, Jacobi):
                P = Timed(P, phases, "precond_apply", A.xp)
            if coarse is not None:
                self.precond.coarse = Timed(coarse, phases, "coarse", A.xp)
            if eager is not None:              # the timers synchronise: no graph replays
                self.precond.eager = True
        try:
            sol = cg(A, self.b, tol=tol, maxiter=maxiter, precond=P, comm=self.comm, **cg_kw)
        finally:
            if coarse is not None:
                self.precond.coarse = coarse
            if eager is not None:
                self.precond.eager = eager
        x = sol.x                    # where it is: no round trip through the host
        self.space.consistent_form(x, self.A.xp)
        sol.x = self.bc.apply(x)
        return sol


def _as_distributed_mesh(mesh, comm):
    """``mesh`` (a BoxMesh, a DistributedMesh, an UnstructuredMesh or a mesh file) as
    this rank's part, and the communicator."""
    if is_distributed_mesh(mesh):
        if comm is not None:
            MPI = load_mpi()
            if MPI.Comm.Compare(comm, mesh.comm) not in (MPI.IDENT, MPI.CONGRUENT):
                raise ValueError("comm is not the communicator the DistributedMesh was built on")
        return mesh, mesh.comm
    if comm is None:
        raise TypeError(f"mesh must be a DistributedMesh, or pass comm=, got "
                        f"{type(mesh).__name__}")
    if type(mesh).__name__ == "BoxMesh":
        return distribute_mesh(mesh, comm), comm
    return partition_mesh(mesh, comm), comm


def _fingerprint(mesh, p, f, dirichlet, neumann, kappa, nq, precond, quadrature, device,
                 backend, pmg_options):
    fp = {"p": p, "f": _spell(f), "dirichlet": _spell(dirichlet), "neumann": _spell(neumann),
          "kappa": _spell(kappa), "nq": nq, "precond": precond, "quadrature": quadrature,
          "device": device, "backend": backend, "pmg_options": _spell(pmg_options)}
    if hasattr(mesh, "shape") and not hasattr(mesh, "vertices"):
        fp.update(mesh_fingerprint(mesh))
    return fp


def _compile_ahead(comm, mesh, p, f, dirichlet, neumann, kappa, nq, precond, quadrature,
                   device, backend, pmg_options, exact=None):
    """:func:`~.phases.compile_ahead` of this problem: its kinds of data on a tiny box
    mesh, set up and solved on one rank (loosely: for the kernels, not the answer)."""
    def run(tiny, self_comm):
        solve_poisson_distributed(tiny, p, f, dirichlet=dirichlet, neumann=neumann,
                                  kappa=kappa, exact=exact, nq=nq, precond=precond, tol=1e-6,
                                  quadrature=quadrature, device=device,
                                  pmg_options=pmg_options, backend=backend, comm=self_comm,
                                  compile_first=False)
    compile_ahead(comm, mesh, "poisson", run, p=p, nq=nq, kappa=_spell(kappa),
                  neumann=_spell(neumann), dirichlet=_spell(dirichlet), precond=precond,
                  quadrature=quadrature, device=device, backend=backend,
                  pmg=_spell(pmg_options), exact=_spell(exact))


def _check(precond, device):
    if precond not in PRECONDS:
        raise ValueError(f"a distributed Poisson solve takes precond in {list(PRECONDS)}, "
                         f"got {precond!r}")
    return device_name(resolve_device(device))


def poisson_problem_distributed(mesh, p, f, *, dirichlet=None, neumann=None, kappa=None,
                                nq=None, precond="jacobi", quadrature="gauss", device="auto",
                                pmg_options=None, backend="auto", comm=None,
                                compile_first=True):
    """:func:`smalltc.fem.poisson_problem` over the ranks of ``comm`` (collective).

    ``mesh`` is the whole box mesh (cut into blocks), a
    :class:`~.space.DistributedMesh` (a block of a box or Kershaw mesh built per
    rank, or a partitioned file mesh), or an unstructured mesh or mesh file
    (partitioned by METIS on rank 0: :func:`~.unstructured.partition_mesh`). The
    other arguments are the serial function's and must agree across the ranks;
    ``precond`` is ``"jacobi"``, ``"pmg"`` (:func:`~.multigrid.distributed_pmg`;
    ``pmg_options``: ``orders``, ``degree``, ``coarse`` (``"auto"``, ``"amg"``, ``"cg"``),
    ``coarse_tol``, ``graph`` (the V-cycle replayed as a CUDA graph: ``"auto"``, True,
    False), ``exchanges`` (``"auto"``, ``"sum"``: consistent vectors and one neighbour
    sum an application, ``"owner"``: owner-form vectors and two exchanges)) or None.

    ``compile_first`` (default True): on a box or Kershaw mesh, the first rank of each
    node compiles the solve's kernels on a tiny problem of the same kind first, the
    node's other ranks asleep, then loads them from the disk cache
    (:func:`~.phases.compile_ahead`): the ranks of a node do not compile the same
    kernels at the same time. Once per process and kind of problem.

    Returns
    -------
    DistributedPoissonProblem

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> prob = poisson_problem_distributed(box_mesh(2, 2), 2, 1.0, device="cpu",
    ...                                    comm=MPI.COMM_SELF)
    >>> sol = prob.solve()
    >>> bool(sol.converged), prob.bc.dofs.size
    (True, 16)
    """
    _check_pmg_options(precond, pmg_options)
    bad = sorted(set(pmg_options or {}) - set(PMG_OPTIONS))
    if bad:
        raise ValueError(f"pmg_options {bad} are not taken by the distributed p-multigrid; "
                         f"it takes {list(PMG_OPTIONS)}")
    if comm is None and not is_distributed_mesh(mesh):
        raise TypeError(f"mesh must be a DistributedMesh, or pass comm=, got "
                        f"{type(mesh).__name__}")
    load_mpi()
    user_comm = comm if comm is not None else mesh.comm
    check_launch(user_comm)
    fp = collective(user_comm, _fingerprint, mesh, p, f, dirichlet, neumann, kappa, nq, precond,
                    quadrature, device, backend, pmg_options, what="checking the arguments")
    agree(user_comm, fp, "the arguments of solve_poisson")
    where = collective(user_comm, _check, precond, device, what="checking the arguments")
    agree(user_comm, {"device": where}, "the devices found")
    gpu = (collective(user_comm, select_gpu, user_comm, what="selecting a GPU")
           if where == "gpu" else None)
    if compile_first:
        _compile_ahead(user_comm, mesh, p, f, dirichlet, neumann, kappa, nq, precond,
                       quadrature, where, backend, pmg_options)
    xp = resolve_device(where)
    clock = _Clock(xp)
    dmesh, _ = _as_distributed_mesh(mesh, comm)
    space = DistributedH1Space(dmesh, p)
    c = space.comm
    dir_, neu = _conditions(dirichlet, neumann)
    for r in list(neu) + [r for r in dir_ if r is not None]:
        collective(c, dmesh.local.boundary_facets, r, what="the boundary regions")
    clock.lap("space")
    bc = distributed_dirichlet_bc(space, dir_, list(neu), where)
    constrained = np.zeros(space.nlocal, dtype=bool)
    constrained[bc.dofs] = True
    (nbc,) = Reducer(c).sums(float(np.count_nonzero(constrained & space.owned_mask())))
    _check_constrained(nbc)
    clock.lap("bc")
    nq = space.p + 2 if nq is None else int(nq)          # the serial path's rule
    with ahead_done():                  # compiled with the problem's kinds (compile_first)
        K = distributed_diffusion_operator(space, nq, kappa, quadrature=quadrature,
                                           device=where, backend=backend)
    clock.lap("operator")
    load = xp.asarray(collective(c, _load, space.local, f, nq, quadrature, xp,
                                 what="the right-hand side"))
    if neu:
        load = load + xp.asarray(collective(c, boundary_load, space.local, neu, nq=nq,
                                            quadrature=quadrature, device=where,
                                            what="the Neumann load"))
    space.owner_form(load, xp)                 # on the vectors' device
    clock.lap("load")
    A = DistributedConstrainedOperator(K, bc)
    b = bc.lift(K, load)
    if space.nghosts:
        b[xp.asarray(space.ghosts)] = 0                   # owner form: the owners hold them
    clock.lap("bc")
    if precond == "jacobi":
        P = collective(c, jacobi, A.diagonal(), what="the Jacobi diagonal")
    elif precond == "pmg":
        with ahead_done():
            P = distributed_pmg(A, dirichlet=dir_, neumann_regions=list(neu), kappa=kappa,
                                quadrature=quadrature, backend=backend,
                                **dict(pmg_options or {}))
    else:
        P = None
    clock.lap("preconditioner")
    red = make_reducer(c, xp)
    path = comm_path(c, xp)
    prob = DistributedPoissonProblem(space, K, load, bc, A, b, P, where, clock.laps, comm=red)
    prob.distribution = distribution(space, K.halo, gpu, path)
    return prob


def solve_poisson_distributed(mesh, p, f, *, dirichlet=None, neumann=None, kappa=None,
                              exact=None, nq=None, precond="jacobi", tol=1e-10, maxiter=None,
                              quadrature="gauss", device="auto", pmg_options=None,
                              backend="auto", comm=None, timings=None, compile_first=True):
    """:func:`smalltc.fem.solve_poisson` over the ranks of ``comm`` (collective).

    Arguments as for :func:`poisson_problem_distributed`, and ``exact``, ``tol``,
    ``maxiter`` as the serial function's. ``timings="phases"`` also times the
    operator's and the preconditioner's applications in CG (``"apply"``,
    ``"precond_apply"``, ``"coarse"``, and ``"cg_other"`` the rest of the solve: vector
    updates and reductions), each synchronised on a GPU, which keeps the host from
    queueing ahead: for measurements, not for production runs (None, the default,
    leaves them out).

    Returns
    -------
    PoissonResult
        ``u`` is this rank's local vector (ghosts filled; ``space.gather`` makes the
        global one); ``iterations``, ``residual`` and the errors are global, the same on
        every rank; ``distribution`` says what this rank held, ``timings`` has
        ``"halo"`` and ``"allreduce"`` (seconds of the solve in the exchanges, every
        level's with a p-multigrid, and the reductions); ``distribution["comm_path"]``
        is the communication path (:func:`~.comm.comm_path`) and why.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> u = lambda x: x[0] ** 2 + x[1]                   # -laplace(u) = -2
    >>> res = solve_poisson_distributed(box_mesh(2, 2, distortion=0.05), 2, -2.0,
    ...                                 dirichlet=u, exact=u, device="cpu",
    ...                                 comm=MPI.COMM_SELF)
    >>> res.l2_error < 1e-9, res.distribution["ranks"]
    (True, 1)
    """
    t0 = time.perf_counter()
    check_timings(timings)
    user_comm = comm if comm is not None else getattr(mesh, "comm", None)
    if user_comm is not None:
        load_mpi()
        agree(user_comm, {"exact": _spell(exact), "tol": tol, "maxiter": maxiter,
                          "timings": timings}, "the arguments of solve_poisson")
        if compile_first:               # with the error's kernels too
            _compile_ahead(user_comm, mesh, p, f, dirichlet, neumann, kappa, nq, precond,
                           quadrature, device, backend, pmg_options, exact)
    prob = poisson_problem_distributed(mesh, p, f, dirichlet=dirichlet, neumann=neumann,
                                       kappa=kappa, nq=nq, precond=precond,
                                       quadrature=quadrature, device=device,
                                       pmg_options=pmg_options, backend=backend, comm=comm,
                                       compile_first=False)
    xp, space, K = prob.A.xp, prob.space, prob.operator
    synchronize(xp)
    t1 = time.perf_counter()
    red = prob.comm
    counters = Counters(halos_of(K, prob.precond), reducers_of(red, prob.precond))
    phases = {} if timings == "phases" else None
    sol = prob.solve(tol=tol, maxiter=maxiter, phases=phases)
    u = to_host(sol.x)
    t2 = time.perf_counter()
    comm_s = counters.since()
    l2, h1 = _errors(exact, lambda func, grad: red.sums(*collective(
        space.comm, _error_sums, space.local, xp.asarray(sol.x, dtype=np.float64), func, None,
        quadrature, fname="exact", h1=True, gradient=grad, what="measuring the error")))
    t3 = time.perf_counter()
    timings = {"setup": t1 - t0, **prob.timings, "solve": t2 - t1, "error": t3 - t2, **comm_s}
    if phases is not None:
        phases.setdefault("precond_apply", 0.0)
        timings.update(phases, cg_other=timings["solve"] - phases["apply"]
                       - phases["precond_apply"])
    return PoissonResult(u, space, sol.iterations, float(sol.residuals[-1]), l2, h1, prob,
                         timings, prob.device, prob.distribution)
