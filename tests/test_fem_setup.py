"""Mesh and space setup by whole arrays, checked against straightforward oracles.

The oracles below are the element-by-element (or key-by-key) formulations the setup
replaced: ``numpy.unique`` over whole rows, dictionaries of facet keys, loops over
facets, ``einsum`` for the element maps. Every integer result (DoF numbering, boundary
facets and regions, DoF sets) must be identical, in the same order; coordinates agree to
rounding. The device-side caches are checked with a stand-in array module that counts
host-to-device copies, so they run without a GPU; the CuPy cases skip cleanly.
"""
import itertools
import types

import numpy as np
import pytest

from fem_oracle import oriented, rotations
from smalltc import fem
from smalltc._arrays import cupy_or_none, gpu_available
from smalltc.fem import _device, topology
from smalltc.fem.basis import lagrange_basis
from smalltc.fem.boundary import DirichletBC
from smalltc.fem.poisson import _dirichlet
from smalltc.fem.unstructured import check_mesh

meshio = pytest.importorskip("meshio")

# ---------------------------------------------------------------- oracles


def numbering_oracle(vertices, dim, p):
    """The global key of every element node (module docstring of topology), numbered by
    ``numpy.unique`` over whole rows."""
    vertices = np.asarray(vertices, dtype=np.int64)
    E, nd = vertices.shape[0], p + 1
    corner = lambda bits: int(np.ravel_multi_index(tuple(bits), (2,) * dim))  # noqa: E731
    local = np.indices((nd,) * dim).reshape(dim, -1).T
    keys = np.full((E, local.shape[0], 7), -1, dtype=np.int64)
    eids = np.arange(E)
    for li, idx in enumerate(local):
        free = [a for a in range(dim) if idx[a] not in (0, p)]
        bits = [int(i) // p if a not in free else 0 for a, i in enumerate(idx)]
        k = keys[:, li]
        if len(free) == dim:
            k[:, 0], k[:, 1], k[:, 2] = dim + 10, eids, li
        elif not free:
            k[:, 0], k[:, 1] = 0, vertices[:, corner(bits)]
        elif len(free) == 1:
            (a,) = free
            b1 = list(bits)
            b1[a] = 1
            g0, g1 = vertices[:, corner(bits)], vertices[:, corner(b1)]
            k[:, 0], k[:, 1], k[:, 2] = 1, np.minimum(g0, g1), np.maximum(g0, g1)
            k[:, 5] = np.where(g0 < g1, idx[a], p - idx[a])
        else:
            a, b = free
            G = np.empty((E, 2, 2), dtype=np.int64)
            for ja, jb in itertools.product((0, 1), repeat=2):
                bb = list(bits)
                bb[a], bb[b] = ja, jb
                G[:, ja, jb] = vertices[:, corner(bb)]
            o = np.argmin(G.reshape(E, 4), axis=1)
            oa, ob = o // 2, o % 2
            da, db = np.abs(idx[a] - oa * p), np.abs(idx[b] - ob * p)
            first_a = G[eids, 1 - oa, ob] < G[eids, oa, 1 - ob]
            k[:, 0], k[:, 1:5] = 2, np.sort(G.reshape(E, 4), axis=1)
            k[:, 5], k[:, 6] = np.where(first_a, da, db), np.where(first_a, db, da)
    _, inverse = np.unique(keys.reshape(-1, 7), axis=0, return_inverse=True)
    return inverse.reshape((E,) + (nd,) * dim), int(inverse.max()) + 1


def boundary_facets_oracle(vertices, dim):
    keys = topology.facet_keys(np.asarray(vertices), dim).reshape(-1, 2 ** (dim - 1))
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    where = np.flatnonzero(counts[inverse.reshape(-1)] == 1)
    return where // (2 * dim), where % (2 * dim), counts


def box_facets_oracle(mesh, region):
    sides = range(2 * mesh.dim) if region is None else [mesh.boundary_regions.index(region)]
    multi = np.indices(mesh.shape).reshape(mesh.dim, -1)
    es, fs = [], []
    for f in sides:
        a, side = divmod(f, 2)
        e = np.flatnonzero(multi[a] == (mesh.shape[a] - 1 if side else 0))
        es.append(e)
        fs.append(np.full(e.size, f))
    return np.concatenate(es), np.concatenate(fs)


def box_nodes_oracle(dim, n, g, distortion, lo, hi):
    """Every element's nodes by a loop over elements and nodes."""
    shape = (n,) * dim if np.isscalar(n) else tuple(n)
    t, _ = fem.gauss_lobatto(g + 1)
    out = np.empty((int(np.prod(shape)), dim) + (g + 1,) * dim)
    for e, multi in enumerate(np.ndindex(*shape)):
        for node in np.ndindex(*(g + 1,) * dim):
            out[(e, slice(None)) + node] = [(multi[d] + 0.5 * (t[node[d]] + 1.0)) / shape[d]
                                            for d in range(dim)]
    xc = np.moveaxis(out, 1, 0)
    moved = distortion(xc) if callable(distortion) else (
        fem.sine_distortion(xc, distortion) if distortion else xc)
    bshape = (dim,) + (1,) * (dim + 1)
    return np.moveaxis(np.reshape(lo, bshape) + (np.reshape(hi, bshape) - np.reshape(lo, bshape))
                       * moved, 0, 1)


def facet_dofs_oracle(space, elems, facets):
    return np.array([space.elem_dofs[e][topology.facet_slices(space.dim, space.nd, f)].ravel()
                     for e, f in zip(elems, facets)], dtype=np.int64).reshape(len(elems), -1)


def boundary_dofs_oracle(space, region=None):
    names = [region] if region is None or isinstance(region, str) else list(region)
    out = [np.zeros(0, dtype=np.int64)]
    for name in names:
        out.append(facet_dofs_oracle(space, *space.mesh.boundary_facets(name)).ravel())
    return np.unique(np.concatenate(out))


def element_map(mesh, ref):
    """The element maps at the lattice of ``ref``: ``(E, dim, n, ..., n)`` by einsum."""
    B, _ = lagrange_basis(mesh.geom_nodes, np.asarray(ref, dtype=np.float64))
    x = mesh.nodes
    for a in range(mesh.dim):
        x = np.moveaxis(np.einsum("ij,...j->...i", B, np.moveaxis(x, 2 + a, -1)), -1, 2 + a)
    return x


def nodal_oracle(space, xe):
    """Global values from element values ``(E, c, nd...)`` of a continuous field: each
    DoF's value from the first element holding it, after checking that all agree."""
    E, c = xe.shape[:2]
    vals = np.moveaxis(xe, 1, -1).reshape(-1, c)
    flat = space.elem_dofs.ravel()
    out = np.full((space.ndofs, c), np.nan)
    first = np.unique(flat, return_index=True)[1]
    out[flat[first]] = vals[first]
    np.testing.assert_allclose(out[flat], vals, atol=1e-13)
    return out.T


# ---------------------------------------------------------------- meshes


def rotated(bm, seed=0):
    """The box mesh's elements with random local orientations, as an unstructured mesh
    (vertex ids found from the coordinates)."""
    rng = np.random.default_rng(seed)
    rots = rotations(bm.dim)
    nodes = np.empty_like(bm.nodes)
    for e in range(bm.nelements):
        nodes[e] = oriented(bm.nodes[e], rots[rng.integers(len(rots))])
    return fem.from_elements(nodes)


def relabelled(vertices, seed=0):
    """Vertex ids scattered over a wide range with gaps and negative values."""
    rng = np.random.default_rng(seed)
    n = int(vertices.max()) + 1
    labels = rng.choice(np.arange(-5 * n, 5 * n), size=n, replace=False)
    return labels[vertices]


# (dim, n, geom_order, distortion)
BOX = [(1, 4, 1, 0.0), (1, 3, 3, 0.1), (2, (3, 2), 1, 0.0), (2, 3, 2, 0.1), (3, (2, 3, 1), 1, 0.05),
       (3, 2, 3, 0.05)]
# (dim, n, geom_order) of the rotated unstructured meshes
ROTATED = [(2, 3, 1), (2, 3, 2), (3, 2, 1), (3, 3, 2)]
PS = (1, 2, 3, 4)


def _file_meshes():
    out = [fem.read_mesh(fem.demo_mesh_path(2)), fem.read_mesh(fem.demo_mesh_path(3))]
    return out + [m.refine() for m in out]


FILE_MESHES = _file_meshes()


# ---------------------------------------------------------------- topology

UNIQUE_CASES = [
    ("small", lambda r: r.integers(-3, 3, (200, 4))),
    ("one column", lambda r: r.integers(0, 5, (50, 1))),
    ("wide range", lambda r: r.integers(-2 ** 62, 2 ** 62, (60, 3))),
    ("extremes", lambda r: np.array([[np.iinfo(np.int64).min, 0], [np.iinfo(np.int64).max, 1],
                                     [np.iinfo(np.int64).min, 0], [0, -1]])),
    ("many columns", lambda r: r.integers(0, 40, (300, 7))),
    ("one row", lambda r: np.array([[5, -2, 3]])),
]


@pytest.mark.parametrize("name, make", UNIQUE_CASES, ids=[c[0] for c in UNIQUE_CASES])
def test_unique_rows_is_numpy_unique_over_rows(name, make):
    rows = make(np.random.default_rng(0))
    rows[::7] = rows[len(rows) // 2]
    _, first, inverse, counts = np.unique(rows, axis=0, return_index=True,
                                          return_inverse=True, return_counts=True)
    got = topology.unique_rows(rows)
    for g, ref in zip(got, (inverse.reshape(-1), first, counts)):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, ref)


def test_unique_rows_of_nothing_and_errors():
    assert all(a.shape == (0,) for a in topology.unique_rows(np.zeros((0, 3), dtype=int)))
    with pytest.raises(ValueError, match=r"rows has shape \(4,\), expected \(n, k\)"):
        topology.unique_rows(np.arange(4))


@pytest.mark.parametrize("dim, n, g, distortion", BOX, ids=[str(c) for c in BOX])
def test_box_numbering_and_facets_match_the_oracles(dim, n, g, distortion):
    bm = fem.box_mesh(dim, n, geom_order=g, distortion=distortion)
    vertices = fem.H1Space(bm, 1).elem_dofs.reshape(bm.nelements, -1)
    for v in (vertices, relabelled(vertices)):
        for p in PS:
            got, ndofs = topology.h1_numbering(v, dim, p)
            ref, nref = numbering_oracle(v, dim, p)
            assert ndofs == nref and got.dtype == np.int64
            np.testing.assert_array_equal(got, ref)
        if dim > 1:
            for a, b in zip(topology.boundary_facets_of(v, dim), boundary_facets_oracle(v, dim)):
                np.testing.assert_array_equal(a, b)
    for region in (None,) + bm.boundary_regions:
        for a, b in zip(bm.boundary_facets(region), box_facets_oracle(bm, region)):
            assert a.dtype == np.int64
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dim, n, g", ROTATED, ids=[str(c) for c in ROTATED])
def test_rotated_numbering_and_facets_match_the_oracles(dim, n, g):
    m = rotated(fem.box_mesh(dim, n, geom_order=g, distortion=0.05), seed=dim + n)
    for v in (m.vertices, relabelled(m.vertices, seed=3)):
        for p in PS:
            got, ndofs = topology.h1_numbering(v, dim, p)
            ref, nref = numbering_oracle(v, dim, p)
            assert ndofs == nref
            np.testing.assert_array_equal(got, ref)
        for a, b in zip(topology.boundary_facets_of(v, dim), boundary_facets_oracle(v, dim)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("k", range(len(FILE_MESHES)))
def test_file_mesh_numbering_facets_and_regions_match_the_oracles(k):
    m = FILE_MESHES[k]
    for p in PS[:3]:
        got, ndofs = topology.h1_numbering(m.vertices, m.dim, p)
        ref, nref = numbering_oracle(m.vertices, m.dim, p)
        assert ndofs == nref
        np.testing.assert_array_equal(got, ref)
    e, f = m.boundary_facets()
    re, rf, _ = boundary_facets_oracle(m.vertices, m.dim)
    np.testing.assert_array_equal(e, re)
    np.testing.assert_array_equal(f, rf)
    # the named regions cover the boundary once
    k_all = np.concatenate([e * 2 * m.dim + f for e, f in m.boundary_regions.values()])
    np.testing.assert_array_equal(np.sort(k_all), np.sort(re * 2 * m.dim + rf))


def test_h1_numbering_of_no_elements_and_errors():
    dofs, n = topology.h1_numbering(np.zeros((0, 4), dtype=int), 2, 3)
    assert dofs.shape == (0, 4, 4) and n == 0
    with pytest.raises(ValueError, match=r"vertices has shape \(2, 3\), expected \(E, 4\)"):
        topology.h1_numbering(np.zeros((2, 3), dtype=int), 2, 1)


def test_facet_lattice_is_facet_slices():
    for dim, nd in ((1, 3), (2, 2), (2, 4), (3, 3)):
        lat = np.arange(nd ** dim).reshape((nd,) * dim)
        want = [lat[topology.facet_slices(dim, nd, f)].ravel() for f in range(2 * dim)]
        np.testing.assert_array_equal(topology.facet_lattice(dim, nd), np.array(want))


# ---------------------------------------------------------------- meshes


@pytest.mark.parametrize("dim, n, g, distortion", BOX + [(2, 6, 1, fem.Kershaw(0.3)),
                                                        (3, 2, 2, lambda x: x + 0.01 * x ** 2)],
                         ids=[str(c[:3]) for c in BOX] + ["kershaw", "callable"])
def test_box_mesh_nodes_match_the_element_loop(dim, n, g, distortion):
    lo, hi = np.array([-1.0, 0.5, 2.0])[:dim], np.array([2.0, 3.0, 5.0])[:dim]
    m = fem.box_mesh(dim, n, geom_order=g, distortion=distortion, lower=lo, upper=hi)
    ref = box_nodes_oracle(dim, n, g, distortion, lo, hi)
    assert m.nodes.flags.c_contiguous and m.nodes.shape == ref.shape
    np.testing.assert_array_equal(m.nodes, ref)


def test_read_mesh_regions_match_a_dictionary_lookup(tmp_path):
    bm = fem.box_mesh(3, 2, geom_order=2, distortion=0.05)
    path = str(tmp_path / "b.msh")
    fem.to_meshio(bm, cells="gmsh").write(path, file_format="gmsh22")
    m = fem.read_mesh(path)
    raw = meshio.read(path)
    keys = topology.facet_keys(m.vertices, 3).reshape(-1, 4)
    lookup = {}
    for k, row in enumerate(map(tuple, keys)):
        lookup.setdefault(row, k)
    # the file's points -> vertex ids: the cells' corners in tensor order
    vid = {}
    for (e, c), pt in np.ndenumerate(m.vertices):
        vid.setdefault(tuple(np.round(m.nodes[(e, slice(None)) + tuple(
            2 * np.array(np.unravel_index(c, (2, 2, 2))))], 12)), pt)
    tags = raw.cell_data["gmsh:physical"]
    names = {int(v[0]): n for n, v in raw.field_data.items() if int(v[1]) == 2}
    for block, tag in zip(raw.cells, tags):
        if block.type != "quad9":
            continue
        for t, name in names.items():
            rows = block.data[tag == t][:, :4]
            ks = sorted({lookup[tuple(sorted(vid[tuple(np.round(raw.points[i], 12))]
                                              for i in row))] for row in rows})
            e, f = m.boundary_regions[name]
            np.testing.assert_array_equal(e * 6 + f, ks)
    assert sorted(m.boundary_regions) == sorted(bm.boundary_regions)


def test_read_mesh_region_errors():
    pts = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0],
                    [5.0, 5.0]])
    quads = [[0, 1, 4, 3], [1, 2, 5, 4]]
    m = meshio.Mesh(pts, [("quad", quads), ("line", [[2, 5], [5, 0]])],
                    cell_sets={"across": [np.array([], int), np.array([0, 1])]})
    with pytest.raises(ValueError, match=r"region 'across'.*vertices \[0, 5\] is not a facet"):
        fem.read_mesh(m)
    m = meshio.Mesh(pts, [("quad", quads), ("line", [[2, 6]])],
                    cell_sets={"loose": [np.array([], int), np.array([0])]})
    with pytest.raises(ValueError, match=r"region 'loose'.*corners are not vertices"):
        fem.read_mesh(m)


def test_check_mesh_errors():
    X = fem.box_mesh(2, 2).nodes
    twice = fem.from_elements(np.concatenate([X, X[:1]]), check=False)    # 3 elements on a facet
    with pytest.raises(ValueError, match=r"2 facet\(s\) shared by more than two elements"):
        check_mesh(twice)
    v = fem.from_elements(X, check=False).vertices.copy()
    v[1, 0] = v.max() + 1                       # a second id for a point: unconnected elements
    m = fem.from_elements(X, vertices=v, check=False)
    corners = np.moveaxis(X, 1, -1)[:, [0, 0, 1, 1], [0, 1, 0, 1]]
    with pytest.raises(ValueError, match=r"vertex \d+ at \[0.0, 0.5\] is repeated"):
        check_mesh(m, corners)


@pytest.mark.parametrize("dim", [2, 3])
def test_refine_matches_the_einsum_of_the_halves(dim):
    m = FILE_MESHES[dim - 2]
    r = m.refine()
    t = m.geom_nodes
    kids = topology.corner_multi_indices(dim)
    halves = [lagrange_basis(t, (t + 1) / 2 + bit - 1)[0] for bit in (0, 1)]
    want = []
    for e in range(m.nelements):
        for bits in kids:
            x = m.nodes[e]
            for a in range(dim):
                x = np.moveaxis(np.einsum("ij,...j->...i", halves[bits[a]],
                                          np.moveaxis(x, 1 + a, -1)), -1, 1 + a)
            want.append(x)
    np.testing.assert_allclose(r.nodes, np.array(want), atol=1e-14)
    assert r.nelements == m.nelements * 2 ** dim
    for name, (e, f) in r.boundary_regions.items():
        pe, pf = m.boundary_regions[name]
        assert sorted(set(zip((e // 2 ** dim).tolist(), f.tolist()))) == \
            sorted(set(zip(pe.tolist(), pf.tolist())))


# ---------------------------------------------------------------- spaces


def _spaces():
    out = []
    for dim, n, g, d in BOX[1:]:
        out.append(fem.box_mesh(dim, n, geom_order=g, distortion=d))
    for dim, n, g in ROTATED[1::2]:
        out.append(rotated(fem.box_mesh(dim, n, geom_order=g, distortion=0.05)))
    return out + FILE_MESHES[:2]


SPACE_MESHES = _spaces()


@pytest.mark.parametrize("k", range(len(SPACE_MESHES)))
@pytest.mark.parametrize("p", [1, 3])
def test_space_setup_matches_the_oracles(k, p):
    mesh = SPACE_MESHES[k]
    V = fem.H1Space(mesh, p)
    regions = [None] + list(getattr(mesh, "boundary_regions", ()))
    for region in regions:
        np.testing.assert_array_equal(V.boundary_dofs(region), boundary_dofs_oracle(V, region))
        e, f = mesh.boundary_facets(region)
        np.testing.assert_array_equal(V.facet_dofs(e, f), facet_dofs_oracle(V, e, f))
    if len(regions) > 2:
        np.testing.assert_array_equal(V.boundary_dofs(regions[1:3]),
                                      boundary_dofs_oracle(V, regions[1:3]))
    ref, _ = fem.gauss_lobatto(p + 1)
    x = V.dof_coordinates()
    np.testing.assert_allclose(x, nodal_oracle(V, element_map(mesh, ref)), atol=1e-14)
    assert V._dof_coordinates is V._dof_coordinates and not V._dof_coordinates.flags.writeable
    x[:] = 0                                            # a copy: the kept one stays
    assert V.dof_coordinates().any()
    eq = np.linspace(-1, 1, p + 1)
    np.testing.assert_allclose(V.map_nodes(eq), nodal_oracle(V, element_map(mesh, eq)),
                               atol=1e-14)
    np.testing.assert_array_equal(V.multiplicity(),
                                  np.bincount(V.elem_dofs.ravel(), minlength=V.ndofs))


SPACE_ERRORS = [
    (lambda V: V.map_nodes([0.0, 1.0]), r"ref has shape \(2,\), expected \(3,\)"),
    (lambda V: V.assign(np.zeros((4, 3, 2))), r"v has shape \(4, 3, 2\), expected \(4, 3, 3\)"),
    (lambda V: V.facet_dofs([0, 1], [0]), r"elements has shape \(2,\) and facets \(1,\)"),
    (lambda V: V.facet_dofs([0, 4], [0, 1]), r"elements must lie in \[0, 4\), got \[0, 4\]"),
    (lambda V: V.facet_dofs([0, 1], [-1, 1]), r"facets must lie in \[0, 4\), got \[-1, 1\]"),
]


@pytest.mark.parametrize("call, match", SPACE_ERRORS)
def test_space_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(fem.H1Space(fem.box_mesh(2, 2), 2))


def _dirichlet_oracle(space, g, neumann):
    e, f = space.mesh.boundary_facets(None)
    skip = set()
    for r in neumann:
        re, rf = space.mesh.boundary_facets(r)
        skip.update(zip(re.tolist(), rf.tolist()))
    keep = [(a, b) not in skip for a, b in zip(e.tolist(), f.tolist())]
    dofs = np.unique(facet_dofs_oracle(space, e[keep], f[keep]))
    x = space.dof_coordinates()
    return dofs, g(x[:, dofs])


@pytest.mark.parametrize("k", [1, 4, len(SPACE_MESHES) - 2, len(SPACE_MESHES) - 1])
def test_dirichlet_with_neumann_regions_matches_the_facet_loop(k):
    mesh = SPACE_MESHES[k]
    V = fem.H1Space(mesh, 2)
    names = list(mesh.boundary_regions)
    g = lambda x: x[0] + 2 * x[1]                        # noqa: E731
    for neumann in (names[:1], names[1:3]):
        bc = _dirichlet(V, {None: g}, neumann)
        dofs, values = _dirichlet_oracle(V, g, neumann)
        np.testing.assert_array_equal(bc.dofs, dofs)
        np.testing.assert_array_equal(bc.values, values)
    # a named region on top: its values win where they meet
    bc = _dirichlet(V, {None: g, names[-1]: 7.0}, names[:1])
    on = V.boundary_dofs(names[-1])
    dofs, values = _dirichlet_oracle(V, g, names[:1])
    np.testing.assert_array_equal(bc.dofs, np.union1d(dofs, on))
    np.testing.assert_array_equal(bc.values[np.isin(bc.dofs, on)], 7.0)


# ---------------------------------------------------------------- output


@pytest.mark.parametrize("k", [1, 4, len(SPACE_MESHES) - 1])
@pytest.mark.parametrize("p", [1, 3])
def test_to_meshio_samples_match_einsum(k, p):
    mesh = SPACE_MESHES[k]
    V = fem.H1Space(mesh, p)
    x = V.dof_coordinates()
    u, w = np.sin(x[0]) + x[1] ** 2, np.stack([x[0], x[1] ** 3])
    m = fem.to_meshio(V, u=u, w=w)
    eq = np.linspace(-1, 1, p + 1)
    pts = nodal_oracle(V, element_map(mesh, eq))
    np.testing.assert_allclose(m.points[:, :V.dim], pts.T, atol=1e-14)
    gll, _ = fem.gauss_lobatto(p + 1)
    B, _ = lagrange_basis(gll, eq)
    for name, f in (("u", u[None]), ("w", w)):
        fe = f[:, V.elem_dofs]                                   # (c, E, nd...)
        for a in range(V.dim):
            fe = np.moveaxis(np.einsum("ij,...j->...i", B, np.moveaxis(fe, 2 + a, -1)), -1, 2 + a)
        want = nodal_oracle(V, np.moveaxis(fe, 0, 1)).T
        np.testing.assert_allclose(m.point_data[name].reshape(want.shape), want, atol=1e-13)


@pytest.mark.parametrize("k", [1, 4, len(SPACE_MESHES) - 1])
def test_raw_vtu_reads_back_as_meshio_writes_it(tmp_path, k):
    meshio = pytest.importorskip("meshio", reason="the VTU files are read back by meshio")
    V = fem.H1Space(SPACE_MESHES[k], 2)
    x = V.dof_coordinates()
    fields = dict(u=np.sin(x[0]) + x[1] ** 2, w=np.stack([x[0], x[1] ** 3]))
    raw = meshio.read(fem.write_vtu(str(tmp_path / "raw.vtu"), V, **fields))
    ref = meshio.read(fem.write_vtu(str(tmp_path / "zlib.vtu"), V, compression="zlib",
                                    **fields))
    np.testing.assert_array_equal(raw.points, ref.points)
    assert [c.type for c in raw.cells] == [c.type for c in ref.cells]
    np.testing.assert_array_equal(raw.cells[0].data, ref.cells[0].data)
    assert sorted(raw.point_data) == ["u", "w"]
    for name in ("u", "w"):
        assert raw.point_data[name].shape == ref.point_data[name].shape
        np.testing.assert_array_equal(raw.point_data[name], ref.point_data[name])


@pytest.mark.parametrize("dim, n, p", [(1, 4, 3), (2, (3, 2), 2), (3, (2, 3, 2), 3)])
def test_one_copy_of_a_box_space_is_the_scatters_last(dim, n, p):
    # the arithmetic index (no map on the host) is the copy a scatter-assignment keeps, and
    # the arithmetic multiplicity the map's count
    V = fem.H1Space(fem.box_mesh(dim, n), p)
    got = V._one_copy(np)
    assert V._elem_dofs is None
    mult = V.multiplicity()
    assert V._elem_dofs is None                   # both without the map on the host
    want = np.empty(V.ndofs, dtype=np.int64)
    want[V.elem_dofs.ravel()] = np.arange(V.elem_dofs.size)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(mult, np.bincount(V.elem_dofs.ravel(), minlength=V.ndofs))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
@pytest.mark.parametrize("k", [1, len(SPACE_MESHES) - 1])
def test_vtu_of_device_fields_is_sampled_on_the_device(tmp_path, k):
    # a CuPy field: points, fields and cells made on the GPU, the file the host's
    meshio = pytest.importorskip("meshio", reason="the VTU files are read back by meshio")
    cp = cupy_or_none()
    mesh = SPACE_MESHES[k]
    if hasattr(mesh, "shape"):                    # a box mesh not placed on the host
        mesh = fem.box_mesh(mesh.dim, mesh.shape, geom_order=mesh.geom_order,
                            distortion=mesh.distortion)
    V = fem.H1Space(mesh, 3)
    x = fem.H1Space(SPACE_MESHES[k], 3).dof_coordinates()
    u = np.sin(x[0]) + x[1] ** 2
    dev = meshio.read(fem.write_vtu(str(tmp_path / "dev.vtu"), V, u=cp.asarray(u)))
    if hasattr(mesh, "shape"):
        assert not mesh.placed and V._elem_dofs is None      # nothing made on the host
    host = meshio.read(fem.write_vtu(str(tmp_path / "host.vtu"), V, u=u))
    np.testing.assert_allclose(dev.points, host.points, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(dev.cells[0].data, host.cells[0].data)
    np.testing.assert_allclose(dev.point_data["u"], host.point_data["u"], rtol=0, atol=1e-13)


def _assign_oracle(V, v):
    """The scatter-assignment: every copy of a DoF written, the last one kept."""
    v = np.asarray(v)
    if v.ndim == V.elem_dofs.ndim:
        out = np.full(V.ndofs, np.nan)
        out[V.elem_dofs.ravel()] = v.ravel()
        return out
    out = np.full((v.shape[1], V.ndofs), np.nan)
    out[:, V.elem_dofs.ravel()] = np.moveaxis(v, 1, 0).reshape(v.shape[1], -1)
    return out


@pytest.mark.parametrize("k", [0, len(SPACE_MESHES) - 1])
@pytest.mark.parametrize("ncomp", [None, 1, 3])
def test_assign_keeps_the_copy_a_scatter_assignment_keeps(k, ncomp):
    V = fem.H1Space(SPACE_MESHES[k], 2)
    shape = V.evector_shape if ncomp is None else V.evector_shape[:1] + (ncomp,) + \
        V.evector_shape[1:]
    v = np.random.default_rng(k).standard_normal(shape)      # discontinuous on purpose
    np.testing.assert_array_equal(V.assign(v), _assign_oracle(V, v))
    if gpu_available():
        cp = cupy_or_none()
        np.testing.assert_array_equal(cp.asnumpy(V.assign(cp.asarray(v))), _assign_oracle(V, v))


@pytest.mark.parametrize("dim", [2, 3])
def test_gmsh_facet_cells_match_the_facet_loop(dim):
    mesh = FILE_MESHES[dim - 2]
    V = fem.H1Space(mesh, 2)
    m = fem.to_meshio(V, cells="gmsh")
    from smalltc.fem import output
    from smalltc.fem._ordering import gmsh_reference, meshio_reference
    fname = output._line_name(2) if dim == 2 else output._type_name(2, 2, "gmsh")
    fref = gmsh_reference(1, 2) if dim == 2 else meshio_reference(fname)
    forder = output._cell_order(fref, 2)
    blocks = [b.data for b in m.cells[1:]]
    for name, data in zip(mesh.boundary_regions, blocks):
        e, f = mesh.boundary_facets(name)
        np.testing.assert_array_equal(data, facet_dofs_oracle(V, e, f)[:, forder])


# ---------------------------------------------------------------- device caches


class _DeviceArray(np.ndarray):
    """An array "on the stand-in device"."""


class _FakeDevice:
    """A stand-in for CuPy: arrays are NumPy arrays of a subclass; ``asarray`` of a host
    array counts a copy; ``cuda.Device().id`` is the current device."""

    def __init__(self):
        self.__name__ = "fakexp"
        self.copies = 0
        self.current = 0
        self.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=self.current))

    def asarray(self, a, dtype=None):
        if not isinstance(a, _DeviceArray):
            self.copies += 1
        return np.asarray(a, dtype=dtype).view(_DeviceArray)

    def array(self, a, copy=True):
        return self.asarray(a) if not copy else self.asarray(a).copy()

    def ones(self, n, dtype=np.float64):
        return np.ones(n, dtype=dtype).view(_DeviceArray)

    def zeros(self, n, dtype=np.float64):
        return np.zeros(n, dtype=dtype).view(_DeviceArray)

    def arange(self, n, dtype=None):
        return np.arange(n, dtype=dtype).view(_DeviceArray)

    def empty(self, shape, dtype=np.float64):
        return np.empty(shape, dtype=dtype).view(_DeviceArray)

    add = staticmethod(np.add)


def test_device_cache_keys_on_module_and_device():
    fake, cache = _FakeDevice(), _device.DeviceCache()
    assert _device.device_key(np) == ("numpy", None)
    assert _device.device_key(fake) == ("fakexp", 0)
    a = cache.get(fake, "x", lambda: fake.asarray(np.arange(3)))
    assert cache.get(fake, "x", lambda: pytest.fail("made twice")) is a
    fake.current = 1                                     # another GPU: another copy
    b = cache.get(fake, "x", lambda: fake.asarray(np.arange(3)))
    assert b is not a and fake.copies == 2 and len(cache) == 2
    assert cache.get(np, "x", lambda: np.arange(3)) is not a and len(cache) == 3


def test_dof_map_is_copied_once_per_device():
    # an unstructured mesh's map is copied once per device; a box mesh's is made on the
    # device from the lattice arithmetic (no copy, and no host map until one is asked for)
    for mesh, copies in ((FILE_MESHES[1], 1), (fem.box_mesh(2, 3), 0)):
        fake = _FakeDevice()
        V = fem.H1Space(mesh, 2)
        m = V.dof_map(fake)
        assert isinstance(m, _DeviceArray) and m.dtype == np.int32 and fake.copies == copies
        if copies == 0:
            assert V._elem_dofs is None
        np.testing.assert_array_equal(m, V.elem_dofs)
        assert V.dof_map(fake) is m and fake.copies == copies
        fake.current = 1
        assert V.dof_map(fake) is not m and fake.copies == 2 * copies
        assert V.dof_map(np) is V.dof_map(np) and not isinstance(V.dof_map(np), _DeviceArray)


@pytest.mark.parametrize("dim, n, p", [(1, 5, 3), (2, (3, 4), 2), (3, (2, 3, 4), 3)])
def test_dof_rows_are_the_map_rows(dim, n, p):
    V = fem.H1Space(fem.box_mesh(dim, n), p)
    ref = fem.H1Space(fem.box_mesh(dim, n), p).elem_dofs
    fake = _FakeDevice()
    full = V.dof_rows(None, fake, np.int32)
    assert isinstance(full, _DeviceArray) and full.dtype == np.int32 and fake.copies == 0
    np.testing.assert_array_equal(full, ref)
    some = np.random.default_rng(dim).permutation(V.nelements)[:5]
    for xp in (np, fake):
        rows = V.dof_rows(xp.asarray(some), xp, np.int64)
        assert rows.dtype == np.int64 and rows.shape == (some.size,) + ref.shape[1:]
        np.testing.assert_array_equal(rows, ref[some])
    U = fem.H1Space(FILE_MESHES[1], p)
    np.testing.assert_array_equal(U.dof_rows(some[:3], np, np.int32), U.elem_dofs[some[:3]])
    for bad in ([V.nelements], [-1, 0]):
        with pytest.raises(ValueError, match=rf"elements must lie in \[0, {V.nelements}\)"):
            V.dof_rows(np.array(bad))


class _Op:
    def __init__(self, xp, n):
        self.xp, self.n = xp, n

    def __call__(self, x):
        return 2.0 * x


def test_dirichlet_arrays_are_copied_once(monkeypatch):
    fake = _FakeDevice()
    from smalltc.fem import boundary
    monkeypatch.setattr(boundary, "array_module",
                        lambda x: fake if isinstance(x, _DeviceArray) else np)
    V = fem.H1Space(fem.box_mesh(2, 3), 2)
    bc = fem.dirichlet_bc(V, lambda x: 1.0 + x[0])
    op = _Op(fake, V.ndofs)
    b = fake.asarray(np.arange(V.ndofs, dtype=np.float64))
    g_ref = np.zeros(V.ndofs)
    g_ref[bc.dofs] = bc.values
    P_ref = np.ones(V.ndofs)
    P_ref[bc.dofs] = 0
    want = P_ref * (np.arange(V.ndofs) - 2 * g_ref) + (1 - P_ref) * g_ref
    start = fake.copies
    for _ in range(3):
        r = bc.lift(op, b)
        assert isinstance(r, _DeviceArray)
        np.testing.assert_array_equal(r, want)
        P = bc.mask(fake)
        np.testing.assert_array_equal(bc.vector(fake), g_ref)
        x = bc.apply(b)
        np.testing.assert_array_equal(x[bc.dofs], bc.values)
        assert fake.copies == start + 2                   # the DoFs and the values, once
    assert bc.mask(fake) is P
    np.testing.assert_array_equal(P, P_ref)
    assert bc.vector(fake) is not bc.vector(fake)         # a new g each time
    bc.mask(fake, np.float32)
    assert fake.copies == start + 3                       # the values as float32
    np.testing.assert_array_equal(bc.apply(np.zeros(V.ndofs))[bc.dofs], bc.values)


def test_dirichlet_bc_checks_its_arrays():
    V = fem.H1Space(fem.box_mesh(1, 2), 1)
    with pytest.raises(ValueError, match=r"dofs \(2,\) and values \(1,\) must be 1D"):
        DirichletBC(V, [0, 1], [0.0])
    with pytest.raises(ValueError, match=r"dofs must lie in \[0, 3\), got \[0, 3\]"):
        DirichletBC(V, [0, 3], [0.0, 1.0])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
def test_device_arrays_on_the_gpu_match_the_host():
    cp = cupy_or_none()
    for mesh in (fem.box_mesh(3, 3), FILE_MESHES[1]):
        V = fem.H1Space(mesh, 2)
        m = V.dof_map(cp)
        assert V.dof_map(cp) is m
        np.testing.assert_array_equal(cp.asnumpy(m), V.elem_dofs)
        bc = fem.dirichlet_bc(V, lambda x: x[0])
        P = bc.mask(cp)
        assert bc.mask(cp) is P
        np.testing.assert_array_equal(cp.asnumpy(P), bc.mask(np))
        np.testing.assert_array_equal(cp.asnumpy(bc.vector(cp)), bc.vector(np))
        x = cp.zeros(V.ndofs)
        np.testing.assert_array_equal(cp.asnumpy(bc.apply(x)), bc.apply(np.zeros(V.ndofs)))
        v = np.random.default_rng(0).standard_normal(V.evector_shape)
        np.testing.assert_allclose(cp.asnumpy(V.scatter(cp.asarray(v))), V.scatter(v),
                                   rtol=1e-13, atol=1e-13)


def test_constant_dirichlet_values_map_no_coordinates(monkeypatch):
    V = fem.H1Space(fem.box_mesh(3, 3, geom_order=2, distortion=0.1), 2)
    ref = fem.dirichlet_bc(V, {None: 3.0, "xmax": lambda x: x[1]})

    def refuse(*args):
        raise AssertionError("a constant needs no coordinates")
    monkeypatch.setattr(V, "boundary_coordinates", refuse)
    bc = fem.dirichlet_bc(V, {None: 3.0, "xmax": 2.0})
    np.testing.assert_array_equal(bc.dofs, ref.dofs)
    on = V.boundary_dofs("xmax")
    np.testing.assert_array_equal(bc.values, np.where(np.isin(bc.dofs, on), 2.0, 3.0))
    with pytest.raises(ValueError, match="non-finite"):
        fem.dirichlet_bc(V, float("nan"))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="no CUDA device (cupy device query failed)")
@pytest.mark.parametrize("k", [1, len(SPACE_MESHES) - 1])
def test_dirichlet_values_on_the_gpu_match_the_host(k):
    """Coordinates mapped and ``g`` called on the device: the host's constraints."""
    cp = cupy_or_none()
    mesh = SPACE_MESHES[k]
    V = fem.H1Space(mesh, 3)
    dofs, x = V.boundary_coordinates(None, cp)
    assert isinstance(x, cp.ndarray)
    dofs_h, x_h = fem.H1Space(mesh, 3).boundary_coordinates(None)
    np.testing.assert_array_equal(dofs, dofs_h)
    np.testing.assert_allclose(cp.asnumpy(x), x_h, rtol=0, atol=1e-14)
    g = lambda x: 1.0 + x[0] * x[1]                      # noqa: E731
    names = list(mesh.boundary_regions)
    for regions, neumann in (({None: g}, []), ({None: g}, names[:1]),
                             ({names[0]: g, names[-1]: 2.5}, [])):
        on = _dirichlet(V, dict(regions), neumann, "gpu")
        ref = _dirichlet(fem.H1Space(mesh, 3), dict(regions), neumann)
        np.testing.assert_array_equal(on.dofs, ref.dofs)
        assert isinstance(on.values, np.ndarray)
        np.testing.assert_allclose(on.values, ref.values, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dim,g,region", [(2, 1, None), (3, 2, None), (3, 2, "xmax"),
                                          (3, 1, ["ymin", "zmax"])])
def test_boundary_coordinates_are_the_dof_coordinates_there(dim, g, region):
    """From the boundary elements alone (curved maps, p = 3), the same numbers as the whole
    space's coordinates at those DoFs, before and after those are kept."""
    mesh = fem.box_mesh(dim, 3, geom_order=g, distortion=0.15)
    dofs, x = fem.H1Space(mesh, 3).boundary_coordinates(region)
    space = fem.H1Space(mesh, 3)
    ref = space.dof_coordinates()
    np.testing.assert_array_equal(dofs, space.boundary_dofs(region))
    np.testing.assert_allclose(x, ref[:, dofs], rtol=0, atol=1e-14)
    dofs2, x2 = space.boundary_coordinates(region)          # from the kept coordinates
    np.testing.assert_array_equal(x2, ref[:, dofs2])
