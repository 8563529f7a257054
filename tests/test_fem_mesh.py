"""Box meshes and H1 spaces: geometry nodes, numbering, gather/scatter."""
import numpy as np
import pytest

from smalltc.fem import H1Space, box_mesh, gauss_lobatto, sine_distortion

# (dim, n, geom_order, distortion)
MESH_CASES = [
    (1, 3, 1, 0.0),
    (1, 4, 3, 0.2),
    (2, 3, 1, 0.0),
    (2, (2, 5), 2, 0.1),
    (2, 4, 4, 0.1),
    (3, 2, 1, 0.05),
    (3, (2, 3, 1), 2, 0.05),
    (3, 3, 3, 0.1),
]

# (dim, n, p, ncomp)
SPACE_CASES = [
    (1, 4, 1, None),
    (1, 3, 5, 2),
    (2, 3, 1, None),
    (2, (2, 4), 2, None),
    (2, 3, 4, 3),
    (3, 2, 1, None),
    (3, (1, 2, 3), 2, 2),
    (3, 2, 4, None),
]


def _ids(cases):
    return ["-".join(str(c) for c in case) for case in cases]


@pytest.mark.parametrize("dim, n, geom_order, distortion", MESH_CASES, ids=_ids(MESH_CASES))
def test_mesh_is_conforming(dim, n, geom_order, distortion):
    # The geometry nodes are an order-geom_order H1 field: gathering the
    # global node coordinates must give every element's nodes bit for bit.
    mesh = box_mesh(dim, n, geom_order=geom_order, distortion=distortion)
    ng = geom_order + 1
    assert mesh.nodes.shape == (mesh.nelements, dim) + (ng,) * dim
    X = H1Space(mesh, geom_order).dof_coordinates()
    gathered = H1Space(mesh, geom_order).gather(X)  # (E, dim, ng...)
    np.testing.assert_array_equal(gathered, mesh.nodes)


@pytest.mark.parametrize("dim, n, geom_order, distortion", MESH_CASES, ids=_ids(MESH_CASES))
def test_distortion_keeps_box_boundary(dim, n, geom_order, distortion):
    mesh = box_mesh(dim, n, geom_order=geom_order, distortion=distortion,
                    lower=-1.0, upper=[2.0, 3.0, 5.0][:dim])
    X = H1Space(mesh, geom_order).dof_coordinates()
    X_plain = H1Space(box_mesh(dim, n, geom_order=geom_order, lower=-1.0,
                               upper=[2.0, 3.0, 5.0][:dim]), geom_order).dof_coordinates()
    lo, hi = mesh.lower[:, None], mesh.upper[:, None]
    on_boundary = np.any((X_plain == lo) | (X_plain == hi), axis=0)
    assert on_boundary.any()
    np.testing.assert_allclose(X[:, on_boundary], X_plain[:, on_boundary], rtol=0, atol=1e-15 * 5)
    assert np.all((X >= lo - 1e-15) & (X <= hi + 1e-15))
    assert mesh.volume == pytest.approx(np.prod(hi - lo))


def test_uniform_mesh_vertices():
    mesh = box_mesh(2, (2, 3), lower=(1.0, 0.0), upper=(2.0, 3.0))
    # element (1, 2) is number 1 * 3 + 2 = 5; x in [1.5, 2], y in [2, 3]
    np.testing.assert_array_equal(mesh.nodes[5, 0], [[1.5, 1.5], [2.0, 2.0]])
    np.testing.assert_array_equal(mesh.nodes[5, 1], [[2.0, 3.0], [2.0, 3.0]])


def test_callable_distortion_matches_amplitude():
    a = box_mesh(3, 2, geom_order=2, distortion=0.07)
    b = box_mesh(3, 2, geom_order=2, distortion=lambda xh: sine_distortion(xh, 0.07))
    np.testing.assert_array_equal(a.nodes, b.nodes)


def test_geometry_nodes_are_gauss_lobatto():
    mesh = box_mesh(1, 1, geom_order=4)
    np.testing.assert_allclose(mesh.nodes[0, 0], 0.5 * (gauss_lobatto(5)[0] + 1.0), atol=1e-16)
    assert "BoxMesh(dim=1, shape=(1,), geom_order=4" in repr(mesh)


@pytest.mark.parametrize("dim, n, p, ncomp", SPACE_CASES, ids=_ids(SPACE_CASES))
def test_numbering(dim, n, p, ncomp):
    mesh = box_mesh(dim, n)
    V = H1Space(mesh, p)
    shape = mesh.shape
    assert V.lattice_shape == tuple(k * p + 1 for k in shape)
    assert V.ndofs == np.prod(V.lattice_shape)
    assert V.elem_dofs.shape == (mesh.nelements,) + (p + 1,) * dim
    assert V.elem_dofs.dtype == np.int64
    # every global DoF is used, and each element's DoFs are distinct
    assert np.array_equal(np.unique(V.elem_dofs), np.arange(V.ndofs))
    flat = V.elem_dofs.reshape(mesh.nelements, -1)
    assert all(np.unique(row).size == row.size for row in flat)
    # a node is shared by at most 2 elements per direction that has more than one
    mult = V.multiplicity()
    assert mult.sum() == V.elem_dofs.size
    assert mult.max() == np.prod([2 if k > 1 else 1 for k in shape])
    assert mult.min() == 1


@pytest.mark.parametrize("dim, n, p, ncomp", SPACE_CASES, ids=_ids(SPACE_CASES))
def test_gather_scatter_adjoint(dim, n, p, ncomp):
    V = H1Space(box_mesh(dim, n, distortion=0.05), p)
    rng = np.random.default_rng(dim * 100 + p)
    gshape = (V.ndofs,) if ncomp is None else (ncomp, V.ndofs)
    eshape = V.evector_shape if ncomp is None else (V.nelements, ncomp) + V.evector_shape[1:]
    x = rng.standard_normal(gshape)
    y = rng.standard_normal(eshape)
    gx = V.gather(x)
    sy = V.scatter(y)
    assert gx.shape == eshape and gx.flags.c_contiguous
    assert sy.shape == gshape
    lhs, rhs = np.vdot(gx, y), np.vdot(x, sy)
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + 1.0)


@pytest.mark.parametrize("dim, n, p, ncomp", SPACE_CASES, ids=_ids(SPACE_CASES))
def test_gather_is_continuous(dim, n, p, ncomp):
    # Gathering the node coordinates gives the element node coordinates,
    # i.e. shared nodes get the same value from each element.
    V = H1Space(box_mesh(dim, n), p)
    X = V.dof_coordinates()
    G = V.gather(X)
    nodes = 0.5 * (gauss_lobatto(p + 1)[0] + 1.0)
    e = V.nelements - 1
    idx = np.unravel_index(e, V.mesh.shape)
    for d in range(dim):
        coord = (idx[d] + nodes) / V.mesh.shape[d]
        expected = np.moveaxis(np.broadcast_to(coord, (p + 1,) * dim), -1, d)
        np.testing.assert_allclose(G[e, d], expected, atol=1e-15)


@pytest.mark.parametrize("dim, n, p, ncomp", SPACE_CASES, ids=_ids(SPACE_CASES))
def test_lattice_scatter_matches_bincount(dim, n, p, ncomp):
    # The device scatter (strided adds per direction, no atomics) run with
    # NumPy here: same sums as numpy.bincount up to the order of addition.
    V = H1Space(box_mesh(dim, n), p)
    eshape = V.evector_shape if ncomp is None else (V.nelements, ncomp) + V.evector_shape[1:]
    y = np.random.default_rng(dim * 10 + p).standard_normal(eshape)
    ref = V.scatter(y)
    out = V._scatter_lattice(y, ncomp)
    assert out.shape == ref.shape and out.flags.c_contiguous
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-14 * np.abs(y).max())
    np.testing.assert_array_equal(V._scatter_lattice(np.ones(V.evector_shape), None), V.multiplicity())


def test_scatter_dtype():
    V = H1Space(box_mesh(2, 2), 2)
    assert V.scatter(np.ones(V.evector_shape, dtype=np.float32)).dtype == np.float32
    assert V.scatter(np.ones(V.evector_shape, dtype=np.int64)).dtype == np.float64
    np.testing.assert_array_equal(V.scatter(np.ones(V.evector_shape)), V.multiplicity())


_V = H1Space(box_mesh(2, 2), 2)

ERROR_CASES = [
    (lambda: box_mesh(4, 2), r"dim must be 1, 2 or 3, got 4"),
    (lambda: box_mesh(2, 0), r"n must be a positive integer or 2 positive integers"),
    (lambda: box_mesh(3, (2, 2)), r"n must be a positive integer or 3 positive integers .* got \(2, 2\)"),
    (lambda: box_mesh(2, 2.0), r"n must be a positive integer"),
    (lambda: box_mesh(2, 2, geom_order=0), r"geom_order must be an integer >= 1, got 0"),
    (lambda: box_mesh(2, 2, lower=1.0, upper=1.0), r"upper must exceed lower"),
    (lambda: box_mesh(2, 2, lower=(0.0, 0.0, 0.0)), r"lower must be a finite scalar or 2 finite numbers"),
    (lambda: box_mesh(2, 2, upper="wide"), r"upper must be a finite scalar or 2 finite numbers"),
    (lambda: box_mesh(2, 2, distortion="wavy"), r"distortion must be a finite amplitude or a callable"),
    (lambda: box_mesh(2, 2, distortion=np.inf), r"distortion must be a finite amplitude"),
    (lambda: box_mesh(2, 2, distortion=lambda x: x[0]), r"distortion returned shape \(4, 2, 2\), expected \(2, 4, 2, 2\)"),
    (lambda: box_mesh(2, 2, distortion=lambda x: 1 / 0), r"distortion .* failed on points of shape \(2, 4, 2, 2\)"),
    (lambda: box_mesh(2, 2, distortion=lambda x: x * np.nan), r"distortion produced non-finite coordinates"),
    (lambda: H1Space(box_mesh(2, 2), 0), r"p must be an integer >= 1, got 0"),
    (lambda: _V.gather(np.zeros(24)), r"x has shape \(24,\), expected \(25,\) or \(ncomp, 25\)"),
    (lambda: _V.gather(np.zeros((1, 1, 25))), r"x has shape \(1, 1, 25\)"),
    (lambda: _V.scatter(np.zeros((4, 3, 2))), r"v has shape \(4, 3, 2\), expected \(4, 3, 3\) or \(4, ncomp, 3, 3\)"),
    (lambda: _V.scatter(np.zeros((3, 3, 3))), r"v has shape \(3, 3, 3\)"),
]


@pytest.mark.parametrize("call, match", ERROR_CASES)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("order", [1, 2])
def test_box_nodes_made_on_the_lattice_are_the_pointwise_maps_bits(dim, order):
    """A sine amplitude and the Kershaw map evaluated on the 1D coordinates and broadcast
    give the bits of the map applied node by node, for the whole mesh and for a block."""
    from smalltc.fem.mesh import Kershaw, _place, _placed_box, _reference_coordinates
    from smalltc.quadrature import gauss_lobatto
    nodes1d = gauss_lobatto(order + 1)[0]
    shape = (12, 4, 6)[:dim]
    lo, hi = np.full(dim, -0.5), np.full(dim, 2.0)
    for dist in (0.05, -0.08, Kershaw(0.3), Kershaw(0.4, 0.2, smooth=3)):
        for start, stop in ((None, None), ((2,) * dim, (7, 3, 5)[:dim])):
            ref = _place(_reference_coordinates(shape, nodes1d, start, stop), dist, lo, hi)
            new = _placed_box(shape, nodes1d, dist, lo, hi, start, stop)
            assert new.shape == ref.shape and np.array_equal(new, ref), (dist, start)


class _OtherModule:
    """NumPy under another name: the array module ``xp is not np`` takes (a device's
    code path) with NumPy's arithmetic, so its nodes can be compared bit for bit."""

    __name__ = "othernp"

    def __getattr__(self, name):
        return getattr(np, name)


@pytest.mark.parametrize("dim", [2, 3])
def test_nodes_placed_in_another_module_are_the_hosts_bits(dim):
    """A box mesh places its nodes lazily: ``nodes_on(xp)`` for a device module makes
    them there (the 1D values on the host, the broadcast on ``xp``) without placing them
    on the host, and gives the host's bits, for the whole mesh and for a block."""
    from smalltc.fem.mesh import Kershaw, _Placement
    other = _OtherModule()
    nodes1d = gauss_lobatto(3)[0]
    shape = (12, 4, 6)[:dim]
    lo, hi = np.full(dim, -0.5), np.array([2.0, 1.0, 3.0])[:dim]
    for dist in (0.0, 0.05, Kershaw(0.3), Kershaw(0.4, 0.2, smooth=3, tiles=(2, 2, 1)[:dim])):
        mesh = box_mesh(dim, shape, geom_order=2, distortion=dist, lower=lo, upper=hi)
        assert not mesh.placed
        got = mesh.nodes_on(other)
        assert not mesh.placed                                   # nothing made on the host
        assert np.array_equal(got, mesh.nodes) and mesh.placed, dist
        for start, stop in (((2,) * dim, (7, 3, 5)[:dim]), ((0,) * dim, shape)):
            place = _Placement(shape, nodes1d, dist, lo, hi, start, stop)
            assert np.array_equal(place(other), place(np)), (dist, start)
    warped = box_mesh(dim, 3, distortion=lambda x: x + 0.01 * np.sin(np.pi * x))
    assert warped.placed                         # a user's map runs when the mesh is made
    assert np.array_equal(warped.nodes_on(other), warped.nodes)
    with pytest.raises(ValueError, match="its nodes or their placement"):
        type(warped)(dim, (3,) * dim, 1, lo, hi, nodes1d, None, 0.0)


@pytest.mark.gpu
def test_nodes_placed_on_the_gpu_are_the_hosts_bits():
    from smalltc._arrays import cupy_or_none, gpu_available
    from smalltc.fem.mesh import Kershaw
    if not gpu_available():
        pytest.skip("no CUDA device (cupy device query failed)")
    cp = cupy_or_none()
    for dist in (0.0, 0.08, Kershaw(0.3, tiles=(1, 2, 2))):
        mesh = box_mesh(3, (6, 8, 4), geom_order=2, distortion=dist, upper=(1.0, 2.0, 2.0))
        got = mesh.nodes_on(cp)
        assert not mesh.placed
        assert np.array_equal(cp.asnumpy(got), mesh.nodes), dist
