"""Gauss-Legendre and Gauss-Lobatto rules: exactness, symmetry, errors."""
import numpy as np
import pytest

from smalltc.fem import gauss_legendre, gauss_lobatto, quadrature_rule
from smalltc.fem.quadrature import MAX_POINTS

GL_COUNTS = [1, 2, 3, 4, 5, 7, 8, 12, 16, 20, 25, 32, 40, 64]
GLL_COUNTS = [2, 3, 4, 5, 6, 9, 12, 16, 17, 20, 25, 32, 40, 64]

# (rule function, n, exact degree as a function of n)
EXACTNESS_CASES = (
    [(gauss_legendre, n, 2 * n - 1) for n in GL_COUNTS]
    + [(gauss_lobatto, n, 2 * n - 3) for n in GLL_COUNTS]
)


def _moment(d):
    return 2.0 / (d + 1) if d % 2 == 0 else 0.0


@pytest.mark.parametrize("rule, n, degree", EXACTNESS_CASES,
                         ids=[f"{r.__name__}-{n}" for r, n, _ in EXACTNESS_CASES])
def test_integrates_monomials_exactly(rule, n, degree):
    x, w = rule(n)
    assert x.shape == w.shape == (n,)
    assert x.dtype == w.dtype == np.float64
    errs = [abs(w @ x**d - _moment(d)) for d in range(degree + 1)]
    assert max(errs) <= 4e-15


@pytest.mark.parametrize("rule, n, degree", EXACTNESS_CASES,
                         ids=[f"{r.__name__}-{n}" for r, n, _ in EXACTNESS_CASES])
def test_weights_positive_nodes_sorted_symmetric(rule, n, degree):
    x, w = rule(n)
    assert np.all(w > 0)
    assert abs(w.sum() - 2.0) <= 4e-15
    assert np.all(np.diff(x) > 0)
    np.testing.assert_array_equal(x, -x[::-1])
    np.testing.assert_array_equal(w, w[::-1])
    assert np.all(np.abs(x) <= 1.0)


@pytest.mark.parametrize("n", GL_COUNTS)
def test_gauss_legendre_is_not_exact_beyond_2n_minus_1(n):
    # P_n vanishes at the nodes, so the rule gives 0 for int P_n^2 = 2/(2n+1):
    # the first degree (2n) it misses, as it should (guards a mislabelled rule).
    x, w = gauss_legendre(n)
    Pn = np.polynomial.legendre.Legendre.basis(n)(x)
    assert abs(w @ Pn**2) <= 1e-13


@pytest.mark.parametrize("n", GLL_COUNTS)
def test_gauss_lobatto_is_not_exact_beyond_2n_minus_3(n):
    # For N = n - 1 the rule gives 2/N for int P_N^2 = 2/(2N+1) (degree 2n-2).
    x, w = gauss_lobatto(n)
    N = n - 1
    PN = np.polynomial.legendre.Legendre.basis(N)(x)
    np.testing.assert_allclose(w @ PN**2, 2.0 / N, rtol=1e-13)


@pytest.mark.parametrize("n", GL_COUNTS)
def test_gauss_legendre_matches_numpy(n):
    # numpy's leggauss weights are themselves only good to ~1e-12 relative
    # at n = 64 (ours are within 1e-13 of a 40-digit reference there).
    x, w = gauss_legendre(n)
    xr, wr = np.polynomial.legendre.leggauss(n)
    np.testing.assert_allclose(x, xr, rtol=0, atol=4e-16)
    np.testing.assert_allclose(w, wr, rtol=3e-12, atol=0)


@pytest.mark.parametrize("n", GLL_COUNTS)
def test_gauss_lobatto_structure(n):
    # End points are exactly +-1; interior nodes are the zeros of P'_{n-1}.
    x, w = gauss_lobatto(n)
    assert x[0] == -1.0 and x[-1] == 1.0
    dP = np.polynomial.legendre.Legendre.basis(n - 1).deriv()
    assert np.max(np.abs(dP(x[1:-1])), initial=0.0) <= 1e-12 * n**2
    np.testing.assert_allclose(w[0], 2.0 / (n * (n - 1)), rtol=1e-14)


# (rule, n, highest degree it integrates exactly) at the largest count allowed
LIMIT_CASES = [(gauss_legendre, MAX_POINTS, 2 * MAX_POINTS - 1),
               (gauss_lobatto, MAX_POINTS, 2 * MAX_POINTS - 3)]


@pytest.mark.parametrize("rule, n, degree", LIMIT_CASES, ids=["gauss", "lobatto"])
def test_rules_at_the_limit(rule, n, degree):
    """At n = MAX_POINTS the rules still integrate Legendre polynomials exactly."""
    x, w = rule(n)
    assert np.all(w > 0) and np.all(np.diff(x) > 0)
    assert abs(w.sum() - 2.0) <= 1e-13
    for k in (1, 2, 3, n - 1, n, degree - 1, degree):
        Pk = np.polynomial.legendre.Legendre.basis(k)(x)
        assert abs(w @ Pk) <= 1e-13, (k, w @ Pk)


RULE_NAME_CASES = [
    ("gauss", 3, gauss_legendre),
    ("Gauss-Legendre", 3, gauss_legendre),
    ("gl", 1, gauss_legendre),
    ("lobatto", 4, gauss_lobatto),
    ("gauss-lobatto", 2, gauss_lobatto),
    ("GLL", 5, gauss_lobatto),
]


@pytest.mark.parametrize("name, n, func", RULE_NAME_CASES)
def test_quadrature_rule_dispatch(name, n, func):
    x, w = quadrature_rule(n, name)
    xr, wr = func(n)
    np.testing.assert_array_equal(x, xr)
    np.testing.assert_array_equal(w, wr)


ERROR_CASES = [
    (lambda: gauss_legendre(0), ValueError, r"n must be >= 1 for Gauss-Legendre, got n=0"),
    (lambda: gauss_lobatto(1), ValueError, r"n must be >= 2 for Gauss-Lobatto, got n=1"),
    (lambda: gauss_legendre(2.0), TypeError, r"n must be an integer, got float"),
    (lambda: gauss_lobatto(True), TypeError, r"n must be an integer"),
    (lambda: quadrature_rule(3, "simpson"), ValueError, r"rule must be one of .* got 'simpson'"),
    (lambda: gauss_legendre(MAX_POINTS + 1), ValueError,
     r"n must be <= 2048 for Gauss-Legendre, got n=2049 \(beyond it .*accuracy"),
    (lambda: gauss_lobatto(10**6), ValueError,
     r"n must be <= 2048 for Gauss-Lobatto, got n=1000000"),
    (lambda: quadrature_rule(10**6 + 2), ValueError, r"n must be <= 2048 for Gauss-Legendre"),
]


@pytest.mark.parametrize("call, exc, match", ERROR_CASES)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
