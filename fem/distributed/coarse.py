"""The coarse (order-1) solve of the distributed p-multigrid.

* :class:`GatheredAMG` (``coarse="amg"``): the order-1 operator assembled on each rank for
  its own elements (the element matrices of :func:`smalltc.fem.diffusion_operator` with
  ``assembled=True``, as COO triplets in the *global* numbering), gathered to rank 0 once
  at setup (``Gatherv``), summed there into the global CSR matrix with the constrained
  DoFs made identity rows and columns, exactly as the serial p-multigrid's
  (:func:`smalltc.fem.coarse.assemble_csr`), and handed to pyamg
  (:class:`smalltc.fem.coarse.AMGSolver`, the serial options). Every V-cycle the owned
  entries of the coarse residual are gathered to rank 0 (``Gatherv``), one AMG V-cycle
  solves there, and each rank gets back its owned entries of the correction
  (``Scatterv``): two messages per V-cycle in place of an iterative solve with an
  ``Allreduce`` per iteration. Rank 0 runs the AMG's cycle where the serial p-multigrid
  would: pyamg's on the host for NumPy vectors, the portable one on rank 0's GPU for
  CuPy vectors (:class:`~smalltc.fem.coarse.AMGSolver`'s ``cycle="auto"``). With CuPy
  vectors and NCCL's exchanges (or one rank) the gather and the scatter are NCCL
  sends and receives of device buffers and nothing waits on the host, so the V-cycle
  around it can be one CUDA graph (:class:`~.multigrid.DistributedPMultigrid`);
  otherwise the coarse vectors (small) go through the host with MPI, and rank 0
  replays its AMG cycle as a CUDA graph. The global numbering is the whole mesh's, so
  on any number of ranks rank 0 builds the serial hierarchy (up to the summation order
  of the element matrices).
* :class:`DistributedCG` (``coarse="cg"``): Jacobi-CG with inner products summed across the
  ranks, to a relative tolerance (no gathering; on distorted meshes the coarse problem is
  ill-conditioned and it takes hundreds of iterations per V-cycle).
"""

import numpy as np

from smalltc._arrays import array_module

from .._device import to_host
from .._graph import GraphReplay
from ..coarse import AMGSolver, constrained_csr, element_csr
from ..solvers import cg, jacobi
from .comm import collective, load_mpi

__all__ = ["GatheredAMG", "DistributedCG", "COARSE"]

#: the coarse solves of the distributed p-multigrid, by name
COARSE = ("auto", "amg", "cg")


class DistributedCG:
    """Jacobi-CG on the coarse operator ``A`` (owner form) to ``tol``, inner products
    summed by ``red`` (a :class:`~.comm.Reducer`).

    Attributes
    ----------
    iterations : list of int
        CG iterations of each coarse solve so far.
    """

    def __init__(self, A, red, tol=1e-6):
        self.A, self.red, self.tol = A, red, float(tol)
        self.P = jacobi(A.diagonal())
        self.iterations = []

    def __call__(self, b):
        sol = cg(self.A, b, tol=self.tol, precond=self.P, comm=self.red,
                 raise_on_failure=False)
        self.iterations.append(sol.iterations)
        return sol.x

    def describe(self):
        return f"distributed Jacobi-CG to relative residual {self.tol:g}"


def _local_csr(space, matrices):
    """The rank's element matrices ``(E, m, m)`` summed into a CSR matrix of the global
    numbering (:func:`~smalltc.fem.coarse.element_csr`: on the matrices' device), on the
    host: ``(indptr, indices, data)``."""
    xp = array_module(matrices)
    E, m = matrices.shape[:2]
    dofs = space.local_to_global_on(xp)[space.local.dof_map(xp).reshape(E, m)]
    A = element_csr(matrices, dofs, int(space.ndofs))
    return A.indptr.astype(np.int64), A.indices.astype(np.int64), A.data


class GatheredAMG:
    """The coarse solve on rank 0: the global order-1 matrix gathered once, one AMG
    V-cycle per application (collective).

    Parameters
    ----------
    space : DistributedH1Space
        The order-1 level's space.
    matrices : ndarray, shape (E, m, m)
        The rank's element matrices in its local element order, NumPy or CuPy: each rank
        sums them into its part of the global matrix where they are, rank 0 adds the
        parts.
    free : ndarray of bool, shape (nlocal,)
        The level's free DoFs (local; agreeing across the ranks).
    xp : module
        Where the V-cycle's vectors live (rank 0's AMG cycle runs on its GPU for CuPy).
    nccl : NcclComm, optional
        The ranks' NCCL communicator (:mod:`.nccl`): with CuPy vectors the residual and
        the correction go as NCCL messages of device buffers. Without it CuPy vectors are
        staged through the host (MPI), except on one rank, where nothing is sent.
    **amg
        More keyword arguments of :class:`smalltc.fem.coarse.AMGSolver`.

    Attributes
    ----------
    amg : AMGSolver or None
        On rank 0; None on the others.
    nnz : int
        Of the global matrix (every rank).
    on_device : bool
        Whether the vectors stay on the GPU (no host wait in a call).
    applications : int
        Coarse solves so far.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc import fem
    >>> from smalltc.fem.distributed import DistributedH1Space, distribute_mesh
    >>> V = DistributedH1Space(distribute_mesh(fem.box_mesh(2, 4), MPI.COMM_SELF), 1)
    >>> K = fem.diffusion_operator(V.local, 2, assembled=True)
    >>> free = ~fem.multigrid.boundary_mask(V.local)
    >>> S = GatheredAMG(V, K.matrices, free)
    >>> S.ndofs, S.nnz
    (25, 65)
    >>> b = np.where(free, 1.0, 0.0)
    >>> x = S(b)                                     # one V-cycle on 9 free unknowns
    >>> A = S.amg.ml.levels[0].A
    >>> bool(np.linalg.norm(A @ x - b) < 0.5 * np.linalg.norm(b))
    True
    """

    def __init__(self, space, matrices, free, xp=np, nccl=None, **amg):
        self.MPI = load_mpi()
        self.space, self.xp = space, xp
        comm = self.comm = space.comm
        self.rank, self.ndofs = comm.Get_rank(), int(space.ndofs)
        if matrices.ndim != 3 or matrices.shape[0] != space.nelements:
            raise ValueError(f"matrices has shape {matrices.shape}, expected "
                             f"({space.nelements}, m, m): one matrix per element of this rank")
        free = np.asarray(free, dtype=bool)
        if free.shape != (space.nlocal,):
            raise ValueError(f"free has shape {free.shape}, expected ({space.nlocal},)")
        self.owned = np.asarray(space.owned)
        owned_global = space.local_to_global[self.owned].astype(np.int64)
        fixed_global = space.local_to_global[self.owned[~free[self.owned]]].astype(np.int64)
        # each rank sums its element matrices on its device; rank 0 adds the ranks' sums
        indptr, indices, data = collective(comm, _local_csr, space, matrices,
                                           what="the coarse level's matrix")
        # the owned entries of every rank, in rank order: the gathers' layout on rank 0
        self.counts = np.array(comm.allgather(int(owned_global.size)), dtype=np.int64)
        self.displs = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        self.order = self._gather(owned_global, np.int64)
        fixed = self._gather(fixed_global, np.int64)
        csr = [self._gather(a, a.dtype) for a in (indptr, indices, data)]
        self.amg = collective(comm, self._setup, csr, fixed, amg,
                              what="the AMG coarse solve's setup")
        self.nnz = int(comm.bcast(None if self.amg is None else self.amg.nnz, root=0))
        self._buf = np.empty(int(self.counts.sum()) if self.rank == 0 else 0)
        self.applications = 0
        portable = self.amg is None or self.amg.cycle == "portable"
        self.nccl = nccl
        self.on_device = bool(comm.allreduce(int(
            xp is not np and portable and (nccl is not None or comm.Get_size() == 1)),
            op=self.MPI.MIN))
        self._cycle = None
        if self.on_device:
            self._owned_dev = xp.asarray(self.owned)
            self._got = xp.empty(self.owned.size)                    # the correction's part
            if self.rank == 0:
                self._order_dev = xp.asarray(self.order)
                self._gbuf = xp.empty(int(self.counts.sum()))        # the owned parts, by rank
        elif self.rank == 0 and xp is not np and portable:
            self._cycle = GraphReplay(self.amg, xp, "the gathered AMG cycle")

    def _gather(self, a, dtype):
        """The concatenation of every rank's ``a`` (1D) on rank 0 (``Gatherv``); None
        elsewhere."""
        MPI, comm = self.MPI, self.comm
        a = np.ascontiguousarray(a, dtype=dtype)        # int64 or float64
        counts = comm.gather(int(a.size), root=0)
        if self.rank != 0:
            comm.Gatherv(a, None, root=0)
            return None
        out = np.empty(int(sum(counts)), dtype=dtype)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        mpi_type = MPI.INT64_T if out.dtype == np.int64 else MPI.DOUBLE
        comm.Gatherv(a, (out, counts, displs, mpi_type), root=0)
        return out

    def _setup(self, csr, fixed, amg):
        """Rank 0: the global CSR matrix (the ranks' sums added, then ``F A F + C`` as the
        serial path's: :func:`~smalltc.fem.coarse.constrained_csr`) and its hierarchy;
        None elsewhere."""
        if self.rank != 0:
            return None
        import scipy.sparse as sp
        n = self.ndofs
        indptr, indices, data = csr
        A, lo, at = None, 0, 0
        for r in range(self.comm.Get_size()):             # rank r's indptr, then its entries
            ip = indptr[lo:lo + n + 1]
            nnz = int(ip[-1])
            Ar = sp.csr_matrix((data[at:at + nnz], indices[at:at + nnz], ip), shape=(n, n))
            A = Ar if A is None else A + Ar
            lo, at = lo + n + 1, at + nnz
        free = np.ones(n, dtype=bool)
        free[fixed] = False
        return AMGSolver(constrained_csr(A, free), self.xp, **amg)

    def __call__(self, b):
        """The correction for the coarse residual ``b`` (owner form, ``xp``): owner form."""
        if self.on_device:
            return self._device_call(b)
        MPI, comm = self.MPI, self.comm
        mine = np.ascontiguousarray(to_host(b)[self.owned], dtype=np.float64)
        dt = MPI.DOUBLE
        if self.rank == 0:
            comm.Gatherv(mine, (self._buf, self.counts, self.displs, dt), root=0)
            g = np.zeros(self.ndofs)
            g[self.order] = self._buf
            cycle = self.amg if self._cycle is None else self._cycle
            x = np.asarray(to_host(cycle(self.xp.asarray(g))), dtype=np.float64)
            send = (np.ascontiguousarray(x[self.order]), self.counts, self.displs, dt)
        else:
            comm.Gatherv(mine, None, root=0)
            send = None
        got = np.empty(self.owned.size)
        comm.Scatterv(send, got, root=0)
        out = np.zeros(self.space.nlocal, dtype=np.float64)
        out[self.owned] = got
        self.applications += 1
        return self.xp.asarray(out.astype(b.dtype, copy=False))

    def _device_call(self, b):
        """:meth:`__call__` on the GPU: the owned parts gathered into rank 0's buffer and
        the correction's parts scattered back by NCCL (one group each way), or on one rank
        by a copy; queued, no host wait."""
        xp = self.xp
        mine = xp.take(b, self._owned_dev).astype(np.float64, copy=False)
        counts, displs = self.counts, self.displs
        parts = [(q, int(displs[q]), int(displs[q] + counts[q])) for q in range(counts.size)]
        if self.rank == 0:
            buf = self._gbuf
            buf[:counts[0]] = mine
            if counts.size > 1:
                self.nccl.wait(self.nccl.exchange([], [(q, buf[a:z]) for q, a, z in parts[1:]]))
            g = xp.zeros(self.ndofs)
            g.put(self._order_dev, buf)
            xs = xp.take(self.amg(g), self._order_dev)          # the owned parts, by rank
            if counts.size > 1:
                self.nccl.wait(self.nccl.exchange([(q, xs[a:z]) for q, a, z in parts[1:]], []))
            got = xs[:counts[0]]
        else:
            self.nccl.wait(self.nccl.exchange([(0, mine)], []))
            got = self._got
            self.nccl.wait(self.nccl.exchange([], [(0, got)]))
        out = xp.zeros(self.space.nlocal, dtype=b.dtype)
        out.put(self._owned_dev, got.astype(b.dtype, copy=False))
        self.applications += 1
        return out

    def describe(self):
        where = self.amg.describe() if self.amg is not None else "AMG"
        return f"{where}, gathered on rank 0 of {self.comm.Get_size()}"
