"""File meshes, unstructured H1 spaces, boundary conditions, the Poisson solve, VTU output.

The Poisson tests run on ``smalltc.fem.diffusion_operator`` where the package has it and
on the NumPy stand-in of tests/diffusion_standin.py otherwise (the convergence sweeps
always use the stand-in, so the suite compiles no kernel for them; one test checks the
package's operator against it).
"""
import os

import numpy as np
import pytest

import diffusion_standin
from conftest import full_only
from fem_oracle import oriented, rotations
from smalltc import fem
from smalltc.fem import _ordering

meshio = pytest.importorskip("meshio")
try:
    import gmsh  # noqa: F401
    HAVE_GMSH = True
except ImportError:
    HAVE_GMSH = False
needs_gmsh = pytest.mark.skipif(not HAVE_GMSH, reason="gmsh is not installed")


@pytest.fixture
def standin(monkeypatch):
    """The NumPy stand-in always: the sweeps over p = 1..6 and the orientation tests
    compile no kernel (the suite's time budget); the package's operator is checked
    against it below."""
    monkeypatch.setattr(fem, "diffusion_operator", diffusion_standin.diffusion_operator,
                        raising=False)


@pytest.fixture
def diffusion(monkeypatch):
    """The package's diffusion operator where it has one, else the stand-in."""
    if not hasattr(fem, "diffusion_operator"):
        monkeypatch.setattr(fem, "diffusion_operator", diffusion_standin.diffusion_operator,
                            raising=False)


def _write_msh(mesh, path):
    fem.to_meshio(mesh, cells="gmsh").write(path, file_format="gmsh22")
    return path


def _file_mesh(tmp_path, dim, n, geom_order=2, distortion=0.05, name="m"):
    bm = fem.box_mesh(dim, n, geom_order=geom_order, distortion=distortion)
    return fem.read_mesh(_write_msh(bm, str(tmp_path / f"{name}{dim}-{n}.msh"))), bm


# ---------------------------------------------------------------- orderings


@needs_gmsh
@pytest.mark.parametrize("dim, types", [(2, [3, 10, 36, 37, 38, 47]), (3, [5, 12, 92, 93, 94, 95])])
def test_gmsh_reference_nodes_match_gmsh(dim, types):
    import gmsh
    gmsh.initialize(interruptible=False)
    try:
        for p, t in enumerate(types, start=1):
            ref = np.asarray(gmsh.model.mesh.getElementProperties(t)[4]).reshape(-1, dim)
            np.testing.assert_allclose(_ordering.gmsh_reference(dim, p), ref, atol=1e-14)
    finally:
        gmsh.finalize()


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_orderings_are_permutations_of_the_lattice(dim, p):
    for ref in (_ordering.gmsh_reference(dim, p), _ordering.vtk_lagrange_reference(dim, p)):
        perm = _ordering.to_tensor_permutation(ref, p)
        assert sorted(perm.tolist()) == list(range((p + 1) ** dim))
        lattice = np.indices((p + 1,) * dim).reshape(dim, -1).T
        np.testing.assert_allclose(ref[perm], -1 + 2 * lattice / p, atol=1e-14)


@pytest.mark.parametrize("dim, g", [(2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (3, 3)])
def test_box_written_as_msh_reads_back_with_its_jacobians_and_regions(tmp_path, dim, g):
    um, bm = _file_mesh(tmp_path, dim, 2, geom_order=g, distortion=0.05)
    pts = np.linspace(-0.9, 0.9, 4)
    np.testing.assert_allclose(fem.jacobian(um, pts), fem.jacobian(bm, pts), atol=1e-13)
    assert sorted(um.boundary_regions) == sorted(bm.boundary_regions)
    for r in bm.boundary_regions:
        e1, f1 = um.boundary_facets(r)
        e2, f2 = bm.boundary_facets(r)
        assert sorted(zip(e1.tolist(), f1.tolist())) == sorted(zip(e2.tolist(), f2.tolist()))


@needs_gmsh
@pytest.mark.parametrize("dim, order", [(2, 1), (2, 2), (2, 4), (3, 1), (3, 2), (3, 3)])
def test_gmsh_box_nodes_in_tensor_order(tmp_path, dim, order):
    """A box meshed by gmsh (structured, order ``order``): after the permutation every
    element's nodes are affine in the multi-index, |J| is the constant h^d / 2^d."""
    import gmsh
    gmsh.initialize(interruptible=False)
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.model.add("box")
        if dim == 2:
            gmsh.model.occ.addRectangle(0, 0, 0, 2, 1)
        else:
            gmsh.model.occ.addBox(0, 0, 0, 2, 1, 1)
        gmsh.model.occ.synchronize()
        for _, c in gmsh.model.getEntities(1):
            gmsh.model.mesh.setTransfiniteCurve(c, 3)
        for _, s in gmsh.model.getEntities(2):
            gmsh.model.mesh.setTransfiniteSurface(s)
            gmsh.model.mesh.setRecombine(2, s)
        if dim == 3:
            for _, v in gmsh.model.getEntities(3):
                gmsh.model.mesh.setTransfiniteVolume(v)
        gmsh.model.mesh.generate(dim)
        gmsh.model.mesh.setOrder(order)
        path = str(tmp_path / "box.msh")
        gmsh.write(path)
    finally:
        gmsh.finalize()
    m = fem.read_mesh(path)
    assert m.nelements == 2 ** dim and m.geom_order == order
    X = m.nodes                                       # (E, dim, ng, ...)
    for a in range(dim):                              # second differences vanish
        d2 = np.diff(X, n=2, axis=2 + a) if order >= 2 else np.zeros(1)
        assert np.abs(d2).max() < 1e-12
    detJ = fem.det_jacobian(fem.jacobian(m, np.array([-0.5, 0.3])))
    np.testing.assert_allclose(detJ, (2.0 if dim == 2 else 2.0) / 2 ** dim / 2 ** dim, rtol=1e-12)


# ---------------------------------------------------------------- errors


def test_missing_file_is_named(tmp_path):
    path = str(tmp_path / "nope.msh")
    with pytest.raises(FileNotFoundError, match="nope.msh"):
        fem.read_mesh(path)


# (file name, contents, what the message must say): each raises ValueError naming the file
UNREADABLE = [
    ("empty.msh", "", r"'[^']*empty\.msh' is empty"),
    ("empty.vtu", "", r"'[^']*empty\.vtu' is empty"),
    ("bad.vtk", "garbage\n", r"could not read '[^']*bad\.vtk': Illegal VTK header"),
    ("bad.vtu", "<not xml", r"could not read '[^']*bad\.vtu': .*vtu"),
    ("cut.msh", "$MeshFormat\n4.1 0 8\n$EndMeshFormat\n$Nodes\n1 2\n",
     r"could not read '[^']*cut\.msh': .*unpack"),
    ("mesh.xyz", "1 2 3\n", r"could not read '[^']*mesh\.xyz': .*file format"),
]


@pytest.mark.parametrize("fname, text, match", UNREADABLE)
def test_unreadable_file_raises_value_error(tmp_path, capsys, fname, text, match):
    """meshio ends the process (SystemExit) on a file none of its readers takes: read_mesh
    turns that, and meshio's own errors, into a ValueError with the reader's words."""
    path = tmp_path / fname
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        fem.read_mesh(str(path))
    out, err = capsys.readouterr()
    assert out == "" and err == "", (out, err)      # what meshio printed is in the message


def test_a_directory_is_not_a_mesh(tmp_path):
    with pytest.raises(ValueError, match="could not read"):
        fem.read_mesh(tmp_path)


def test_simplices_and_serendipity_are_refused():
    pts = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="unsupported cell type.*triangle"):
        fem.read_mesh(meshio.Mesh(pts, [("triangle", [[0, 1, 2]])]))
    with pytest.raises(ValueError, match="no quadrilateral or hexahedral cells.*SaveAll"):
        fem.read_mesh(meshio.Mesh(pts, [("line", [[0, 1]])]))
    pts8 = np.random.default_rng(0).random((8, 2))
    with pytest.raises(ValueError, match="quad8"):
        fem.read_mesh(meshio.Mesh(pts8, [("quad8", [list(range(8))])]))


def test_mixed_cell_types_are_refused():
    pts = np.array([[x, y] for y in (0.0, 1.0, 2.0) for x in (0.0, 1.0, 2.0)] + [[0.5, 0.5]] * 5)
    m = meshio.Mesh(pts, [("quad", [[0, 1, 4, 3]]), ("quad9", [[1, 2, 5, 4, 9, 10, 11, 12, 13]])])
    with pytest.raises(ValueError, match="mixed cell types"):
        fem.read_mesh(m)


def test_inverted_element_is_named():
    pts = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]])
    m = meshio.Mesh(pts, [("quad", [[0, 1, 4, 3], [2, 1, 4, 5]])])      # the second clockwise
    with pytest.raises(ValueError, match="inverted element.*element 1"):
        fem.read_mesh(m)


def test_hanging_node_is_refused():
    pts = np.array([[0, 0], [1, 0], [1, 2], [0, 2], [2, 0], [2, 1], [1, 1], [2, 2]], float)
    m = meshio.Mesh(pts, [("quad", [[0, 1, 2, 3], [1, 4, 5, 6], [6, 5, 7, 2]])])
    with pytest.raises(ValueError, match="non-conforming"):
        fem.read_mesh(m)


def test_unknown_region_is_named(tmp_path, diffusion):
    um, _ = _file_mesh(tmp_path, 2, 2)
    V = fem.H1Space(um, 2)
    with pytest.raises(KeyError, match="'wall'.*xmax"):
        V.boundary_dofs("wall")
    with pytest.raises(KeyError, match="'wall'"):
        fem.solve_poisson(um, 2, 1.0, dirichlet={"wall": 0.0}, device="cpu")
    with pytest.raises(KeyError, match="'top'.*ymax"):
        fem.box_mesh(2, 2).boundary_facets("top")


# ---------------------------------------------------------------- spaces


def _rotated_mesh(bm):
    """The box mesh's elements, each with its local numbering rotated (all rotations used)."""
    rots = rotations(bm.dim)
    nodes = [oriented(bm.nodes[e], rots[e % len(rots)]) for e in range(bm.nelements)]
    return fem.from_elements(np.array(nodes)), len(rots)


def _match(Va, Vb):
    """perm with Vb's DoF perm[i] at the coordinates of Va's DoF i."""
    xa, xb = Va.dof_coordinates().T, Vb.dof_coordinates().T
    ka = np.round(xa * 1e9).astype(np.int64)
    kb = np.round(xb * 1e9).astype(np.int64)
    ia = np.lexsort(ka.T[::-1])
    ib = np.lexsort(kb.T[::-1])
    assert np.array_equal(ka[ia], kb[ib]), "the two spaces' DoFs are not at the same points"
    perm = np.empty(len(xa), dtype=np.int64)
    perm[ia] = ib
    return perm


@pytest.mark.parametrize("dim, n, ps", [(2, 3, (2, 3, 4, 5)), (3, 3, (2, 3, 4, 5))])
def test_every_local_orientation_gives_the_structured_operator(dim, n, ps, standin):
    bm = fem.box_mesh(dim, n, geom_order=2, distortion=0.05)
    rm, nrot = _rotated_mesh(bm)
    assert nrot == (4 if dim == 2 else 24) and rm.nelements >= nrot
    rng = np.random.default_rng(1)
    f = lambda x: np.sin(3 * x[0]) + x[1] ** 2          # noqa: E731
    for p in ps:
        Vb, Vr = fem.H1Space(bm, p), fem.H1Space(rm, p)
        assert Vb.ndofs == Vr.ndofs
        perm = _match(Vb, Vr)
        x = rng.standard_normal(Vb.ndofs)
        xr = np.empty_like(x)
        xr[perm] = x
        Kb = fem.diffusion_operator(Vb, device="cpu")
        Kr = fem.diffusion_operator(Vr, device="cpu")
        np.testing.assert_allclose(Kr(xr)[perm], Kb(x), atol=1e-12 * np.abs(Kb(x)).max())
        Mb, Mr = (fem.mass_operator(V, device="cpu", backend="reference") for V in (Vb, Vr))
        np.testing.assert_allclose(Mr(xr)[perm], Mb(x), atol=1e-13)
        np.testing.assert_allclose(fem.load_vector(Vr, f)[perm], fem.load_vector(Vb, f),
                                   atol=1e-14)
        np.testing.assert_array_equal(np.sort(perm[Vb.boundary_dofs()]), Vr.boundary_dofs())
        if dim == 2 or p == 2:                              # the solutions themselves
            ub = _dense_solve(Vb, f)
            ur = _dense_solve(Vr, f)
            np.testing.assert_allclose(ur[perm], ub, atol=1e-12 * np.abs(ub).max())


def _dense_solve(V, f):
    prob = fem.poisson_problem(V.mesh, V.p, f, dirichlet=lambda x: x[0], device="cpu")
    A = np.stack([prob.A(c) for c in np.eye(V.ndofs)], axis=1)
    return np.linalg.solve(A, prob.b)


def test_unstructured_space_multiplicity_and_gather_scatter(tmp_path):
    um, bm = _file_mesh(tmp_path, 3, 2)
    V, Vb = fem.H1Space(um, 3), fem.H1Space(bm, 3)
    perm = _match(Vb, V)
    np.testing.assert_array_equal(V.multiplicity()[perm], Vb.multiplicity())
    x = np.random.default_rng(2).standard_normal(V.ndofs)
    v = np.random.default_rng(3).standard_normal(V.evector_shape)
    assert np.isclose(np.vdot(V.gather(x), v), np.vdot(x, V.scatter(v)), rtol=1e-13)


# ---------------------------------------------------------------- boundary conditions


def test_constrained_operator_with_scipy_and_fem_cg(diffusion):
    from scipy.sparse.linalg import cg as scipy_cg
    V = fem.H1Space(fem.box_mesh(2, 3, distortion=0.05), 2)
    K = fem.diffusion_operator(V, device="cpu")
    bc = fem.dirichlet_bc(V, lambda x: x[0] + 2 * x[1])
    A = bc.constrain(K)
    b = bc.lift(K, np.zeros(V.ndofs))
    u1 = fem.cg(A, b, tol=1e-13, precond=fem.jacobi(A.diagonal())).x
    u2, info = scipy_cg(A.aslinearoperator(), b, rtol=1e-13)
    x = V.dof_coordinates()
    np.testing.assert_allclose(u1, x[0] + 2 * x[1], atol=1e-10)     # linear: exact
    assert info == 0 and np.abs(u2 - u1).max() < 1e-9
    np.testing.assert_allclose(u1[bc.dofs], bc.values, atol=1e-12)
    np.testing.assert_array_equal(bc.apply(u1)[bc.dofs], bc.values)


def test_energy_identity_on_a_file_mesh(diffusion):
    m = fem.read_mesh(fem.meshes.demo_mesh_path(2))
    c = np.array([0.7, -1.3])
    for p in (m.geom_order, m.geom_order + 1):
        V = fem.H1Space(m, p)
        u = c @ V.dof_coordinates()
        K = fem.diffusion_operator(V, device="cpu")
        np.testing.assert_allclose(u @ K(u), (c @ c) * m.volume, rtol=1e-12)
        np.testing.assert_allclose(K(np.ones(V.ndofs)), 0, atol=1e-12)


def test_neumann_load_is_the_flux_of_a_linear_field(tmp_path):
    um, _ = _file_mesh(tmp_path, 3, 2, distortion=0.05)
    V = fem.H1Space(um, 2)
    c = np.array([1.0, 2.0, 3.0])
    b = fem.boundary_load(V, lambda x, n: np.einsum("i,i...->...", c, n))
    assert abs(b.sum()) < 1e-12                                  # div c = 0
    b = fem.boundary_load(V, 1.0, "xmax")
    assert np.isclose(b.sum(), 1.0, rtol=1e-12)                  # the area of the side


# ---------------------------------------------------------------- convergence

U2 = lambda x: np.sin(2 * x[0]) * np.exp(x[1])                   # noqa: E731
F2 = lambda x: 3 * np.sin(2 * x[0]) * np.exp(x[1])               # noqa: E731  -lap U2
U3 = lambda x: np.sin(x[0]) * np.cos(x[1]) * np.exp(x[2])        # noqa: E731
F3 = lambda x: np.sin(x[0]) * np.cos(x[1]) * np.exp(x[2])        # noqa: E731  -lap U3


def _flux(u):
    return lambda x, n: np.einsum("i...,i...->...", fem.exact_gradient(u, x), n)


def _rates(errs):
    e = np.asarray(errs)
    return np.log2(e[:-1] / e[1:])


# p = 1..6 in 2D and 3D with SMALLTC_TEST_FULL=1; by default the low orders, the highest
# 2D one and a middle one (each p is a set of kernels to compile)
CONV = [(2, p) if (2, p) in {(2, 1), (2, 2), (2, 4), (2, 6)} else full_only(2, p)
        for p in range(1, 7)] + \
    [(3, p) if p <= 3 else full_only(3, p) for p in range(1, 7)]
CONV_IDS = [f"{d}d-p{p}" for d in (2, 3) for p in range(1, 7)]


@pytest.mark.parametrize("dim, p", CONV, ids=CONV_IDS)
@pytest.mark.parametrize("bc", ["dirichlet", "mixed"])
def test_convergence_on_curved_file_meshes(tmp_path, standin, dim, p, bc):
    """A curved mesh read from a .msh file (quadratic maps: a sine-distorted box, 2 x 2 in
    2D, one hexahedron in 3D) and its two uniform refinements (nested: each child keeps its
    parent's curved map): L2 at rate p + 1, H1 at p, over the last refinement."""
    u, f = (U2, F2) if dim == 2 else (U3, F3)
    um, _ = _file_mesh(tmp_path, dim, 2 if dim == 2 else 1, geom_order=2,
                       distortion=0.1 if dim == 2 else 0.03)
    meshes = [um, um.refine()]
    meshes.append(meshes[-1].refine())
    l2, h1 = [], []
    for m in meshes:
        kw = {"dirichlet": u} if bc == "dirichlet" else \
             {"dirichlet": {r: u for r in ("xmin", "ymin")}, "neumann":
              {r: _flux(u) for r in m.boundary_regions if r not in ("xmin", "ymin")}}
        res = fem.solve_poisson(m, p, f, exact=u, tol=1e-13, device="cpu", **kw)
        l2.append(res.l2_error)
        h1.append(res.h1_error)
    assert abs(_rates(l2)[-1] - (p + 1)) < 0.2, (l2, _rates(l2))
    assert abs(_rates(h1)[-1] - p) < 0.2, (h1, _rates(h1))


@needs_gmsh
def test_demo_mesh_script_and_a_gmsh_convergence(tmp_path, standin):
    """make_demo_mesh (the script behind the shipped file) and a Poisson solve on its
    refinements: curved arcs, optimal rates."""
    from smalltc.fem.meshes import make_demo_mesh
    shipped = fem.read_mesh(fem.meshes.demo_mesh_path(2))
    made = fem.read_mesh(make_demo_mesh(str(tmp_path / "a.msh"), dim=2, n=4, order=3))
    np.testing.assert_allclose(made.nodes, shipped.nodes, atol=1e-12)
    m3 = fem.read_mesh(make_demo_mesh(str(tmp_path / "a3.msh"), dim=3, n=2, order=2))
    assert sorted(m3.boundary_regions) == ["back", "bottom", "front", "inner", "left", "outer"]
    p, l2, h1 = 3, [], []
    base = fem.read_mesh(make_demo_mesh(str(tmp_path / "c.msh"), dim=2, n=2, order=2))
    for m in (base, base.refine(), base.refine().refine()):
        res = fem.solve_poisson(m, p, F2, dirichlet={"inner": U2, "outer": U2},
                                neumann={"left": _flux(U2), "bottom": _flux(U2)},
                                exact=U2, tol=1e-13, device="cpu")
        l2.append(res.l2_error)
        h1.append(res.h1_error)
    assert abs(_rates(l2)[-1] - (p + 1)) < 0.2 and abs(_rates(h1)[-1] - p) < 0.2, (l2, h1)


def test_package_diffusion_operator_matches_the_standin_on_a_file_mesh():
    if not hasattr(fem, "diffusion_operator"):
        pytest.skip("smalltc.fem.diffusion_operator is not in this build")
    m = fem.read_mesh(fem.meshes.demo_mesh_path(2))
    V = fem.H1Space(m, 3)
    x = np.random.default_rng(4).standard_normal(V.ndofs)
    K = fem.diffusion_operator(V, device="cpu")
    S = diffusion_standin.diffusion_operator(V, device="cpu")
    np.testing.assert_allclose(K(x), S(x), atol=1e-11 * np.abs(S(x)).max())
    res = fem.solve_poisson(fem.meshes.demo_mesh_path(2), 3, F2, dirichlet=U2, exact=U2,
                            device="cpu")
    assert res.l2_error < 1e-3 and res.h1_error < 1e-2


# ---------------------------------------------------------------- output


@pytest.mark.parametrize("dim, p", [(2, 1), (2, 3), (3, 2), (3, 4)])
def test_vtu_written_and_read_back(tmp_path, dim, p):
    m = fem.read_mesh(fem.meshes.demo_mesh_path(dim))
    V = fem.H1Space(m, p)
    x = V.dof_coordinates()
    u = np.sin(x[0]) + x[1] ** 2
    path = fem.write_vtu(str(tmp_path / "u.vtu"), V, u=u, grad=np.stack([x[0], x[1]]))
    r = meshio.read(path)
    assert r.cells[0].type == ("VTK_LAGRANGE_QUADRILATERAL" if dim == 2 else
                               "VTK_LAGRANGE_HEXAHEDRON")
    assert r.cells[0].data.shape == (m.nelements, (p + 1) ** dim)
    written = fem.to_meshio(V, u=u, grad=np.stack([x[0], x[1]]))
    np.testing.assert_array_equal(r.point_data["u"], written.point_data["u"])
    np.testing.assert_allclose(r.points, written.points)
    # the points sit where the element maps put the equispaced nodes; vertices carry u
    np.testing.assert_allclose(r.point_data["grad"][:, 0], r.points[:, 0], atol=1e-12)
    corners = r.cells[0].data[:, : 2 ** dim].ravel()
    xc = r.points[corners, :dim].T
    np.testing.assert_allclose(r.point_data["u"][corners], np.sin(xc[0]) + xc[1] ** 2,
                               atol=1e-12)
    # each cell's VTK order: the first 2^dim nodes are its corners in VTK's order
    ref = _ordering.vtk_lagrange_reference(dim, p)
    assert np.allclose(np.abs(ref[: 2 ** dim]), 1)


def test_vtu_errors(tmp_path):
    V = fem.H1Space(fem.box_mesh(2, 1), 1)
    with pytest.raises(ValueError, match="field 'u' has shape"):
        fem.write_vtu(str(tmp_path / "a.vtu"), V, u=np.zeros(3))
    with pytest.raises(ValueError, match=".vtu"):
        fem.write_vtu(str(tmp_path / "a.txt"), V, u=np.zeros(4))
    with pytest.raises(ValueError, match="compression must be"):
        fem.write_vtu(str(tmp_path / "a.vtu"), V, compression="gzip", u=np.zeros(4))


@pytest.mark.parametrize("compression", [None, "zlib"])
def test_vtu_compression_reads_back(tmp_path, compression):
    import meshio
    V = fem.H1Space(fem.box_mesh(2, 2), 2)
    u = V.dof_coordinates()[0] ** 2
    m = meshio.read(fem.write_vtu(str(tmp_path / "a.vtu"), V, compression=compression, u=u))
    assert np.allclose(m.point_data["u"], m.points[:, 0] ** 2)


# ---------------------------------------------------------------- README and demo

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_poisson_example_runs(tmp_path, monkeypatch, capsys):
    import re
    if not hasattr(fem, "diffusion_operator"):
        monkeypatch.setattr(fem, "diffusion_operator", diffusion_standin.diffusion_operator,
                            raising=False)
    text = open(README).read()
    (code,) = re.findall(r"```python poisson\n(.*?)```", text, flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, README, "exec"), {})
    out = capsys.readouterr().out
    assert "UnstructuredMesh(dim=2" in out and "True True" in out
    assert (tmp_path / "poisson.vtu").stat().st_size > 1000
    for png in ("benchmarks/fem-poisson/poisson-solution.png",
                "benchmarks/fem-poisson/poisson-convergence.png"):
        assert png in text
        assert os.path.getsize(os.path.join(os.path.dirname(README), png)) > 10_000


def test_poisson_demo_writes_vtu_and_pngs(tmp_path, standin):
    rep = fem.poisson_demo(str(tmp_path), p=2, ps=(1, 2), refinements=1, device="cpu")
    assert rep["l2_error"] < 1e-2 and rep["iterations"] > 0
    assert abs(rep["convergence"][2]["rate_l2"] - 3) < 0.3
    for path in rep["pngs"]:
        assert os.path.getsize(path) > 10_000
    assert meshio.read(rep["vtu"]).point_data["u"].shape == (rep["dofs"],)
    assert sorted(os.path.basename(p) for p in rep["pngs"]) == ["poisson-convergence.png",
                                                                "poisson-solution.png"]


# ---------------------------------------------------------------- serial and distributed layers


def test_serial_layer_imports_nothing_of_the_distributed_one():
    import subprocess
    import sys
    code = ("import sys, numpy as np; from smalltc import fem; "
            "fem.l2_project(fem.box_mesh(1, 2), 1, 1.0, device='cpu'); "
            "fem.mass_operator(fem.H1Space(fem.box_mesh(1, 2), 1)); "
            "fem.cg(lambda x: x, np.ones(2)); "
            "print(sorted(m for m in sys.modules if 'distributed' in m or m.startswith('mpi4py')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    here = os.path.dirname(fem.__file__)
    for name in ("operators.py", "projection.py", "solvers.py", "space.py", "geometry.py"):
        src = open(os.path.join(here, name)).read()
        assert "from .distributed" not in src and "import mpi4py" not in src, name


def test_distribute_mesh_points_a_file_mesh_to_partition_mesh():
    from smalltc.fem.distributed.space import distribute_mesh
    m = fem.read_mesh(fem.meshes.demo_mesh_path(2))
    with pytest.raises(TypeError, match="cuts box meshes.*UnstructuredMesh.*partition_mesh"):
        distribute_mesh(m, None)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("smalltc._arrays", fromlist=["gpu_available"]).gpu_available(),
                    reason="no CUDA device")
def test_poisson_on_a_file_mesh_on_the_gpu_matches_the_cpu(diffusion):
    import cupy
    m = fem.read_mesh(fem.meshes.demo_mesh_path(3))
    V = fem.H1Space(m, 2)
    v = np.random.default_rng(5).standard_normal(V.evector_shape)
    np.testing.assert_allclose(V.scatter(cupy.asarray(v)).get(), V.scatter(v), atol=1e-12)
    kw = dict(dirichlet={"inner": U3, "outer": U3}, neumann={"front": _flux(U3)}, exact=U3,
              tol=1e-12)
    cpu = fem.solve_poisson(m, 2, F3, device="cpu", **kw)
    gpu = fem.solve_poisson(m, 2, F3, device="gpu", **kw)
    assert gpu.device == "gpu" and isinstance(gpu.u, np.ndarray)
    np.testing.assert_allclose(gpu.u, cpu.u, atol=1e-9)
    prob = fem.poisson_problem(m, 2, F3, device="gpu", **{k: kw[k] for k in ("dirichlet", "neumann")})
    from cupyx.scipy.sparse.linalg import cg as cupy_cg
    import inspect
    key = "rtol" if "rtol" in inspect.signature(cupy_cg).parameters else "tol"
    x, info = cupy_cg(prob.A.aslinearoperator(), prob.b, **{key: 1e-12})
    assert info == 0 and float(abs(prob.bc.apply(x).get() - cpu.u).max()) < 1e-8


@pytest.mark.parametrize("dim", [2, 3])
def test_vtu_of_lagrange_cells_reads_back_as_a_mesh(tmp_path, dim):
    """write_vtu -> read_mesh: the VTK Lagrange orders both ways give the same maps."""
    m = fem.read_mesh(fem.meshes.demo_mesh_path(dim))
    V = fem.H1Space(m, m.geom_order)
    back = fem.read_mesh(fem.write_vtu(str(tmp_path / "m.vtu"), V))
    assert back.geom_order == m.geom_order and back.nelements == m.nelements
    pts = np.array([-0.7, 0.1, 0.8])
    np.testing.assert_allclose(fem.jacobian(back, pts), fem.jacobian(m, pts), atol=1e-12)


def test_kappa_and_the_parts_of_the_problem(diffusion):
    """kappa = 2 with 2 f gives the solution of kappa = 1 with f; solve_poisson equals the
    loop over its parts (poisson_problem, fem.cg); a pure Neumann problem is refused."""
    m = fem.read_mesh(fem.meshes.demo_mesh_path(2))
    kw = dict(dirichlet={"inner": U2, "outer": U2},
              neumann={"left": _flux(U2), "bottom": _flux(U2)}, tol=1e-12, device="cpu")
    r1 = fem.solve_poisson(m, 2, F2, exact=U2, **kw)
    flux2 = lambda x, n: 2 * _flux(U2)(x, n)              # noqa: E731
    kw2 = dict(kw, neumann={"left": flux2, "bottom": flux2})
    r2 = fem.solve_poisson(m, 2, lambda x: 2 * F2(x), kappa=2.0, **kw2)
    np.testing.assert_allclose(r2.u, r1.u, atol=1e-9)
    prob = fem.poisson_problem(m, 2, F2, **{k: kw[k] for k in ("dirichlet", "neumann")},
                               device="cpu")
    sol = fem.cg(prob.A, prob.b, tol=1e-12, precond=fem.jacobi(prob.A.diagonal()))
    np.testing.assert_allclose(prob.bc.apply(sol.x), r1.u, atol=1e-9)
    assert r1.l2_error < 5e-3 and r1.h1_error < 0.1 and r1.iterations == sol.iterations
    with pytest.raises(ValueError, match="singular"):
        fem.solve_poisson(m, 2, F2, neumann={"left": 0.0}, device="cpu")
