"""Preconditioned CG and the Jacobi preconditioner."""
import numpy as np
import pytest

from smalltc.fem import ConvergenceError, cg, jacobi


def _spd(n, cond_scale, seed):
    """Random SPD matrix with a badly scaled diagonal (Jacobi's favourite)."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = Q @ np.diag(np.linspace(1.0, 10.0, n)) @ Q.T
    s = np.logspace(0, cond_scale, n)
    return s[:, None] * A * s[None, :]


# (n, diagonal scaling decades, tol, shape of the unknown)
CG_CASES = [
    (5, 0, 1e-12, None),
    (30, 0, 1e-10, None),
    (30, 3, 1e-12, None),
    (60, 2, 1e-8, None),
    (20, 1, 1e-12, 3),
]


@pytest.mark.parametrize("n, decades, tol, ncomp", CG_CASES)
@pytest.mark.parametrize("use_jacobi", [False, True])
def test_cg_solves_spd_systems(n, decades, tol, ncomp, use_jacobi):
    A = _spd(n, decades, seed=n + decades)
    rng = np.random.default_rng(1)
    apply = (lambda x: x @ A) if ncomp else (lambda x: A @ x)  # A symmetric: same action per row
    b = rng.standard_normal(n if ncomp is None else (ncomp, n))
    P = jacobi(np.broadcast_to(np.diag(A), b.shape)) if use_jacobi else None
    res = cg(apply, b, tol=tol, precond=P, maxiter=50 * n)
    assert res.converged
    assert res.residuals[0] == 1.0 and res.residuals[-1] <= tol
    assert res.residuals.shape == (res.iterations + 1,)
    assert res.true_residual <= 100 * tol
    x_ref = np.linalg.solve(A, b.T).T
    cond = np.linalg.cond(A)
    assert np.linalg.norm(res.x - x_ref) <= 10 * cond * tol * np.linalg.norm(x_ref)


def test_jacobi_reduces_iterations_on_bad_scaling():
    A = _spd(40, 4, seed=3)
    b = np.ones(40)
    plain = cg(lambda x: A @ x, b, tol=1e-10, maxiter=10_000)
    pre = cg(lambda x: A @ x, b, tol=1e-10, precond=jacobi(np.diag(A)))
    assert pre.iterations < plain.iterations / 2


def test_initial_guess_and_zero_rhs():
    A = _spd(10, 0, seed=0)
    b = np.arange(10.0)
    x = np.linalg.solve(A, b)
    res = cg(lambda v: A @ v, b, x0=x, tol=1e-10)
    assert res.iterations <= 1 and res.converged
    zero = cg(lambda v: A @ v, np.zeros(10))
    assert zero.iterations == 0 and zero.converged and not zero.x.any()


def test_not_converged_raises_with_result():
    A = _spd(50, 2, seed=5)
    b = np.ones(50)
    with pytest.raises(ConvergenceError, match=r"CG did not converge in 3 iterations: relative residual "
                                                r"[0-9.e+-]+ > tol 1.000e-12") as info:
        cg(lambda x: A @ x, b, tol=1e-12, maxiter=3)
    assert info.value.result.iterations == 3 and not info.value.result.converged
    res = cg(lambda x: A @ x, b, tol=1e-12, maxiter=3, raise_on_failure=False)
    assert not res.converged and res.residuals[-1] > 1e-12


ERROR_CASES = [
    (lambda: cg(lambda x: -x, np.ones(3)), ValueError, r"operator is not positive definite: p\^T A p = -3.000e\+00 at iteration 0"),
    (lambda: cg(lambda x: x, np.ones(3), precond=lambda r: -r), ValueError, r"preconditioner is not positive definite"),
    (lambda: cg(lambda x: x, np.array([1.0, np.nan])), ValueError, r"b contains non-finite values"),
    (lambda: cg(lambda x: x, np.ones(3), tol=0.0), ValueError, r"tol must be a positive number, got 0.0"),
    (lambda: cg(lambda x: x, np.ones(3), maxiter=-1), ValueError, r"maxiter must be a non-negative integer, got -1"),
    (lambda: cg(lambda x: x, np.ones(3), x0=np.ones(4)), ValueError, r"x0 has shape \(4,\), expected \(3,\)"),
    (lambda: cg(lambda x: x * np.nan, np.ones(3)), ValueError, r"operator is not positive definite: p\^T A p = nan"),
    (lambda: jacobi(np.array([1.0, 0.0, -2.0])), ValueError, r"entry \(1,\) is 0.0 \(2 bad entries\)"),
    (lambda: jacobi(np.array([[1.0, np.inf]])), ValueError, r"diagonal must be positive and finite .* entry \(0, 1\)"),
]


@pytest.mark.parametrize("call, exc, match", ERROR_CASES)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------- the fused iteration
from conftest import array_modules, to_numpy, xp_of  # noqa: E402


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("use_jacobi", [False, True, "callable"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fused_cg_matches_the_plain_loop(xp_name, use_jacobi, dtype):
    """The fused iteration (CPU: Numba passes; GPU: device-resident scalars, with any
    preconditioner the host one iteration ahead) and the plain loop take the same
    iterations to the same iterate, up to rounding."""
    from smalltc.fem import H1Space, box_mesh, mass_operator
    xp = xp_of(xp_name)
    space = H1Space(box_mesh(3, 3, distortion=0.05), p=3)
    M = mass_operator(space, dtype=dtype, device="cpu" if xp is np else "gpu")
    b = M(xp.asarray(np.random.default_rng(2).random(space.ndofs), dtype=dtype))
    P = jacobi(M.diagonal()) if use_jacobi else None
    if use_jacobi == "callable":                  # any preconditioner: not folded in
        inv = 1.0 / M.diagonal()
        P = lambda r: r * inv                     # noqa: E731
    tol = 1e-10 if dtype == "float64" else 1e-5
    plain = cg(M, b, tol=tol, precond=P, fused=False)
    fused = cg(M, b, tol=tol, precond=P)
    # without a preconditioner the residuals drift apart by the end (below), so the one
    # that first falls under tol may come an iteration earlier or later (GPU: 154 vs 155
    # once, the atomic additions' order); with Jacobi they agree to rounding throughout
    slack = 0 if use_jacobi else 1
    assert fused.converged and abs(fused.iterations - plain.iterations) <= slack
    eps = 1e-9 if dtype == "float64" else 1e-3
    x0, x1 = to_numpy(plain.x), to_numpy(fused.x)
    assert np.abs(x1 - x0).max() <= eps * np.abs(x0).max()
    # the early residuals agree to rounding; later ones drift apart (CG amplifies the
    # rounding of its inner products, more without preconditioner: ~10% by the end here)
    np.testing.assert_allclose(fused.residuals[:10], plain.residuals[:10], rtol=eps * 10)
    if use_jacobi:
        np.testing.assert_allclose(fused.residuals, plain.residuals, rtol=eps * 10)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("smalltc._arrays", fromlist=["x"]).gpu_available(),
                    reason="no CUDA device")
def test_device_cg_result_does_not_depend_on_check_every():
    """Kernels queued past the stop do nothing: the same bits whether the host checks
    every iteration or every 16 (with the deterministic operator: atomics would change the
    last bits from run to run)."""
    from smalltc.fem import H1Space, box_mesh, mass_operator
    space = H1Space(box_mesh(3, 3, distortion=0.05), p=2)
    M = mass_operator(space, device="gpu", deterministic=True)
    b = M(xp_of("cupy").asarray(np.random.default_rng(3).random(space.ndofs)))
    P = jacobi(M.diagonal())
    a = cg(M, b, tol=1e-10, precond=P, check_every=1)
    c = cg(M, b, tol=1e-10, precond=P, check_every=16)
    assert a.iterations == c.iterations > 5
    assert np.array_equal(to_numpy(a.x), to_numpy(c.x))
    assert np.array_equal(a.residuals, c.residuals)


@pytest.mark.parametrize("check_every", [0, -2, 1.5, True])
def test_check_every_must_be_a_positive_integer(check_every):
    with pytest.raises(ValueError, match=r"check_every must be a positive integer"):
        cg(lambda x: x, np.ones(3), check_every=check_every)


def test_fused_cg_maxiter_and_breakdowns():
    A = _spd(50, 2, seed=5)
    b = np.ones(50)
    res = cg(lambda x: A @ x, b, tol=1e-12, maxiter=3, raise_on_failure=False,
             precond=jacobi(np.diag(A)))
    assert res.iterations == 3 and not res.converged and res.residuals.shape == (4,)
    with pytest.raises(ValueError, match=r"preconditioner is not positive definite"):
        cg(lambda x: x, np.ones(3), precond=jacobi(np.ones(3)).__class__(-np.ones(3)))
