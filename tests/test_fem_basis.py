"""Gauss-Lobatto nodal Lagrange bases: values, derivatives, errors."""
import numpy as np
import pytest

from smalltc.fem import (
    barycentric_weights,
    basis_1d,
    differentiation_matrix,
    gauss_lobatto,
    lagrange_basis,
)
from smalltc.fem.basis import MAX_ORDER
from smalltc.fem.quadrature import MAX_POINTS

ORDERS = [1, 2, 3, 4, 5, 6, 8, 12, 16, 20]

# (p, nq, quadrature)
BASIS_CASES = [(p, p + 1, "gauss") for p in ORDERS] + [
    (2, 5, "gauss"),
    (3, 4, "lobatto"),
    (4, 7, "lobatto"),
    (16, 18, "gauss"),
    (16, 17, "lobatto"),
]

RNG_POINTS = np.random.default_rng(7).uniform(-1.0, 1.0, 23)


def _points(p):
    """Random points, the nodes themselves, end points and near-node points."""
    nodes, _ = gauss_lobatto(p + 1)
    return np.concatenate([RNG_POINTS, nodes, nodes[1:-1] + 1e-9, [-1.0, 1.0, 0.0]])


@pytest.mark.parametrize("p", ORDERS)
def test_partition_of_unity(p):
    B, G = lagrange_basis(gauss_lobatto(p + 1)[0], _points(p))
    np.testing.assert_allclose(B.sum(axis=1), 1.0, rtol=0, atol=1e-13)
    np.testing.assert_allclose(G.sum(axis=1), 0.0, rtol=0, atol=1e-11 * p**2)


@pytest.mark.parametrize("p", ORDERS)
def test_nodal_property(p):
    nodes = gauss_lobatto(p + 1)[0]
    B, _ = lagrange_basis(nodes, nodes)
    np.testing.assert_array_equal(B, np.eye(p + 1))


@pytest.mark.parametrize("p", ORDERS)
def test_reproduces_polynomials_and_derivatives(p):
    # Interpolating a degree-p polynomial at the nodes reproduces it and its
    # derivative everywhere.
    nodes = gauss_lobatto(p + 1)[0]
    poly = np.polynomial.Polynomial(np.random.default_rng(p).standard_normal(p + 1))
    t = _points(p)
    B, G = lagrange_basis(nodes, t)
    scale = np.max(np.abs(poly.coef)) * (p + 1)
    np.testing.assert_allclose(B @ poly(nodes), poly(t), rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(G @ poly(nodes), poly.deriv()(t), rtol=0, atol=1e-12 * scale * p**2)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_derivative_matches_finite_differences(p):
    nodes = gauss_lobatto(p + 1)[0]
    t = np.linspace(-0.9, 0.9, 11)
    h = 1e-6
    _, G = lagrange_basis(nodes, t)
    Bp, _ = lagrange_basis(nodes, t + h)
    Bm, _ = lagrange_basis(nodes, t - h)
    np.testing.assert_allclose(G, (Bp - Bm) / (2 * h), rtol=0, atol=1e-6 * p**2)


@pytest.mark.parametrize("p", ORDERS)
def test_differentiation_matrix_is_derivative_at_nodes(p):
    nodes = gauss_lobatto(p + 1)[0]
    _, G = lagrange_basis(nodes, nodes)
    np.testing.assert_allclose(G, differentiation_matrix(nodes), rtol=0, atol=1e-12)


def test_barycentric_weights_scaled():
    lam = barycentric_weights(gauss_lobatto(17)[0])
    assert np.max(np.abs(lam)) == 1.0
    assert np.all(np.sign(lam[:-1]) == -np.sign(lam[1:]))  # alternating signs


@pytest.mark.parametrize("p, nq, quadrature", BASIS_CASES)
def test_basis_1d(p, nq, quadrature):
    b = basis_1d(p, nq, quadrature)
    assert b.B1d.shape == b.G1d.shape == (nq, p + 1)
    assert b.qpoints.shape == b.qweights.shape == (nq,)
    np.testing.assert_array_equal(b.nodes, gauss_lobatto(p + 1)[0])
    # The basis functions sum to 1, so their integrals sum to the length 2.
    assert abs(np.sum(b.qweights @ b.B1d) - 2.0) < 1e-13
    # Derivatives of the basis integrate to phi_i(1) - phi_i(-1).
    expected = np.zeros(p + 1)
    expected[0], expected[-1] = -1.0, 1.0
    np.testing.assert_allclose(b.qweights @ b.G1d, expected, rtol=0, atol=1e-12)


# (p, nq, quadrature) at and near the largest order allowed
LIMIT_CASES = [(MAX_ORDER, MAX_ORDER + 1, "gauss"), (MAX_ORDER, MAX_ORDER + 2, "gauss"),
               (MAX_ORDER, MAX_ORDER + 1, "lobatto"), (MAX_ORDER - 11, MAX_ORDER - 9, "gauss")]


@pytest.mark.parametrize("p, nq, quadrature", LIMIT_CASES)
def test_identities_hold_up_to_the_limit(p, nq, quadrature):
    """The accuracy the docstrings state for p <= MAX_ORDER: partition of unity to 1e-15,
    the derivative identities to 1e-10."""
    b = basis_1d(p, nq, quadrature)
    B, G = b.B1d, b.G1d
    assert np.all(np.isfinite(B)) and np.all(np.isfinite(G))
    ends = np.zeros(p + 1)
    ends[0], ends[-1] = -1.0, 1.0
    assert np.max(np.abs(B.sum(axis=1) - 1.0)) <= 2e-15
    assert np.max(np.abs(B @ b.nodes - b.qpoints)) <= 1e-13     # x reproduced
    assert np.max(np.abs(G.sum(axis=1))) <= 1e-10               # (1)' = 0
    assert np.max(np.abs(G @ b.nodes - 1.0)) <= 1e-10           # (x)' = 1
    assert np.max(np.abs(b.qweights @ G - ends)) <= 1e-10       # int phi_i' = phi_i(1) - phi_i(-1)


ERROR_CASES = [
    (lambda: basis_1d(0, 2), ValueError, r"p must be an integer >= 1, got 0"),
    (lambda: basis_1d(2.5, 3), ValueError, r"p must be an integer >= 1, got 2.5"),
    (lambda: basis_1d(2, 0), ValueError, r"n must be >= 1 for Gauss-Legendre"),
    (lambda: basis_1d(2, 3, "trapezoid"), ValueError, r"rule must be one of"),
    (lambda: lagrange_basis([0.0, 0.0, 1.0], [0.5]), ValueError, r"nodes must be distinct"),
    (lambda: lagrange_basis([[0.0, 1.0]], [0.5]), ValueError, r"nodes must be a non-empty 1D array, got shape \(1, 2\)"),
    (lambda: lagrange_basis([0.0, np.nan], [0.5]), ValueError, r"nodes must be finite"),
    (lambda: lagrange_basis([0.0, 1.0], [[0.5]]), ValueError, r"points must be a 1D array, got shape \(1, 1\)"),
    (lambda: lagrange_basis([0.0, 1.0], [np.inf]), ValueError, r"points must be finite"),
    (lambda: basis_1d(MAX_ORDER + 1, MAX_ORDER + 3), ValueError,
     r"p must be <= 256, got p=257: beyond it the float64 basis derivatives lose accuracy"),
    (lambda: basis_1d(900, 902), ValueError, r"p must be <= 256, got p=900"),
    (lambda: basis_1d(10**6, 10**6 + 2), ValueError, r"p must be <= 256, got p=1000000"),
    (lambda: basis_1d(4, MAX_POINTS + 1), ValueError, r"n must be <= 2048 for Gauss-Legendre"),
    (lambda: lagrange_basis(np.linspace(-1, 1, MAX_ORDER + 2), [0.5]), ValueError,
     r"nodes has shape \(258,\), at most \(257,\)"),
    (lambda: barycentric_weights(np.arange(10**6)), ValueError, r"nodes has shape \(1000000,\)"),
]


@pytest.mark.parametrize("call, exc, match", ERROR_CASES)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
