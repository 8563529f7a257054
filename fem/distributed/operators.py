"""The distributed operators (mass, diffusion, Helmholtz): the fused operator on each
rank's elements, plus the halo.

``y = A x`` for local vectors (:mod:`.space`): each rank applies the fused
operator of the family (:func:`smalltc.mass_apply` for mass,
:func:`smalltc.operator_apply` for ``"diffusion"`` (:func:`smalltc.diffusion_apply`)
and ``"helmholtz"``) to its elements in its local numbering, then the
contributions to shared nodes are summed onto their owners. The elements are
split in two sets, so that the messages travel while most of the work runs:

1. start the forward exchange (owners send ``x`` at shared nodes to the ranks
   that hold them as ghosts);
2. *interior* elements (touching no ghost): the fused operator into ``y``;
3. finish the forward exchange: ``x``'s ghosts now hold their owners' values;
4. *ghost* elements (the block's last layer towards each upper neighbour):
   the operator on a compact vector of just their nodes;
5. start the reverse exchange (their results at ghosts go to the owners), add
   their results into ``y``, finish it (received values added to owned nodes,
   ghosts zeroed).

So ``y`` comes out in owner form (zero ghosts) and ``x``'s ghosts are filled in
place. On one rank there is nothing to exchange and ``apply`` is exactly the
serial :class:`~smalltc.fem.operators.Operator` (the same call, the same bits).
On a GPU the interior elements' kernel is queued before the host waits for the
messages, so the exchange overlaps it.
"""

import numpy as np

import smalltc
from smalltc._arrays import is_cupy
from smalltc._validate import check_scalar

from .._device import device_name, resolve_device, to_device
from ..basis import basis_1d
from ..geometry import diffusion_data, mass_data
from ..operators import Operator, _operator_basis
from ..space import H1Space
from .comm import agree, collective, load_mpi, select_gpu, spelling
from .halo import add_at
from .phases import compile_ahead
from .space import DistributedH1Space, distribute_mesh
from .unstructured import partition_mesh

__all__ = ["DistributedOperator", "DistributedMassOperator", "distributed_mass_operator",
           "distributed_diffusion_operator", "distributed_helmholtz_operator"]


class DistributedOperator:
    """Matrix-free operator of the family on a :class:`~.space.DistributedH1Space`
    (fused, per rank): ``qfunc`` ``"mass"``, ``"diffusion"`` or ``"helmholtz"``.

    Collective to build (each rank its own elements' data).

    Parameters
    ----------
    space : DistributedH1Space
    data : ndarray or pair of ndarrays
        The rank's elements' point data, as for :class:`smalltc.fem.operators.Operator`:
        ``D`` (mass, e.g. ``mass_data(space.mesh.local, nq)``), ``Q`` (diffusion),
        ``(D, Q)`` (Helmholtz); NumPy or CuPy (CuPy puts the operator on the GPU).
    B1d : ndarray, shape (nq, nd), or None
        None: the collocated form (not for mass).
    G1d : ndarray, shape (nq, nd), optional
        For diffusion and Helmholtz.
    qfunc : {"mass", "diffusion", "helmholtz"}
    backend : str
        Passed to :func:`smalltc.operator_apply` (:func:`smalltc.mass_apply`).
    deterministic : bool
        Passed to the fused operator (the same bits every run on a GPU).
    transport : str, optional
        The halo's (:class:`~.halo.Halo`); by default chosen at run time.

    Attributes
    ----------
    space, xp, dtype, qfunc, B1d, G1d
    halo : Halo
        This operator's exchange (its ``seconds`` time the halo work).
    interior, boundary : ndarray of int64
        Local element indices of the two sets.

    Raises
    ------
    ValueError
        On every rank, when the data or the bases do not fit some rank's space.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import basis_1d, box_mesh, diffusion_data
    >>> from smalltc.fem.distributed import DistributedH1Space, distribute_mesh
    >>> V = DistributedH1Space(distribute_mesh(box_mesh(2, 3), MPI.COMM_SELF), p=2)
    >>> b = basis_1d(2, 4)
    >>> K = DistributedOperator(V, diffusion_data(V.mesh.local, 4), b.B1d, b.G1d,
    ...                         qfunc="diffusion")
    >>> float(abs(K(np.ones(V.nlocal))).max()) < 1e-12          # K 1 = 0
    True
    """

    def __init__(self, space, data, B1d, G1d=None, *, qfunc="mass", backend="auto",
                 deterministic=False, transport=None):
        collective(space.comm, self._setup, space, data, B1d, G1d, qfunc, backend,
                   deterministic, transport, what=f"building the distributed {qfunc} operator")

    def _setup(self, space, data, B1d, G1d, qfunc, backend, deterministic, transport):
        # the serial operator of the rank's elements: checks the data and the bases, holds
        # them in their module
        local = Operator(space.local, data, B1d, G1d, qfunc=qfunc, backend=backend,
                         deterministic=deterministic)
        xp = local.xp
        self.space, self.xp, self.dtype, self.qfunc = space, xp, local.dtype, qfunc
        self.B1d, self.G1d = local.B1d, local.G1d
        self.backend, self.deterministic = backend, bool(deterministic)
        # the elements touching a node another rank holds (a superset of those touching
        # a ghost): computed after the exchanges start, the rest overlap them
        touching = space.shared_elements()
        self.interior = np.flatnonzero(~touching)
        self.boundary = np.flatnonzero(touching)
        itype = np.int32 if space.nlocal < 2**31 else np.int64
        if self.boundary.size == 0:                     # nothing to exchange: the serial operator
            self.data_int, self.map_int = local.data, local.dof_map
            self.data_bnd = self.map_bnd = self.bdofs = self.ghost_pos = None
        else:
            interior = xp.asarray(self.interior)
            self.data_int = _rows(local.data, interior, xp)
            self.map_int = space.local.dof_rows(interior, xp, itype)   # made where it is used
            self.data_bnd = _rows(local.data, xp.asarray(self.boundary), xp)
            bmap = space.local.dof_rows(self.boundary, np, np.int64)  # the few first ones'
            bdofs = np.unique(bmap)
            self.bdofs = xp.asarray(bdofs)
            self.map_bnd = to_device(np.searchsorted(bdofs, bmap).astype(itype), xp)
        self.halo = space.make_halo(xp, transport)
        self._xb = None                                 # the ghost elements' input, reused
        if self.boundary.size:
            # where the reverse exchange finds each ghost's value: in the halo's ghost order
            # (neighbour by neighbour), as positions in the compact vector of ghost elements
            order = np.concatenate([space.recvs[q] for q in self.halo.recv_ranks]
                                   or [np.zeros(0, dtype=np.int64)])
            self.ghost_pos = xp.asarray(np.searchsorted(bdofs, order))
        self.sum_pos = None                    # where the neighbour sum finds its values
        if self.boundary.size and self.halo.has_sum and self.halo.sum_ranks:
            order = np.concatenate([space.shared[q] for q in self.halo.sum_ranks])
            pos = np.searchsorted(bdofs, order)
            if not np.array_equal(bdofs[np.minimum(pos, bdofs.size - 1)], order):
                raise RuntimeError("a shared node outside the elements that touch one")
            self.sum_pos = xp.asarray(pos)
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
        q = "" if self.qfunc == "mass" else f"qfunc={self.qfunc!r}, "
        nq = (self.B1d if self.B1d is not None else self.G1d).shape[0]
        return (f"{type(self).__name__}({q}dim={s.dim}, p={s.p}, nq={nq}, "
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

    def _apply(self, data, x, emap, out=None):
        if self.qfunc == "mass":
            return smalltc.mass_apply(self.B1d, data, x, emap, out=out,
                                      deterministic=self.deterministic, backend=self.backend)
        return smalltc.operator_apply(self.qfunc, self.B1d, self.G1d, data, x, emap, out=out,
                                      deterministic=self.deterministic, backend=self.backend)

    def _diagonal(self, data, emap, n):
        if self.qfunc == "mass":
            return smalltc.mass_diagonal(self.B1d, data, emap, n,
                                         deterministic=self.deterministic, backend=self.backend)
        return smalltc.operator_diagonal(self.qfunc, self.B1d, self.G1d, data, emap, n,
                                         deterministic=self.deterministic, backend=self.backend)

    def _apply_interior(self, x, out=None):
        """The elements that touch no shared node, into ``out`` (zeros where there are
        none): a local vector of partial sums."""
        if self.interior.size:
            return self._apply(self.data_int, x, self.map_int, out)
        y = self.xp.zeros(self.space.nlocal, dtype=self.dtype) if out is None else out
        if out is not None:
            y.fill(0)
        return y

    def _local_diagonal(self):
        """This rank's elements' part of the diagonal (partial sums at shared nodes)."""
        s = self.space
        if self.interior.size:
            d = self._diagonal(self.data_int, self.map_int, s.nlocal)
        else:
            d = self.xp.zeros(s.nlocal, dtype=self.dtype)
        if self.boundary.size:
            d[self.bdofs] += self._diagonal(self.data_bnd, self.map_bnd, int(self.bdofs.size))
        return d

    def apply(self, x, out=None):
        """``y = A x`` in owner form; ``x``'s ghosts are filled with their owners' values
        (in place when ``x`` is already an array of the operator's module and dtype).

        Collective: every rank calls it the same number of times.
        """
        x = self._vector(x)
        if self.boundary.size == 0 and not self.halo.send_ranks:
            return self._apply(self.data_int, x, self.map_int, out)
        xp, halo = self.xp, self.halo
        fwd = halo.start_forward(x)
        y = self._apply_interior(x, out)
        halo.finish_forward(fwd, x)
        if self.boundary.size:
            xb = self._xb = xp.take(x, self.bdofs, out=self._xb)
            yb = self._apply(self.data_bnd, xb, self.map_bnd)
            rev = halo.start_reverse(yb, self.ghost_pos)
            add_at(y, self.bdofs, yb, xp)
        else:
            rev = halo.start_reverse(y)
        return halo.finish_reverse(rev, y)

    def apply_sum(self, x, out=None):
        """``y = A x`` for a consistent ``x`` (its ghosts hold their owners' values; not
        modified), consistent: every rank's partial sums at its shared nodes completed by
        the neighbour sum (:meth:`~.halo.Halo.sum`: one exchange instead of the forward
        and the reverse ones), sent while the elements that touch no shared node run.

        Collective: every rank calls it the same number of times.
        """
        x = self._vector(x)
        if self.boundary.size == 0 and not self.halo.send_ranks:
            return self._apply(self.data_int, x, self.map_int, out)
        xp, halo = self.xp, self.halo
        if self.sum_pos is None:                # no shared lists: reverse, then forward
            return halo.forward(self.apply(x.copy(), out))
        xb = self._xb = xp.take(x, self.bdofs, out=self._xb)
        yb = self._apply(self.data_bnd, xb, self.map_bnd)
        pending = halo.start_sum(yb, self.sum_pos)
        y = self._apply_interior(x, out)
        add_at(y, self.bdofs, yb, xp)
        return halo.finish_sum(pending, y)

    def diagonal_sum(self):
        """The diagonal of the global matrix at every node this rank holds, ghosts
        included (consistent; the neighbour sum). Collective."""
        return self.halo.sum(self._local_diagonal())

    def summed(self):
        """This operator on consistent vectors (:meth:`apply_sum`), as an operator object
        (``shape``, ``dtype``, ``xp``, call, ``diagonal``)."""
        return _Summed(self)

    def diagonal(self, ghost_value=0.0):
        """The diagonal of the global matrix at this rank's nodes (owner form: ghosts get
        ``ghost_value``; e.g. 1 for :func:`~smalltc.fem.solvers.jacobi`). Collective."""
        s = self.space
        d = self.halo.reverse(self._local_diagonal())
        if ghost_value != 0 and s.nghosts:
            d[self.halo.ghosts] = ghost_value
        return d


class _Summed:
    """A distributed operator on consistent vectors: :meth:`DistributedOperator.apply_sum`
    and its consistent diagonal."""

    def __init__(self, op):
        self.op, self.xp, self.dtype, self.shape = op, op.xp, op.dtype, op.shape

    def __call__(self, x):
        return self.op.apply_sum(x)

    def diagonal(self):
        return self.op.diagonal_sum()


def _rows(data, idx, xp):
    """The point data (an array, or the Helmholtz pair) of the elements ``idx``."""
    if isinstance(data, tuple):
        return tuple(xp.ascontiguousarray(a[idx]) for a in data)
    return xp.ascontiguousarray(data[idx])


class DistributedMassOperator(DistributedOperator):
    """Matrix-free mass operator of a :class:`~.space.DistributedH1Space` (fused, per rank):
    :class:`DistributedOperator` with ``qfunc="mass"`` and the mass signature.

    Parameters
    ----------
    space : DistributedH1Space
    D : ndarray, shape (E_local, nq, ..., nq)
        Quadrature data of the rank's elements (C order within its block), e.g.
        ``mass_data(space.mesh.local, nq)``; NumPy or CuPy (a CuPy ``D`` puts the
        operator on the GPU).
    B1d : ndarray, shape (nq, nd)
    backend, deterministic, transport
        As for :class:`DistributedOperator`.

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
        super().__init__(space, D, B1d, None, qfunc="mass", backend=backend,
                         deterministic=deterministic, transport=transport)

    @property
    def D_int(self):
        return self.data_int

    @property
    def D_bnd(self):
        return self.data_bnd


def _touch(op):
    """Apply ``op`` and take its diagonal once (its kernels built)."""
    op(op.xp.ones(op.shape[0], dtype=op.dtype))
    op.diagonal()


def _space_and_device(space, comm, args, name, device, build=None):
    """The distributed space (cut from ``space``'s mesh when it is serial), after checking
    that the ranks agree on ``args``; selects this rank's GPU for ``device="gpu"``.

    ``build(space, device, comm)``: the operator of the caller (for
    :func:`~.phases.compile_ahead`: the first rank of each node builds and applies it on
    a tiny mesh first, so the node's other ranks load its kernels from the disk cache)."""
    if hasattr(space, "partition"):
        dspace = space
        if comm is not None:
            MPI = load_mpi()
            if MPI.Comm.Compare(comm, space.mesh.comm) not in (MPI.IDENT, MPI.CONGRUENT):
                raise ValueError("comm is not the communicator of the DistributedH1Space")
        comm = space.mesh.comm
    else:
        dspace = None
    agree(comm, args, f"the arguments of {name}")
    if args.get("assembled") or not args.get("fused", True):
        raise ValueError(f"only the fused matrix-free {name.split('_')[0]} operator is "
                         f"distributed (got assembled={args.get('assembled')!r}, "
                         f"fused={args.get('fused')!r})")
    where = collective(comm, lambda: device_name(resolve_device(device)),
                       what="choosing the device")
    agree(comm, {"device": where}, "the devices found")
    if where == "gpu":
        collective(comm, select_gpu, comm, what="selecting a GPU")
    if build is not None:
        compile_ahead(comm, space.mesh, name,
                      lambda mesh1, comm1: _touch(build(H1Space(mesh1, space.p), where, comm1)),
                      **dict(args, p=space.p, device=where))
    if dspace is None:
        if type(space.mesh).__name__ == "BoxMesh":
            dmesh = distribute_mesh(space.mesh, comm)
        else:                               # an unstructured mesh: METIS parts
            dmesh = partition_mesh(space.mesh, comm)
        dspace = DistributedH1Space(dmesh, space.p)
    return dspace, where, resolve_device(where)


def _family_setup(build, coefficients, spelled, space, comm, nq, assembled, quadrature, dtype,
                  backend, device, fused, deterministic):
    """:func:`_space_and_device` of the operator builder ``build`` (its name the
    operator's): the ranks agree on its arguments (``spelled``: its coefficients as
    every rank spells them), and ``build(space, *coefficients, ...)`` compiles its
    kernels ahead on a tiny mesh."""
    args = {**spelled, "nq": nq, "assembled": assembled, "quadrature": quadrature,
            "dtype": np.dtype(dtype).name, "backend": backend, "device": device,
            "fused": fused, "deterministic": bool(deterministic)}
    return _space_and_device(
        space, comm, args, build.__name__[len("distributed_"):], device,
        lambda V, dev, c: build(V, *coefficients, quadrature=quadrature, dtype=dtype,
                                backend=backend, device=dev, deterministic=deterministic,
                                comm=c))


def _diffusion_parts(dspace, nq, kappa, quadrature, dtype, where, xp):
    """``Q`` of this rank's elements (on module ``xp``) and the bases ``B1d, G1d`` of a
    distributed diffusion (or Helmholtz) operator."""
    Q = collective(dspace.comm, diffusion_data, dspace.mesh.local, nq, kappa,
                   quadrature=quadrature, dtype=dtype, device=where, what="computing Q")
    B1d, G1d = _operator_basis(dspace.local, nq, quadrature, xp)
    return xp.asarray(Q), B1d, G1d


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
    dspace, where, xp = _family_setup(
        distributed_mass_operator, (nq, rho), {"rho": spelling(rho)}, space, comm, nq,
        assembled, quadrature, dtype, backend, device, fused, deterministic)
    nq = dspace.p + 2 if nq is None else nq
    D = collective(dspace.comm, mass_data, dspace.mesh.local, nq, rho, quadrature=quadrature,
                   dtype=dtype, device=where, what="computing D")
    B1d = basis_1d(dspace.p, nq, quadrature).B1d
    return DistributedMassOperator(dspace, xp.asarray(D), xp.asarray(B1d), backend=backend,
                                   deterministic=deterministic)


def _default_nq(p, nq, quadrature):
    return p + (1 if quadrature in ("gll", "lobatto", "gauss-lobatto") else 2) if nq is None else nq


def distributed_diffusion_operator(space, nq=None, kappa=None, *, assembled=False,
                                   quadrature="gauss", dtype=np.float64, backend="auto",
                                   device="cpu", fused=True, deterministic=False, comm=None):
    """:func:`smalltc.fem.diffusion_operator` over the ranks of ``comm`` (collective).

    Parameters are those of :func:`distributed_mass_operator`, ``kappa`` (a number or
    a callable, :func:`~smalltc.fem.geometry.diffusion_data`) for ``rho``; ``Q`` is
    computed for this rank's elements only; ``quadrature="gll"`` with ``nq = p + 1``
    is the collocated form.

    Returns
    -------
    DistributedOperator
        With ``qfunc="diffusion"``.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import H1Space, box_mesh
    >>> K = distributed_diffusion_operator(H1Space(box_mesh(2, 3), p=2), comm=MPI.COMM_SELF)
    >>> K.qfunc, K.shape
    ('diffusion', (49, 49))
    """
    dspace, where, xp = _family_setup(
        distributed_diffusion_operator, (nq, kappa), {"kappa": spelling(kappa)}, space, comm,
        nq, assembled, quadrature, dtype, backend, device, fused, deterministic)
    nq = _default_nq(dspace.p, nq, quadrature)
    Q, B1d, G1d = _diffusion_parts(dspace, nq, kappa, quadrature, dtype, where, xp)
    return DistributedOperator(dspace, Q, B1d, G1d, qfunc="diffusion",
                               backend=backend, deterministic=deterministic)


def distributed_helmholtz_operator(space, alpha, nq=None, kappa=None, *, assembled=False,
                                   quadrature="gauss", dtype=np.float64, backend="auto",
                                   device="cpu", fused=True, deterministic=False, comm=None):
    """:func:`smalltc.fem.helmholtz_operator` (``alpha M + K``, one fused operator) over
    the ranks of ``comm`` (collective); parameters as for
    :func:`distributed_diffusion_operator`.

    Returns
    -------
    DistributedOperator
        With ``qfunc="helmholtz"``.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import H1Space, box_mesh
    >>> A = distributed_helmholtz_operator(H1Space(box_mesh(2, 2), p=1), 2.0,
    ...                                    comm=MPI.COMM_SELF)
    >>> print(round(float(A(np.ones(9)).sum()), 12))          # 2 * area
    2.0
    """
    alpha = check_scalar("alpha", alpha)
    dspace, where, xp = _family_setup(
        distributed_helmholtz_operator, (alpha, nq, kappa),
        {"alpha": alpha, "kappa": spelling(kappa)}, space, comm, nq, assembled, quadrature,
        dtype, backend, device, fused, deterministic)
    nq = _default_nq(dspace.p, nq, quadrature)
    D = collective(dspace.comm, mass_data, dspace.mesh.local, nq, alpha, quadrature=quadrature,
                   dtype=dtype, device=where, what="computing D")
    Q, B1d, G1d = _diffusion_parts(dspace, nq, kappa, quadrature, dtype, where, xp)
    return DistributedOperator(dspace, (xp.asarray(D), Q), B1d, G1d,
                               qfunc="helmholtz", backend=backend, deterministic=deterministic)
