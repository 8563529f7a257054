"""Overlapping Schwarz with FDM local solves (fem.schwarz), Chebyshev accelerated by it,
and pmg(relaxation="schwarz").

The local solves are checked against an independent reference: on a mesh of equal boxes
the extended element's separable operator is the principal submatrix of the globally
assembled stiffness matrix (exact quadrature: consistent mass; Gauss-Lobatto quadrature:
lumped mass) on the element's extended nodes, inverted densely in float64. Small cases
only; the GPU cases skip cleanly without a CUDA device.
"""
import numpy as np
import pytest

from conftest import array_modules, to_numpy, xp_of
from optional_deps import needs
from smalltc import fem
from smalltc._arrays import gpu_available
from smalltc.fem.chebyshev import Chebyshev, estimate_lambda_max
from smalltc.fem.coarse import assemble_csr
from smalltc.fem.multigrid import Constrained, boundary_mask
from smalltc.fem.schwarz import Schwarz, element_lengths, fdm_pair, reference_matrices

# (dim, p, overlap, mass)
LOCAL_CASES = [(2, 1, 1, "consistent"), (2, 3, 1, "consistent"), (2, 4, 0, "consistent"),
               (2, 2, 1, "lumped"), (3, 1, 1, "consistent"), (3, 2, 1, "consistent"),
               (3, 3, 0, "lumped"), (3, 2, 1, "lumped")]


def GPU(test):
    """Mark ``test`` as a GPU test, skipped without a CUDA device (a device query)."""
    return pytest.mark.gpu(pytest.mark.skipif(not gpu_available(), reason="no CUDA device")(test))


def _global_matrix(V, mass):
    """The assembled stiffness on V: exact (Gauss, p + 2 points) or Gauss-Lobatto
    (p + 1 points, collocated: the lumped mass's separable form)."""
    if mass == "consistent":
        A = fem.diffusion_operator(V, V.p + 2)
    else:
        A = fem.diffusion_operator(V, V.p + 1, quadrature="gll")
    return assemble_csr(A, V).toarray()


@pytest.mark.parametrize("dim, p, overlap, mass", LOCAL_CASES)
def test_local_inverse_is_the_dense_inverse_of_the_extended_element(dim, p, overlap, mass):
    needs("scipy")
    m = 5 if p == 1 else 3               # p = 1: the extension reaches the next elements
    mesh = fem.box_mesh(dim, m, upper=2.0)           # equal boxes of side 2/m
    V = fem.H1Space(mesh, p)
    P = Schwarz(V, overlap=overlap, mass=mass)
    K = _global_matrix(V, mass)
    center = (m ** dim) // 2                         # all neighbours present
    idx = to_numpy(P.idx[center]).ravel()
    assert np.all(idx < V.ndofs)
    Kloc = K[np.ix_(idx, idx)]
    U = np.random.default_rng(p).standard_normal((V.nelements,) + (P.nloc,) * dim)
    X = np.full_like(U, np.nan)
    X[...] = P.local_solve(U)
    ref = np.linalg.solve(Kloc, U[center].ravel())
    assert np.allclose(X[center].ravel(), ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())


@pytest.mark.parametrize("dim, p", [(2, 2), (3, 2)])
def test_local_inverse_at_a_constrained_corner(dim, p):
    """A corner element of a Dirichlet box: its boundary nodes are decoupled, the rest is
    the principal submatrix of the global matrix on its free extended nodes."""
    needs("scipy")
    V = fem.H1Space(fem.box_mesh(dim, 3), p)
    free = ~boundary_mask(V)
    P = Schwarz(V, free=free)
    K = _global_matrix(V, "consistent")
    idx = to_numpy(P.idx[0]).ravel()
    keep = np.flatnonzero((idx < V.ndofs) & free[np.minimum(idx, V.ndofs - 1)])
    U = np.zeros((V.nelements,) + (P.nloc,) * dim)
    u = U[0].reshape(-1)
    u[keep] = np.random.default_rng(0).standard_normal(keep.size)
    X = P.local_solve(U)[0].ravel()
    ref = np.linalg.solve(K[np.ix_(idx[keep], idx[keep])], u[keep])
    assert np.allclose(X[keep], ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())


def test_fdm_pair_diagonalises():
    rng = np.random.default_rng(1)
    G = rng.standard_normal((4, 5, 5))
    A = G @ np.swapaxes(G, 1, 2)
    H = rng.standard_normal((4, 5, 5))
    M = H @ np.swapaxes(H, 1, 2) + 5 * np.eye(5)
    lam, S = fdm_pair(A, M)
    St = np.swapaxes(S, 1, 2)
    assert np.allclose(St @ M @ S, np.eye(5), atol=1e-10)
    assert np.allclose(St @ A @ S, lam[:, :, None] * np.eye(5), atol=1e-9)


def test_reference_matrices_and_lengths():
    K1, M1 = reference_matrices(3)
    x = fem.quadrature.gauss_lobatto(4)[0]
    assert np.allclose(K1 @ np.ones(4), 0, atol=1e-13)          # constants: no energy
    assert np.isclose(x @ K1 @ x, 2.0)                          # int_{-1}^{1} 1 dx
    assert np.isclose(np.ones(4) @ M1 @ np.ones(4), 2.0)
    assert np.isclose(x @ M1 @ x, 2.0 / 3.0)                    # exact: int x^2
    Kl, Ml = reference_matrices(3, "lumped")
    assert np.allclose(Kl, K1) and np.allclose(Ml, np.diag(np.diag(Ml)))
    mesh = fem.box_mesh(3, (2, 3, 4), upper=(1.0, 3.0, 2.0))
    assert np.allclose(element_lengths(mesh), [0.5, 1.0, 0.5])


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("dim, p, overlap, weights, constrained",
                         [(2, 3, 1, "sqrt", False), (3, 2, 1, "sqrt", True),
                          (3, 3, 0, "none", True), (3, 1, 1, "none", False)])
def test_schwarz_is_symmetric_positive_definite(xp_name, dim, p, overlap, weights,
                                               constrained):
    xp = xp_of(xp_name)
    mesh = fem.kershaw_mesh(6, 0.3, dim=dim) if dim == 3 else fem.kershaw_mesh((6, 4), 0.3,
                                                                               dim=2)
    V = fem.H1Space(mesh, p)
    free = ~boundary_mask(V) if constrained else None
    P = Schwarz(V, xp, free=free, overlap=overlap, weights=weights)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x, y = (xp.asarray(v) for v in rng.standard_normal((2, V.ndofs)))
        xPy, yPx, xPx = (float(xp.vdot(a, P(b))) for a, b in ((x, y), (y, x), (x, x)))
        assert abs(xPy - yPx) <= 1e-12 * xPx
        assert xPx > 0
    if constrained:                               # the identity on constrained DoFs
        r = xp.asarray(rng.standard_normal(V.ndofs))
        fixed = ~free
        assert np.allclose(to_numpy(P(r))[fixed], to_numpy(r)[fixed])


def test_schwarz_cg_beats_jacobi_cg():
    """As a CG preconditioner by itself on a Kershaw mesh (a check that it is a good
    approximate inverse, not only SPD; one level: not h-independent). Measured 82 against
    178 iterations."""
    V = fem.H1Space(fem.kershaw_mesh(6, 0.3), 3)
    free = ~boundary_mask(V)
    A = fem.diffusion_operator(V)
    Ac = Constrained(A, A.diagonal(), free)
    b = Ac(np.random.default_rng(0).standard_normal(V.ndofs) * free)
    its_s = fem.cg(Ac, b, tol=1e-8, precond=Schwarz(V, free=free)).iterations
    its_j = fem.cg(Ac, b, tol=1e-8, precond=fem.jacobi(Ac.diagonal())).iterations
    assert its_s < 0.55 * its_j, (its_s, its_j)


def test_chebyshev_with_a_preconditioner_matches_a_dense_transcription():
    rng = np.random.default_rng(2)
    G = rng.standard_normal((12, 12))
    A = G @ G.T + 12 * np.eye(12)
    H = rng.standard_normal((12, 12))
    Minv = np.linalg.inv(H @ H.T + 12 * np.eye(12))
    S = Chebyshev(A, degree=4, preconditioner=lambda r: Minv @ r, steps=12)
    lam = np.linalg.eigvals(Minv @ A).real.max()
    assert np.isclose(S.estimate, lam, rtol=1e-8)
    # the fourth-kind recurrence written out with dense matrices
    r = rng.standard_normal(12)
    x, res = np.zeros(12), r.copy()
    coef = S.coefficients()
    d = coef[0][1] * (Minv @ res)
    for c0, c1 in coef[1:]:
        x += d
        res -= A @ d
        d = c0 * d + c1 * (Minv @ res)
    x += d
    out = np.full(12, np.nan)
    out[:] = S(r)
    assert np.allclose(out, x, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="callable"):
        Chebyshev(A, preconditioner=np.eye(12))


def test_estimate_with_a_preconditioner():
    A = np.diag([1.0, 2.0, 4.0])
    est = estimate_lambda_max(lambda x: A @ x, np.ones(3),
                              preconditioner=lambda r: r / np.array([1.0, 1.0, 2.0]))
    assert np.isclose(est, 2.0)


@pytest.mark.parametrize("p", [2, 3])
def test_pmg_schwarz_converges_to_the_jacobi_cg_solution(p):
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(3, 3, distortion=0.05), p)
    A = fem.diffusion_operator(V)
    M = fem.pmg(A, constrained="boundary", relaxation="schwarz")
    assert M.relaxation == "schwarz"
    assert "Schwarz (FDM, overlap 1" in repr(M)
    assert all(lev.smoother.preconditioner is not None for lev in M.levels[:-1])
    b = M.operator(np.random.default_rng(p).standard_normal(V.ndofs) * M.levels[0].free)
    ref = fem.cg(M.operator, b, tol=1e-12, precond=fem.jacobi(M.operator.diagonal()))
    res = fem.cg(M.operator, b, tol=1e-12, precond=M)
    assert res.converged and ref.converged
    assert res.iterations < ref.iterations / 3
    assert np.allclose(res.x, ref.x, rtol=0, atol=1e-8 * np.abs(ref.x).max())


def test_pmg_schwarz_beats_jacobi_on_kershaw():
    """Kershaw eps = 0.3, 6^3 elements, p = 4, the defaults otherwise (degree 3): measured
    31 (Jacobi) against 17 (Schwarz) iterations to 1e-8."""
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.kershaw_mesh(6, 0.3), 4)
    A = fem.diffusion_operator(V)
    its = {}
    for relax in ("jacobi", "schwarz"):
        M = fem.pmg(A, constrained="boundary", relaxation=relax)
        free = M.levels[0].free
        b = M.operator(np.random.default_rng(0).standard_normal(V.ndofs) * free)
        res = fem.cg(M.operator, b, tol=1e-8, precond=M)
        assert res.converged
        its[relax] = res.iterations
    assert its["schwarz"] <= 20 and its["schwarz"] < 0.7 * its["jacobi"], its


def test_pmg_schwarz_options_and_errors():
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.box_mesh(2, 3), 2)
    M = fem.pmg(V, kind="diffusion", constrained="boundary", relaxation="schwarz",
                schwarz_options=dict(overlap=0, mass="lumped"))
    pre = M.levels[0].smoother.preconditioner
    assert pre.overlap == 0 and pre.mass == "lumped"
    with pytest.raises(ValueError, match="relaxation"):
        fem.pmg(V, kind="diffusion", relaxation="sor")
    with pytest.raises(ValueError, match="schwarz_options"):
        fem.pmg(V, kind="diffusion", schwarz_options=dict(overlap=0))
    with pytest.raises(ValueError, match="kappa"):
        fem.pmg(V, kind="diffusion", relaxation="schwarz", schwarz_options=dict(kappa=2.0))
    with pytest.raises(ValueError, match="mass"):
        fem.pmg(V, kind="mass", relaxation="schwarz")


def test_schwarz_errors():
    V = fem.H1Space(fem.box_mesh(2, 2), 2)
    with pytest.raises(ValueError, match="overlap"):
        Schwarz(V, overlap=2)
    with pytest.raises(ValueError, match="weights"):
        Schwarz(V, weights="harmonic")
    with pytest.raises(ValueError, match="mass"):
        Schwarz(V, mass="exact")
    with pytest.raises(ValueError, match="free has shape"):
        Schwarz(V, free=np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="kappa"):
        Schwarz(V, kappa=np.ones(7))
    with pytest.raises(ValueError, match="r has shape"):
        Schwarz(V)(np.ones(V.ndofs + 1))

    class Fake:
        lattice_shape = None
        mesh = object()
    with pytest.raises(TypeError, match="box mesh"):
        Schwarz(Fake())


def test_solve_poisson_passes_pmg_options():
    needs("scipy", "pyamg")
    from smalltc.fem.poisson import solve_poisson
    u = lambda x: x[0] ** 2 + x[1] * x[2]            # -laplace(u) = -2
    res = solve_poisson(fem.box_mesh(3, 2, distortion=0.05), 3, -2.0, dirichlet=u, exact=u,
                        precond="pmg", pmg_options=dict(relaxation="schwarz"), device="cpu")
    assert res.problem.precond.relaxation == "schwarz"
    assert res.l2_error < 1e-8 and res.iterations < 12
    with pytest.raises(ValueError, match="pmg_options"):
        solve_poisson(fem.box_mesh(2, 2), 2, 1.0, pmg_options=dict(relaxation="schwarz"),
                      device="cpu")


@GPU
@pytest.mark.parametrize("p", [2, 3])
def test_schwarz_on_the_gpu_matches_the_cpu(p):
    needs("scipy", "pyamg")
    cp = xp_of("cupy")
    V = fem.H1Space(fem.kershaw_mesh(6, 0.3), p)
    free = ~boundary_mask(V)
    r = np.random.default_rng(0).standard_normal(V.ndofs)
    zc = Schwarz(V, free=free)(r)
    zg = Schwarz(V, cp, free=free)(cp.asarray(r))
    assert isinstance(zg, cp.ndarray)
    assert np.allclose(cp.asnumpy(zg), zc, rtol=1e-12, atol=1e-12 * np.abs(zc).max())
    gpu = fem.pmg(V, kind="diffusion", constrained="boundary", device="gpu",
                  relaxation="schwarz")
    b = gpu.operator(cp.asarray(r * free))
    res = fem.cg(gpu.operator, b, tol=1e-8, precond=gpu)
    assert res.converged and res.iterations < 20


@GPU
@pytest.mark.parametrize("dim, p, overlap, dtype", [(2, 3, 1, np.float64), (3, 1, 1, np.float64),
                                                    (3, 4, 0, np.float64), (3, 3, 1, np.float32),
                                                    (3, 8, 1, np.float64)])
def test_device_kernel_matches_the_array_path(dim, p, overlap, dtype):
    cp = xp_of("cupy")
    mesh = fem.kershaw_mesh(6, 0.3, dim=dim) if dim == 3 else fem.kershaw_mesh((6, 4), 0.3,
                                                                               dim=2)
    V = fem.H1Space(mesh, p)
    free = ~boundary_mask(V)
    fast = Schwarz(V, cp, free=free, overlap=overlap, dtype=dtype)
    slow = Schwarz(V, cp, free=free, overlap=overlap, dtype=dtype)
    slow.device_kernel = False
    assert fast.device_kernel
    r = cp.asarray(np.random.default_rng(6).standard_normal(V.ndofs))
    z = cp.full(V.ndofs, cp.nan, dtype=dtype)
    z[:] = fast(r)
    ref = cp.asnumpy(slow(r))
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert np.allclose(cp.asnumpy(z), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_bench_pmg_relaxation_option():
    from argparse import Namespace

    from smalltc.bench.cli import _pmg_options, _tag
    args = Namespace(pmg_smoother=None, pmg_relaxation="schwarz", pmg_degree=None,
                     sizes=None, p="2-4", dim=None, mesh=None)
    assert _pmg_options(args) == {"relaxation": "schwarz"}
    assert _tag(args, ["solve"], ["gemm"]) == "solve-p2_4-rxschwarz-"


@pytest.mark.parametrize("dim, p, overlap", [(2, 3, 1), (3, 2, 1), (3, 4, 0)])
def test_host_kernel_matches_the_array_path(dim, p, overlap):
    pytest.importorskip("numba")
    mesh = fem.kershaw_mesh(6, 0.3, dim=dim) if dim == 3 else fem.kershaw_mesh((6, 4), 0.3,
                                                                               dim=2)
    V = fem.H1Space(mesh, p)
    free = ~boundary_mask(V)
    fast = Schwarz(V, free=free, overlap=overlap, host_kernel=True)
    slow = Schwarz(V, free=free, overlap=overlap, host_kernel=False)
    r = np.random.default_rng(5).standard_normal(V.ndofs)
    z = np.full(V.ndofs, np.nan)
    z[:] = fast(r)
    ref = slow(r)
    assert np.allclose(z, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_pmg_with_float32_local_solves():
    """float32 Schwarz inside a float64 V-cycle: the smoother's vectors stay float64 and
    the iterations are those of float64 local solves (to 1e-8)."""
    needs("scipy", "pyamg")
    V = fem.H1Space(fem.kershaw_mesh(6, 0.3), 3)
    A = fem.diffusion_operator(V)
    its = []
    for dt in (np.float64, np.float32):
        M = fem.pmg(A, constrained="boundary", relaxation="schwarz",
                    schwarz_options=dict(dtype=dt, host_kernel=False))
        assert M.levels[0].smoother.preconditioner.dtype == dt
        b = M.operator(np.random.default_rng(0).standard_normal(V.ndofs) * M.levels[0].free)
        z = M(b)
        assert z.dtype == np.float64
        res = fem.cg(M.operator, b, tol=1e-8, precond=M)
        assert res.converged
        its.append(res.iterations)
    assert abs(its[0] - its[1]) <= 1, its


@pytest.mark.parametrize("dim, p", [(2, 2), (3, 2)])
def test_local_inverse_with_coefficients(dim, p):
    """kappa and alpha: the extended element's block of the assembled Helmholtz matrix
    ``alpha M + kappa K`` (equal boxes, exact quadrature)."""
    needs("scipy")
    kappa, alpha = 0.5, 3.0
    V = fem.H1Space(fem.box_mesh(dim, 3, upper=2.0), p)
    P = Schwarz(V, kappa=kappa, alpha=alpha)
    H = assemble_csr(fem.helmholtz_operator(V, alpha, p + 2, kappa, backend="reference"),
                     V).toarray()
    center = (3 ** dim) // 2
    idx = to_numpy(P.idx[center]).ravel()
    U = np.random.default_rng(4).standard_normal((V.nelements,) + (P.nloc,) * dim)
    ref = np.linalg.solve(H[np.ix_(idx, idx)], U[center].ravel())
    X = P.local_solve(U)[center].ravel()
    assert np.allclose(X, ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())
    # a per-element kappa scales that element's stiffness part only
    k = np.ones(V.nelements)
    k[center] = kappa
    Pk = Schwarz(V, kappa=k, alpha=alpha)
    assert np.allclose(Pk.local_solve(U)[center], P.local_solve(U)[center], rtol=1e-12)
