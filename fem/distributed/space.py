"""A box mesh and its H1 space split across MPI ranks: each rank holds one block.

:class:`DistributedMesh` is one rank's block of a box mesh, itself a
:class:`~smalltc.fem.mesh.BoxMesh` (``.local``): cut from a mesh every rank built
(:func:`distribute_mesh`), or built alone, block only, without the whole mesh
ever existing anywhere (:func:`distributed_box_mesh`: what large runs use). Both
give the same coordinates, bit for bit.

:class:`DistributedH1Space` is the order-``p`` space on it: the local space
(:attr:`~DistributedH1Space.local`, an :class:`~smalltc.fem.space.H1Space` of
the block, whose numbering is the rank's *local* numbering), which of its nodes
are ghosts (owned by a neighbour, :mod:`.partition`), the halo exchange
(:class:`~.halo.Halo`), and the moves between local and global vectors.

A *local vector* has the local space's ``ndofs`` entries (``nlocal``). In the
form the solver uses ("owner form") its ghost entries are zero, so a sum over
all local entries and all ranks counts every node once; ``forward`` fills the
ghosts with their owners' values ("consistent form"), as the operator's input
and the projection's result have them.

Examples
--------
>>> from mpi4py import MPI
>>> from smalltc.fem import box_mesh
>>> V = DistributedH1Space(distribute_mesh(box_mesh(2, 3), MPI.COMM_SELF), p=2)
>>> V.ndofs, V.nlocal, V.nowned, V.nghosts      # one rank: it owns everything
(49, 49, 49, 0)
"""

from dataclasses import dataclass
from numbers import Real

import numpy as np

from .._device import to_host
from ..mesh import (BOX_REGIONS, BoxMesh, Kershaw, _as_corner, _as_shape, _is_int,
                    _kershaw_shape, _Placement)
from ..quadrature import gauss_lobatto
from ..space import H1Space
from .comm import agree, check_launch, collective, load_mpi, private_comm, spelling
from .halo import Halo
from .partition import box_indices, partition_box

__all__ = ["BlockMesh", "DistributedMesh", "DistributedH1Space", "distribute_mesh",
           "distributed_box_mesh", "distributed_kershaw_mesh",
           "is_distributed_mesh", "mesh_fingerprint"]


_MESH_FIELDS = ("dim", "shape", "geom_order", "lower", "upper", "distortion")


def is_distributed_mesh(mesh):
    """Is ``mesh`` a :class:`DistributedMesh`? (By its attributes: the package may be
    imported under two names, ``smalltc.fem`` and, in doctests, ``fem``.)"""
    return all(hasattr(mesh, a) for a in ("comm", "partition", "local", "whole"))


def mesh_fingerprint(mesh):
    """What every rank must agree on about a mesh: a dict of plain values.

    A callable distortion is named by its module and qualified name
    (:func:`~.comm.spelling`).

    Examples
    --------
    >>> from smalltc.fem import box_mesh
    >>> mesh_fingerprint(box_mesh(2, 3, distortion=0.05))["shape"]
    (3, 3)
    """
    if is_distributed_mesh(mesh) and hasattr(mesh, "elements"):     # a partitioned file mesh
        return {"dim": mesh.dim, "source": mesh.source, "nelements": mesh.nelements}
    if not hasattr(mesh, "shape"):           # a mesh file or an unstructured mesh
        return {"source": str(getattr(mesh, "source", mesh))}
    base = mesh.whole if is_distributed_mesh(mesh) else mesh
    if not all(hasattr(base, a) for a in _MESH_FIELDS):
        raise TypeError(f"mesh must be a BoxMesh or a DistributedMesh, got {type(mesh).__name__}")
    return {"dim": base.dim, "shape": tuple(base.shape), "geom_order": base.geom_order,
            "lower": tuple(base.lower.tolist()), "upper": tuple(base.upper.tolist()),
            "distortion": spelling(base.distortion)}


@dataclass(frozen=True, eq=False)
class _WholeMesh:
    """The description of the whole mesh (no coordinates): what a block needs of it."""

    dim: int
    shape: tuple
    geom_order: int
    lower: np.ndarray
    upper: np.ndarray
    distortion: object

    @property
    def nelements(self):
        return int(np.prod(self.shape))


@dataclass(frozen=True, eq=False)
class BlockMesh(BoxMesh):
    """One rank's block of a box mesh, a :class:`~smalltc.fem.mesh.BoxMesh` of its own
    whose boundary is the whole mesh's: :meth:`boundary_facets` gives the block's facets
    on the whole box's sides, none on the interfaces with other blocks.

    Attributes
    ----------
    sides : tuple of str
        The whole box's sides (``"xmin"``, ...) the block touches.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> m = distribute_mesh(box_mesh(2, 2), MPI.COMM_SELF).local
    >>> m.sides, m.boundary_facets("ymax")[0].tolist()
    (('xmin', 'xmax', 'ymin', 'ymax'), [1, 3])
    """

    sides: tuple = ()

    def boundary_facets(self, region=None):
        """``(elements, facets)`` of the block on the whole box's boundary (``None``) or
        on one of its sides (none where the block does not touch it).

        Raises
        ------
        KeyError
            For an unknown region, naming the box's.
        """
        if region is not None and region not in self.boundary_regions:
            return BoxMesh.boundary_facets(self, region)          # the KeyError
        names = self.sides if region is None else [n for n in (region,) if n in self.sides]
        if not names:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        parts = [BoxMesh.boundary_facets(self, n) for n in names]
        return np.concatenate([e for e, _ in parts]), np.concatenate([f for _, f in parts])


def _sides(start, stop, shape):
    """The box's sides that the block ``[start, stop)`` of a mesh of ``shape`` touches."""
    out = []
    for d, (a, b, n) in enumerate(zip(start, stop, shape)):
        if a == 0:
            out.append(BOX_REGIONS[2 * d])
        if b == n:
            out.append(BOX_REGIONS[2 * d + 1])
    return tuple(out)


class DistributedMesh:
    """One rank's block of a box mesh; build it with :func:`distribute_mesh` or
    :func:`distributed_box_mesh` (collective: every rank of ``comm`` calls it).

    Attributes
    ----------
    comm : mpi4py communicator
        The user's communicator.
    partition : BlockPartition
    rank : int
    local : BlockMesh
        The block, a mesh of its own (elements in C order within the block; its
        boundary is the whole mesh's).
    whole
        The whole mesh's description: ``dim, shape, geom_order, lower, upper,
        distortion`` (a :class:`~smalltc.fem.mesh.BoxMesh` when it was cut from one).
    start, stop : tuple of int
        The block's element multi-indices in the whole mesh (stop exclusive).
    """

    def __init__(self, comm, partition, whole, local):
        self.comm, self.partition, self.whole, self.local = comm, partition, whole, local
        self.rank = comm.Get_rank()
        self.start, self.stop = partition.block(self.rank)

    @property
    def dim(self):
        return self.whole.dim

    @property
    def shape(self):
        """Elements per direction of the whole mesh."""
        return tuple(self.whole.shape)

    @property
    def nelements(self):
        """Elements of the whole mesh."""
        return int(np.prod(self.shape))

    def __repr__(self):
        return (f"DistributedMesh(rank={self.rank} of {self.partition.nranks}, grid="
                f"{self.partition.grid}, block={self.start}..{self.stop}, whole shape={self.shape})")


def _block_corners(whole, start, stop):
    lo, hi = whole.lower, whole.upper
    n = np.asarray(whole.shape, dtype=np.float64)
    return (lo + (hi - lo) * np.asarray(start) / n, lo + (hi - lo) * np.asarray(stop) / n)


def _partition(comm, shape):
    """The partition of ``shape`` over ``comm``'s ranks (raises on every rank alike)."""
    check_launch(comm)
    return partition_box(shape, comm.Get_size())


def distribute_mesh(mesh, comm):
    """Cut this rank's block out of ``mesh`` (built the same on every rank).

    Collective. The arguments are checked to agree across the ranks.

    Parameters
    ----------
    mesh : BoxMesh
        The whole mesh.
    comm : mpi4py communicator

    Returns
    -------
    DistributedMesh

    Raises
    ------
    ValueError
        On every rank: the meshes differ across ranks, or the rank count cannot
        partition the mesh.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> distribute_mesh(box_mesh(3, 2), MPI.COMM_SELF).local.nelements
    8
    """
    # by name: under pytest's --doctest-modules this module is also imported as
    # fem.distributed.space, whose BoxMesh is another class object than smalltc.fem's
    if type(mesh).__name__ != BoxMesh.__name__:
        raise TypeError(f"distribute_mesh cuts box meshes (BoxMesh) into blocks; got a "
                        f"{type(mesh).__name__}: partition a mesh read from a file with "
                        f"smalltc.fem.distributed.partition_mesh")
    load_mpi()
    agree(comm, collective(comm, mesh_fingerprint, mesh, what="the mesh"), "the meshes")
    part = collective(comm, _partition, comm, mesh.shape, what="partitioning")
    start, stop = part.block(comm.Get_rank())
    elems = box_indices((start, stop), ((0,) * mesh.dim, mesh.shape))
    lo, hi = _block_corners(mesh, start, stop)
    local = BlockMesh(mesh.dim, part.block_shape(comm.Get_rank()), mesh.geom_order, lo, hi,
                      mesh.geom_nodes, np.ascontiguousarray(mesh.nodes[elems]), mesh.distortion,
                      sides=_sides(start, stop, mesh.shape))
    return DistributedMesh(comm, part, mesh, local)


def distributed_box_mesh(dim, n, comm, *, geom_order=1, distortion=0.0, lower=0.0, upper=1.0):
    """This rank's block of ``box_mesh(dim, n, ...)``, built without the whole mesh.

    Collective; the arguments are those of :func:`smalltc.fem.box_mesh` and are
    checked to agree across the ranks. Each rank computes the coordinates of its
    block's nodes only, with the same arithmetic as the whole mesh (the same bits).

    Returns
    -------
    DistributedMesh

    Raises
    ------
    ValueError
        On every rank: bad or differing arguments, a rank count that cannot
        partition the mesh.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import box_mesh
    >>> m = distributed_box_mesh(2, (4, 3), MPI.COMM_SELF, distortion=0.05)
    >>> bool(np.array_equal(m.local.nodes, box_mesh(2, (4, 3), distortion=0.05).nodes))
    True
    """
    load_mpi()
    whole = collective(comm, _describe_box, dim, n, geom_order, distortion, lower, upper,
                       what="the mesh arguments")
    agree(comm, mesh_fingerprint(whole), "the mesh arguments")
    part = collective(comm, _partition, comm, whole.shape, what="partitioning")
    start, stop = part.block(comm.Get_rank())
    nodes1d, _ = gauss_lobatto(whole.geom_order + 1)
    place = _Placement(whole.shape, nodes1d, whole.distortion, whole.lower, whole.upper,
                       start, stop)
    nodes = None                       # placed where they are first used (host or device)
    if callable(whole.distortion) and not isinstance(whole.distortion, Kershaw):
        nodes = collective(comm, place, np, what="placing the mesh nodes")   # a user's map
    lo, hi = _block_corners(whole, start, stop)
    local = BlockMesh(whole.dim, part.block_shape(comm.Get_rank()), whole.geom_order, lo, hi,
                      nodes1d, nodes, whole.distortion, placement=place,
                      sides=_sides(start, stop, whole.shape))
    return DistributedMesh(comm, part, whole, local)


def distributed_kershaw_mesh(n, comm, eps=0.3, *, dim=3, epsz=None, smooth=1, geom_order=1,
                             lower=0.0, upper=1.0, tiles=1):
    """This rank's block of ``kershaw_mesh(n, eps, ...)``, built without the whole mesh.

    Collective; the arguments are those of :func:`smalltc.fem.kershaw_mesh` (checked
    as there, and to agree across the ranks): :func:`distributed_box_mesh` with the
    :class:`~smalltc.fem.mesh.Kershaw` map as its distortion, so each rank's
    coordinates are the whole mesh's, bit for bit.

    Returns
    -------
    DistributedMesh

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import kershaw_mesh
    >>> m = distributed_kershaw_mesh(6, MPI.COMM_SELF, 0.3, dim=2)
    >>> bool(np.array_equal(m.local.nodes, kershaw_mesh(6, 0.3, dim=2).nodes))
    True
    """
    def check():
        kershaw = Kershaw(eps, epsz, smooth, tiles=tiles)
        return _kershaw_shape(n, dim, kershaw), kershaw
    load_mpi()
    shape, kershaw = collective(comm, check, what="the Kershaw mesh arguments")
    return distributed_box_mesh(dim, shape, comm, geom_order=geom_order, distortion=kershaw,
                                lower=lower, upper=upper)


def _describe_box(dim, n, geom_order, distortion, lower, upper):
    """Check ``box_mesh``'s arguments as it does; the whole mesh's description."""
    if not _is_int(dim) or dim not in (1, 2, 3):
        raise ValueError(f"dim must be 1, 2 or 3, got {dim!r}")
    shape = _as_shape(n, dim)
    if not _is_int(geom_order) or geom_order < 1:
        raise ValueError(f"geom_order must be an integer >= 1, got {geom_order!r}")
    lo, hi = _as_corner(lower, dim, "lower"), _as_corner(upper, dim, "upper")
    if np.any(hi <= lo):
        raise ValueError(f"upper must exceed lower in every direction, got lower={lo}, upper={hi}")
    if not callable(distortion) and not (isinstance(distortion, Real) and np.isfinite(distortion)):
        raise ValueError(f"distortion must be a finite amplitude or a callable, got {distortion!r}")
    return _WholeMesh(int(dim), shape, int(geom_order), lo, hi, distortion)


class DistributedH1Space:
    """The order-``p`` H1 space of a :class:`DistributedMesh`, one block per rank.

    Collective (it checks that every rank asks for the same ``p``; its messages
    go over :func:`~.comm.private_comm` of the mesh's communicator).

    Parameters
    ----------
    mesh : DistributedMesh
    p : int

    Attributes
    ----------
    mesh : DistributedMesh
    local : H1Space
        The space of the rank's block: its numbering is the local numbering,
        its ``elem_dofs`` the local element-to-DoF map.
    comm : mpi4py communicator
        :func:`~.comm.private_comm` of the mesh's: smalltc's messages never meet
        the user's.
    partition : BlockPartition
    rank, nranks : int
    p, nd, dim : int
    ndofs : int
        Global DoFs (of the whole mesh's space).
    nlocal, nowned, nghosts : int
        Local vector length; nodes this rank owns; its ghosts.
    sends, recvs : dict rank -> int64 array
        :meth:`~.partition.BlockPartition.exchange_lists`.
    shared : dict rank -> int64 array or None
        :meth:`~.partition.BlockPartition.shared_lists`: the nodes held with each
        neighbour, for the one-exchange neighbour sum (:meth:`~.halo.Halo.sum`); None on
        a partitioned mesh (the sum is then the reverse and forward exchanges).
    ghosts : ndarray of int64
        Local indices of the ghosts, increasing.
    local_to_global : ndarray of int64, shape (nlocal,)
        Global index of each local node.

    Raises
    ------
    ValueError
        On every rank, when ``p`` is bad or differs across ranks.
    """

    def __new__(cls, mesh, p):
        if cls is DistributedH1Space and is_distributed_mesh(mesh) and hasattr(mesh, "elements"):
            from .unstructured import PartitionedH1Space  # cycle: .unstructured imports this
            return super().__new__(PartitionedH1Space)
        return super().__new__(cls)

    def __init__(self, mesh, p):
        if not is_distributed_mesh(mesh):
            raise TypeError(f"mesh must be a DistributedMesh (distribute_mesh or "
                            f"distributed_box_mesh), got {type(mesh).__name__}")
        self._block_space(mesh, p)
        part, p = self.partition, self.p
        self.lattice_shape = tuple(n * p + 1 for n in part.shape)
        self.ndofs = int(np.prod(self.lattice_shape))
        self.nlocal = self.local.ndofs
        lbox = part.local_box(self.rank, p)
        obox = part.owned_box(self.rank, p)
        self.nowned = int(np.prod([b - a for a, b in zip(*obox)]))
        self._boxes = (obox, lbox)            # owned and local_to_global: made when asked for
        self._owned = self._local_to_global = None
        self._exchange(*part.exchange_lists(self.rank, p))
        self.shared = part.shared_lists(self.rank, p)

    @property
    def owned(self):
        """Local indices of the nodes this rank owns, increasing (int64)."""
        if self._owned is None:
            obox, lbox = self._boxes
            self._owned = box_indices(obox, lbox)
        return self._owned

    @owned.setter
    def owned(self, value):
        self._owned = value

    def owned_mask(self, xp=np):
        """Boolean mask over the local nodes, True on those this rank owns, an array of
        ``xp`` (a block's made there from its owned box: no index array).

        Examples
        --------
        >>> from mpi4py import MPI
        >>> from smalltc.fem import box_mesh
        >>> V = DistributedH1Space(distribute_mesh(box_mesh(2, 2), MPI.COMM_SELF), p=1)
        >>> int(V.owned_mask().sum()) == V.nowned == V.nlocal
        True
        """
        boxes = getattr(self, "_boxes", None)
        if boxes is None or self._owned is not None:
            mask = xp.zeros(self.nlocal, dtype=bool)
            mask[xp.asarray(self.owned)] = True
            return mask
        (olo, ohi), (llo, lhi) = boxes
        mask = xp.zeros(tuple(b - a for a, b in zip(llo, lhi)), dtype=bool)
        mask[tuple(slice(a - w, b - w) for a, b, w in zip(olo, ohi, llo))] = True
        return mask.reshape(-1)

    def local_to_global_on(self, xp=np):
        """:attr:`local_to_global` as an array of ``xp`` (a block's made there)."""
        boxes = getattr(self, "_boxes", None)
        if boxes is None or self._local_to_global is not None:
            return xp.asarray(self.local_to_global)
        return box_indices(boxes[1], ((0,) * self.dim, self.lattice_shape), xp)

    @property
    def local_to_global(self):
        """Global index of each local node (int64, ``(nlocal,)``)."""
        if self._local_to_global is None:
            self._local_to_global = box_indices(self._boxes[1],
                                                ((0,) * self.dim, self.lattice_shape))
        return self._local_to_global

    @local_to_global.setter
    def local_to_global(self, value):
        self._local_to_global = value

    def _block_space(self, mesh, p):
        """Checks ``p`` across the ranks; the space of this rank's elements (``local``),
        the mesh, the space's own communicator, the partition, the rank, the order."""
        comm = mesh.comm
        agree(comm, {"p": p}, "the space arguments")
        self.local = collective(comm, H1Space, mesh.local, p, what="building the space")
        self.mesh = mesh
        self.comm = private_comm(comm)
        self.partition = mesh.partition
        self.rank, self.nranks = mesh.rank, mesh.partition.nranks
        self.p, self.nd, self.dim = self.local.p, self.local.nd, self.local.dim

    def _exchange(self, sends, recvs):
        """The exchange lists (rank -> local DoFs sent to it, received from it), the
        ghosts (the received DoFs, sorted) and no halo yet."""
        self.sends, self.recvs = sends, recvs
        self.ghosts = (np.sort(np.concatenate(list(self.recvs.values()))) if self.recvs
                       else np.zeros(0, dtype=np.int64))
        self.nghosts = int(self.ghosts.size)
        self._halos = {}
        self.shared = None              # the neighbour sum's lists, where known

    def __repr__(self):
        return (f"DistributedH1Space(p={self.p}, ndofs={self.ndofs}, rank={self.rank} of "
                f"{self.nranks}, nlocal={self.nlocal}, nowned={self.nowned}, "
                f"nghosts={self.nghosts})")

    @property
    def nelements(self):
        """Elements of this rank's block."""
        return self.local.nelements

    def ghost_elements(self):
        """Boolean mask over the rank's elements: those touching a ghost node."""
        return self.partition.ghost_elements(self.rank)

    def halo(self, xp=np, transport=None):
        """The :class:`~.halo.Halo` of this space for vectors of module ``xp``
        (one per module and transport, made on first use)."""
        key = (xp.__name__, transport)
        h = self._halos.get(key)
        if h is None:
            h = self._halos[key] = Halo(self.comm, self.sends, self.recvs, xp, transport,
                                        self.shared)
        return h

    def make_halo(self, xp=np, transport=None):
        """A new :class:`~.halo.Halo` (its own buffers and timers), e.g. for an operator."""
        return Halo(self.comm, self.sends, self.recvs, xp, transport, self.shared)

    def shared_elements(self):
        """Boolean mask over the rank's elements: those touching a node another rank
        holds too (where the neighbour sum's lists are known; else those touching a
        ghost)."""
        if self.shared is None:
            return self.ghost_elements()
        return self.partition.shared_elements(self.rank, self.p)

    def global_to_local(self, u):
        """A local vector (consistent form) from a global one every rank has, shape (ndofs,)."""
        u = np.asarray(u)
        if u.shape != (self.ndofs,):
            raise ValueError(f"u has shape {u.shape}, expected ({self.ndofs},): a global vector "
                             f"of this space")
        return u[self.local_to_global]

    def gather(self, u, root=0):
        """The global vector from every rank's local one (owned entries), on ``root``.

        Collective. Returns the NumPy array of shape ``(ndofs,)`` on ``root``
        (``root=None``: on every rank) and None elsewhere.
        """
        u = np.ascontiguousarray(to_host(u), dtype=np.float64)
        if u.shape != (self.nlocal,):
            raise ValueError(f"u has shape {u.shape}, expected ({self.nlocal},): this rank's "
                             f"local vector")
        mine = self._owned_values(u)
        every = (self.comm.allgather(mine) if root is None
                 else self.comm.gather(mine, root=root))
        if every is None:
            return None
        out = np.empty(self.ndofs, dtype=np.float64)
        for r, vals in enumerate(every):
            self._place(out, r, vals)
        return out

    def _owned_values(self, u):
        """What :meth:`gather` sends of the local vector ``u``: its owned entries."""
        return u[self.owned]

    def _place(self, out, r, vals):
        """Put rank ``r``'s :meth:`_owned_values` into the global vector ``out``."""
        out[box_indices(self.partition.owned_box(r, self.p),
                        ((0,) * self.dim, self.lattice_shape))] = vals

    def owner_form(self, y, xp=np):
        """Sum the ghosts' values into their owners and zero them (``Halo.reverse``)."""
        return self.halo(xp).reverse(y)

    def consistent_form(self, x, xp=np):
        """Give every ghost its owner's value (``Halo.forward``)."""
        return self.halo(xp).forward(x)
