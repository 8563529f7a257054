"""smalltc.fem.distributed in one process: the partition (every rank simulated in turn),
one-rank runs through mpi4py's COMM_SELF, and the errors. The runs under mpiexec are in
test_fem_distributed_mpi.py."""
import os
import subprocess
import sys

import numpy as np
import pytest

import smalltc
from optional_deps import needs
from smalltc import fem
from smalltc.fem import H1Space, basis_1d, box_mesh, cg, jacobi, l2_project, mass_data
from smalltc.fem.mesh import BoxMesh, _place, _reference_coordinates
from smalltc.fem.distributed.partition import box_indices, partition_box, process_grid

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py (pip install 'smalltc[mpi]')")

from smalltc.fem import distributed as dist  # noqa: E402  (after the skip)

# --------------------------------------------------------------------------- partition

GRIDS = [  # (mesh shape, ranks, expected grid)
    ((8,), 3, (3,)),
    ((4, 6), 6, (2, 3)),
    ((16, 4), 4, (4, 1)),
    ((8, 8, 8), 4, (1, 2, 2)),
    ((8, 8, 8), 8, (2, 2, 2)),
    ((3, 2, 4), 6, (2, 1, 3)),
    ((4, 4, 16), 2, (1, 1, 2)),
    ((5, 3, 2), 3, (3, 1, 1)),
]


@pytest.mark.parametrize("shape,nranks,grid", GRIDS)
def test_process_grid_keeps_interfaces_small(shape, nranks, grid):
    assert process_grid(shape, nranks) == grid
    part = partition_box(shape, nranks)
    sizes = [int(np.prod(part.block_shape(r))) for r in range(nranks)]
    assert sum(sizes) == int(np.prod(shape)) and min(sizes) >= 1


@pytest.mark.parametrize("shape,nranks,match", [
    ((2, 2), 5, "cannot partition a mesh of 2 x 2 elements into 5 blocks.*near 5: 4, 2, 1"),
    ((3,), 4, "cannot partition a mesh of 3 elements into 4 blocks"),
    ((2, 2, 2), 0, "rank count must be a positive integer"),
])
def test_process_grid_errors(shape, nranks, match):
    with pytest.raises(ValueError, match=match):
        process_grid(shape, nranks)


def _block_mesh(mesh, part, r):
    start, stop = part.block(r)
    elems = box_indices((start, stop), ((0,) * mesh.dim, mesh.shape))
    local = BoxMesh(mesh.dim, part.block_shape(r), mesh.geom_order, mesh.lower, mesh.upper,
                    mesh.geom_nodes, mesh.nodes[elems], mesh.distortion)
    return local, elems


SIMULATED = [((7,), 3), ((4, 5), 4), ((3, 4), 6), ((4, 4, 4), 8), ((3, 2, 4), 6), ((2, 3, 3), 4)]


@pytest.mark.parametrize("shape,nranks", SIMULATED)
@pytest.mark.parametrize("p", [1, 3])
def test_partition_reassembles_the_serial_operator(shape, nranks, p):
    """Every rank's local operator plus the exchange lists give the serial M x; every node
    has one owner; the ghost elements are exactly those touching a ghost."""
    dim, nq = len(shape), p + 1
    part = partition_box(shape, nranks)
    mesh = box_mesh(dim, shape, distortion=0.05)
    V = H1Space(mesh, p)
    B, D = basis_1d(p, nq).B1d, mass_data(mesh, nq)
    x = np.random.default_rng(1).random(V.ndofs)
    full = ((0,) * dim, V.lattice_shape)
    ranks = {}
    for r in range(nranks):
        local, elems = _block_mesh(mesh, part, r)
        Vl = H1Space(local, p)
        l2g = box_indices(part.local_box(r, p), full)
        assert np.array_equal(l2g[Vl.elem_dofs], V.elem_dofs[elems])    # the local numbering
        y = smalltc.mass_apply(B, np.ascontiguousarray(D[elems]), x[l2g], Vl.dof_map(),
                               backend="reference")
        sends, recvs = part.exchange_lists(r, p)
        ghosts = np.zeros(Vl.ndofs, dtype=bool)
        for idx in recvs.values():
            ghosts[idx] = True
        touches = ghosts[Vl.elem_dofs].reshape(len(elems), -1).any(axis=1)
        assert np.array_equal(touches, part.ghost_elements(r))
        owned = box_indices(part.owned_box(r, p), part.local_box(r, p))
        assert not ghosts[owned].any() and ghosts.sum() + owned.size == Vl.ndofs
        ranks[r] = dict(y=y, l2g=l2g, sends=sends, recvs=recvs, ghosts=ghosts, owned=owned)
    for r, a in ranks.items():                       # the reverse exchange, by hand
        for q, idx in a["recvs"].items():
            b = ranks[q]
            assert np.array_equal(a["l2g"][idx], b["l2g"][b["sends"][r]])
            b["y"][b["sends"][r]] += a["y"][idx]
    y, count = np.zeros(V.ndofs), np.zeros(V.ndofs, dtype=int)
    for a in ranks.values():
        y[a["l2g"][a["owned"]]] = a["y"][a["owned"]]
        count[a["l2g"][a["owned"]]] += 1
    assert (count == 1).all()
    ref = smalltc.mass_apply(B, D, x, V.dof_map(), backend="reference")
    assert np.abs(y - ref).max() <= 1e-14 * np.abs(ref).max()


@pytest.mark.parametrize("distortion", [0.05, lambda xh: xh + 0.02 * np.sin(np.pi * xh)])
def test_block_coordinates_are_the_whole_meshs(distortion):
    mesh = box_mesh(3, (4, 3, 5), geom_order=2, distortion=distortion, lower=-1, upper=(1, 2, 3))
    part = partition_box(mesh.shape, 6)
    for r in range(6):
        start, stop = part.block(r)
        nodes = _place(_reference_coordinates(mesh.shape, mesh.geom_nodes, start, stop),
                       distortion, mesh.lower, mesh.upper)
        assert np.array_equal(nodes, _block_mesh(mesh, part, r)[0].nodes)


# --------------------------------------------------------------------------- one rank

def test_one_rank_is_the_serial_solve_bit_for_bit():
    mesh = box_mesh(3, 3, distortion=0.05, geom_order=2)
    f = smalltc.fem.smooth_function
    ser = l2_project(mesh, 3, f, device="cpu")
    for m in (mesh, dist.distributed_box_mesh(3, 3, MPI.COMM_SELF, distortion=0.05,
                                              geom_order=2)):
        res = l2_project(m, 3, f, device="cpu", comm=MPI.COMM_SELF if m is mesh else None)
        assert np.array_equal(res.u, ser.u) and np.array_equal(res.residuals, ser.residuals)
        assert res.l2_error == ser.l2_error and res.iterations == ser.iterations
        d = res.distribution
        assert (d["ranks"], d["owned_dofs"], d["transport"]) == (1, ser.space.ndofs, "host")
        assert set(res.timings) >= {"setup", "solve", "error", "halo", "halo_wait", "allreduce"}


@pytest.mark.parametrize("fused", [True, False])
def test_cg_with_a_reducer_of_one_rank_is_serial_cg(fused):
    A = np.diag(np.arange(1.0, 9.0)) + 0.1
    b = np.linspace(1.0, 2.0, 8)
    P = jacobi(np.diag(A).copy())
    ser = cg(lambda v: A @ v, b, tol=1e-12, precond=P, fused=fused)
    red = dist.Reducer(MPI.COMM_SELF)
    res = cg(lambda v: A @ v, b, tol=1e-12, precond=P, fused=fused, comm=red)
    assert np.array_equal(res.x, ser.x) and res.iterations == ser.iterations
    assert red.calls > res.iterations
    res = cg(lambda v: A @ v, b, tol=1e-12, precond=P, fused=fused, comm=MPI.COMM_SELF)
    assert np.array_equal(res.x, ser.x)


def test_a_reducer_of_one_rank_sends_nothing():
    """On one rank a sum is the rank's own: no MPI call, no copy (CuPy arrays too)."""
    class Alone:
        def Get_size(self):
            return 1

        def Allreduce(self, *args, **kwargs):
            raise AssertionError("a one-rank reduction called MPI")
    red = dist.Reducer(Alone())
    a = np.arange(3.0)
    assert red.sums(1.5, 2) == (1.5, 2.0) and red.sum_array(a) is a
    assert np.array_equal(a, [0.0, 1.0, 2.0]) and red.calls == 2


def test_cg_errors_are_raised_with_a_communicator():
    with pytest.raises(ValueError, match="b contains non-finite values"):
        cg(lambda v: v, np.array([1.0, np.nan]), comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match=r"x0 has shape \(3,\), expected \(2,\)"):
        cg(lambda v: v, np.ones(2), x0=np.zeros(3), comm=MPI.COMM_SELF)


def test_space_operator_and_halo_on_one_rank():
    dm = dist.distribute_mesh(box_mesh(2, (3, 2)), MPI.COMM_SELF)
    V = dist.DistributedH1Space(dm, 2)
    assert (V.ndofs, V.nlocal, V.nowned, V.nghosts) == (35, 35, 35, 0)
    u = np.arange(35.0)
    assert np.array_equal(V.gather(u), u) and np.array_equal(V.global_to_local(u), u)
    M = smalltc.fem.mass_operator(V, 4)
    assert isinstance(M, dist.DistributedMassOperator) and M.halo.transport == "host"
    ser = smalltc.fem.mass_operator(H1Space(box_mesh(2, (3, 2)), 2), 4)
    assert np.array_equal(M(u), ser(u)) and np.array_equal(M.diagonal(), ser.diagonal())
    assert "rank=0 of 1" in repr(M) and "transport='host'" in repr(V.halo())
    assert dist.Halo(V.comm, {}, {}, np, transport="staged").transport == "staged"


def test_collective_and_agree_on_one_rank():
    assert dist.collective(MPI.COMM_SELF, int, "7") == 7
    with pytest.raises(ZeroDivisionError):                   # the rank's own error
        dist.collective(MPI.COMM_SELF, lambda: 1 / 0)
    dist.agree(MPI.COMM_SELF, {"p": 2})
    from smalltc.fem.distributed.comm import _ranges
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


@pytest.mark.parametrize("call,exc,match", [
    (lambda: dist.Halo(MPI.COMM_SELF, {}, {}, np, transport="nvlink"), ValueError,
     "transport must be one of"),
    (lambda: dist.DistributedH1Space(box_mesh(2, 2), 1), TypeError,
     "mesh must be a DistributedMesh"),
    (lambda: l2_project(box_mesh(2, 2), 1, 1.0, operator="assembled", device="cpu",
                        comm=MPI.COMM_SELF), ValueError, "matrix-free operator only"),
    (lambda: l2_project(box_mesh(2, 2), 0, 1.0, device="cpu", comm=MPI.COMM_SELF), ValueError,
     "p must be an integer >= 1"),
    (lambda: dist.DistributedMassOperator(
        dist.DistributedH1Space(dist.distribute_mesh(box_mesh(2, 2), MPI.COMM_SELF), 1),
        np.ones((4, 3, 3)), np.ones((2, 2))), ValueError, r"D has shape \(4, 3, 3\), expected"),
    (lambda: smalltc.fem.mass_operator(H1Space(box_mesh(2, 2), 1), assembled=True,
                                       comm=MPI.COMM_SELF), ValueError,
     "only the fused matrix-free mass operator is distributed"),
    (lambda: dist.distributed_box_mesh(2, 0, MPI.COMM_SELF), ValueError,
     "n must be a positive integer"),
])
def test_errors_name_what_is_wrong(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_a_launcher_mpi4py_does_not_belong_to_is_reported(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(RuntimeError, match="the launcher started 2 processes .* MPI sees one"):
        l2_project(box_mesh(2, 2), 1, 1.0, device="cpu", comm=MPI.COMM_WORLD)


def test_a_missing_mpi4py_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)
    with pytest.raises(RuntimeError, match=r"needs mpi4py .* pip install 'smalltc\[mpi\]'"):
        dist.load_mpi()


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **env))


def test_serial_runs_never_import_mpi4py():
    res = _run("import sys\nfrom smalltc import fem\n"
               "r = fem.l2_project(fem.box_mesh(2, 2), 1, 1.0, device='cpu')\n"
               "M = fem.mass_operator(fem.H1Space(fem.box_mesh(2, 2), 1))\n"
               "print('mpi4py' in sys.modules)\n")
    assert res.returncode == 0 and res.stdout.strip() == "False", res.stderr


def test_demo_mpi_without_mpi_says_what_is_missing():
    res = _run("import sys\nsys.modules['mpi4py'] = None\nfrom smalltc.app.cli import main\n"
               "sys.exit(main(['demo', '--mpi', '--quick']))\n")
    assert res.returncode == 2 and "pip install 'smalltc[mpi]'" in res.stderr, res.stderr
    res = _run("import sys\nfrom smalltc.app.cli import main\n"
               "sys.exit(main(['demo', '--mpi', '--quick']))\n",
               MPI4PY_LIBMPI="/nonexistent/libmpi.so")
    assert res.returncode == 2 and "loads no MPI library" in res.stderr, res.stderr


@pytest.mark.parametrize("dim,p", [(2, 2), (3, 1)])
def test_one_rank_poisson_is_the_serial_solve(dim, p):
    """comm=COMM_SELF: the same operator calls and the same CG as the serial solve."""
    u = lambda x: np.exp(x[0] + 0.5 * x[1])                                    # noqa: E731
    mesh = fem.box_mesh(dim, 3, distortion=0.05)
    kw = dict(dirichlet={None: u}, neumann={"xmax": lambda x: 2.0 * u(x)}, kappa=2.0, exact=u,
              tol=1e-12, device="cpu")
    f = lambda x: -2.5 * u(x)                                                  # noqa: E731
    ser = fem.solve_poisson(mesh, p, f, **kw)
    res = fem.solve_poisson(mesh, p, f, comm=MPI.COMM_SELF, **kw)
    assert res.distribution["ranks"] == 1 and res.iterations == ser.iterations
    assert np.abs(res.space.gather(res.u) - ser.u).max() <= 1e-12 * np.abs(ser.u).max()
    assert abs(res.l2_error - ser.l2_error) <= 1e-12 * ser.l2_error
    assert abs(res.h1_error - ser.h1_error) <= 1e-12 * ser.h1_error


def test_distributed_poisson_errors():
    mesh = fem.box_mesh(2, 2)
    with pytest.raises(ValueError, match="precond in"):
        fem.solve_poisson(mesh, 1, 1.0, precond="chebyshev", comm=MPI.COMM_SELF, device="cpu")
    with pytest.raises(KeyError, match="no boundary region 'top'"):
        fem.solve_poisson(mesh, 1, 1.0, dirichlet={"top": 0.0}, comm=MPI.COMM_SELF,
                          device="cpu")
    with pytest.raises(ValueError, match="singular"):
        fem.solve_poisson(mesh, 1, 1.0, neumann={"xmin": 0.0}, dirichlet={}, comm=MPI.COMM_SELF,
                          device="cpu")


def test_element_graph_and_metis_parts():
    """The annulus's element graph is symmetric with a neighbour per shared facet; METIS
    splits it into connected non-empty parts."""
    from smalltc.fem.distributed.unstructured import element_graph, metis_parts
    mesh = fem.read_mesh(fem.demo_mesh_path(2))
    xadj, adj = element_graph(mesh.vertices, 2)
    pairs = {(e, int(q)) for e in range(mesh.nelements) for q in adj[xadj[e]:xadj[e + 1]]}
    assert pairs == {(q, e) for e, q in pairs}
    _, _, counts = fem.topology.boundary_facets_of(mesh.vertices, 2)
    assert len(pairs) == 2 * int((counts == 2).sum())
    assert metis_parts(mesh, 1).tolist() == [0] * mesh.nelements
    with pytest.raises(ValueError, match="run at most 16 ranks"):
        metis_parts(mesh, 17)
    pytest.importorskip("pymetis", reason="pymetis (pip install 'smalltc[mpi]')")
    parts = metis_parts(mesh, 3)
    assert sorted(set(parts.tolist())) == [0, 1, 2]


def test_metis_missing_names_the_extra(monkeypatch):
    import builtins
    from smalltc.fem.distributed.unstructured import metis_parts
    real = builtins.__import__

    def no_pymetis(name, *args, **kwargs):
        if name == "pymetis":
            raise ImportError("No module named 'pymetis'")
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_pymetis)
    with pytest.raises(ImportError, match=r"pip install 'smalltc\[mpi\]'"):
        metis_parts(fem.read_mesh(fem.demo_mesh_path(2)), 2)


def test_one_rank_file_mesh_poisson_is_serial():
    """A mesh file over one rank: the part is the whole mesh, the solve the serial one."""
    u = lambda x: np.exp(x[0] + 0.5 * x[1])                                    # noqa: E731
    path = fem.demo_mesh_path(2)
    kw = dict(dirichlet={None: u}, neumann={"outer": 0.0}, exact=u, tol=1e-12, device="cpu")
    f = lambda x: -1.25 * u(x)                                                 # noqa: E731
    ser = fem.solve_poisson(path, 2, f, **kw)
    res = fem.solve_poisson(path, 2, f, comm=MPI.COMM_SELF, **kw)
    assert type(res.space).__name__ == "PartitionedH1Space" and res.space.nghosts == 0
    assert res.iterations == ser.iterations
    assert np.abs(res.space.gather(res.u) - ser.u).max() <= 1e-12 * np.abs(ser.u).max()
    assert abs(res.l2_error - ser.l2_error) <= 1e-12 * ser.l2_error


def test_one_rank_pmg_solves_the_serial_problem():
    """precond="pmg" on one rank: the serial solution, in a few iterations."""
    u = lambda x: np.exp(x[0] + 0.5 * x[1])                                    # noqa: E731
    mesh = fem.box_mesh(2, 3, distortion=0.05)
    kw = dict(dirichlet={None: u}, exact=u, tol=1e-12, device="cpu")
    f = lambda x: -1.25 * u(x)                                                 # noqa: E731
    ser = fem.solve_poisson(mesh, 4, f, **kw)
    res = fem.solve_poisson(mesh, 4, f, comm=MPI.COMM_SELF, precond="pmg",
                            pmg_options={"degree": 3}, **kw)
    P = res.problem.precond
    assert P.orders == [4, 2, 1] and P.smoothers[0].degree == 3
    assert res.iterations < ser.iterations / 4
    assert np.abs(res.space.gather(res.u) - ser.u).max() <= 1e-9 * np.abs(ser.u).max()
    with pytest.raises(ValueError, match="not taken by the distributed p-multigrid"):
        fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, precond="pmg",
                          pmg_options={"smoother": "schwarz"}, **kw)


PMG_ONE_RANK = [  # (mesh, p): a distorted box and a Kershaw mesh (eps = 0.3)
    ("box", 2), ("box", 3), ("kershaw", 2), ("kershaw", 3),
]


def _pmg_problem(kind):
    u = lambda x: np.exp(x[0] + 0.5 * x[1])                                    # noqa: E731
    mesh = (fem.box_mesh(2, 4, distortion=0.05) if kind == "box"
            else fem.kershaw_mesh((6, 4), 0.3, dim=2))
    kw = dict(dirichlet={None: u}, exact=u, tol=1e-12, device="cpu", precond="pmg")
    return mesh, (lambda x: -1.25 * u(x)), kw


@pytest.mark.parametrize("kind,p", PMG_ONE_RANK)
def test_one_rank_pmg_with_amg_is_the_serial_pmg(kind, p):
    """The AMG coarse solve gathered on rank 0 (here the only one): the serial pmg's
    coarse matrix, hierarchy, smoothers and iterations."""
    needs("pyamg")
    mesh, f, kw = _pmg_problem(kind)
    ser = fem.solve_poisson(mesh, p, f, **kw)
    res = fem.solve_poisson(mesh, p, f, comm=MPI.COMM_SELF, **kw)
    P, S = res.problem.precond, ser.problem.precond
    assert type(P.coarse).__name__ == "GatheredAMG" and P.coarse_iterations == []
    A_ser = S.coarse.ml.levels[0].A
    A_dist = P.coarse.amg.ml.levels[0].A
    assert A_dist.shape == A_ser.shape and abs(A_dist - A_ser).max() <= 1e-13 * abs(A_ser).max()
    assert [s.lambda_max for s in P.smoothers] == pytest.approx(
        [lev.smoother.lambda_max for lev in S.levels[:-1]], rel=0.05)
    assert res.iterations == ser.iterations, (res.iterations, ser.iterations)
    assert np.abs(res.space.gather(res.u) - ser.u).max() <= 1e-10 * np.abs(ser.u).max()
    assert P.coarse.applications == res.iterations + 1       # one V-cycle per CG step


def test_pmg_graph_option_on_the_host():
    """graph="auto" on the host: launch by launch; True: an error naming what it needs."""
    needs("pyamg")
    mesh, f, kw = _pmg_problem("box")
    res = fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, **kw)
    P = res.problem.precond
    assert not P.graphed and P.cycles == res.iterations + 1 and "graphed=False" in repr(P)
    assert not P.coarse.on_device
    with pytest.raises(ValueError, match="graph=True needs the GPU"):
        fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, pmg_options={"graph": True}, **kw)
    with pytest.raises(ValueError, match="graph must be"):
        fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, pmg_options={"graph": "yes"}, **kw)


def test_pmg_exchanges_option():
    """exchanges="auto" on a box mesh: the consistent V-cycle ("sum"); "owner" asked for:
    the owner-form one; one rank: the same solve either way; a bad value: an error."""
    needs("pyamg")
    mesh, f, kw = _pmg_problem("box")
    got = {ex: fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF,
                                 pmg_options=None if ex == "auto" else {"exchanges": ex}, **kw)
           for ex in ("auto", "owner")}
    assert got["auto"].problem.precond.exchanges == "sum"
    assert got["owner"].problem.precond.exchanges == "owner"
    assert got["auto"].iterations == got["owner"].iterations
    np.testing.assert_allclose(got["auto"].u, got["owner"].u, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="exchanges must be one of"):
        fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, pmg_options={"exchanges": "both"},
                          **kw)


@pytest.mark.parametrize("shape, nranks, p", [((4,), 2, 2), ((4, 6), 4, 2), ((4, 4, 6), 8, 3),
                                               ((3, 5, 4), 6, 2)])
def test_shared_lists_and_elements(shape, nranks, p):
    """The nodes two blocks both hold, listed alike on both sides (the same global
    nodes, in the same order), and the elements touching them (a brute-force check)."""
    part = partition_box(shape, nranks)
    for r in range(nranks):
        lo, hi = part.local_box(r, p)
        lat = tuple(b - a for a, b in zip(lo, hi))
        glob = np.ravel_multi_index(np.indices(lat).reshape(len(shape), -1)
                                    + np.array(lo)[:, None], [n * p + 1 for n in shape])
        mine = part.shared_lists(r, p)
        nodes = set()
        for q, idx in mine.items():
            qlo, qhi = part.local_box(q, p)
            qlat = tuple(b - a for a, b in zip(qlo, qhi))
            qglob = np.ravel_multi_index(np.indices(qlat).reshape(len(shape), -1)
                                         + np.array(qlo)[:, None], [n * p + 1 for n in shape])
            np.testing.assert_array_equal(glob[idx], qglob[part.shared_lists(q, p)[r]])
            nodes |= set(idx.tolist())
        want = np.zeros(part.block_shape(r), dtype=bool)
        for e in np.ndindex(*want.shape):
            box = np.ix_(*[np.arange(k * p, k * p + p + 1) for k in e])
            want[e] = bool(nodes & set(np.ravel_multi_index(box, lat).ravel().tolist()))
        np.testing.assert_array_equal(part.shared_elements(r, p), want.ravel())
        assert not (part.ghost_elements(r) & ~want.ravel()).any()


def test_one_rank_pmg_coarse_cg_and_the_fallback(monkeypatch, caplog):
    """coarse="cg": the distributed Jacobi-CG; "auto" without pyamg: the same, said once."""
    from smalltc.fem.distributed import multigrid
    mesh, f, kw = _pmg_problem("kershaw")
    res = fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, pmg_options={"coarse": "cg"}, **kw)
    P = res.problem.precond
    assert type(P.coarse).__name__ == "DistributedCG"
    assert len(P.coarse_iterations) == res.iterations + 1 and min(P.coarse_iterations) > 1
    monkeypatch.setattr(multigrid, "_pyamg_present", lambda: False)
    with caplog.at_level("WARNING", logger="smalltc"):
        again = fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, **kw)
    assert type(again.problem.precond.coarse).__name__ == "DistributedCG"
    assert again.iterations == res.iterations
    assert sum("coarse solve is Jacobi-CG" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(ValueError, match="coarse must be one of"):
        fem.solve_poisson(mesh, 2, f, comm=MPI.COMM_SELF, pmg_options={"coarse": "lu"}, **kw)


def test_box_indices_are_the_ravelled_multi_indices():
    """Any sub-box (the whole box included, its own path) against NumPy's ravel."""
    rng = np.random.default_rng(3)
    for _ in range(60):
        dim = int(rng.integers(1, 4))
        wlo = tuple(int(v) for v in rng.integers(0, 3, dim))
        whi = tuple(a + int(v) for a, v in zip(wlo, rng.integers(1, 6, dim)))
        whole = rng.random() < 0.3
        lo = wlo if whole else tuple(int(rng.integers(a, b + 1)) for a, b in zip(wlo, whi))
        hi = whi if whole else tuple(int(rng.integers(a, b + 1)) for a, b in zip(lo, whi))
        grids = np.meshgrid(*[np.arange(a - w, b - w) for a, b, w in zip(lo, hi, wlo)],
                            indexing="ij")
        want = np.ravel_multi_index([g.ravel() for g in grids],
                                    tuple(b - a for a, b in zip(wlo, whi)))
        got = box_indices((lo, hi), (wlo, whi))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
