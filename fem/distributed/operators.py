"""The distributed mass operator: the fused operator on each rank's block, plus the halo.

``y = M x`` for local vectors (:mod:`.space`): each rank applies
:func:`smalltc.mass_apply` to its elements in its local numbering, then the
contributions to shared nodes are summed onto their owners. The elements are
split in two sets, so that the messages travel while most of the work runs:

1. start the forward exchange (owners send ``x`` at shared nodes to the ranks
   that hold them as ghosts);
2. *interior* elements (touching no ghost): ``mass_apply`` into ``y``;
3. finish the forward exchange: ``x``'s ghosts now hold their owners' values;
4. *ghost* elements (the block's last layer towards each upper neighbour):
   ``mass_apply`` on a compact vector of just their nodes;
5. start the reverse exchange (their results at ghosts go to the owners), add
   their results into ``y``, finish it (received values added to owned nodes,
   ghosts zeroed).

So ``y`` comes out in owner form (zero ghosts) and ``x``'s ghosts are filled in
place. On one rank there is nothing to exchange and ``apply`` is exactly the
serial :class:`~smalltc.fem.operators.MassOperator` (the same call, the same bits).
On a GPU the interior ``mass_apply`` is queued before the host waits for the
messages, so the exchange overlaps it.
"""

import numpy as np

import smalltc
from smalltc._arrays import is_cupy

from .._device import device_name, resolve_device
from ..basis import basis_1d
from ..geometry import mass_data
from ..operators import MassOperator
from .comm import agree, collective, load_mpi, select_gpu, spelling
from .space import DistributedH1Space, distribute_mesh

__all__ = ["DistributedMassOperator", "distributed_mass_operator"]


class DistributedMassOperator:
    """Matrix-free mass operator of a :class:`~.space.DistributedH1Space` (fused, per rank).

    Collective to build (each rank its own block's data).

    Parameters
    ----------
    space : DistributedH1Space
    D : ndarray, shape (E_local, nq, ..., nq)
        Quadrature data of the rank's elements (C order within its block), e.g.
        ``mass_data(space.mesh.local, nq)``; NumPy or CuPy (a CuPy ``D`` puts the
        operator on the GPU).
    B1d : ndarray, shape (nq, nd)
    backend : str
        Passed to :func:`smalltc.mass_apply`.
    deterministic : bool
        Passed to :func:`smalltc.mass_apply` (the same bits every run on a GPU).
    transport : str, optional
        The halo's (:class:`~.halo.Halo`); by default chosen at run time.

    Attributes
    ----------
    space, xp, dtype, B1d
    halo : Halo
        This operator's exchange (its ``seconds`` time the halo work).
    interior, boundary : ndarray of int64
        Local element indices of the two sets.

    Raises
    ------
    ValueError
        On every rank, when ``D`` or ``B1d`` does not fit some rank's space.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import basis_1d, box_mesh, mass_data
    >>> from smalltc.fem.distributed import DistributedH1Space, distribute_mesh
    >>> V = DistributedH1Space(distribute_mesh(box_mesh(2, 3), MPI.COMM_SELF), p=2)
    >>> M = DistributedMassOperator(V, mass_data(V.mesh.local, 4), basis_1d(2, 4).B1d)
    >>> print(round(float(M(np.ones(V.nlocal)).sum()), 12))     # 1^T M 1 = area
    1.0
    """

    def __init__(self, space, D, B1d, *, backend="auto", deterministic=False, transport=None):
        collective(space.comm, self._setup, space, D, B1d, backend, deterministic, transport,
                   what="building the distributed mass operator")

    def _setup(self, space, D, B1d, backend, deterministic, transport):
        # the serial operator of the block: checks D and B1d, holds them in their module
        local = MassOperator(space.local, D, B1d, backend=backend, deterministic=deterministic)
        xp = local.xp
        self.space, self.xp, self.dtype = space, xp, local.dtype
        self.B1d, self.backend, self.deterministic = local.B1d, backend, bool(deterministic)
        ghost_el = space.partition.ghost_elements(space.rank)
        self.interior = np.flatnonzero(~ghost_el)
        self.boundary = np.flatnonzero(ghost_el)
        emap = space.local.elem_dofs
        itype = np.int32 if space.nlocal < 2**31 else np.int64
        if self.boundary.size == 0:                     # nothing to exchange: the serial operator
            self.D_int, self.map_int = local.D, local.dof_map
            self.D_bnd = self.map_bnd = self.bdofs = self.ghost_pos = None
        else:
            self.D_int = xp.ascontiguousarray(local.D[xp.asarray(self.interior)])
            self.map_int = xp.asarray(emap[self.interior].astype(itype))
            self.D_bnd = xp.ascontiguousarray(local.D[xp.asarray(self.boundary)])
            bmap = emap[self.boundary]
            bdofs = np.unique(bmap)
            self.bdofs = xp.asarray(bdofs)
            self.map_bnd = xp.asarray(np.searchsorted(bdofs, bmap).astype(itype))
        self.halo = space.make_halo(xp, transport)
        if self.boundary.size:
            # where the reverse exchange finds each ghost's value: in the halo's ghost order
            # (neighbour by neighbour), as positions in the compact vector of ghost elements
            order = np.concatenate([space.recvs[q] for q in self.halo.recv_ranks])
            self.ghost_pos = xp.asarray(np.searchsorted(bdofs, order))
        return self

    @property
    def shape(self):
        """``(nlocal, nlocal)``: the local block of the operator."""
        return (self.space.nlocal, self.space.nlocal)

    @property
    def device(self):
        return "cpu" if self.xp is np else "gpu"

    @property
    def comm(self):
        return self.space.comm

    def __repr__(self):
        s = self.space
        where = "" if self.xp is np else ", device='gpu'"
        return (f"DistributedMassOperator(dim={s.dim}, p={s.p}, nq={self.B1d.shape[0]}, "
                f"rank={s.rank} of {s.nranks}, E_local={s.nelements} ({self.boundary.size} "
                f"touch ghosts), nlocal={s.nlocal}, dtype={self.dtype}, "
                f"transport={self.halo.transport!r}{where})")

    def __call__(self, x):
        return self.apply(x)

    def _vector(self, x):
        if self.xp is np and is_cupy(x):
            raise TypeError("x is a CuPy array but this operator's data are on the host")
        x = self.xp.asarray(x, dtype=self.dtype)
        if x.shape != (self.space.nlocal,):
            raise ValueError(f"x has shape {x.shape}, expected ({self.space.nlocal},): this "
                             f"rank's local vector (the distributed operator takes one component)")
        return x

    def _mass(self, D, x, emap, out=None):
        return smalltc.mass_apply(self.B1d, D, x, emap, out=out, deterministic=self.deterministic,
                                  backend=self.backend)

    def apply(self, x, out=None):
        """``y = M x`` in owner form; ``x``'s ghosts are filled with their owners' values
        (in place when ``x`` is already an array of the operator's module and dtype).

        Collective: every rank calls it the same number of times.
        """
        x = self._vector(x)
        if self.boundary.size == 0 and not self.halo.send_ranks:
            return self._mass(self.D_int, x, self.map_int, out)
        xp, halo = self.xp, self.halo
        fwd = halo.start_forward(x)
        if self.interior.size:
            y = self._mass(self.D_int, x, self.map_int, out)
        else:
            y = xp.zeros(self.space.nlocal, dtype=self.dtype) if out is None else out
            if out is not None:
                y.fill(0)
        halo.finish_forward(fwd, x)
        if self.boundary.size:
            yb = self._mass(self.D_bnd, x[self.bdofs], self.map_bnd)
            rev = halo.start_reverse(yb, self.ghost_pos)
            y[self.bdofs] += yb
        else:
            rev = halo.start_reverse(y)
        return halo.finish_reverse(rev, y)

    def diagonal(self, ghost_value=0.0):
        """The diagonal of the global matrix at this rank's nodes (owner form: ghosts get
        ``ghost_value``; e.g. 1 for :func:`~smalltc.fem.solvers.jacobi`). Collective."""
        s = self.space
        if self.interior.size:
            d = smalltc.mass_diagonal(self.B1d, self.D_int, self.map_int, s.nlocal,
                                      deterministic=self.deterministic, backend=self.backend)
        else:
            d = self.xp.zeros(s.nlocal, dtype=self.dtype)
        if self.boundary.size:
            db = smalltc.mass_diagonal(self.B1d, self.D_bnd, self.map_bnd, int(self.bdofs.size),
                                       deterministic=self.deterministic, backend=self.backend)
            d[self.bdofs] += db
        self.halo.reverse(d)
        if ghost_value != 0 and s.nghosts:
            d[self.halo.ghosts] = ghost_value
        return d


def distributed_mass_operator(space, nq=None, rho=None, *, assembled=False, quadrature="gauss",
                              dtype=np.float64, backend="auto", device="cpu", fused=True,
                              deterministic=False, comm=None):
    """:func:`smalltc.fem.mass_operator` over the ranks of ``comm`` (collective).

    Parameters
    ----------
    space : H1Space or DistributedH1Space
        An :class:`~smalltc.fem.space.H1Space` of the whole mesh (then ``comm``
        is needed: the mesh is cut into blocks, :func:`~.space.distribute_mesh`),
        or a distributed space.
    nq, rho, quadrature, dtype, backend, device, deterministic
        As for :func:`smalltc.fem.mass_operator`; ``D`` is computed for this
        rank's elements only. ``device="gpu"`` selects this rank's GPU
        (:func:`~.comm.select_gpu`) first.
    assembled, fused
        Must be False and True: only the fused matrix-free operator is distributed.
    comm : mpi4py communicator, optional

    Returns
    -------
    DistributedMassOperator

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import H1Space, box_mesh, mass_operator
    >>> M = mass_operator(H1Space(box_mesh(3, 2), p=1), comm=MPI.COMM_SELF)
    >>> M.shape, M.space.nranks
    ((27, 27), 1)
    """
    if hasattr(space, "partition"):
        dspace = space
        if comm is not None:
            MPI = load_mpi()
            if MPI.Comm.Compare(comm, space.mesh.comm) not in (MPI.IDENT, MPI.CONGRUENT):
                raise ValueError("comm is not the communicator of the DistributedH1Space")
        comm = space.mesh.comm
    else:
        dspace = None
    agree(comm, {"nq": nq, "rho": spelling(rho), "assembled": assembled, "quadrature": quadrature,
                 "dtype": np.dtype(dtype).name, "backend": backend, "device": device,
                 "fused": fused, "deterministic": bool(deterministic)},
          "the arguments of mass_operator")
    if assembled or not fused:
        raise ValueError("only the fused matrix-free mass operator is distributed "
                         f"(got assembled={assembled!r}, fused={fused!r})")
    where = collective(comm, lambda: device_name(resolve_device(device)),
                       what="choosing the device")
    agree(comm, {"device": where}, "the devices found")
    if where == "gpu":
        collective(comm, select_gpu, comm, what="selecting a GPU")
    xp = resolve_device(where)
    if dspace is None:
        dspace = DistributedH1Space(distribute_mesh(space.mesh, comm), space.p)
    nq = dspace.p + 2 if nq is None else nq
    D = collective(comm, mass_data, dspace.mesh.local, nq, rho, quadrature=quadrature,
                   dtype=dtype, device=where, what="computing D")
    B1d = basis_1d(dspace.p, nq, quadrature).B1d
    return DistributedMassOperator(dspace, xp.asarray(D), xp.asarray(B1d), backend=backend,
                                   deterministic=deterministic)

