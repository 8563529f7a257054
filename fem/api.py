"""The entry points of :mod:`smalltc.fem` that take ``comm=``: serial or distributed.

The serial modules (:mod:`~smalltc.fem.operators`, :mod:`~smalltc.fem.projection`,
:mod:`~smalltc.fem.solvers`) know nothing of MPI; :mod:`smalltc.fem.distributed`
builds on them. These functions are what ``smalltc.fem`` exports under the
serial names: without ``comm`` (and without a distributed mesh or space) they are
the serial functions; with it they send the call to the distributed layer,
imported only then. Every other parameter is the serial function's.
"""

import numpy as np

from smalltc._arrays import array_module

from . import operators as _operators
from . import projection as _projection
from . import solvers as _solvers

__all__ = ["mass_operator", "diffusion_operator", "helmholtz_operator", "l2_project", "cg"]


def _distributed(obj, comm):
    return comm is not None or hasattr(obj, "partition")


def mass_operator(space, nq=None, rho=None, *, comm=None, **kwargs):
    """The mass operator of ``space`` (:func:`smalltc.fem.operators.mass_operator`), or,
    with ``comm`` (an mpi4py communicator; collective) or a
    :class:`~smalltc.fem.distributed.DistributedH1Space`, the distributed one: a
    :class:`~smalltc.fem.distributed.DistributedMassOperator` on this rank's block of
    ``space.mesh``, whose ``.space`` numbers the local vectors it takes (box meshes
    only).

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> mass_operator(H1Space(box_mesh(2, 2), p=1)).shape
    (9, 9)
    """
    if _distributed(space, comm):
        # the distributed layer loads for comm= only, not with every `import smalltc.fem`
        from .distributed.operators import distributed_mass_operator  # loaded for comm=
        return distributed_mass_operator(space, nq, rho, comm=comm, **kwargs)
    return _operators.mass_operator(space, nq, rho, **kwargs)


def diffusion_operator(space, nq=None, kappa=None, *, comm=None, **kwargs):
    """The diffusion operator of ``space`` (:func:`smalltc.fem.operators.diffusion_operator`),
    or, with ``comm`` (collective) or a
    :class:`~smalltc.fem.distributed.DistributedH1Space`, the distributed one: a
    :class:`~smalltc.fem.distributed.DistributedOperator` on this rank's elements
    (:func:`~smalltc.fem.distributed.distributed_diffusion_operator`).

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> diffusion_operator(H1Space(box_mesh(2, 2), p=1)).shape
    (9, 9)
    """
    if _distributed(space, comm):
        from .distributed.operators import distributed_diffusion_operator  # loaded for comm=
        return distributed_diffusion_operator(space, nq, kappa, comm=comm, **kwargs)
    return _operators.diffusion_operator(space, nq, kappa, **kwargs)


def helmholtz_operator(space, alpha, nq=None, kappa=None, *, comm=None, **kwargs):
    """``alpha M + K`` of ``space`` (:func:`smalltc.fem.operators.helmholtz_operator`), or,
    with ``comm`` (collective) or a :class:`~smalltc.fem.distributed.DistributedH1Space`,
    the distributed one (:func:`~smalltc.fem.distributed.distributed_helmholtz_operator`).

    Examples
    --------
    >>> from smalltc.fem import H1Space, box_mesh
    >>> helmholtz_operator(H1Space(box_mesh(2, 2), p=1), 1.0).shape
    (9, 9)
    """
    if _distributed(space, comm):
        from .distributed.operators import distributed_helmholtz_operator  # loaded for comm=
        return distributed_helmholtz_operator(space, alpha, nq, kappa, comm=comm, **kwargs)
    return _operators.helmholtz_operator(space, alpha, nq, kappa, **kwargs)


def l2_project(mesh, p, f, *, comm=None, **kwargs):
    """L2 projection (:func:`smalltc.fem.projection.l2_project`), or, with ``comm`` (an
    mpi4py communicator) or a :class:`~smalltc.fem.distributed.DistributedMesh`, the
    projection distributed over the ranks: every rank calls it with the same arguments,
    ``mesh`` the whole box mesh (cut into blocks), or a mesh file or unstructured mesh
    (partitioned by METIS on rank 0: :func:`~smalltc.fem.distributed.partition_mesh`);
    only the matrix-free operator is distributed; with a GPU each rank uses the
    node-local rank modulo the device count.

    Raises
    ------
    ValueError, RuntimeError, ConvergenceError
        As the serial function; distributed, also arguments that differ across the
        ranks, a rank count that cannot partition the mesh (on every rank), a missing
        mpi4py or MPI library; ImportError for a file mesh over several ranks without
        pymetis (``smalltc[mpi]``).

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> l2_project(box_mesh(2, 2), 1, lambda x: x[0], device="cpu").l2_error < 1e-12
    True
    """
    if _distributed(mesh, comm):
        from .distributed.projection import l2_project_distributed  # loaded for comm=
        return l2_project_distributed(mesh, p, f, comm=comm, **kwargs)
    return _projection.l2_project(mesh, p, f, **kwargs)


def cg(apply, b, *, comm=None, **kwargs):
    """Preconditioned CG (:func:`smalltc.fem.solvers.cg`); ``comm`` may also be an mpi4py
    communicator, for which a :class:`~smalltc.fem.distributed.Reducer` is made
    (CUDA-aware for CuPy vectors where MPI is).

    Examples
    --------
    >>> A = np.array([[4.0, 1.0], [1.0, 3.0]])
    >>> print(np.round(cg(lambda x: A @ x, np.array([1.0, 2.0]), tol=1e-12).x, 6))
    [0.090909 0.636364]
    """
    if comm is not None and not hasattr(comm, "sums"):
        from .distributed.comm import Reducer, cuda_aware  # loaded for comm=
        xp = array_module(b)
        comm = Reducer(comm, device_buffers=xp is not np and cuda_aware()[0])
    return _solvers.cg(apply, b, comm=comm, **kwargs)
