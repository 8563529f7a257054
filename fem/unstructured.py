"""Unstructured conforming quadrilateral and hexahedral meshes, read from files.

:class:`UnstructuredMesh` satisfies the mesh protocol the rest of
:mod:`smalltc.fem` uses (as :class:`~smalltc.fem.mesh.BoxMesh` does): ``dim``,
``nelements``, ``geom_order``, ``geom_nodes`` (the 1D reference nodes of the
element maps) and ``nodes`` (each element's geometry nodes in tensor order,
shape ``(E, dim, ng, ..., ng)``), plus the topology a continuous space needs:
``vertices``, the global vertex ids of each element's corners, and the boundary
facets and named regions of :meth:`UnstructuredMesh.boundary_facets`.

:func:`read_mesh` reads one through `meshio <https://github.com/nschloe/meshio>`_
(imported only then): gmsh ``.msh`` files (versions 2 and 4), VTK/VTU and the
other formats meshio reads, with element maps of any order meshio gives
(4/9/16/...-node quadrilaterals, 8/27/64/...-node hexahedra, VTK Lagrange
cells). The nodes are put into tensor order by the permutations of
:mod:`smalltc.fem._ordering`. Physical groups (gmsh) or cell sets (meshio) of
the facets become named boundary regions, those of the cells volume regions.
"""

import contextlib
import io
import os
import sys
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

import smalltc

from ._ordering import HEX_TYPES, QUAD_TYPES, cell_order, meshio_reference, to_tensor_permutation
from .basis import lagrange_basis
from .geometry import check_jacobian, det_jacobian, jacobian, quadrature_data
from .topology import (boundary_facets_of, corner_multi_indices, facet_keys, facet_vertices,
                       unique_rows)

__all__ = ["UnstructuredMesh", "read_mesh", "from_elements"]

_SIMPLICES = ("triangle", "tetra", "wedge", "pyramid")
_SERENDIPITY = ("quad8", "hexahedron20", "hexahedron24")
_LINE_TYPES = ("line",) + tuple(f"line{n}" for n in range(3, 12)) + ("VTK_LAGRANGE_CURVE",)


@dataclass(frozen=True, eq=False)
class UnstructuredMesh:
    """A conforming mesh of quadrilaterals (dim 2) or hexahedra (dim 3).

    Build one with :func:`read_mesh` (a file or a ``meshio.Mesh``) or
    :func:`from_elements` (arrays).

    Attributes
    ----------
    dim : int
    geom_order : int
        Order of the element maps.
    geom_nodes : ndarray, shape (geom_order + 1,)
        1D reference nodes of the maps (equispaced on [-1, 1], as mesh files
        place them).
    nodes : ndarray, shape (E, dim, ng, ..., ng)
        Coordinates of each element's geometry nodes in tensor order.
    vertices : ndarray of int64, shape (E, 2**dim)
        Global vertex ids of the corners, in C order of ``{0,1}^dim``.
    boundary_regions : dict
        Region name -> ``(elements, facets)``: the element and local facet
        ``f = 2 a + side`` of every facet of the region.
    volume_regions : dict
        Region name -> element indices.
    source : str
        Where the mesh came from (a path, or a description).
    """

    dim: int
    geom_order: int
    geom_nodes: np.ndarray
    nodes: np.ndarray
    vertices: np.ndarray
    boundary_regions: dict = field(default_factory=dict)
    volume_regions: dict = field(default_factory=dict)
    source: str = "arrays"

    @property
    def nelements(self):
        """Number of elements ``E``."""
        return int(self.nodes.shape[0])

    @property
    def nvertices(self):
        """Number of distinct vertices."""
        return int(self.vertices.max()) + 1 if self.vertices.size else 0

    @property
    def volume(self):
        """Measure of the meshed domain (a quadrature of ``|J|`` exact for the maps)."""
        return float(quadrature_data(self, self.dim * self.geom_order // 2 + 2).wdetJ.sum())

    def boundary_facets(self, region=None):
        """``(elements, facets)`` of the boundary (``region=None``) or of a named region.

        Parameters
        ----------
        region : str, optional
            A key of :attr:`boundary_regions`.

        Returns
        -------
        elements, facets : ndarray of int64
            Element index and local facet ``f = 2 a + side`` (side 0 at ``xi_a = -1``).

        Raises
        ------
        KeyError
            For an unknown region, naming the regions there are.

        Examples
        --------
        >>> m = from_elements(np.array([[[[0.0, 0.0], [1.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]]))
        >>> e, f = m.boundary_facets()
        >>> e.tolist(), f.tolist()
        ([0, 0, 0, 0], [0, 1, 2, 3])
        """
        if region is None:
            e, f, _ = self._facets
            return e.copy(), f.copy()
        if region not in self.boundary_regions:
            raise KeyError(f"no boundary region {region!r} in the mesh from {self.source}; "
                           f"its boundary regions: {sorted(self.boundary_regions)}")
        return self.boundary_regions[region]

    @cached_property
    def _facets(self):
        """:func:`~smalltc.fem.topology.boundary_facets_of` of the vertices, found once."""
        e, f, counts = boundary_facets_of(self.vertices, self.dim)
        return e.astype(np.int64), f.astype(np.int64), counts

    def refine(self):
        """Split every element into ``2^dim`` children (uniform refinement).

        A child's map is its parent's restricted to a sub-cube, so the refined
        mesh has the same geometry (curved elements stay on their parent's curve);
        regions pass to the children.

        Examples
        --------
        >>> m = from_elements(np.array([[[[0.0, 0.0], [1.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]]))
        >>> r = m.refine()
        >>> r.nelements, r.nvertices, round(r.volume, 12)
        (4, 9, 1.0)
        """
        dim, t = self.dim, self.geom_nodes
        ng = t.size
        # both halves of [-1, 1] at once: rows 0..ng-1 the lower half's nodes, then the upper's
        B = np.concatenate([lagrange_basis(t, (t + 1) / 2 + bit - 1)[0] for bit in (0, 1)])
        both = smalltc.interpolate(B, None, self.nodes, dim=dim)  # (E, dim, 2 ng, ..., 2 ng)
        kids = corner_multi_indices(dim)                          # child bits, C order
        nodes = np.stack([both[(slice(None), slice(None)) +
                               tuple(slice(b * ng, (b + 1) * ng) for b in bits)]
                          for bits in kids], axis=1)
        nodes = nodes.reshape((self.nelements * len(kids),) + self.nodes.shape[1:])
        nk = len(kids)
        boundary = {}
        for name, (e, f) in self.boundary_regions.items():
            ce, cf = [], []
            for k, bits in enumerate(kids):
                on = bits[f // 2] == f % 2
                ce.append(e[on] * nk + k)
                cf.append(f[on])
            boundary[name] = (np.concatenate(ce), np.concatenate(cf))
        volume = {name: (e[:, None] * nk + np.arange(nk)).ravel()
                  for name, e in self.volume_regions.items()}
        return from_elements(nodes, boundary_regions=boundary, volume_regions=volume,
                             source=f"{self.source} (refined)", check=False)

    def __repr__(self):
        return (f"UnstructuredMesh(dim={self.dim}, E={self.nelements}, geom_order={self.geom_order}, "
                f"boundary_regions={sorted(self.boundary_regions)}, "
                f"volume_regions={sorted(self.volume_regions)}, source={self.source!r})")


def _vertex_ids_from_coordinates(corners, tol):
    """Global vertex ids by merging coinciding corner coordinates ``(E, 2^d, dim)``."""
    pts = corners.reshape(-1, corners.shape[-1])
    key = np.rint(pts / tol).astype(np.int64)
    inverse, _, _ = unique_rows(key)
    return inverse.reshape(corners.shape[:2])


def from_elements(nodes, *, vertices=None, boundary_regions=None, volume_regions=None,
                  source="arrays", check=True):
    """An :class:`UnstructuredMesh` from each element's geometry nodes in tensor order.

    Parameters
    ----------
    nodes : array_like, shape (E, dim, ng, ..., ng)
        Coordinates of the geometry nodes of order ``ng - 1`` (equispaced
        reference nodes), coordinate axis first.
    vertices : array_like of int, shape (E, 2**dim), optional
        Global corner ids; by default found by merging coinciding corners.
    boundary_regions, volume_regions : dict, optional
        See :class:`UnstructuredMesh`.
    source : str
    check : bool
        Check conformity and the Jacobians (:func:`check_mesh`).

    Returns
    -------
    UnstructuredMesh

    Examples
    --------
    >>> nodes = np.array([[[[0.0, 0.0], [1.0, 1.0]], [[0.0, 2.0], [0.0, 2.0]]]])  # one quad
    >>> m = from_elements(nodes)
    >>> m.nelements, m.vertices.tolist(), round(m.volume, 12)
    (1, [[0, 1, 2, 3]], 2.0)
    """
    nodes = np.ascontiguousarray(nodes, dtype=np.float64)
    if nodes.ndim < 3 or nodes.shape[1] not in (2, 3) or nodes.ndim != 2 + nodes.shape[1] or \
            len(set(nodes.shape[2:])) != 1 or nodes.shape[2] < 2:
        raise ValueError(f"nodes has shape {nodes.shape}, expected (E, dim, ng, ..., ng) with "
                         "dim 2 or 3 node axes of one length >= 2")
    dim, ng = nodes.shape[1], nodes.shape[2]
    cm = corner_multi_indices(dim) * (ng - 1)
    corners = np.stack([nodes[(slice(None), slice(None)) + tuple(c)] for c in cm], axis=1)
    if vertices is None:
        scale = float(np.abs(nodes).max()) or 1.0
        vertices = _vertex_ids_from_coordinates(corners, 1e-9 * scale)
    vertices = np.asarray(vertices, dtype=np.int64)
    mesh = UnstructuredMesh(dim, ng - 1, np.linspace(-1.0, 1.0, ng), nodes, vertices,
                            dict(boundary_regions or {}), dict(volume_regions or {}), source)
    if check:
        check_mesh(mesh, corners)
    return mesh


def check_mesh(mesh, corners=None):
    """Raise ``ValueError`` for a non-conforming mesh or an inverted element.

    Checks: no facet is shared by more than two elements; distinct vertex ids
    are at distinct points; the boundary closes (in 2D every boundary vertex
    ends two boundary edges, in 3D every boundary edge borders two boundary
    faces: a hanging node breaks this); ``|J| > 0`` at the Gauss points of
    every element (:func:`~smalltc.fem.geometry.check_jacobian` names the
    element).

    Examples
    --------
    >>> m = from_elements(np.array([[[[0.0, 0.0], [1.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]]),
    ...                   check=False)
    >>> check_mesh(m)                         # one unit square: fine
    >>> bad = from_elements(m.nodes[:, :, ::-1], check=False)     # reflected: inverted
    >>> check_mesh(bad)
    Traceback (most recent call last):
    ...
    ValueError: inverted element in the mesh from arrays: tangled mesh: |J| <= 0 at 9 quadrature point(s) of element 0 (min |J| = -0.25); 1 bad element(s) in all
    """
    dim, src = mesh.dim, mesh.source
    v = mesh.vertices
    if v.shape != (mesh.nelements, 2 ** dim):
        raise ValueError(f"vertices has shape {v.shape}, expected ({mesh.nelements}, {2 ** dim})")
    if corners is not None:
        pts = np.zeros((mesh.nvertices, dim))
        pts[v.ravel()] = corners.reshape(-1, dim)
        scale = float(np.abs(pts).max()) or 1.0
        key = np.rint(pts / (1e-9 * scale)).astype(np.int64)
        _, first, counts = unique_rows(key)
        if (counts > 1).any():
            i = int(first[np.flatnonzero(counts > 1)[0]])
            raise ValueError(f"non-conforming mesh from {src}: vertex {i} at {pts[i].tolist()} "
                             "is repeated by another vertex at the same point (unconnected "
                             "elements or duplicate nodes)")
    e, f, counts = mesh._facets if isinstance(mesh, UnstructuredMesh) else \
        boundary_facets_of(v, dim)
    if (counts > 2).any():
        raise ValueError(f"non-conforming mesh from {src}: {int((counts > 2).sum())} facet(s) "
                         "shared by more than two elements")
    if dim == 2:
        sub = facet_keys(v, dim)[e, f].reshape(-1, 1)    # the vertices of boundary edges
    else:                                                 # the edges of boundary faces
        # a face's corners in C order (0,0),(0,1),(1,0),(1,1): edges 0-1, 2-3, 0-2, 1-3
        loc = _face_corner_ids(v, e, f)
        sub = np.concatenate([np.sort(loc[:, [i, j]], axis=1)
                              for i, j in ((0, 1), (2, 3), (0, 2), (1, 3))])
    if sub.size:
        _, first, cnt = unique_rows(sub)
        if (cnt != 2).any():
            what = "vertex" if dim == 2 else "edge"
            bad = sub[first[np.flatnonzero(cnt != 2)[0]]].tolist()
            raise ValueError(f"non-conforming mesh from {src}: boundary {what} {bad} ends "
                             f"{int(cnt[np.flatnonzero(cnt != 2)[0]])} boundary facet(s), not 2 "
                             "(a hanging node, or facets that do not match)")
    pts = np.polynomial.legendre.leggauss(mesh.geom_order + 2)[0]
    try:
        check_jacobian(det_jacobian(jacobian(mesh, pts)))
    except ValueError as err:
        raise ValueError(f"inverted element in the mesh from {src}: {err}") from None


def _face_corner_ids(vertices, e, f):
    """Corner ids of local facets ``f`` of elements ``e`` in the facet's own C order."""
    return vertices[np.asarray(e)[:, None], facet_vertices(3)[np.asarray(f)]].reshape(-1, 4)


def _blocks(m):
    """(type, connectivity, block index) of meshio's cell blocks."""
    return [(b.type, np.asarray(b.data), i) for i, b in enumerate(m.cells)]


def _named_sets(m, blocks):
    """name -> {block index: cell indices}, from cell sets or gmsh physical tags."""
    out = {}
    for name, per_block in (m.cell_sets or {}).items():
        if name.startswith("gmsh:"):
            continue
        d = {}
        for i, idx in enumerate(per_block):
            if idx is not None and len(idx):
                d[i] = np.asarray(idx, dtype=np.int64)
        if d:
            out[name] = d
    if out:
        return out
    phys = (m.cell_data or {}).get("gmsh:physical")
    if phys is None:
        return out
    names = {(int(t), int(dm)): n for n, (t, dm) in ((n, v[:2]) for n, v in
                                                    (m.field_data or {}).items())}
    for (ctype, conn, i) in blocks:
        tags = np.asarray(phys[i]).astype(np.int64)
        cdim = 3 if ctype in HEX_TYPES else (2 if ctype in QUAD_TYPES else 1)
        for t in np.unique(tags):
            name = names.get((int(t), cdim), str(int(t)))
            out.setdefault(name, {})[i] = np.flatnonzero(tags == t)
    return out


def _regions(sets, blocks, offsets, vertices, vmap, dim, name):
    """Boundary regions (facet cells matched to the cells' facets) and volume regions.

    Every facet cell of every region is looked up at once: its sorted corner ids and the
    keys of all the cells' facets are sorted together (:func:`unique_rows`), and a facet
    cell names the first cell facet ``k = 2 dim e + f`` with its key.
    """
    nv, nf = 2 ** (dim - 1), 2 * dim
    fkeys = facet_keys(vertices, dim).reshape(-1, nv)
    btypes = (_LINE_TYPES if dim == 2 else tuple(QUAD_TYPES) + ("VTK_LAGRANGE_QUADRILATERAL",))
    parts = {}                                # (region, block index) -> (type, corner ids)
    for rname, per_block in sets.items():
        for i, idx in per_block.items():
            t, c, _ = blocks[i]
            if i not in offsets and t in btypes:
                parts[rname, i] = t, np.sort(vmap[np.asarray(c)[idx][:, :nv]], axis=1)
    rows = np.concatenate([fkeys] + [r for _, r in parts.values()])
    inverse, first, _ = unique_rows(rows)
    k_all = first[inverse]                    # the first cell facet of each row's key
    ends = fkeys.shape[0] + np.cumsum([0] + [r.shape[0] for _, r in parts.values()])
    where = dict(zip(parts, zip(ends[:-1], ends[1:])))
    boundary, volume = {}, {}
    for rname, per_block in sets.items():
        facets, elems = [], []
        for i, idx in per_block.items():
            if i in offsets:
                elems.append(offsets[i] + idx)
            elif (rname, i) in parts:
                t, corner = parts[rname, i]
                if (corner < 0).any():
                    raise ValueError(f"region {rname!r} of {name}: a {t} cell whose corners "
                                     "are not vertices of the mesh's cells")
                k = k_all[slice(*where[rname, i])]
                missing = np.flatnonzero(k >= fkeys.shape[0])
                if missing.size:
                    raise ValueError(f"region {rname!r} of {name}: the {t} cell with vertices "
                                     f"{corner[missing[0]].tolist()} is not a facet of any cell")
                facets.append(k)
        if sum(k.size for k in facets):
            k = np.unique(np.concatenate(facets))
            boundary[rname] = (k // nf, k % nf)
        if elems:
            volume[rname] = np.unique(np.concatenate(elems))
    return boundary, volume


def read_mesh(source, *, check=True):
    """Read a conforming quadrilateral or hexahedral mesh from a file (or a ``meshio.Mesh``).

    Parameters
    ----------
    source : str, os.PathLike or meshio.Mesh
        A mesh file meshio reads (gmsh ``.msh``, ``.vtu``, ``.vtk``, ...) or
        a mesh meshio made.
    check : bool
        Check conformity and the Jacobians (the default).

    Returns
    -------
    UnstructuredMesh
        Its dimension is the highest of its quadrilateral/hexahedral cells; the
        lower-dimensional cells (lines in 2D, quadrilaterals in 3D) only carry
        boundary regions.

    Raises
    ------
    FileNotFoundError
        For a path that does not exist.
    ValueError
        For a file meshio cannot read (empty, truncated, of an unknown format:
        the message names the file and gives the reader's words), cells
        smalltc does not support (simplices, serendipity cells), several cell
        types or orders among the cells, a non-planar 2D mesh, a non-conforming
        mesh, an inverted element (named), or a region whose facets are not
        facets of the mesh.

    Examples
    --------
    >>> import meshio
    >>> pts = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]])
    >>> m = meshio.Mesh(pts, [("quad", [[0, 1, 4, 3], [1, 2, 5, 4]]), ("line", [[2, 5]])],
    ...                 cell_sets={"right": [np.array([], int), np.array([0])]})
    >>> mesh = read_mesh(m)
    >>> mesh.nelements, mesh.geom_order, round(mesh.volume, 12)
    (2, 1, 2.0)
    >>> mesh.boundary_facets("right")
    (array([1]), array([1]))
    """
    import meshio
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise FileNotFoundError(f"mesh file {path!r} does not exist")
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            raise ValueError(f"mesh file {path!r} is empty")
        said = io.StringIO()            # meshio prints its readers' errors, then exits
        try:
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
                # a .msh is gmsh's (meshio would try ANSYS's reader first, printing its failure)
                m = meshio.read(path, file_format="gmsh" if path.lower().endswith(".msh")
                                else None)
        except (Exception, SystemExit) as err:
            why = [" ".join(said.getvalue().split())]           # (rich wraps its lines)
            if not isinstance(err, SystemExit):
                why.append(str(err))
            raise ValueError(f"meshio could not read {path!r}: "
                             f"{'; '.join(filter(None, why)) or type(err).__name__}") from err
        sys.stderr.write(said.getvalue())         # what meshio said about a file it read
        name = path
    elif isinstance(source, meshio.Mesh):
        m, name = source, "a meshio.Mesh"
    else:
        raise TypeError(f"source must be a path or a meshio.Mesh, got {type(source).__name__}")
    blocks = _blocks(m)
    bad = sorted({t for t, _, _ in blocks if t.startswith(_SIMPLICES) or
                  t.startswith(("VTK_LAGRANGE_TRIANGLE", "VTK_LAGRANGE_TETRA", "VTK_LAGRANGE_WEDGE",
                                "VTK_LAGRANGE_PYRAMID")) or t in _SERENDIPITY})
    if bad:
        raise ValueError(f"unsupported cell type(s) {bad} in {name}: smalltc.fem reads "
                         "conforming quadrilateral and hexahedral meshes (4/9/16/...-node "
                         "quadrilaterals, 8/27/64/...-node hexahedra, VTK Lagrange cells)")
    typed = [(t, conn, i, cell_order(t, conn.shape[1])) for t, conn, i in blocks]
    dims = [d[0] for *_, d in typed if d is not None]
    if not dims:
        raise ValueError(f"no quadrilateral or hexahedral cells in {name} "
                         f"(cell types: {sorted({t for t, _, _ in blocks})}; gmsh saves only "
                         "the elements of physical groups when there are any: add one for the "
                         "cells, or set Mesh.SaveAll)")
    dim = max(dims)
    vol = [(t, conn, i, o) for t, conn, i, (d, o) in
           ((t, c, i, dp) for t, c, i, dp in typed if dp is not None) if d == dim]
    kinds = sorted({(t, o) for t, _, _, o in vol})
    if len({o for _, o in kinds}) > 1 or len({t for t, _ in kinds}) > 1:
        raise ValueError(f"mixed cell types {[t for t, _ in kinds]} in {name}: smalltc.fem "
                         "needs one cell type and order for the whole mesh")
    ctype, g = kinds[0]
    conn = np.concatenate([c for _, c, _, _ in vol]).astype(np.int64)
    offsets = {}
    start = 0
    for _, c, i, _ in vol:
        offsets[i] = start
        start += c.shape[0]
    perm = to_tensor_permutation(meshio_reference(ctype, conn.shape[1]), g)
    conn = conn[:, perm]                                         # tensor order
    pts = np.asarray(m.points, dtype=np.float64)
    if pts.shape[1] < dim:
        raise ValueError(f"{name} has {pts.shape[1]}D points for {dim}D cells")
    if pts.shape[1] > dim:
        used = np.zeros(pts.shape[0], dtype=bool)
        used[conn] = True
        extra = pts[used, dim:]
        if extra.size and np.ptp(extra, axis=0).max() > 1e-12 * max(1.0, np.abs(pts).max()):
            raise ValueError(f"{name}: a {dim}D mesh whose points do not lie in a plane "
                             f"z = const (smalltc.fem meshes {dim}D domains in {dim}D)")
        pts = pts[:, :dim]
    E, ng = conn.shape[0], g + 1
    nodes = np.empty((E, dim) + (ng,) * dim)
    for d, column in enumerate(np.ascontiguousarray(pts.T)):
        nodes[:, d] = column[conn].reshape((E,) + (ng,) * dim)
    cm = corner_multi_indices(dim) * g
    corner_pts = conn.reshape((E,) + (ng,) * dim)[(slice(None),) + tuple(cm.T)]  # (E, 2^dim)
    vids, vertices = np.unique(corner_pts, return_inverse=True)
    vertices = vertices.reshape(E, 2 ** dim)
    vmap = np.full(pts.shape[0], -1, dtype=np.int64)
    vmap[vids] = np.arange(vids.size)
    boundary, volume = _regions(_named_sets(m, blocks), blocks, offsets, vertices, vmap, dim,
                                name)
    mesh = UnstructuredMesh(dim, g, np.linspace(-1.0, 1.0, ng), nodes,
                            vertices.astype(np.int64), boundary, volume, name)
    if check:
        corners = np.moveaxis(nodes, 1, -1)[(slice(None),) + tuple(cm.T)]
        check_mesh(mesh, corners)
    return mesh
