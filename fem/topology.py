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

__all__ = ["corner_multi_indices", "h1_numbering", "facet_vertices", "facet_keys",
           "boundary_facets_of", "facet_slices"]


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
    E = vertices.shape[0]
    if vertices.shape != (E, 2 ** dim):
        raise ValueError(f"vertices has shape {vertices.shape}, expected (E, {2 ** dim})")
    nd = p + 1
    local = np.indices((nd,) * dim).reshape(dim, -1).T          # (nd^dim, dim)
    keys = np.full((E, local.shape[0], 7), -1, dtype=np.int64)
    eids = np.arange(E, dtype=np.int64)
    for li, idx in enumerate(local):
        on = [int(i) in (0, p) for i in idx]
        free = [a for a in range(dim) if not on[a]]
        m = len(free)
        k = keys[:, li]
        if m == dim:                                            # cell interior
            k[:, 0], k[:, 1], k[:, 2] = dim + 10, eids, li
            continue
        bits = [int(i) // p if on[a] else 0 for a, i in enumerate(idx)]
        if m == 0:
            k[:, 0], k[:, 1] = 0, vertices[:, _corner(dim, bits)]
        elif m == 1:
            (a,) = free
            b0, b1 = list(bits), list(bits)
            b1[a] = 1
            g0, g1 = vertices[:, _corner(dim, b0)], vertices[:, _corner(dim, b1)]
            pos = int(idx[a])
            k[:, 0], k[:, 1], k[:, 2] = 1, np.minimum(g0, g1), np.maximum(g0, g1)
            k[:, 5] = np.where(g0 < g1, pos, p - pos)
        else:                                                   # m == 2: a face in 3D
            a, b = free
            G = np.empty((E, 2, 2), dtype=np.int64)
            for ja in (0, 1):
                for jb in (0, 1):
                    bb = list(bits)
                    bb[a], bb[b] = ja, jb
                    G[:, ja, jb] = vertices[:, _corner(dim, bb)]
            flatG = G.reshape(E, 4)
            o = np.argmin(flatG, axis=1)
            oa, ob = o // 2, o % 2
            nb_a = G[eids, 1 - oa, ob]
            nb_b = G[eids, oa, 1 - ob]
            da = np.abs(int(idx[a]) - oa * p)
            db = np.abs(int(idx[b]) - ob * p)
            first_a = nb_a < nb_b
            k[:, 0] = 2
            k[:, 1:5] = np.sort(flatG, axis=1)
            k[:, 5] = np.where(first_a, da, db)
            k[:, 6] = np.where(first_a, db, da)
    flat = keys.reshape(-1, 7)
    _, inverse = np.unique(flat, axis=0, return_inverse=True)
    ndofs = int(inverse.max()) + 1 if inverse.size else 0
    return inverse.reshape((E,) + (nd,) * dim).astype(np.int64), ndofs


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
    multiplicity of every facet key (for conformity checks).

    Examples
    --------
    >>> e, f, counts = boundary_facets_of(np.array([[0, 3, 1, 4], [1, 4, 2, 5]]), 2)
    >>> list(zip(e.tolist(), f.tolist()))      # the shared facet (1, 4) is not there
    [(0, 0), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    """
    keys = facet_keys(vertices, dim).reshape(-1, 2 ** (dim - 1))
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    mult = counts[inverse]
    where = np.flatnonzero(mult == 1)
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
