"""Unstructured meshes (a mesh file, an :class:`~smalltc.fem.UnstructuredMesh`) across
MPI ranks: partitioned by METIS on rank 0, each rank its part.

Rank 0 reads the mesh (:func:`smalltc.fem.read_mesh`), splits its element graph
(elements joined where they share a facet) into one part per rank with METIS
(pymetis, the optional ``mpi`` extra: ``pip install 'smalltc[mpi]'``), and sends
each rank its elements: their geometry, their corners renumbered locally, the
whole mesh's boundary facets and regions among them (:class:`PartMesh`, whose
boundary is the whole mesh's, not the part's). No rank but 0 ever holds the
whole mesh.

The order-``p`` space of a part (:class:`PartitionedH1Space`, made by
:class:`~.space.DistributedH1Space` for a partitioned mesh) follows the rules of
the box blocks: each rank holds the nodes of its elements in a local numbering;
a node held by several ranks is *owned* by the lowest of them and is a ghost on
the others; the exchange lists go between each pair in increasing global order.
Rank 0 numbers the whole space once and sends each rank its elements' global
DoFs and the lists; the local numbering is the part's own
(:class:`~smalltc.fem.space.H1Space` of :class:`PartMesh`), matched to the
global one node by node.

Examples
--------
>>> from mpi4py import MPI
>>> from smalltc.fem import demo_mesh_path
>>> m = partition_mesh(demo_mesh_path(2), MPI.COMM_SELF)     # one rank: no METIS needed
>>> m.local.nelements, sorted(m.local.boundary_regions)
(16, ['bottom', 'inner', 'left', 'outer'])
"""

from dataclasses import dataclass

import numpy as np

from ..space import H1Space
from ..topology import facet_keys, unique_rows
from ..unstructured import UnstructuredMesh
from ..unstructured import read_mesh
from .comm import agree, check_launch, collective, load_mpi, private_comm
from .space import DistributedH1Space

__all__ = ["PartMesh", "PartitionedMesh", "PartitionedH1Space", "MetisPartition",
           "partition_mesh", "element_graph", "metis_parts"]


def _load_pymetis():
    try:
        import pymetis
    except ImportError as err:
        raise ImportError(
            "partitioning an unstructured mesh over several ranks needs pymetis (METIS): "
            "pip install 'smalltc[mpi]'") from err
    return pymetis


@dataclass(frozen=True, eq=False)
class PartMesh(UnstructuredMesh):
    """One rank's part of an unstructured mesh, a mesh of its own whose boundary is the
    whole mesh's: :meth:`boundary_facets` gives the part's facets on the whole
    mesh's boundary (none on the interfaces with other parts); every named region of
    the whole mesh is in :attr:`boundary_regions` (empty where the part has none).

    Attributes
    ----------
    outer : tuple of two int64 arrays
        ``(elements, facets)`` of the part on the whole mesh's boundary.
    """

    outer: tuple = None

    def boundary_facets(self, region=None):
        if region is None:
            return self.outer[0].copy(), self.outer[1].copy()
        return UnstructuredMesh.boundary_facets(self, region)


@dataclass(frozen=True)
class MetisPartition:
    """Which rank holds each element of an unstructured mesh.

    Attributes
    ----------
    nranks : int
    sizes : tuple of int
        Elements per rank.
    parts : ndarray of int or None
        The rank of every element (on rank 0; None elsewhere).
    """

    nranks: int
    sizes: tuple
    parts: object = None


class PartitionedMesh:
    """One rank's part of an unstructured mesh; build it with :func:`partition_mesh`.

    Attributes
    ----------
    comm : mpi4py communicator
    partition : MetisPartition
    rank : int
    local : PartMesh
    elements : ndarray of int64
        The part's elements' indices in the whole mesh (increasing).
    whole : UnstructuredMesh or None
        The whole mesh on rank 0; None on the others.
    dim : int
    nelements : int
        Elements of the whole mesh.
    source : str
    """

    def __init__(self, comm, partition, local, elements, whole):
        self.comm, self.partition, self.local = comm, partition, local
        self.elements, self.whole = elements, whole
        self.rank = comm.Get_rank()
        self.dim = local.dim
        self.nelements = int(sum(partition.sizes))
        self.source = local.source

    def __repr__(self):
        return (f"PartitionedMesh(rank={self.rank} of {self.partition.nranks}, "
                f"elements={self.local.nelements} of {self.nelements}, "
                f"source={self.source!r})")


def element_graph(vertices, dim):
    """The element graph of a conforming mesh: elements joined where they share a facet,
    as METIS takes it (CSR: ``xadj``, ``adjncy``).

    Examples
    --------
    >>> xadj, adj = element_graph(np.array([[0, 3, 1, 4], [1, 4, 2, 5]]), 2)
    >>> xadj.tolist(), adj.tolist()
    ([0, 1, 2], [1, 0])
    """
    vertices = np.asarray(vertices, dtype=np.int64)
    E, nf = vertices.shape[0], 2 * dim
    keys = facet_keys(vertices, dim).reshape(E * nf, -1)
    inverse, _, counts = unique_rows(keys)
    shared = np.flatnonzero(counts[inverse] == 2)
    order = shared[np.argsort(inverse[shared], kind="stable")]
    a, b = order[0::2] // nf, order[1::2] // nf          # the two elements of each facet
    src = np.concatenate([a, b])
    dst = np.concatenate([b, a])
    by = np.lexsort((dst, src))
    src, dst = src[by], dst[by]
    xadj = np.zeros(E + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=E), out=xadj[1:])
    return xadj, dst


def metis_parts(mesh, nranks):
    """The rank of every element of ``mesh``: METIS (pymetis) on :func:`element_graph`.

    Raises
    ------
    ImportError
        Without pymetis, naming the extra that brings it.
    ValueError
        When the mesh has fewer elements than ranks, or METIS leaves a rank empty.
    """
    if nranks > mesh.nelements:
        raise ValueError(f"cannot partition a mesh of {mesh.nelements} elements into {nranks} "
                         f"parts (one per rank): run at most {mesh.nelements} ranks")
    if nranks == 1:
        return np.zeros(mesh.nelements, dtype=np.int64)
    pymetis = _load_pymetis()
    xadj, adj = element_graph(mesh.vertices, mesh.dim)
    if hasattr(pymetis, "CSRAdjacency"):                 # pymetis 2025 and later
        _, parts = pymetis.part_graph(nranks, adjacency=pymetis.CSRAdjacency(xadj, adj))
    else:
        _, parts = pymetis.part_graph(nranks, xadj=xadj.tolist(), adjncy=adj.tolist())
    parts = np.asarray(parts, dtype=np.int64)
    sizes = np.bincount(parts, minlength=nranks)
    if (sizes == 0).any():
        raise ValueError(f"METIS left rank(s) {np.flatnonzero(sizes == 0).tolist()} without "
                         f"elements (a mesh of {mesh.nelements} elements over {nranks} ranks): "
                         f"run fewer ranks")
    return parts


def _restrict(pairs, keep):
    """``(elements, facets)`` of the whole mesh -> those of the part ``keep`` (global
    element indices, increasing), in local element indices."""
    e, f = (np.asarray(a, dtype=np.int64) for a in pairs)
    mask = np.isin(e, keep)
    return np.searchsorted(keep, e[mask]).astype(np.int64), f[mask]


def _piece(mesh, keep):
    """What rank gets: its elements' geometry, local corners, regions, outer facets."""
    verts = mesh.vertices[keep]
    _, local_verts = np.unique(verts, return_inverse=True)
    regions = {name: _restrict(pair, keep) for name, pair in mesh.boundary_regions.items()}
    outer = _restrict(mesh.boundary_facets(None), keep)
    volumes = {name: np.searchsorted(keep, np.intersect1d(np.asarray(el), keep))
               for name, el in mesh.volume_regions.items()}
    return dict(dim=mesh.dim, geom_order=mesh.geom_order, geom_nodes=mesh.geom_nodes,
                nodes=np.ascontiguousarray(mesh.nodes[keep]),
                vertices=local_verts.reshape(verts.shape).astype(np.int64),
                boundary_regions=regions, volume_regions=volumes, source=mesh.source,
                outer=outer, elements=keep)


def _split(path_or_mesh, nranks):
    """On rank 0: the whole mesh, the parts, and every rank's piece."""
    if isinstance(path_or_mesh, UnstructuredMesh):
        mesh = path_or_mesh
    else:
        mesh = read_mesh(path_or_mesh)
    if not hasattr(mesh, "vertices"):
        raise TypeError(f"mesh must be an UnstructuredMesh or a mesh file, got "
                        f"{type(mesh).__name__}")
    parts = metis_parts(mesh, nranks)
    pieces = [_piece(mesh, np.flatnonzero(parts == r)) for r in range(nranks)]
    return mesh, parts, pieces


def partition_mesh(mesh, comm):
    """This rank's part of an unstructured mesh, partitioned by METIS on rank 0.

    Collective. Rank 0 reads ``mesh`` (a path; an :class:`~smalltc.fem.UnstructuredMesh`
    is taken as it is there), partitions its element graph (:func:`metis_parts`) and
    scatters the parts; the other ranks' ``mesh`` argument is only checked to name the
    same thing.

    Parameters
    ----------
    mesh : str, os.PathLike or UnstructuredMesh
    comm : mpi4py communicator

    Returns
    -------
    PartitionedMesh

    Raises
    ------
    ImportError
        On every rank, for more than one rank without pymetis (``smalltc[mpi]``).
    ValueError, FileNotFoundError
        On every rank: an unreadable mesh, more ranks than elements.
    """
    load_mpi()
    check_launch(comm)
    name = mesh.source if isinstance(mesh, UnstructuredMesh) else str(mesh)
    agree(comm, {"mesh": name}, "the meshes")
    rank, size = comm.Get_rank(), comm.Get_size()
    whole, parts, pieces = (collective(comm, _split, mesh, size, what="partitioning the mesh")
                            if rank == 0 else collective(comm, lambda: (None, None, None),
                                                         what="partitioning the mesh"))
    inner = private_comm(comm)
    piece = inner.scatter(pieces, root=0)
    sizes = tuple(inner.bcast(None if rank else [int((parts == r).sum()) for r in range(size)],
                              root=0))
    elements = piece.pop("elements")
    local = PartMesh(**piece)
    return PartitionedMesh(comm, MetisPartition(size, sizes, parts), local, elements, whole)


def _exchange_plan(space_whole, parts, nranks):
    """On rank 0, for every rank: its elements' global DoFs, and the global DoFs it
    owns that each other rank holds (``sends``) and the ghosts each owns (``recvs``)."""
    G = space_whole.elem_dofs
    holders = [np.unique(G[parts == r]) for r in range(nranks)]
    owner = np.full(space_whole.ndofs, nranks, dtype=np.int64)
    for r in range(nranks - 1, -1, -1):
        owner[holders[r]] = r                         # the lowest holder wins
    plans = []
    for r in range(nranks):
        sends, recvs = {}, {}
        mine = holders[r]
        for q in range(nranks):
            if q == r:
                continue
            both = np.intersect1d(mine, holders[q], assume_unique=True)
            s = both[owner[both] == r]
            g = both[owner[both] == q]
            if s.size:
                sends[q] = s
            if g.size:
                recvs[q] = g
        plans.append(dict(G=np.ascontiguousarray(G[parts == r]), sends=sends, recvs=recvs,
                          owned=mine[owner[mine] == r]))
    return plans


class PartitionedH1Space(DistributedH1Space):
    """The order-``p`` space of a :class:`PartitionedMesh` (what
    :class:`~.space.DistributedH1Space` makes for such a mesh), with the attributes of
    :class:`~.space.DistributedH1Space` (``local``, ``nlocal``, ``nowned``,
    ``ghosts``, ``sends``, ``recvs``, ``local_to_global``, ...). Collective.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> from smalltc.fem import demo_mesh_path
    >>> V = DistributedH1Space(partition_mesh(demo_mesh_path(2), MPI.COMM_SELF), p=2)
    >>> type(V).__name__, V.ndofs == V.nlocal == V.nowned, V.nghosts
    ('PartitionedH1Space', True, 0)
    """

    def __init__(self, mesh, p):
        self._block_space(mesh, p)
        comm = mesh.comm
        self.lattice_shape = None
        if self.rank == 0:
            whole = collective(comm, H1Space, mesh.whole, p, what="numbering the whole space")
            plans = _exchange_plan(whole, mesh.partition.parts, self.nranks)
            ndofs = whole.ndofs
        else:
            collective(comm, lambda: None, what="numbering the whole space")
            plans, ndofs = None, None
        plan = self.comm.scatter(plans, root=0)
        self.ndofs = int(self.comm.bcast(ndofs, root=0))
        L, G = self.local.elem_dofs.ravel(), plan["G"].ravel()
        l2g = np.full(self.local.ndofs, -1, dtype=np.int64)
        l2g[L] = G
        if (l2g < 0).any() or not np.array_equal(l2g[L], G):
            raise RuntimeError("the part's numbering does not match the whole mesh's "
                               "node by node (a non-conforming part?)")
        self.local_to_global = l2g
        self.nlocal = self.local.ndofs
        sorter = np.argsort(l2g)
        to_local = lambda g: sorter[np.searchsorted(l2g, g, sorter=sorter)]  # noqa: E731
        self.owned = np.sort(to_local(plan["owned"]))
        self.nowned = int(self.owned.size)
        self._exchange({q: to_local(g) for q, g in plan["sends"].items()},
                       {q: to_local(g) for q, g in plan["recvs"].items()})
        self._owned_global = plan["owned"]

    def ghost_elements(self):
        """Boolean mask over the rank's elements: those touching a ghost node."""
        is_ghost = np.zeros(self.nlocal, dtype=bool)
        is_ghost[self.ghosts] = True
        E = self.local.nelements
        return is_ghost[self.local.elem_dofs.reshape(E, -1)].any(axis=1)

    def _owned_values(self, u):
        """The owned entries of ``u`` with their global numbers (a part's are not a box)."""
        return (self._owned_global, u[self.owned])

    def _place(self, out, r, vals):
        idx, vals = vals
        out[idx] = vals
