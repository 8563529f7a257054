"""Chebyshev smoothing polynomials: the fourth kind's and the optimised fourth kind's
error polynomials on a diagonal spectrum (Lottes 2022), the weighted steps against a
dense reference, CPU and GPU vector updates with weights; the in-place Lanczos estimate
of ``lambda_max`` against the recurrence written out of place."""
import numpy as np
import pytest

from smalltc.fem.chebyshev import (OPT_FOURTH_BETAS, Chebyshev, VectorOps, estimate_lambda_max,
                                   start_vector)
from smalltc.fem.levels import Constrained

from conftest import array_modules, to_numpy, xp_of

LAM = np.linspace(1e-7, 1.0, 100001)


def _error_polynomial(kind, k):
    """``q(t) = 1 - t p(t)`` on LAM: the smoother's error after ``k`` steps from zero on
    the diagonal operator ``diag(LAM)`` (``D = I``, ``lambda_max = 1``)."""
    S = Chebyshev(lambda x: LAM * x, diagonal=np.ones(LAM.size), degree=k, kind=kind,
                  lambda_max=1.0, check=False)
    return 1.0 - S.smooth(LAM.copy())


@pytest.mark.parametrize("k", range(1, 9))
def test_fourth_kind_bounds(k):
    q = _error_polynomial("fourth", k)
    # Lottes: max sqrt(t) |q(t)| = 1 / (2k + 1); the V-cycle bound
    # max t q^2 / (1 - q^2) = 3 / (4k(k + 1)); |q| <= 1, q(0) = 1
    assert np.max(np.sqrt(LAM) * np.abs(q)) == pytest.approx(1 / (2 * k + 1), rel=1e-6)
    assert np.max(LAM * q ** 2 / (1 - q ** 2)) == pytest.approx(3 / (4 * k * (k + 1)),
                                                                rel=1e-4)
    assert np.abs(q).max() <= 1.0 and q[0] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("k", range(1, 9))
def test_optimised_weights_lower_the_vcycle_bound(k):
    q4, qo = _error_polynomial("fourth", k), _error_polynomial("fourth-opt", k)
    b4 = np.max(LAM * q4 ** 2 / (1 - q4 ** 2))
    bo = np.max(LAM * qo ** 2 / (1 - qo ** 2))
    assert bo < 0.9 * b4                       # 11-18% lower at k = 1..8
    assert np.abs(qo).max() <= 1.0
    # the optimised polynomial's max sqrt(t)|q| is sin(pi / (4k + 2)) (observed for the
    # tabulated weights to their accuracy: a check of the table's digits)
    assert np.max(np.sqrt(LAM) * np.abs(qo)) == pytest.approx(np.sin(np.pi / (4 * k + 2)),
                                                              rel=2e-6)


def _dense_reference(A, Dinv, b, k, lam, betas):
    """Lottes' algorithm with weights, written out with dense matrices."""
    x = np.zeros_like(b)
    r = b.copy()
    d = 4.0 / (3.0 * lam) * (Dinv @ r)
    for i in range(1, k):
        x = x + betas[i - 1] * d
        r = r - A @ d
        d = (2 * i - 1) / (2 * i + 3) * d + (8 * i + 4) / ((2 * i + 3) * lam) * (Dinv @ r)
    return x + betas[k - 1] * d


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_weighted_steps_match_dense_reference(k):
    rng = np.random.default_rng(k)
    B = rng.standard_normal((30, 30))
    A = B @ B.T + 30 * np.eye(30)
    S = Chebyshev(A, degree=k, kind="fourth-opt")
    b = rng.standard_normal(30)
    want = _dense_reference(A, np.diag(1 / np.diag(A)), b, k, S.lambda_max,
                            OPT_FOURTH_BETAS[k])
    np.testing.assert_allclose(S(b), want, rtol=1e-12, atol=1e-12)
    # from a nonzero guess: the same polynomial on the residual
    x0 = rng.standard_normal(30)
    np.testing.assert_allclose(S.smooth(b, x0), x0 + _dense_reference(
        A, np.diag(1 / np.diag(A)), b - A @ x0, k, S.lambda_max, OPT_FOURTH_BETAS[k]),
        rtol=1e-12, atol=1e-12)
    # symmetric (a CG preconditioner)
    P = np.stack([S(e) for e in np.eye(30)], axis=1)
    np.testing.assert_allclose(P, P.T, rtol=0, atol=1e-12 * np.abs(P).max())


def test_optimised_kind_refuses_untabulated_degree():
    with pytest.raises(ValueError, match=r"'fourth-opt' has weights for degrees 1..8, got "
                                         r"degree 9"):
        Chebyshev(np.eye(3), degree=9, kind="fourth-opt")


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("masked, xzero, beta", [(False, True, 1.3), (True, False, 1.07),
                                                 (True, True, 1.0)])
def test_weighted_vector_updates(xp_name, masked, xzero, beta):
    xp = xp_of(xp_name)
    n = 1000
    rng = np.random.default_rng(3)
    v = {key: rng.standard_normal(n) for key in ("y", "r", "x", "d")}
    inv = rng.random(n) + 0.5
    f = (rng.random(n) < 0.7).astype(np.float64) if masked else np.ones(n)
    ops = VectorOps(xp.asarray(inv), xp.asarray(f) if masked else None)
    r, d = xp.array(v["r"]), xp.array(v["d"])
    x = xp.full(n, np.nan) if xzero else xp.array(v["x"])
    dm = xp.full(n, np.nan) if masked or xp is not np else d
    ops.step(xp.array(v["y"]), r, x, d, dm, 0.3, 1.9, xzero, beta)
    x_ref = beta * v["d"] + (0 if xzero else v["x"])
    r_ref = v["r"] - (f * v["y"] + (1 - f) * v["d"])
    np.testing.assert_allclose(to_numpy(x), x_ref, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(to_numpy(d), 0.3 * v["d"] + 1.9 * inv * r_ref, rtol=1e-13,
                               atol=1e-13)
    x = xp.full(n, np.nan) if xzero else xp.array(v["x"])
    x, xm = ops.last(xp.array(v["d"]), x, xzero, beta)
    np.testing.assert_allclose(to_numpy(x), x_ref, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(to_numpy(xm), f * x_ref, rtol=1e-13, atol=1e-13)


def _lanczos_out_of_place(apply, inv, r, prec=None, steps=10):
    """The largest Ritz value of the Jacobi-PCG (PCG with ``prec``) Lanczos recurrence,
    every vector a new array (the oracle of the in-place estimate)."""
    prec = prec or (lambda v: v * inv)
    z = prec(r)
    p = z.copy()
    rz = float(np.vdot(r, z))
    alphas, betas = [], []
    for _ in range(steps):
        Ap = apply(p)
        alpha = rz / float(np.vdot(p, Ap))
        alphas.append(alpha)
        r = r - alpha * Ap
        z = prec(r)
        rz_new = float(np.vdot(r, z))
        if not rz_new > 1e-28 * rz:
            break
        betas.append(rz_new / rz)
        p = z + betas[-1] * p
        rz = rz_new
    m = len(alphas)
    T = np.diag([1 / alphas[j] + (betas[j - 1] / alphas[j - 1] if j else 0.0)
                 for j in range(m)])
    for j in range(m - 1):
        T[j, j + 1] = T[j + 1, j] = np.sqrt(betas[j]) / alphas[j]
    return float(np.linalg.eigvalsh(T)[-1])


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-14), (np.float32, 1e-5)])
@pytest.mark.parametrize("case", ["jacobi", "constrained", "preconditioner", "start",
                                  "converged"])
def test_estimate_matches_out_of_place_lanczos(case, dtype, rtol):
    n = 60
    rng = np.random.default_rng(5)
    Q = rng.standard_normal((n, n))
    A = (Q @ Q.T / n + np.diag(rng.random(n) + 0.5)).astype(dtype)
    if case == "converged":                      # D^-1 A = I: stops after one step
        A = np.diag(np.repeat([1.0, 2.0, 5.0], n // 3)).astype(dtype)
    inv = (1 / np.diag(A)).astype(dtype)
    op = raw = lambda x: A @ x                   # noqa: E731
    kw, prec = {}, None
    if case == "constrained":                    # the multigrid levels' operators
        op = Constrained(raw, np.diag(A).copy(), rng.random(n) < 0.8)
        inv = 1 / op.diagonal()
        kw["free"] = op.free                     # raw A and the mask, A_c applied inside
    if case == "preconditioner":
        L = np.linalg.cholesky(A.astype(np.float64) + np.eye(n))
        prec = kw["preconditioner"] = lambda r: np.linalg.solve(L @ L.T, r).astype(dtype)
    start = rng.standard_normal(n).astype(dtype)
    if case == "start":
        kw["start"] = start.copy()
    else:
        start = start_vector(np.arange(n, dtype=np.uint64), dtype)
    got = estimate_lambda_max(raw if "free" in kw else op, inv, steps=10, **kw)
    ref = _lanczos_out_of_place(op, inv, start, prec)
    assert got == pytest.approx(ref, rel=rtol)
    if case == "constrained":                    # a smoother of Constrained estimates alike
        assert Chebyshev(op).estimate == got
    if case == "start":
        np.testing.assert_array_equal(kw["start"], start)     # the caller's start is kept
    if dtype == np.float64:
        assert got == ref                        # the same arithmetic, bit for bit


def test_start_vector_is_uniform_and_the_same_for_a_key():
    """The Lanczos start: entries in [-0.5, 0.5) with a uniform's mean and spread, a key's
    entry independent of the other keys (a DoF's global number on any number of ranks),
    another seed another vector."""
    keys = np.arange(200_000, dtype=np.uint64)
    v = start_vector(keys)
    assert v.dtype == np.float64 and np.all((v >= -0.5) & (v < 0.5))
    assert abs(v.mean()) < 3e-3 and abs(v.std() - 12 ** -0.5) < 2e-3
    np.testing.assert_array_equal(start_vector(keys[::-7])[::-1], v[::-7][::-1])
    assert np.corrcoef(v[:-1], v[1:])[0, 1] < 0.01
    w = start_vector(keys, seed=1)
    assert not np.any(w == v) or np.mean(w == v) < 1e-4
    assert start_vector(keys[:10], np.float32).dtype == np.float32
