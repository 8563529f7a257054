"""The L2 projection across MPI ranks: :func:`smalltc.fem.l2_project` with ``comm=``.

Every rank, on its block (:mod:`.space`): geometry and ``D`` of its elements,
its part of the right-hand side (summed onto owners by the reverse exchange),
the distributed fused operator and its Jacobi diagonal, then CG with inner
products summed across the ranks; the solution's ghosts are filled from their
owners, and the error's squared sums are added across the ranks. Each step that
can fail on some ranks only runs under :func:`.comm.collective`, so the failure
is raised on all of them.

With one rank the result is the serial one, bit for bit.
"""

import time

import numpy as np

from .._device import device_name, resolve_device, synchronize, to_host
from ..basis import basis_1d
from ..geometry import mass_data
from ..projection import _default_nq, _error_sums, _load, _result
from ..solvers import cg, jacobi
from .comm import (agree, check_launch, collective, comm_path, load_mpi, make_reducer,
                   select_gpu, spelling)
from .phases import Counters, Timed, check_timings, compile_ahead, distribution
from .operators import DistributedMassOperator
from .space import DistributedH1Space, distribute_mesh, is_distributed_mesh, mesh_fingerprint
from .unstructured import partition_mesh

__all__ = ["l2_project_distributed"]


def _fingerprint(mesh, p, nq, operator, tol, maxiter, precond, quadrature, error_nq, backend,
                 device, deterministic, f):
    """The arguments every rank must agree on (plain values)."""
    return dict(mesh_fingerprint(mesh), p=p, nq=nq, operator=operator, tol=tol, maxiter=maxiter,
                precond=precond, quadrature=quadrature, error_nq=error_nq, backend=backend,
                device=device, deterministic=bool(deterministic), f=spelling(f))


def _check(operator, precond, device):
    if operator != "matrix-free":
        raise ValueError(f"a distributed projection runs the matrix-free operator only, "
                         f"got operator={operator!r}")
    if precond not in ("jacobi", None):
        raise ValueError(f"precond must be 'jacobi' or None, got {precond!r}")
    return device_name(resolve_device(device))


def l2_project_distributed(mesh, p, f, *, nq=None, operator="matrix-free", tol=1e-12,
                           maxiter=None, precond="jacobi", quadrature="gauss", error_nq=None,
                           backend="auto", device="auto", comm=None, deterministic=False,
                           timings=None, compile_first=True):
    """:func:`smalltc.fem.l2_project` over the ranks of ``comm`` (see there).

    ``timings="phases"`` also times the mass operator's applications in CG
    (``"apply"``, its exchanges included; ``"cg_other"`` the rest of the solve),
    synchronised on a GPU (:class:`~.phases.Timed`: for measurements). With
    ``compile_first`` (the default) the first rank of each node compiles the kernels on
    a tiny projection of the same kind first, the node's other ranks asleep
    (:func:`~.phases.compile_ahead`).

    Returns
    -------
    ProjectionResult
        ``u`` is this rank's local vector (ghosts filled); ``l2_error``,
        ``l2_norm``, ``iterations`` and the residuals are global, the same on
        every rank; ``distribution`` says what this rank held and the communication
        path (``comm_path``, ``comm_path_reason``: :func:`~.comm.comm_path`).
    """
    check_timings(timings)
    if comm is None and not is_distributed_mesh(mesh):
        raise TypeError(f"mesh must be a DistributedMesh, or pass comm=, got "
                        f"{type(mesh).__name__}")
    if is_distributed_mesh(mesh):
        if comm is None:
            comm = mesh.comm
        else:
            MPI = load_mpi()
            if MPI.Comm.Compare(comm, mesh.comm) not in (MPI.IDENT, MPI.CONGRUENT):
                raise ValueError("comm is not the communicator the DistributedMesh was built on")
    load_mpi()
    check_launch(comm)
    t0 = time.perf_counter()
    fp = collective(comm, _fingerprint, mesh, p, nq, operator, tol, maxiter, precond, quadrature,
                    error_nq, backend, device, deterministic, f, what="checking the arguments")
    agree(comm, fp, "the arguments of l2_project")
    where = collective(comm, _check, operator, precond, device, what="checking the arguments")
    agree(comm, {"device": where}, "the devices found")       # "auto" must pick alike
    agree(comm, {"timings": timings}, "the arguments of l2_project")
    gpu = collective(comm, select_gpu, comm, what="selecting a GPU") if where == "gpu" else None
    if compile_first:
        def tiny(mesh1, self_comm):
            l2_project_distributed(mesh1, p, f, nq=nq, tol=1e-6, precond=precond,
                                   quadrature=quadrature, error_nq=error_nq, backend=backend,
                                   device=where, comm=self_comm, deterministic=deterministic,
                                   compile_first=False)
        compile_ahead(comm, mesh, "l2_project", tiny, p=p, nq=nq, precond=precond,
                      quadrature=quadrature, error_nq=error_nq, backend=backend, device=where,
                      deterministic=deterministic, f=spelling(f))
    xp = resolve_device(where)
    if is_distributed_mesh(mesh):
        dmesh = mesh
    elif type(mesh).__name__ == "BoxMesh":
        dmesh = distribute_mesh(mesh, comm)
    else:                                   # a mesh file or an unstructured mesh: METIS parts
        dmesh = partition_mesh(mesh, comm)
    space = DistributedH1Space(dmesh, p)
    nq = collective(comm, _default_nq, space.p, nq, what="checking nq")
    B1d = basis_1d(space.p, nq, quadrature).B1d
    D = collective(comm, mass_data, dmesh.local, nq, quadrature=quadrature, device=where,
                   what="computing the geometry")
    b = xp.asarray(collective(comm, _load, space.local, f, nq, quadrature, xp,
                              what="the right-hand side"))
    space.owner_form(b, xp)                       # on the vectors' device
    M = DistributedMassOperator(space, D, xp.asarray(B1d), backend=backend,
                                deterministic=deterministic)
    P = None
    if precond == "jacobi":
        P = collective(comm, jacobi, M.diagonal(ghost_value=1.0), what="the Jacobi diagonal")
    red = make_reducer(space.comm, xp)
    path = comm_path(space.comm, xp)
    synchronize(xp)
    t1 = time.perf_counter()
    counters = Counters([M.halo], [red])
    phases = {} if timings == "phases" else None
    A = M if phases is None else Timed(M, phases, "apply", xp)
    sol = cg(A, b, tol=tol, maxiter=maxiter, precond=P, comm=red)
    x = sol.x
    space.consistent_form(x, xp)                  # on the device: the error is measured there
    u = to_host(x)
    t2 = time.perf_counter()
    comm_s = counters.since()
    err2, norm2 = collective(comm, _error_sums, space.local, x, f, error_nq,
                             quadrature, "error_nq", what="measuring the error")
    err2, norm2 = red.sums(err2, norm2)
    t3 = time.perf_counter()
    return _result(
        sol,
        u=u,
        space=space,
        l2_error=float(np.sqrt(err2)),
        l2_norm=float(np.sqrt(norm2)),
        timings={"setup": t1 - t0, "solve": t2 - t1, "error": t3 - t2, **comm_s,
                 **({} if phases is None else
                    dict(phases, cg_other=t2 - t1 - phases["apply"]))},
        device=where,
        distribution=distribution(space, M.halo, gpu, path),
    )

