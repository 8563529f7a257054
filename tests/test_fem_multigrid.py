"""p-multigrid: transfers, Chebyshev smoothing, the coarse solves, convergence.

Small cases only (p <= 4, a few elements). The GPU cases are marked ``gpu`` and
skip cleanly without a CUDA device; they run the same bodies with CuPy vectors.
"""
import numpy as np
import pytest

from conftest import array_modules, to_numpy, xp_of
from optional_deps import needs
from smalltc import fem
from smalltc.fem.chebyshev import Chebyshev, estimate_lambda_max
from smalltc.fem.coarse import AMGSolver, CGSolver, assemble_csr
from smalltc.fem.multigrid import Constrained, Transfer, boundary_mask

# (dim, n, q, p): transfers from order q to order p
TRANSFER_CASES = [(1, 3, 1, 4), (2, 2, 1, 2), (2, 3, 2, 4), (3, 2, 1, 3), (3, 2, 2, 4),
                  (3, 2, 3, 3)]


def _poly(X, q):
    """A polynomial of degree q in each coordinate (the Q_q space on an affine mesh)."""
    out = np.ones(X.shape[1])
    for d in range(X.shape[0]):
        out = out * (0.3 + X[d] + 0.7 * X[d] ** q)
    return out


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("dim, n, q, p", TRANSFER_CASES)
def test_prolongation_interpolates_polynomials_exactly(xp_name, dim, n, q, p):
    xp = xp_of(xp_name)
    mesh = fem.box_mesh(dim, n, lower=-0.5, upper=1.5)        # affine: Q_q in every space
    Vq, Vp = fem.H1Space(mesh, q), fem.H1Space(mesh, p)
    T = Transfer(Vq, Vp, xp)
    uq = _poly(Vq.dof_coordinates(), q)
    up = to_numpy(T.prolong(xp.asarray(uq)))
    np.testing.assert_allclose(up, _poly(Vp.dof_coordinates(), q), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dim, n, q, p", TRANSFER_CASES)
def test_restriction_is_the_transpose(xp_name, masked, dim, n, q, p):
    xp = xp_of(xp_name)
    mesh = fem.box_mesh(dim, n, distortion=0.05)
    Vq, Vp = fem.H1Space(mesh, q), fem.H1Space(mesh, p)
    kw = {}
    if masked:
        kw = dict(coarse_free=~boundary_mask(Vq), fine_free=~boundary_mask(Vp))
    T = Transfer(Vq, Vp, xp, **kw)
    rng = np.random.default_rng(dim * 100 + q * 10 + p)
    u, v = rng.standard_normal(Vp.ndofs), rng.standard_normal(Vq.ndofs)
    Ru = to_numpy(T.restrict(xp.asarray(u)))
    Pv = to_numpy(T.prolong(xp.asarray(v)))
    assert Ru.shape == (Vq.ndofs,) and Pv.shape == (Vp.ndofs,)
    assert np.dot(Ru, v) == pytest.approx(np.dot(u, Pv), rel=1e-12, abs=1e-12)
    if masked:      # F_p P F_q: zero in and out of the constrained DoFs
        assert not Pv[boundary_mask(Vp)].any() and not Ru[boundary_mask(Vq)].any()


def test_transfer_errors():
    m1, m2 = fem.box_mesh(2, 2), fem.box_mesh(2, 2)
    with pytest.raises(ValueError, match="same mesh"):
        Transfer(fem.H1Space(m1, 1), fem.H1Space(m2, 2))
    with pytest.raises(ValueError, match="coarse order 3 is above fine order 2"):
        Transfer(fem.H1Space(m1, 3), fem.H1Space(m1, 2))


@pytest.mark.parametrize("dim, p", [(2, 1), (2, 2), (3, 1)])
def test_assemble_csr_by_probing_matches_the_assembled_matrix(dim, p):
    needs("scipy")
    V = fem.H1Space(fem.box_mesh(dim, 3, distortion=0.05), p)
    ref = fem.mass_operator(V, assembled=True).to_dense()
    A = assemble_csr(fem.mass_operator(V), V)           # matrix-free: probed
    np.testing.assert_allclose(A.toarray(), ref, rtol=0, atol=1e-15)
    B = assemble_csr(fem.mass_operator(V, assembled=True), V)   # its to_csr()
    np.testing.assert_allclose(B.toarray(), ref, rtol=0, atol=1e-15)


def test_constrained_operator_is_identity_on_fixed_dofs_and_idempotent():
    needs("scipy")
    V = fem.H1Space(fem.box_mesh(2, 3, distortion=0.05), 2)
    K = fem.diffusion_operator(V)
    free = ~boundary_mask(V)
    Ac = Constrained(K, K.diagonal(), free)
    Acc = Constrained(Ac, Ac.diagonal(), free)
    A = assemble_csr(Ac, V).toarray()
    np.testing.assert_allclose(A, A.T, atol=1e-14)
    fixed = np.flatnonzero(~free)
    np.testing.assert_array_equal(A[fixed][:, fixed], np.eye(fixed.size))
    assert not A[fixed][:, np.flatnonzero(free)].any()
    np.testing.assert_allclose(np.diag(A), Ac.diagonal(), atol=1e-14)
    np.testing.assert_allclose(assemble_csr(Acc, V).toarray(), A, atol=1e-15)


def _laplace_1d(n):
    return np.diag(2.0 * np.ones(n)) - np.diag(np.ones(n - 1), 1) - np.diag(np.ones(n - 1), -1)


@pytest.mark.parametrize("kind", ["fourth", "first"])
@pytest.mark.parametrize("degree", [1, 2, 3, 5])
def test_chebyshev_is_an_spd_smoother(kind, degree):
    n = 60
    A = _laplace_1d(n) + np.diag(np.linspace(0, 3, n))         # SPD, variable diagonal
    S = Chebyshev(A, degree=degree, kind=kind)
    assert S.lambda_max == pytest.approx(1.1 * S.estimate)
    Dm = np.diag(A)
    lam = np.linalg.eigvals(A / Dm[:, None]).real.max()
    assert S.estimate <= lam * (1 + 1e-10) and S.estimate > 0.9 * lam
    Z = np.stack([S(np.eye(n)[j]) for j in range(n)], axis=1)   # the preconditioner's matrix
    np.testing.assert_allclose(Z, Z.T, atol=1e-12)
    assert np.linalg.eigvalsh(Z).min() > 0
    # error propagation I - Z A: contracts (in the A-norm), strongly on the upper spectrum
    L = np.linalg.cholesky(A)
    E = L.T @ (np.eye(n) - Z @ A) @ np.linalg.inv(L.T)
    assert np.linalg.norm(E, 2) < 1 + 1e-12
    # smooth() from a nonzero guess: x + Z (b - A x)
    rng = np.random.default_rng(degree)
    b, x = rng.standard_normal(n), rng.standard_normal(n)
    np.testing.assert_allclose(S.smooth(b, x), x + Z @ (b - A @ x), atol=1e-12)


def test_chebyshev_as_a_preconditioner_cuts_iterations():
    V = fem.H1Space(fem.box_mesh(2, 4, distortion=0.05), 3)
    M = fem.pmg(V, kind="diffusion", constrained="boundary", coarse="cg").operator
    b = M(np.random.default_rng(0).random(V.ndofs))
    jac = fem.cg(M, b, tol=1e-8, precond=fem.jacobi(M.diagonal()))
    che = fem.cg(M, b, tol=1e-8, precond=fem.chebyshev(M, degree=4))
    assert che.iterations < 0.6 * jac.iterations
    np.testing.assert_allclose(che.x, jac.x, atol=1e-6 * np.abs(jac.x).max())


def test_chebyshev_errors():
    A = _laplace_1d(20)
    with pytest.raises(ValueError, match="lambda_max=0.5 is below the estimated largest"):
        Chebyshev(A, lambda_max=0.5)
    with pytest.raises(ValueError, match="degree must be an integer >= 1"):
        Chebyshev(A, degree=0)
    with pytest.raises(ValueError, match="kind must be one of"):
        Chebyshev(A, kind="second")
    with pytest.raises(ValueError, match="safety must be a number >= 1"):
        Chebyshev(A, safety=0.5)
    with pytest.raises(ValueError, match="Chebyshev smoother: diagonal must be positive"):
        Chebyshev(-A)
    B = A.copy()
    B[0, 0] = B[-1, -1] = 0.1                 # positive diagonal, indefinite
    B[0, 1] = B[1, 0] = -2.0
    with pytest.raises(ValueError, match="not positive definite"):
        Chebyshev(B)
    with pytest.raises(ValueError, match="not positive definite"):
        estimate_lambda_max(lambda x: -x, np.ones(5))


def test_wrong_smoother_bound_is_an_error_not_a_divergence():
    """A bound far below lambda_max, unchecked, makes the preconditioner indefinite:
    CG says so instead of running on."""
    n = 40
    A = _laplace_1d(n)
    S = Chebyshev(A, degree=2, lambda_max=0.2, check=False)   # p(t) < 0 for t > 0.25
    with pytest.raises(ValueError, match="preconditioner is not positive definite"):
        fem.cg(lambda x: A @ x, np.random.default_rng(0).random(n), tol=1e-10, precond=S)


# (dim, n, p, coarse, amg_cycle, smoother): convergence of pmg-CG to 1e-8
PMG_CASES = [
    (2, 4, 2, "amg", "pyamg", "fourth"),
    (2, 4, 4, "amg", "portable", "fourth"),
    (2, 3, 3, "cg", "auto", "first"),
    (3, 2, 2, "amg", "pyamg", "fourth"),
    (3, 2, 4, "amg", "portable", "fourth"),
    (3, 3, 3, "cg", "auto", "fourth"),
]


@pytest.mark.parametrize("dim, n, p, coarse, cycle, smoother", PMG_CASES)
def test_pmg_cg_converges_fast_to_the_direct_solution(dim, n, p, coarse, cycle, smoother):
    needs("scipy", *(["pyamg"] if coarse == "amg" else []))
    import scipy.sparse.linalg as sla
    V = fem.H1Space(fem.box_mesh(dim, n, distortion=0.05), p)
    M = fem.pmg(V, kind="diffusion", constrained="boundary", coarse=coarse,
                amg_cycle=cycle, smoother=smoother)
    assert [lev.space.p for lev in M.levels] == fem.pmg_orders(p)
    A = M.operator
    b = A(np.random.default_rng(p).random(V.ndofs))
    res = fem.cg(A, b, tol=1e-8, precond=M)
    assert res.converged and res.iterations <= 12, res.iterations
    jac = fem.cg(A, b, tol=1e-8, precond=fem.jacobi(A.diagonal()))
    assert res.iterations < jac.iterations
    x = sla.spsolve(assemble_csr(A, V).tocsc(), b)
    scale = np.abs(x).max()
    np.testing.assert_allclose(res.x, x, atol=1e-5 * scale)
    np.testing.assert_allclose(jac.x, x, atol=1e-5 * scale)


def test_pmg_is_a_symmetric_positive_definite_preconditioner():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(2, 2, distortion=0.05), 3)
    M = fem.pmg(V, kind="diffusion", constrained="boundary", amg_cycle="portable")
    Z = np.stack([M(np.eye(V.ndofs)[j]) for j in range(V.ndofs)], axis=1)
    np.testing.assert_allclose(Z, Z.T, atol=1e-10 * np.abs(Z).max())
    assert np.linalg.eigvalsh(Z).min() > 0


def test_pmg_on_a_mass_operator_with_scipy_cg_and_print():
    needs("scipy", "pyamg")
    from scipy.sparse.linalg import cg
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), 4)
    op = fem.mass_operator(V)
    M = fem.pmg(op)                                # kind read from the type
    assert M.levels[0].raw is op and type(M.levels[1].raw).__name__ == "MassOperator"
    b = op(np.ones(V.ndofs))
    x, info = cg(op.aslinearoperator(), b, rtol=1e-10, M=M.aslinearoperator())
    assert info == 0 and np.allclose(x, 1.0)
    text = str(M)
    assert "PMultigrid: 3 levels" in text and "AMG (pyamg" in text and "degree 3" in text
    assert f"{V.ndofs:10d}" in text and "finest-level applications" in text
    c = M.cost()
    assert c["per_level"] == [(4, 6), (2, 6)]
    assert c["fine_equivalent"] == pytest.approx(6 * (1 + fem.H1Space(V.mesh, 2).ndofs / V.ndofs))


def test_pmg_errors():
    V = fem.H1Space(fem.box_mesh(2, 2), 4)
    with pytest.raises(ValueError, match="orders must decrease strictly from p=4 to 1"):
        fem.pmg(V, kind="mass", orders=[4, 3])
    with pytest.raises(ValueError, match="kind must be"):
        fem.pmg(V, kind="stokes")
    with pytest.raises(ValueError, match="coarse must be one of"):
        fem.pmg(V, kind="mass", coarse="lu")
    with pytest.raises(ValueError, match="constrained has shape"):
        fem.pmg(V, kind="mass", constrained=np.zeros(3, dtype=bool))
    with pytest.raises(TypeError, match="has no .space"):
        fem.pmg(lambda x: x)


@pytest.mark.gpu
@pytest.mark.skipif(xp_of("cupy") is None or not __import__(
    "smalltc._arrays", fromlist=["gpu_available"]).gpu_available(), reason="no CUDA device")
@pytest.mark.parametrize("p", [2, 4])
def test_pmg_on_the_gpu_matches_the_cpu(p):
    needs("scipy", "pyamg")
    cp = xp_of("cupy")
    V = fem.H1Space(fem.box_mesh(3, 3, distortion=0.05), p)
    cpu = fem.pmg(V, kind="diffusion", constrained="boundary", amg_cycle="portable")
    gpu = fem.pmg(V, kind="diffusion", constrained="boundary", device="gpu")
    assert gpu.xp is cp and gpu.coarse.cycle == "portable"
    b = cpu.operator(np.random.default_rng(0).random(V.ndofs))
    rc = fem.cg(cpu.operator, b, tol=1e-8, precond=cpu)
    rg = fem.cg(gpu.operator, cp.asarray(b), tol=1e-8, precond=gpu)
    assert abs(rg.iterations - rc.iterations) <= 1
    np.testing.assert_allclose(to_numpy(rg.x), rc.x, atol=1e-6 * np.abs(rc.x).max())


@pytest.mark.gpu
@pytest.mark.skipif(xp_of("cupy") is None or not __import__(
    "smalltc._arrays", fromlist=["gpu_available"]).gpu_available(), reason="no CUDA device")
def test_pmg_graph_replays_the_vcycle():
    """The V-cycle captured as a CUDA graph (AMG with levels below the dense solve) gives
    the launch-by-launch V-cycle's result for new inputs, and the same solve."""
    needs("scipy", "pyamg")
    cp = xp_of("cupy")
    V = fem.H1Space(fem.box_mesh(3, 8, distortion=0.05), 3)
    eager = fem.pmg(V, kind="diffusion", constrained="boundary", device="gpu", graph=False)
    graphed = fem.pmg(V, kind="diffusion", constrained="boundary", device="gpu", graph=True)
    assert len(graphed.coarse.levels) >= 1
    rng = np.random.default_rng(0)
    for _ in range(3):                  # the first call captures, the others replay
        r = cp.asarray(rng.standard_normal(V.ndofs))
        z0, z1 = to_numpy(eager(r)), to_numpy(graphed(r))
        np.testing.assert_allclose(z1, z0, rtol=0, atol=1e-10 * np.abs(z0).max())
    assert graphed._replay.captured(r) and graphed._replay.replays == 2
    b = eager.operator(r)
    r0 = fem.cg(eager.operator, b, tol=1e-8, precond=eager)
    r1 = fem.cg(graphed.operator, b, tol=1e-8, precond=graphed)
    assert r1.converged and abs(r1.iterations - r0.iterations) <= 1


def test_pmg_graph_option():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(2, 3), 2)
    with pytest.raises(ValueError, match="graph must be"):
        fem.pmg(V, kind="diffusion", graph="yes")
    M = fem.pmg(V, kind="diffusion", constrained="boundary", graph=True)   # host: ignored
    assert M(np.ones(V.ndofs)).shape == (V.ndofs,) and M._replay is None


def test_pmg_and_probing_on_an_unstructured_mesh():
    """Elements rotated by 180 degrees (their own node orders): the transfers, the
    boundary and the distance-2 colouring of the probing work through the DoF map."""
    needs("scipy", "pyamg")
    from smalltc.fem.unstructured import from_elements
    nodes = fem.box_mesh(2, 4, distortion=0.05).nodes.copy()
    nodes[::2] = nodes[::2][..., ::-1, ::-1]
    mesh = from_elements(nodes)
    V = fem.H1Space(mesh, 3)
    assert V.lattice_shape is None
    K = fem.diffusion_operator(fem.H1Space(mesh, 2))
    dense = np.stack([K(e) for e in np.eye(K.shape[0])], axis=1)
    np.testing.assert_allclose(assemble_csr(K, K.space).toarray(), dense, rtol=0, atol=1e-14)
    M = fem.pmg(V, kind="diffusion", constrained="boundary")
    assert int(np.count_nonzero(M.levels[0].free)) == (4 * 3 - 1) ** 2
    b = M.operator(np.random.default_rng(0).random(V.ndofs))
    res = fem.cg(M.operator, b, tol=1e-8, precond=M)
    assert res.converged and res.iterations <= 10


def test_cg_callback_logs_every_iteration_of_a_pmg_solve(capsys):
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(2, 3, distortion=0.05), 2)
    M = fem.pmg(V, kind="diffusion", constrained="boundary")
    b = M.operator(np.ones(V.ndofs))
    seen = []
    res = fem.cg(M.operator, b, tol=1e-8, precond=M, callback=lambda k, r: seen.append((k, r)))
    assert [k for k, _ in seen] == list(range(1, res.iterations + 1))
    np.testing.assert_allclose([r for _, r in seen], res.residuals[1:])
    assert M.cycles == res.iterations + 1          # one V-cycle per iteration, and z_0
    fem.cg(M.operator, b, tol=1e-8, precond=M, callback=fem.progress_log(1))
    err = capsys.readouterr().err
    assert err.count("cg: iteration") == res.iterations and "relative residual" in err


@pytest.mark.parametrize("precond", ["chebyshev", "pmg"])
def test_solve_poisson_with_chebyshev_and_pmg(precond):
    """The same solution as Jacobi-CG (to the tolerance), in fewer iterations; pmg built from
    the problem's ConstrainedOperator (its Dirichlet DoFs, the operator's quadrature)."""
    needs("scipy", "pyamg")
    u = lambda x: np.sin(np.pi * x[0]) * x[1] + x[2] ** 2          # noqa: E731
    mesh = fem.box_mesh(3, 3, distortion=0.05)
    kw = dict(dirichlet=u, device="cpu", tol=1e-10)
    f = lambda x: np.pi ** 2 * np.sin(np.pi * x[0]) * x[1] - 2.0    # noqa: E731
    ref = fem.solve_poisson(mesh, 3, f, precond="jacobi", **kw)
    res = fem.solve_poisson(mesh, 3, f, precond=precond, **kw)
    assert res.iterations < ref.iterations / (2 if precond == "chebyshev" else 4)
    np.testing.assert_allclose(res.u, ref.u, atol=1e-8 * np.abs(ref.u).max())
    P = res.problem.precond
    if precond == "pmg":
        assert [lev.space.p for lev in P.levels] == [3, 2, 1]
        fixed = ~P.levels[0].free
        np.testing.assert_array_equal(np.flatnonzero(fixed), res.problem.bc.dofs)
    with pytest.raises(ValueError, match="precond must be one of"):
        fem.solve_poisson(mesh, 2, f, precond="ilu", **kw)


@pytest.mark.parametrize("make, kw", [
    (lambda V: fem.diffusion_operator(V, quadrature="gll"), {}),             # collocated (BP5)
    (lambda V: fem.helmholtz_operator(V, 10.0), dict(alpha=10.0)),
    (lambda V: fem.diffusion_operator(V, kappa=lambda x: 1 + x[0] ** 2), dict(kappa=lambda x: 1 + x[0] ** 2)),
])
def test_pmg_levels_are_built_like_the_given_operator(make, kw):
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), 4)
    op = make(V)
    M = fem.pmg(op, constrained="boundary", coarse_nq_offset=None, **kw)
    coarse = M.levels[1].raw
    assert coarse.qfunc == op.qfunc and coarse.space.p == 2
    assert coarse.G1d.shape[0] - 2 == op.G1d.shape[0] - 4          # the same nq - p
    assert (coarse.B1d is None) == (op.B1d is None)
    ref = make(M.levels[1].space)
    x = np.random.default_rng(0).random(coarse.space.ndofs)
    np.testing.assert_allclose(coarse(x), ref(x), rtol=1e-13, atol=1e-13)
    b = M.operator(np.random.default_rng(1).random(V.ndofs))
    assert fem.cg(M.operator, b, tol=1e-8, precond=M).iterations <= 8


def test_pmg_coarse_levels_take_q_plus_1_points_by_default():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), 4)
    op = fem.diffusion_operator(V)                                   # nq = p + 2
    M = fem.pmg(op, constrained="boundary")
    assert [lev.raw.G1d.shape[0] for lev in M.levels] == [6, 3, 2]
    assert M.levels[0].raw is op
    b = M.operator(np.random.default_rng(1).random(V.ndofs))
    assert fem.cg(M.operator, b, tol=1e-8, precond=M).iterations <= 8


@pytest.mark.gpu
@pytest.mark.skipif(xp_of("cupy") is None or not __import__(
    "smalltc._arrays", fromlist=["gpu_available"]).gpu_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dim, n, q, p", TRANSFER_CASES)
def test_fused_transfer_kernels_match_the_array_path(dim, n, q, p, dtype):
    cp = xp_of("cupy")
    mesh = fem.box_mesh(dim, n, distortion=0.05)
    Vq, Vp = fem.H1Space(mesh, q), fem.H1Space(mesh, p)
    kw = dict(coarse_free=~boundary_mask(Vq), fine_free=~boundary_mask(Vp), dtype=dtype)
    fused, plain = Transfer(Vq, Vp, cp, fused=True, **kw), Transfer(Vq, Vp, cp, fused=False, **kw)
    assert fused.fused and not plain.fused
    rng = np.random.default_rng(p)
    xc = cp.asarray(rng.standard_normal(Vq.ndofs).astype(dtype))
    rf = cp.asarray(rng.standard_normal(Vp.ndofs).astype(dtype))
    tol = 1e-13 if dtype == np.float64 else 1e-5
    for a, b in ((fused.prolong(xc), plain.prolong(xc)), (fused.restrict(rf), plain.restrict(rf))):
        assert a.dtype == dtype
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=0, atol=tol * float(abs(b).max()))


def test_the_amg_level_is_assembled_and_matches_the_probed_matrix():
    needs("scipy", "pyamg")
    from smalltc.fem.multigrid import Constrained
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), 2)
    M = fem.pmg(V, kind="diffusion", constrained="boundary")
    last = M.levels[-1]
    assert type(last.raw).__name__ == "AssembledOperator"
    K = fem.diffusion_operator(last.space, nq=last.raw.G1d.shape[0])   # matrix-free: probed
    probed = assemble_csr(Constrained(K, K.diagonal(), last.free), last.space)
    assembled = assemble_csr(last.A, last.space)            # to_csr(), then F A F + C
    np.testing.assert_allclose(assembled.toarray(), probed.toarray(), rtol=0, atol=1e-14)
    # a factory without the assembled keyword: the order-1 level stays matrix-free
    M2 = fem.pmg(V, constrained="boundary", operator_factory=lambda s: fem.diffusion_operator(s))
    assert type(M2.levels[-1].raw).__name__ == "Operator"


def _gpu_or_skip(xp_name):
    if xp_name == "cupy" and not __import__("smalltc._arrays", fromlist=["gpu_available"]
                                            ).gpu_available():
        pytest.skip("no CUDA device")


# (n, masked, xzero, dtype): the fused vector updates against their array expressions
VECTOR_CASES = [(7, False, True, np.float64), (1000, True, False, np.float64),
                (1000, True, True, np.float32), (33, False, False, np.float32)]


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("n, masked, xzero, dtype", VECTOR_CASES)
def test_vector_ops_match_the_array_expressions(xp_name, n, masked, xzero, dtype):
    from smalltc.fem.chebyshev import VectorOps
    _gpu_or_skip(xp_name)
    xp = xp_of(xp_name)
    rng = np.random.default_rng(n)
    v = {k: rng.standard_normal(n).astype(dtype) for k in ("y", "r", "x", "d", "b")}
    inv = rng.random(n).astype(dtype) + 0.5
    f = (rng.random(n) < 0.7).astype(dtype) if masked else np.ones(n, dtype)
    ops = VectorOps(xp.asarray(inv), xp.asarray(f) if masked else None)
    # xp.array copies: the updates are in place and the references read v
    tol = dict(rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-5 if dtype == np.float32
               else 1e-13)
    # start: d = c1 inv r, dm = f d
    d, dm = ops.start(xp.array(v["r"]), 0.7)
    np.testing.assert_allclose(to_numpy(d), 0.7 * inv * v["r"], **tol)
    np.testing.assert_allclose(to_numpy(dm), f * 0.7 * inv * v["r"], **tol)
    # step, in place on poisoned x when xzero (its old values must not be read)
    r, d = xp.array(v["r"]), xp.array(v["d"])
    x = xp.full(n, np.nan, dtype=dtype) if xzero else xp.array(v["x"])
    # a separate dm where it is one (with a mask; always on the GPU: start makes two)
    dm = xp.full(n, np.nan, dtype=dtype) if masked or xp is not np else d
    ops.step(xp.array(v["y"]), r, x, d, dm, 0.3, 1.9, xzero)
    r_ref = v["r"] - (f * v["y"] + (1 - f) * v["d"])
    d_ref = 0.3 * v["d"] + 1.9 * inv * r_ref
    np.testing.assert_allclose(to_numpy(r), r_ref, **tol)
    np.testing.assert_allclose(to_numpy(x), v["d"] if xzero else v["x"] + v["d"], **tol)
    np.testing.assert_allclose(to_numpy(d), d_ref, **tol)
    np.testing.assert_allclose(to_numpy(dm), f * d_ref, **tol)
    # last and residual
    x = xp.full(n, np.nan, dtype=dtype) if xzero else xp.array(v["x"])
    x, xm = ops.last(xp.array(v["d"]), x, xzero)
    x_ref = v["d"] if xzero else v["x"] + v["d"]
    np.testing.assert_allclose(to_numpy(x), x_ref, **tol)
    np.testing.assert_allclose(to_numpy(xm), f * x_ref, **tol)
    r = ops.residual(xp.array(v["b"]), xp.array(v["y"]), xp.array(v["x"]))
    np.testing.assert_allclose(to_numpy(r), v["b"] - (f * v["y"] + (1 - f) * v["x"]), **tol)


def _plain_vcycle(M, l, b):
    """The V-cycle written with the constrained operators and array expressions only."""
    if l == len(M.levels) - 1:
        return M.coarse(b)
    lev, T, S = M.levels[l], M.transfers[l], M.levels[l].smoother
    inv, lam, k = S.inv_diag, S.lambda_max, S.degree

    def smooth(x, r):
        d = (4.0 / (3.0 * lam)) * (inv * r)
        for i in range(1, k):
            x = d.copy() if x is None else x + d
            r = r - lev.A(d)
            d = ((2 * i - 1) / (2 * i + 3)) * d + ((8 * i + 4) / ((2 * i + 3) * lam)) * (inv * r)
        return d if x is None else x + d
    x = smooth(None, b)
    x = x + T.prolong(_plain_vcycle(M, l + 1, T.restrict(b - lev.A(x))))
    return smooth(x, b - lev.A(x))


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("p", [2, 4])
def test_fused_vcycle_matches_the_plain_vcycle(xp_name, p):
    needs("scipy", "pyamg")
    _gpu_or_skip(xp_name)
    xp = xp_of(xp_name)
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), p)
    M = fem.pmg(V, kind="diffusion", constrained="boundary",
                device="gpu" if xp_name == "cupy" else "cpu")
    b = xp.asarray(np.random.default_rng(p).standard_normal(V.ndofs))
    b0 = b.copy()
    z = M(b)
    np.testing.assert_array_equal(to_numpy(b), to_numpy(b0))          # r is not modified
    np.testing.assert_allclose(to_numpy(z), to_numpy(_plain_vcycle(M, 0, b)), rtol=1e-11,
                               atol=1e-11 * float(abs(to_numpy(z)).max()))


def test_profile_times_every_part_of_every_level():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), 4)
    M = fem.pmg(V, kind="diffusion", constrained="boundary")
    prof = M.profile(np.ones(V.ndofs), repeats=2)
    assert [row["p"] for row in prof["levels"]] == [4, 2, 1]
    for row in prof["levels"][:-1]:
        assert {"presmooth", "residual", "restrict", "prolong", "postsmooth"} <= set(row)
        assert all(v > 0 for k, v in row.items() if k not in ("p", "ndofs"))
    assert prof["levels"][-1]["coarse"] > 0
    assert prof["vcycle_s"] > 0 and prof["apply_s"] > 0 and prof["parts_s"] > 0
    assert set(M.setup_times) == {"operators", "transfers", "assembly", "eigenvalues", "csr",
                                  "amg"}


def test_element_matrices_sum_to_the_csr_of_to_csr():
    needs("scipy")
    V = fem.H1Space(fem.box_mesh(3, 3, distortion=0.1), 1)
    op = fem.diffusion_operator(V, nq=2, assembled=True)
    A = assemble_csr(op, V)
    indptr, indices, data = op.to_csr()
    np.testing.assert_array_equal(A.indptr, indptr)
    np.testing.assert_array_equal(A.indices, indices)
    np.testing.assert_allclose(A.data, data, rtol=1e-14, atol=1e-14)


def test_pmg_degree_per_level():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 2, distortion=0.05), 4)
    M = fem.pmg(V, kind="diffusion", constrained="boundary", degree=[4, 2])
    assert [lev.smoother.degree for lev in M.levels[:-1]] == [4, 2]
    assert M.cost()["per_level"] == [(4, 8), (2, 4)]
    assert "degree 4" in str(M)
    with pytest.raises(ValueError, match="degree must be"):
        fem.pmg(V, kind="diffusion", degree=[])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("dim, n, q, p", TRANSFER_CASES)
def test_compiled_host_transfers_match_the_array_path(dim, n, q, p, dtype):
    mesh = fem.box_mesh(dim, n, distortion=0.05)
    Vq, Vp = fem.H1Space(mesh, q), fem.H1Space(mesh, p)
    kw = dict(coarse_free=~boundary_mask(Vq), fine_free=~boundary_mask(Vp), dtype=dtype)
    fast, plain = Transfer(Vq, Vp, **kw), Transfer(Vq, Vp, host_kernel=False, **kw)
    assert fast.host_kernel and not plain.host_kernel
    rng = np.random.default_rng(dim + 10 * p)
    xc, xf = rng.standard_normal(Vq.ndofs).astype(dtype), rng.standard_normal(Vp.ndofs).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    for got, ref in ((fast.prolong(xc), plain.prolong(xc)), (fast.restrict(xf), plain.restrict(xf))):
        assert got.dtype == dtype and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    x = np.full(Vp.ndofs, 1.0, dtype=dtype)
    np.testing.assert_allclose(fast.prolong_add(xc, x), 1.0 + plain.prolong(xc), rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(xp_of("cupy") is None or not __import__(
    "smalltc._arrays", fromlist=["gpu_available"]).gpu_available(), reason="no CUDA device")
def test_amg_csr_kernel_matches_cupyx_on_the_gpu():
    needs("scipy", "pyamg")
    cp = xp_of("cupy")
    V = fem.H1Space(fem.box_mesh(3, 9, distortion=0.05), 1)
    A = assemble_csr(fem.diffusion_operator(V, nq=2), V) + __import__("scipy.sparse").sparse.eye(V.ndofs)
    k = AMGSolver(A, cp, cycle="portable", spmv="kernel", max_coarse=50)
    c = AMGSolver(A, cp, cycle="portable", spmv="cupyx", max_coarse=50)
    assert k.spmv == "kernel" and c.spmv == "cupyx" and len(k.levels) >= 1
    x = cp.asarray(np.random.default_rng(0).standard_normal(V.ndofs))
    for (Ak, Pk, Rk, _), (Ac, Pc, Rc, _) in zip(k.levels, c.levels):
        for M, N in ((Ak, Ac), (Pk, Pc), (Rk, Rc)):
            v = x[:M.A.shape[1]]
            np.testing.assert_allclose(to_numpy(M @ v), to_numpy(N @ v), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(to_numpy(k(x)), to_numpy(c(x)), rtol=1e-10, atol=1e-12)


def test_amg_portable_cycle_options():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 11, distortion=0.05), 1)
    A = assemble_csr(fem.diffusion_operator(V, nq=2), V)
    import scipy.sparse as sp
    A = A + sp.eye(V.ndofs)
    S = AMGSolver(A, cycle="portable", max_coarse=1000)
    assert S.ml.levels[-1].A.shape[0] <= 1000 and S.spmv == "host"
    assert AMGSolver(A, cycle="portable").ml.levels[-1].A.shape[0] <= 200
    with pytest.raises(ValueError, match="spmv must be"):
        AMGSolver(A, cycle="portable", spmv="mkl")


def test_amg_setup_is_reproducible_and_leaves_numpy_random_alone():
    """pyamg's setup draws random start vectors from NumPy's global generator: AMGSolver
    seeds it for the setup (the same matrix, the same hierarchy and result bits) and
    restores the caller's state."""
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 5, distortion=0.05), 1)
    A = assemble_csr(fem.diffusion_operator(V, nq=2, device="cpu"), V)
    x = np.random.default_rng(1).standard_normal(V.ndofs)
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    a, b = AMGSolver(A, np, max_coarse=20), AMGSolver(A, np, max_coarse=20)
    assert np.random.random() == before
    assert np.array_equal(a(x), b(x))



@pytest.mark.parametrize("seed", [0, 1, 2])
def test_constrained_csr_is_f_a_f_plus_the_identity_on_the_constrained(seed):
    """The masked CSR arrays give SciPy's ``F A F + (I - F)`` exactly: the same entries
    (explicit zeros dropped by both), the same values, sorted indices; duplicates summed
    first; a constrained row without a diagonal entry gets one."""
    needs("scipy")
    import scipy.sparse as sp
    from smalltc.fem.coarse import constrained_csr
    rng = np.random.default_rng(seed)
    n = 40
    B = sp.random(n, n, density=0.15, random_state=seed, format="coo")
    rows = np.concatenate([B.row, B.col, np.arange(n), [3, 3]])
    cols = np.concatenate([B.col, B.row, np.arange(n), [5, 5]])   # a duplicate pair
    vals = np.concatenate([B.data, B.data, rng.random(n) + 1, [0.25, 0.5]])
    vals[::7] = 0.0                                                # explicit zeros
    A = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    free = rng.random(n) < 0.7
    f = free.astype(float)
    want = (sp.diags(f) @ A @ sp.diags(f) + sp.diags(1.0 - f)).tocsr()
    want.eliminate_zeros()
    got = constrained_csr(A, free)
    assert got.has_sorted_indices and np.all(got.data != 0)
    assert got.nnz == want.nnz and np.array_equal(got.toarray(), want.toarray())
    # a constrained DoF whose row has no diagonal entry
    C = sp.csr_matrix(np.array([[2.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 2.0]]))
    C.eliminate_zeros()
    got = constrained_csr(C, np.array([True, False, True]))
    np.testing.assert_array_equal(got.toarray(), [[2, 0, 0], [0, 1, 0], [0, 0, 2]])
