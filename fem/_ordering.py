"""Node orderings of quadrilateral and hexahedral cells: gmsh, VTK, and smalltc's.

smalltc stores an element's nodes in *tensor (lexicographic) order*: the array
``nodes[e, :, i_0, ..., i_{dim-1}]`` holds the node at reference coordinates
``(t[i_0], ..., t[i_{dim-1}])`` of ``[-1, 1]^dim``, C order (``i_0`` slowest).
Mesh files list a cell's nodes in their format's order instead: vertices first,
then the nodes inside edges, faces and the cell. This module gives, for each
ordering, the reference coordinates of the nodes in the file's order
(equispaced nodes of the cell's order), and from them the permutation to tensor
order, found by rounding the coordinates onto the lattice (no hand-written
tables to get wrong):

* gmsh (and meshio's ``quad``, ``quad9``, ``quadN``, ``hexahedronN`` read from a
  ``.msh`` file, N > 27): vertices, then the edges' interior nodes along each
  edge, then each face's interior nodes as a smaller quadrilateral of order
  ``p - 2`` in the face's own frame, then the interior as a smaller cell, the
  same rule applied recursively;
* meshio's ``hexahedron27`` (VTK_TRIQUADRATIC_HEXAHEDRON; meshio reorders
  gmsh's 27-node hexahedron to it);
* VTK's Lagrange cells (``VTK_LAGRANGE_QUADRILATERAL``,
  ``VTK_LAGRANGE_HEXAHEDRON``), with the hexahedron's edge order of VTU files
  before format version 2.2 (meshio writes version 0.1, and VTK reads such a
  file with that order).
"""

import numpy as np

__all__ = ["gmsh_reference", "vtk_lagrange_reference", "meshio_reference",
           "to_tensor_permutation", "QUAD_TYPES", "HEX_TYPES", "cell_order"]

_QUAD_V = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], dtype=np.float64)
_QUAD_E = [(0, 1), (1, 2), (2, 3), (3, 0)]
_HEX_V = np.array([[-1, -1, -1], [1, -1, -1], [1, 1, -1], [-1, 1, -1],
                   [-1, -1, 1], [1, -1, 1], [1, 1, 1], [-1, 1, 1]], dtype=np.float64)
_HEX_E = [(0, 1), (0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (2, 6), (3, 7), (4, 5), (4, 7),
          (5, 6), (6, 7)]
_HEX_F = [(0, 3, 2, 1), (0, 1, 5, 4), (0, 4, 7, 3), (1, 2, 6, 5), (2, 3, 7, 6), (4, 5, 6, 7)]

# meshio's cell type names -> (dim, order): the gmsh types meshio knows, plus VTK's
QUAD_TYPES = {"quad": 1, "quad9": 2, "quad16": 3, "quad25": 4, "quad36": 5, "quad49": 6,
              "quad64": 7, "quad81": 8, "quad100": 9, "quad121": 10}
HEX_TYPES = {"hexahedron": 1, "hexahedron27": 2, "hexahedron64": 3, "hexahedron125": 4,
             "hexahedron216": 5, "hexahedron343": 6, "hexahedron512": 7, "hexahedron729": 8,
             "hexahedron1000": 9}
# the VTK_TRIQUADRATIC_HEXAHEDRON order as meshio makes it from gmsh's (meshio's table)
_MESHIO_HEX27 = [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 13, 9, 16, 18, 19, 17, 10, 12, 14, 15,
                 22, 23, 21, 24, 20, 25, 26]


def _vertices_and_edges(V, edges, p):
    """The gmsh order's first points of an order-``p`` cell: its vertices ``V``, then the
    ``p - 1`` inner points of each edge ``(a, b)`` of ``edges``, from ``a`` to ``b``."""
    pts = [V]
    for a, b in edges:
        k = np.arange(1, p)[:, None] / p
        pts.append(V[a] + k * (V[b] - V[a]))
    return pts


def _gmsh_quad(p):
    """(n, 2) gmsh order of the order-``p`` quadrilateral on [-1, 1]^2."""
    if p == 0:
        return np.zeros((1, 2))
    pts = _vertices_and_edges(_QUAD_V, _QUAD_E, p)
    if p >= 2:
        pts.append(_gmsh_quad(p - 2) * ((p - 2) / p))
    return np.concatenate(pts)


def _bilinear(corners, uv):
    """Points ``uv`` of [-1, 1]^2 mapped onto the quadrilateral ``corners`` (4, dim)."""
    u, v = uv[:, 0:1], uv[:, 1:2]
    w = [(1 - u) * (1 - v), (1 + u) * (1 - v), (1 + u) * (1 + v), (1 - u) * (1 + v)]
    return sum(wi * corners[i] for i, wi in enumerate(w)) / 4.0


def _gmsh_hex(p):
    if p == 0:
        return np.zeros((1, 3))
    pts = _vertices_and_edges(_HEX_V, _HEX_E, p)
    if p >= 2:
        inner = _gmsh_quad(p - 2) * ((p - 2) / p)
        for f in _HEX_F:
            pts.append(_bilinear(_HEX_V[list(f)], inner))
        pts.append(_gmsh_hex(p - 2) * ((p - 2) / p))
    return np.concatenate(pts)


def gmsh_reference(dim, p):
    """Reference coordinates of gmsh's order-``p`` quadrilateral (dim 2) or hexahedron
    (dim 3) nodes, in gmsh's order.

    Examples
    --------
    >>> print(gmsh_reference(2, 2)[4:])     # edge midpoints, then the centre
    [[ 0. -1.]
     [ 1.  0.]
     [ 0.  1.]
     [-1.  0.]
     [ 0.  0.]]
    """
    if dim == 1:
        return np.concatenate([[-1.0, 1.0], np.linspace(-1, 1, p + 1)[1:-1]])[:, None]
    return _gmsh_quad(p) if dim == 2 else _gmsh_hex(p)


def vtk_lagrange_reference(dim, p):
    """Reference coordinates of VTK's Lagrange quadrilateral / hexahedron of order ``p``
    in VTK's order (the hexahedron's vertical edges in the order of VTU files before
    version 2.2: (0,4), (1,5), (3,7), (2,6)).

    Examples
    --------
    >>> print(vtk_lagrange_reference(2, 2)[-1])
    [0. 0.]
    """
    idx = np.indices((p + 1,) * dim).reshape(dim, -1).T
    keys = np.array([_vtk_index(tuple(int(v) for v in ijk), p, dim) for ijk in idx])
    out = np.empty((idx.shape[0], dim))
    out[keys] = -1.0 + 2.0 * idx / p
    return out


def _vtk_index(ijk, p, dim):
    """VTK's point index of lattice node ``ijk`` (i along x) of a Lagrange cell."""
    if dim == 2:
        i, j = ijk
        ib, jb = i in (0, p), j in (0, p)
        if ib and jb:
            return (1 if j == 0 else 2) if i else (0 if j == 0 else 3)
        off = 4
        if jb and not ib:   # along x: edge 0 (j = 0) or edge 2 (j = p)
            return off + (i - 1) + (0 if j == 0 else 2 * (p - 1))
        if ib and not jb:   # along y: edge 1 (i = p) or edge 3 (i = 0)
            return off + (j - 1) + ((p - 1) if i else 3 * (p - 1))
        return off + 4 * (p - 1) + (i - 1) + (p - 1) * (j - 1)
    i, j, k = ijk
    ib, jb, kb = i in (0, p), j in (0, p), k in (0, p)
    nb = ib + jb + kb
    if nb == 3:
        return ((2 if j else 1) if i else (3 if j else 0)) + (4 if k else 0)
    off = 8
    q = p - 1
    if nb == 2:
        if not ib:
            return off + (i - 1) + (2 * q if j else 0) + (4 * q if k else 0)
        if not jb:
            return off + (j - 1) + (q if i else 3 * q) + (4 * q if k else 0)
        off += 8 * q
        return off + (k - 1) + q * ((3 if j else 1) if i else (2 if j else 0))
    off += 12 * q
    if nb == 1:
        if ib:
            return off + (j - 1) + q * (k - 1) + (q * q if i else 0)
        off += 2 * q * q
        if jb:
            return off + (i - 1) + q * (k - 1) + (q * q if j else 0)
        off += 2 * q * q
        return off + (i - 1) + q * (j - 1) + (q * q if k else 0)
    off += 6 * q * q
    return off + (i - 1) + q * ((j - 1) + q * (k - 1))


def cell_order(cell_type, nnodes=None):
    """``(dim, order)`` of a meshio cell type smalltc reads, or None.

    ``nnodes`` is the node count of a cell, needed for the VTK Lagrange types
    (whose order the name does not give).

    Examples
    --------
    >>> cell_order("hexahedron27"), cell_order("VTK_LAGRANGE_QUADRILATERAL", 16)
    ((3, 2), (2, 3))
    """
    if cell_type in QUAD_TYPES:
        return 2, QUAD_TYPES[cell_type]
    if cell_type in HEX_TYPES:
        return 3, HEX_TYPES[cell_type]
    if cell_type in ("VTK_LAGRANGE_QUADRILATERAL", "VTK_LAGRANGE_HEXAHEDRON") and nnodes:
        dim = 2 if cell_type == "VTK_LAGRANGE_QUADRILATERAL" else 3
        p = round(nnodes ** (1.0 / dim)) - 1
        if p >= 1 and (p + 1) ** dim == nnodes:
            return dim, p
    return None


def meshio_reference(cell_type, nnodes=None):
    """Reference coordinates of the nodes of a meshio cell in meshio's order.

    Examples
    --------
    >>> meshio_reference("hexahedron27").shape
    (27, 3)
    """
    dp = cell_order(cell_type, nnodes)
    if dp is None:
        raise ValueError(f"cell type {cell_type!r} is not a quadrilateral or hexahedron "
                         "smalltc reads")
    dim, p = dp
    if cell_type.startswith("VTK_LAGRANGE"):
        return vtk_lagrange_reference(dim, p)
    ref = gmsh_reference(dim, p)
    return ref[_MESHIO_HEX27] if cell_type == "hexahedron27" else ref


def to_tensor_permutation(ref, p):
    """``perm`` with ``cell_nodes[perm]`` in tensor (C, lexicographic) order, from the
    reference coordinates ``ref`` (n, dim) of the nodes of an order-``p`` cell.

    Raises
    ------
    ValueError
        If the points are not the equispaced lattice of order ``p``.

    Examples
    --------
    >>> print(to_tensor_permutation(gmsh_reference(2, 1), 1))   # (-1,-1),(-1,1),(1,-1),(1,1)
    [0 3 1 2]
    """
    ref = np.asarray(ref, dtype=np.float64)
    n, dim = ref.shape
    lat = (ref + 1.0) * p / 2.0
    idx = np.rint(lat).astype(np.int64)
    if n != (p + 1) ** dim or np.abs(lat - idx).max() > 1e-9 or idx.min() < 0 or idx.max() > p:
        raise ValueError(f"reference nodes of shape {ref.shape} are not the order-{p} lattice")
    flat = np.ravel_multi_index(tuple(idx.T), (p + 1,) * dim)
    perm = np.empty(n, dtype=np.int64)
    perm[flat] = np.arange(n)
    if np.unique(flat).size != n:
        raise ValueError(f"reference nodes of shape {ref.shape} repeat a lattice point")
    return perm
