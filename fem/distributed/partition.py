"""Block partitions of a box mesh and the DoF ownership they imply (NumPy only, no MPI).

The ``n_0 x ... x n_{dim-1}`` elements of a :class:`~smalltc.fem.mesh.BoxMesh`
are split into a grid of ``P_0 x ... x P_{dim-1}`` blocks, one per rank, ranks
numbered in C order of their grid coordinates (as ``MPI_Cart_create`` does). The
grid is the factorisation of the rank count with the smallest interface (element
faces between blocks); each direction's elements are split into ``P_d`` nearly
equal runs (the first ``n_d mod P_d`` one element longer).

Degrees of freedom of order ``p`` form the global lattice of ``n_d p + 1`` nodes
per direction (:class:`~smalltc.fem.space.H1Space`). A rank whose block holds
elements ``[s_d, e_d)`` along direction ``d`` *holds* the lattice nodes ``[s_d p,
e_d p]`` (its local lattice, numbered in C order: the local space's numbering)
and *owns* ``[s_d p, e_d p)``, with ``e_d p`` too where the block ends the mesh:
the rank below an interface owns it. Held nodes it does not own are its *ghosts*;
each is owned by exactly one other rank, and every global node by exactly one.

All of it is arithmetic on boxes: the nodes a rank ``q`` holds and rank ``r``
owns are the intersection of two boxes, listed in increasing global order, so
both sides compute the same list without talking.

Examples
--------
>>> part = partition_box((4, 6), 6)
>>> part.grid, part.block(4)
((2, 3), ((2, 2), (4, 4)))
>>> part.owned_box(0, p=2), part.local_box(0, p=2)
(((0, 0), (4, 4)), ((0, 0), (5, 5)))
"""

from dataclasses import dataclass
from itertools import product

import numpy as np

__all__ = ["BlockPartition", "partition_box", "process_grid", "box_indices", "suggest_ranks"]


def _factorisations(n, k):
    """Every ordered tuple of ``k`` positive integers whose product is ``n``."""
    if k == 1:
        return [(n,)]
    out = []
    for f in range(1, n + 1):
        if n % f == 0:
            out += [(f,) + rest for rest in _factorisations(n // f, k - 1)]
    return out


def _interface(shape, grid):
    """Element faces between blocks: ``sum_d (P_d - 1) prod_{k != d} n_k``."""
    total = int(np.prod(shape))
    return sum((g - 1) * total // n for n, g in zip(shape, grid))


def process_grid(shape, nranks):
    """The block grid for ``nranks`` ranks on a mesh of ``shape`` elements.

    The factorisation ``P_0 x ... = nranks`` with ``P_d <= n_d`` in every
    direction whose interface is smallest (ties: the one earliest in C order
    of the grid tuple, so every rank picks the same).

    Parameters
    ----------
    shape : tuple of int
        Elements per direction.
    nranks : int

    Returns
    -------
    tuple of int

    Raises
    ------
    ValueError
        When no factorisation fits (naming rank counts that do).

    Examples
    --------
    >>> process_grid((8, 8, 8), 4), process_grid((16, 4), 4), process_grid((8, 2), 2)
    ((1, 2, 2), (4, 1), (2, 1))
    >>> process_grid((2, 2), 5)
    Traceback (most recent call last):
    ...
    ValueError: cannot partition a mesh of 2 x 2 elements into 5 blocks (one per rank): every factorisation of 5 into 2 factors puts more blocks than elements along some direction; rank counts that fit near 5: 4, 2, 1
    """
    shape = tuple(int(n) for n in shape)
    if isinstance(nranks, bool) or not isinstance(nranks, (int, np.integer)) or nranks < 1:
        raise ValueError(f"the rank count must be a positive integer, got {nranks!r}")
    fits = [g for g in _factorisations(int(nranks), len(shape))
            if all(b <= n for b, n in zip(g, shape))]
    if not fits:
        near = suggest_ranks(shape, int(nranks))
        raise ValueError(
            f"cannot partition a mesh of {' x '.join(map(str, shape))} elements into {nranks} "
            f"blocks (one per rank): every factorisation of {nranks} into {len(shape)} factors "
            f"puts more blocks than elements along some direction; rank counts that fit near "
            f"{nranks}: {', '.join(map(str, near))}")
    return min(fits, key=lambda g: (_interface(shape, g), g))


def suggest_ranks(shape, nranks, count=3):
    """Up to ``count`` rank counts that can partition ``shape``, nearest ``nranks`` first.

    Examples
    --------
    >>> suggest_ranks((3,), 5)
    [3, 2, 1]
    """
    limit = int(np.prod(shape))
    ok = [m for m in range(1, min(limit, 2 * nranks + 8) + 1)
          if any(all(b <= n for b, n in zip(g, shape)) for g in _factorisations(m, len(shape)))]
    return sorted(ok, key=lambda m: (abs(m - nranks), -m))[:count]


def _split(n, parts, i):
    """Run ``i`` of ``n`` elements split into ``parts`` nearly equal runs: ``(start, stop)``."""
    q, r = divmod(n, parts)
    start = i * q + min(i, r)
    return start, start + q + (1 if i < r else 0)


def box_indices(box, within, xp=np):
    """Flat C-order indices, inside the box ``within``, of the nodes of ``box``, an array
    of ``xp`` (made there).

    Boxes are ``(lo, hi)`` tuples of lattice multi-indices, ``hi`` exclusive;
    ``box`` lies inside ``within``. The indices increase (C order of a sub-box).

    Examples
    --------
    >>> box_indices(((1, 1), (3, 2)), ((0, 0), (3, 3))).tolist()
    [4, 7]
    """
    (lo, hi), (wlo, whi) = box, within
    wshape = tuple(b - a for a, b in zip(wlo, whi))
    if any(not (w0 <= a <= b <= w1) for a, b, w0, w1 in zip(lo, hi, wlo, whi)):
        raise ValueError(f"box {box} does not lie inside {within}")
    if tuple(lo) == tuple(wlo) and tuple(hi) == tuple(whi):      # the whole box (one rank)
        return xp.arange(int(np.prod(wshape)), dtype=np.int64)
    ranges = [xp.arange(a - w, b - w, dtype=np.int64) for a, b, w in zip(lo, hi, wlo)]
    if any(r.size == 0 for r in ranges):
        return xp.zeros(0, dtype=np.int64)
    # C order: index = sum_d r_d * stride_d, summed in place over broadcast views
    strides = np.cumprod((wshape[1:] + (1,))[::-1])[::-1]
    dim = len(ranges)
    out = xp.empty(tuple(r.size for r in ranges), dtype=np.int64)
    for d, (r, st) in enumerate(zip(ranges, strides)):
        view = (r * int(st)).reshape((1,) * d + (r.size,) + (1,) * (dim - d - 1))
        if d == 0:
            out[...] = view
        else:
            out += view
    return out.ravel()


def _intersect(a, b):
    """The intersection of two boxes, or None when it is empty."""
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x, y) for x, y in zip(a[1], b[1]))
    return (lo, hi) if all(l < h for l, h in zip(lo, hi)) else None


@dataclass(frozen=True)
class BlockPartition:
    """Blocks of a box mesh, one per rank; build it with :func:`partition_box`.

    Attributes
    ----------
    shape : tuple of int
        Elements per direction of the whole mesh.
    grid : tuple of int
        Blocks per direction; ``prod(grid)`` is the rank count.
    """

    shape: tuple
    grid: tuple

    @property
    def nranks(self):
        """Number of blocks (ranks)."""
        return int(np.prod(self.grid))

    @property
    def dim(self):
        return len(self.shape)

    def coords(self, rank):
        """Grid coordinates of ``rank`` (C order)."""
        return tuple(int(c) for c in np.unravel_index(rank, self.grid))

    def rank_of(self, coords):
        """The rank at grid coordinates ``coords``."""
        return int(np.ravel_multi_index(tuple(coords), self.grid))

    def block(self, rank):
        """``(start, stop)``: the element multi-indices of ``rank``'s block, stop exclusive."""
        runs = [_split(n, g, c) for n, g, c in zip(self.shape, self.grid, self.coords(rank))]
        return tuple(r[0] for r in runs), tuple(r[1] for r in runs)

    def block_shape(self, rank):
        """Elements per direction of ``rank``'s block."""
        start, stop = self.block(rank)
        return tuple(b - a for a, b in zip(start, stop))

    def local_box(self, rank, p):
        """The lattice nodes ``rank`` holds, a box ``(lo, hi)`` of global lattice indices."""
        start, stop = self.block(rank)
        return tuple(s * p for s in start), tuple(e * p + 1 for e in stop)

    def owned_box(self, rank, p):
        """The lattice nodes ``rank`` owns: its held box less the upper interfaces."""
        start, stop = self.block(rank)
        return (tuple(s * p for s in start),
                tuple(e * p + (1 if e == n else 0) for e, n in zip(stop, self.shape)))

    def neighbors(self, rank):
        """Ranks whose blocks touch ``rank``'s (faces, edges, corners), increasing."""
        c = self.coords(rank)
        out = set()
        for off in product((-1, 0, 1), repeat=self.dim):
            q = tuple(a + o for a, o in zip(c, off))
            if any(o != 0 for o in off) and all(0 <= x < g for x, g in zip(q, self.grid)):
                out.add(self.rank_of(q))
        return sorted(out)

    def shared(self, holder, owner, p):
        """Global lattice box of the nodes ``holder`` holds as ghosts and ``owner`` owns
        (None when there are none; ``holder != owner``)."""
        return _intersect(self.local_box(holder, p), self.owned_box(owner, p))

    def exchange_lists(self, rank, p):
        """What ``rank`` exchanges with each neighbour, in local (held-lattice) indices.

        Returns
        -------
        sends : dict rank -> int64 array
            Owned nodes of ``rank`` that the neighbour holds as ghosts.
        recvs : dict rank -> int64 array
            Ghosts of ``rank`` that the neighbour owns.

        Both lists of a pair are in increasing global order: ``sends`` of ``r`` to
        ``q`` matches ``recvs`` of ``q`` from ``r`` entry by entry.
        """
        mine = self.local_box(rank, p)
        sends, recvs = {}, {}
        for q in self.neighbors(rank):
            box = self.shared(q, rank, p)
            if box is not None:
                sends[q] = box_indices(box, mine)
            box = self.shared(rank, q, p)
            if box is not None:
                recvs[q] = box_indices(box, mine)
        return sends, recvs

    def shared_lists(self, rank, p):
        """The nodes ``rank`` holds together with each neighbour (both hold them: the
        interfaces' nodes, owned by one of the two or by a third), in local indices:
        dict rank -> int64 array, the pair's lists in the same (global C) order.

        Examples
        --------
        >>> part = partition_box((4,), 2)
        >>> part.shared_lists(0, 2), part.shared_lists(1, 2)
        ({1: array([4])}, {0: array([0])})
        """
        mine = self.local_box(rank, p)
        out = {}
        for q in self.neighbors(rank):
            box = _intersect(mine, self.local_box(q, p))
            if box is not None:
                out[q] = box_indices(box, mine)
        return out

    def shared_elements(self, rank, p):
        """Boolean mask over the block's elements (C order): those touching a node that
        another rank holds too (the first and last layers where the block meets a
        neighbour; a superset of :meth:`ghost_elements`)."""
        start, stop = self.block(rank)
        bshape = tuple(b - a for a, b in zip(start, stop))
        mask = np.zeros(bshape, dtype=bool)
        for q in self.neighbors(rank):
            box = _intersect(self.local_box(rank, p), self.local_box(q, p))
            if box is None:
                continue
            # element e covers lattice nodes e p .. e p + p: it touches [lo, hi) when
            # (lo - p) / p <= e <= (hi - 1) / p
            sl = tuple(slice(max(a, -(-(lo - p) // p)) - a, min(b - 1, (hi - 1) // p) - a + 1)
                       for a, b, lo, hi in zip(start, stop, *box))
            mask[sl] = True
        return mask.ravel()

    def ghost_elements(self, rank):
        """Boolean mask over the block's elements (C order): those touching a ghost node
        (in the last layer along a direction where the block does not end the mesh)."""
        start, stop = self.block(rank)
        bshape = tuple(b - a for a, b in zip(start, stop))
        mask = np.zeros(bshape, dtype=bool)
        for d, (e, n) in enumerate(zip(stop, self.shape)):
            if e < n:
                idx = [slice(None)] * self.dim
                idx[d] = -1
                mask[tuple(idx)] = True
        return mask.ravel()


def partition_box(shape, nranks):
    """Split a box mesh of ``shape`` elements into ``nranks`` blocks.

    Parameters
    ----------
    shape : tuple of int
        Elements per direction (``mesh.shape``).
    nranks : int

    Returns
    -------
    BlockPartition

    Raises
    ------
    ValueError
        When ``nranks`` cannot be split into blocks of at least one element
        (see :func:`process_grid`).

    Examples
    --------
    >>> part = partition_box((5,), 2)
    >>> [part.block(r) for r in range(2)]
    [((0,), (3,)), ((3,), (5,))]
    >>> part.exchange_lists(0, p=2)     # rank 0 holds node 6 (local 6) as a ghost of rank 1
    ({}, {1: array([6])})
    """
    shape = tuple(int(n) for n in shape)
    return BlockPartition(shape, process_grid(shape, nranks))
