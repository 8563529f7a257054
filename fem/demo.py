"""The FEM demonstration behind ``smalltc demo``: project a smooth function.

:func:`projection_demo` meshes the unit box (curved, distorted elements),
L2-projects :func:`smooth_function` onto the order-``p`` space with the
matrix-free mass operator (:func:`smalltc.batched_contract` inside CG), and
returns a plain dictionary a command-line tool can print or dump as JSON.
The solve runs on the GPU when there is one (``device="auto"``).

With ``comm=`` it runs distributed over the ranks of an mpi4py communicator:
each rank builds only its block of the mesh
(:func:`smalltc.fem.distributed.distributed_box_mesh`) and reports its share.
"""

import time

import numpy as np

from smalltc._arrays import array_module

from .mesh import box_mesh
from .api import l2_project

__all__ = ["smooth_function", "projection_demo"]


def smooth_function(x):
    """``sin(pi x) cos(pi y) exp(z)``, dropping the factors of absent coordinates.

    Parameters
    ----------
    x : ndarray, shape (dim, ...)

    Returns
    -------
    ndarray, shape x.shape[1:]
        In ``x``'s array module. ``np.sin`` of a CuPy array works too, but CuPy's first
        NumPy ufunc on a device array imports ``cupyx.scipy`` (SciPy's sparse and special
        modules: about 0.4 s once a process), so this calls the module's own functions.

    Examples
    --------
    >>> print(round(float(smooth_function(np.array([0.5, 0.0, 1.0]))), 6))
    2.718282
    """
    xp = array_module(x)           # CuPy's own ufuncs on a device array (see below)
    val = xp.sin(np.pi * x[0])
    if x.shape[0] > 1:
        val = val * xp.cos(np.pi * x[1])
    if x.shape[0] > 2:
        val = val * xp.exp(x[2])
    return val


def projection_demo(dim=3, p=4, n=6, *, distortion=0.05, geom_order=2, nq=None,
                    operator="matrix-free", tol=1e-12, backend="auto", device="auto", comm=None,
                    timings=None):
    """Project :func:`smooth_function` on a distorted box mesh and report.

    Parameters
    ----------
    dim : int
        1, 2 or 3.
    p : int
        Polynomial order of the space.
    n : int or tuple of int
        Elements per direction (one per direction for a tuple).
    distortion : float
        Amplitude of :func:`smalltc.fem.mesh.sine_distortion`.
    geom_order : int
        Order of the element maps.
    nq : int, optional
        Quadrature points per direction (``p + 2`` by default).
    operator : {"matrix-free", "assembled"}
    tol : float
        CG relative residual target.
    backend : str
        Passed to the smalltc core.
    device : {"auto", "cpu", "gpu"}
        Where the operator and CG run, see
        :func:`smalltc.fem.projection.l2_project`.
    comm : mpi4py communicator, optional
        Run distributed over its ranks (collective; every rank passes the
        same arguments).
    timings : {None, "phases"}
        Distributed: ``"phases"`` also times the operator's applications in CG
        (:func:`smalltc.fem.distributed.projection.l2_project_distributed`).

    Returns
    -------
    dict
        ``dim, p, n, nq, elements, dofs, operator, backend, device,
        iterations, residual, l2_error, relative_l2_error, time_setup_s,
        time_solve_s, time_total_s`` (ints, floats and strings only;
        ``device`` is where it ran, ``"cpu"`` or ``"gpu"``). Distributed, also
        ``cg_dofs_per_s`` (global DoFs times iterations over the solve's time),
        ``ranks, rank, grid, owned_dofs,
        local_dofs, local_elements, rank_dofs_per_s`` (this rank's owned DoFs
        times iterations over its solve time), ``transport,
        transport_reason, gpu, time_halo_s, time_halo_wait_s,
        time_allreduce_s, comm_path, comm_path_reason, phases_s`` (every timed
        phase of this rank); the global entries are the same on every rank.

    Raises
    ------
    ValueError, RuntimeError, ConvergenceError
        As :func:`smalltc.fem.projection.l2_project`.

    Examples
    --------
    >>> r = projection_demo(dim=2, p=2, n=4, device="cpu")
    >>> r["elements"], r["dofs"], r["relative_l2_error"] < 1e-2, r["device"]
    (16, 81, True, 'cpu')
    """
    t0 = time.perf_counter()
    if comm is None:
        mesh = box_mesh(dim, n, geom_order=geom_order, distortion=distortion)
    else:
        from .distributed import distributed_box_mesh   # the MPI layer: loaded for comm=
        mesh = distributed_box_mesh(dim, n, comm, geom_order=geom_order, distortion=distortion)
    extra = {} if comm is None else {"timings": timings}
    res = l2_project(mesh, p, smooth_function, nq=nq, operator=operator, tol=tol, backend=backend,
                     device=device, **extra)
    total = time.perf_counter() - t0
    out = {
        "dim": int(dim),
        "p": int(p),
        "n": int(n) if isinstance(n, (int, np.integer)) else [int(k) for k in n],
        "nq": int(p + 2 if nq is None else nq),
        "elements": int(mesh.nelements),
        "dofs": int(res.space.ndofs),
        "operator": operator,
        "backend": backend,
        "device": res.device,
        "iterations": int(res.iterations),
        "residual": float(res.residual),
        "l2_error": float(res.l2_error),
        "relative_l2_error": float(res.relative_l2_error),
        "time_setup_s": float(res.timings["setup"]),
        "time_solve_s": float(res.timings["solve"]),
        "time_total_s": float(total),
    }
    d = res.distribution
    if d is not None:
        t = res.timings
        out.update(cg_dofs_per_s=float(res.space.ndofs * res.iterations / t["solve"]),
                   ranks=d["ranks"], rank=d["rank"], grid=list(d["grid"]),
                   owned_dofs=d["owned_dofs"], local_dofs=d["local_dofs"],
                   local_elements=d["elements"],
                   rank_dofs_per_s=float(d["owned_dofs"] * res.iterations / t["solve"]),
                   transport=d["transport"], transport_reason=d["transport_reason"], gpu=d["gpu"],
                   time_halo_s=float(t["halo"]), time_halo_wait_s=float(t["halo_wait"]),
                   time_allreduce_s=float(t["allreduce"]), comm_path=d["comm_path"],
                   comm_path_reason=d["comm_path_reason"],
                   phases_s={k: float(v) for k, v in t.items()})
    return out
