"""Global numbering of vertices, edges, faces and cells: continuous spaces on any
conforming quadrilateral or hexahedral mesh.

An element's nodes of order ``p`` form the lattice ``{0..p}^dim`` in tensor
order. A lattice node belongs to one *entity* of the element: a vertex (every
index 0 or p), an edge (one index inside), a face (two, in 3D) or the cell's
interior. Neighbours share the entities on their common boundary but may see
them in any local orientation: an edge reversed, a face rotated or reflected
(any of its 8 symmetries). The numbering makes their nodes agree by giving each
shared node a key that does not depend on the element that sees it, built from
the entity's global vertex ids:

* an edge with end vertices ``g0`` (at local index 0) and ``g1`` (at ``p``): the
  key is ``(min, max)`` and the position counted from the end with the smaller
  id, ``k`` if ``g0 < g1`` else ``p - k``;
* a face: the key is its four vertex ids sorted, and the position ``(s, t)`` in
  the face's *canonical frame*: the origin at its corner with the smallest
  global id, the first axis along the edge from there towards the neighbouring
  corner with the smaller id. Two elements sharing the face find the same
  origin and axes from the same global ids, so the same ``(s, t)`` for the same
  physical node, whatever their local orientation;
* a vertex its global id; an interior node the element and its local index.

The distinct keys, sorted, are the global DoFs (vertices first, then edges,
faces and interiors). Nothing here depends on ``p`` beyond the lattice, so every
order ``p >= 1`` is numbered the same way. The result is the element-to-DoF map
that gathers a global vector into E-vectors (docs/math.md section 1).
"""

import numpy as np

__all__ = ["corner_multi_indices", "h1_numbering", "unique_rows", "facet_vertices", "facet_keys",
           "boundary_facets_of", "facet_slices", "facet_lattice"]


def corner_multi_indices(dim):
    """The ``2^dim`` corners of the reference cell as ``{0,1}^dim`` multi-indices, C order.

    Examples
    --------
    >>> print(corner_multi_indices(2))
    [[0 0]
     [0 1]
     [1 0]
     [1 1]]
    """
    return np.indices((2,) * dim).reshape(dim, -1).T


def _corner(dim, bits):
    """Flat index (C order over {0,1}^dim) of the corner with the given bits."""
    return int(np.ravel_multi_index(tuple(int(b) for b in bits), (2,) * dim))


def h1_numbering(vertices, dim, p):
    """Element-to-DoF map of the continuous order-``p`` space on a conforming mesh.

    The DoFs are numbered entity by entity, as the sorted keys of the module's
    docstring order them: the vertices by id, then the edges by their pair of vertex
    ids with the ``p - 1`` nodes of each by position, the faces by their sorted vertex
    ids with their ``(p - 1)^2`` nodes by ``(s, t)``, the interiors by element and
    local index. Each kind of entity is found once per element by sorting its keys
    (:func:`unique_rows`), then its nodes are filled in by whole arrays, one local
    entity (12 edges and 6 faces of a hexahedron) at a time.

    Parameters
    ----------
    vertices : ndarray of int, shape (E, 2**dim)
        Global vertex ids of each element's corners, corners in C order of their
        ``{0,1}^dim`` multi-index (the corner ``(1, 0)`` is at ``xi_0 = 1``,
        ``xi_1 = -1``).
    dim : int
        1, 2 or 3.
    p : int
        Order, ``>= 1``.

    Returns
    -------
    elem_dofs : ndarray of int64, shape (E, p+1, ..., p+1)
    ndofs : int

    Examples
    --------
    >>> # two quads sharing the edge of vertices 1 and 4, the second one rotated
    >>> v = np.array([[0, 3, 1, 4], [4, 5, 1, 2]])
    >>> dofs, n = h1_numbering(v, 2, 2)
    >>> n, int(dofs[0, 2, 1]) == int(dofs[1, 1, 0])   # the shared edge's midpoint
    (15, True)
    """
    vertices = np.asarray(vertices, dtype=np.int64)
    E = vertices.shape[0] if vertices.ndim else 0
    if vertices.shape != (E, 2 ** dim):
        raise ValueError(f"vertices has shape {vertices.shape}, expected (E, {2 ** dim})")
    nd, m = p + 1, p - 1
    dofs = np.empty((E,) + (nd,) * dim, dtype=np.int64)
    if E == 0:
        return dofs, 0
    # vertex ids -> 0..nv-1 keeping their order (every comparison below is unchanged)
    _, v = np.unique(vertices, return_inverse=True)
    v = v.reshape(E, 2 ** dim)
    base = int(v.max()) + 1
    corners = corner_multi_indices(dim)
    for c, bits in enumerate(corners):
        dofs[(slice(None),) + tuple(int(b) * p for b in bits)] = v[:, c]
    if m > 0 and dim >= 2:                    # edges: the nodes with one free axis
        local = [(a, bits) for a in range(dim) for bits in corners if bits[a] == 0]
        g0 = np.stack([v[:, _corner(dim, bits)] for a, bits in local], axis=1)
        g1 = np.stack([v[:, _corner(dim, _with(bits, a, 1))] for a, bits in local], axis=1)
        inverse, first, _ = unique_rows(np.stack([np.minimum(g0, g1).ravel(),
                                                  np.maximum(g0, g1).ravel()], axis=1))
        gid = inverse.reshape(g0.shape)
        k = np.arange(1, p)
        for j, (a, bits) in enumerate(local):
            pos = np.where((g0[:, j] < g1[:, j])[:, None], k, p - k)      # (E, p - 1)
            at = tuple(slice(1, p) if b == a else int(bits[b]) * p for b in range(dim))
            dofs[(slice(None),) + at] = base + gid[:, j, None] * m + (pos - 1)
        base += first.size * m
    if m > 0 and dim == 3:                    # faces: two free axes (a, b), axis c fixed
        local = [(c, side) for c in range(3) for side in (0, 1)]
        G = np.empty((E, len(local), 2, 2), dtype=np.int64)
        for j, (c, side) in enumerate(local):
            a, b = (x for x in range(3) if x != c)
            for ja in (0, 1):
                for jb in (0, 1):
                    bits = [0, 0, 0]
                    bits[a], bits[b], bits[c] = ja, jb, side
                    G[:, j, ja, jb] = v[:, _corner(3, bits)]
        flat = G.reshape(E, len(local), 4)
        inverse, first, _ = unique_rows(np.sort(flat, axis=2).reshape(-1, 4))
        gid = inverse.reshape(E, len(local))
        o = np.argmin(flat, axis=2)                                       # the origin corner
        oa, ob = o // 2, o % 2
        nb_a = np.take_along_axis(flat, ((1 - oa) * 2 + ob)[..., None], axis=2)[..., 0]
        nb_b = np.take_along_axis(flat, (oa * 2 + 1 - ob)[..., None], axis=2)[..., 0]
        first_a = nb_a < nb_b
        ia, ib = np.arange(1, p)[:, None], np.arange(1, p)[None, :]
        for j, (c, side) in enumerate(local):
            da = np.abs(ia - oa[:, j, None, None] * p)                    # (E, p - 1, p - 1)
            db = np.abs(ib - ob[:, j, None, None] * p)
            fa = first_a[:, j, None, None]
            s, t = np.where(fa, da, db), np.where(fa, db, da)
            at = tuple(side * p if x == c else slice(1, p) for x in range(3))
            dofs[(slice(None),) + at] = (base + gid[:, j, None, None] * (m * m)
                                         + (s - 1) * m + (t - 1))
        base += first.size * m * m
    if m > 0:                                 # cell interiors, by element then local index
        inner = np.arange(m ** dim, dtype=np.int64).reshape((m,) * dim)
        e = np.arange(E, dtype=np.int64).reshape((E,) + (1,) * dim)
        dofs[(slice(None),) + (slice(1, p),) * dim] = base + e * m ** dim + inner
        base += E * m ** dim
    return dofs, base


def _with(bits, a, value):
    out = [int(b) for b in bits]
    out[a] = value
    return out


def unique_rows(rows):
    """Distinct rows of an integer array in lexicographic order, by one sort.

    What ``numpy.unique(rows, axis=0, return_index=True, return_inverse=True,
    return_counts=True)`` gives, without its comparisons of whole rows: the columns are
    packed into as few int64 keys as their ranges allow (one key for the vertex ids of
    an edge or a face of most meshes) and sorted stably, so the first occurrence of a
    row is its smallest index.

    Parameters
    ----------
    rows : array_like of int, shape (n, k)

    Returns
    -------
    inverse : ndarray of int64, shape (n,)
        The rank of each row among the distinct rows.
    first : ndarray of int64, shape (nu,)
        The index of each distinct row's first occurrence.
    counts : ndarray of int64, shape (nu,)
        How often each distinct row occurs.

    Examples
    --------
    >>> inverse, first, counts = unique_rows([[3, 1], [0, 2], [3, 1], [0, -5]])
    >>> inverse.tolist(), first.tolist(), counts.tolist()
    ([2, 1, 2, 0], [3, 1, 0], [1, 1, 2])
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.ndim != 2:
        raise ValueError(f"rows has shape {rows.shape}, expected (n, k)")
    n = rows.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    lo = rows.min(axis=0)
    spans = [int(h) - int(low) + 1 for h, low in zip(rows.max(axis=0), lo)]
    keys, key, span = [], None, 1
    for c, s in enumerate(spans):             # columns packed while the key fits in 62 bits
        col = rows[:, c] - lo[c] if s < 2 ** 62 else rows[:, c]      # no offset that overflows
        if key is not None and span * s < 2 ** 62:
            key = key * s + col
            span *= s
        else:
            if key is not None:
                keys.append(key)
            key, span = col, s
    keys.append(key)
    if len(keys) == 1:
        order = np.argsort(keys[0], kind="stable")
    else:
        order = np.lexsort(keys[::-1])        # lexsort is stable; its last key is the first
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = False
    for key in keys:
        s = key[order]
        new[1:] |= s[1:] != s[:-1]
    rank = np.cumsum(new) - 1
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = rank
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, n))
    return inverse, order[starts].astype(np.int64), counts.astype(np.int64)


def facet_vertices(dim):
    """Corners of each local facet ``f = 2 a + side`` (side 0 at ``xi_a = -1``), as flat
    corner indices: an int array of shape ``(2 dim, 2**(dim-1))``.

    Examples
    --------
    >>> print(facet_vertices(2))
    [[0 1]
     [2 3]
     [0 2]
     [1 3]]
    """
    corners = corner_multi_indices(dim)
    out = []
    for a in range(dim):
        for side in (0, 1):
            out.append(np.flatnonzero(corners[:, a] == side))
    return np.array(out, dtype=np.int64)


def facet_keys(vertices, dim):
    """Sorted vertex ids of every element facet, shape ``(E, 2 dim, 2**(dim-1))``.

    Examples
    --------
    >>> facet_keys(np.array([[0, 3, 1, 4]]), 2)[0].tolist()
    [[0, 3], [1, 4], [0, 1], [3, 4]]
    """
    fv = facet_vertices(dim)
    return np.sort(vertices[:, fv], axis=2)


def boundary_facets_of(vertices, dim):
    """``(elements, facets)`` of the facets that belong to one element only, and the
    multiplicity of every facet key (for conformity checks), keys in sorted order.

    Examples
    --------
    >>> e, f, counts = boundary_facets_of(np.array([[0, 3, 1, 4], [1, 4, 2, 5]]), 2)
    >>> list(zip(e.tolist(), f.tolist()))      # the shared facet (1, 4) is not there
    [(0, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    """
    vertices = np.asarray(vertices, dtype=np.int64)
    keys = facet_keys(vertices, dim).reshape(-1, 2 ** (dim - 1))
    inverse, _, counts = unique_rows(keys)
    where = np.flatnonzero(counts[inverse] == 1)
    return where // (2 * dim), where % (2 * dim), counts


def facet_slices(dim, nd, f):
    """Index tuple of the lattice nodes of local facet ``f`` in an ``(nd,)*dim`` array.

    Examples
    --------
    >>> np.arange(9).reshape(3, 3)[facet_slices(2, 3, 3)]    # xi_1 = +1
    array([2, 5, 8])
    """
    a, side = divmod(int(f), 2)
    sl = [slice(None)] * dim
    sl[a] = nd - 1 if side else 0
    return tuple(sl)



def facet_lattice(dim, nd):
    """Flat lattice indices of the nodes of every local facet, in the facet's C order:
    an int array of shape ``(2 dim, nd**(dim-1))`` (row ``f`` is
    ``numpy.arange(nd**dim).reshape((nd,) * dim)[facet_slices(dim, nd, f)].ravel()``).

    Examples
    --------
    >>> print(facet_lattice(2, 3))
    [[0 1 2]
     [6 7 8]
     [0 3 6]
     [2 5 8]]
    """
    lattice = np.arange(nd ** dim, dtype=np.int64).reshape((nd,) * dim)
    return np.stack([lattice[facet_slices(dim, nd, f)].ravel() for f in range(2 * dim)])
