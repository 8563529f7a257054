"""The FEM layer's diffusion and Helmholtz operators: the identities of docs/math.md
section 7 on curved (geometry order 2, distorted) box meshes.

- constants are in the kernel: ``K 1 = 0``;
- the energy of a linear function: ``u^T K u = |c|^2 volume`` for ``u = c . x``
  interpolated (the space contains it: p >= the geometry order);
- ``K @ V == U``: the assembled global matrix times a vector is the matrix-free apply
  (fused and unfused), and the diagonal is the assembled matrix's;
- the collocated form (Gauss-Lobatto, nq = p + 1) equals the same operator with B1d
  given as the identity;
- CG on ``M + K`` converges to the solution.

The operators run on the reference backend here (these are the FEM layer's identities;
the kernels are checked in tests/test_operators.py), except the matrix-free operator of
:func:`test_assembled_equals_matrix_free`, which runs where ``backend="auto"`` puts it.
"""
import numpy as np
import pytest

from smalltc import fem
from smalltc.fem import H1Space, box_mesh

BE = "reference"

# (dim, p, quadrature, geom_order)
CASES = [
    (2, 2, "gauss", 2),
    (2, 3, "gll", 2),
    (3, 2, "gauss", 2),
    (3, 3, "gll", 2),
    (1, 4, "gauss", 1),
]


def _space(dim, p, geom_order):
    return H1Space(box_mesh(dim, 2, geom_order=geom_order, distortion=0.08), p)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_constants_and_linear_energy(case):
    dim, p, quadrature, g = case
    space = _space(dim, p, g)
    K = fem.diffusion_operator(space, quadrature=quadrature, backend=BE)
    assert K.collocated == (quadrature == "gll")
    assert np.abs(K(np.ones(space.ndofs))).max() <= 1e-11
    c = np.array([0.3, -1.2, 0.7][:dim])
    u = c @ space.dof_coordinates()
    nq = K.nq
    volume = float(fem.mass_data(space.mesh, nq, quadrature=quadrature).sum())
    assert abs(volume - 1.0) <= 1e-6
    energy = float(u @ K(u))
    assert abs(energy - (c @ c) * volume) <= 1e-11 * (c @ c)
    kappa = fem.diffusion_operator(space, quadrature=quadrature, kappa=2.5, backend=BE)
    assert abs(float(u @ kappa(u)) - 2.5 * energy) <= 1e-11 * energy


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "-".join(map(str, c)))
def test_assembled_equals_matrix_free(case):
    """``K @ V == U`` globally: CSR times x is the fused and the unfused apply; the
    diagonals agree; the matrix is symmetric."""
    dim, p, quadrature, g = case
    space = _space(dim, p, g)
    kappa = (lambda x: 1.0 + x[0] ** 2)
    A = fem.diffusion_operator(space, quadrature=quadrature, kappa=kappa, assembled=True,
                               backend=BE)
    K = fem.diffusion_operator(space, quadrature=quadrature, kappa=kappa)
    Ku = fem.diffusion_operator(space, quadrature=quadrature, kappa=kappa, fused=False,
                                backend=BE)
    dense = A.to_dense()
    assert np.abs(dense - dense.T).max() <= 1e-12 * np.abs(dense).max()
    x = np.random.default_rng(1).standard_normal((2, space.ndofs))
    ref = x @ dense.T
    for op in (K, Ku, A):
        assert np.abs(op(x) - ref).max() <= 1e-11 * np.abs(ref).max()
    for op in (K, Ku, A):
        assert np.abs(op.diagonal() - np.diag(dense)).max() <= 1e-12 * np.abs(dense).max()


def test_collocated_equals_explicit_identity():
    space = _space(3, 3, 2)
    K = fem.diffusion_operator(space, quadrature="gll", backend=BE)
    b = fem.basis_1d(3, 4, "gll")
    assert np.allclose(b.B1d, np.eye(4), atol=1e-14)
    Kb = fem.Operator(space, K.Q, np.eye(4), b.G1d, qfunc="diffusion", backend=BE)
    x = np.random.default_rng(2).standard_normal(space.ndofs)
    assert np.abs(K(x) - Kb(x)).max() <= 1e-12 * np.abs(Kb(x)).max()
    assert "collocated" in repr(K)


@pytest.mark.parametrize("quadrature", ["gauss", "gll"])
def test_cg_on_helmholtz_converges(quadrature):
    space = _space(3, 2, 2)
    A = fem.helmholtz_operator(space, 1.0, quadrature=quadrature, backend=BE)
    M = fem.mass_operator(space, quadrature=quadrature, nq=A.nq, backend=BE)
    K = fem.diffusion_operator(space, quadrature=quadrature, nq=A.nq, backend=BE)
    x = np.random.default_rng(3).standard_normal(space.ndofs)
    b = A(x)
    assert np.abs(b - (M(x) + K(x))).max() <= 1e-12 * np.abs(b).max()
    sol = fem.cg(A, b, tol=1e-12, precond=fem.jacobi(A.diagonal()))
    assert sol.iterations < 200 and np.abs(sol.x - x).max() <= 1e-8
    H = fem.helmholtz_operator(space, 3.0, quadrature=quadrature, assembled=True, backend=BE)
    assert np.abs(H(x) - (3 * M(x) + K(x))).max() <= 1e-11 * np.abs(H(x)).max()


def test_operator_errors():
    space = _space(2, 2, 1)
    b = fem.basis_1d(2, 4)
    Q = fem.diffusion_data(space.mesh, 4)
    with pytest.raises(ValueError, match=r"the diffusion operator needs G1d"):
        fem.Operator(space, Q, b.B1d, qfunc="diffusion")
    with pytest.raises(ValueError, match=r"Q has shape \(4, 2, 4, 4\), expected "
                                         r"\(4, 3, 4, 4\)"):
        fem.Operator(space, Q[:, :2], b.B1d, b.G1d, qfunc="diffusion")
    with pytest.raises(ValueError, match=r"G1d has shape \(3, 3\), expected \(4, 3\)"):
        fem.Operator(space, Q, b.B1d, b.G1d[:3], qfunc="diffusion")
    with pytest.raises(ValueError, match=r"B1d is None \(collocated\) but G1d has shape "
                                         r"\(4, 3\)"):
        fem.Operator(space, Q, None, b.G1d, qfunc="diffusion")
    with pytest.raises(TypeError, match=r"data of a Helmholtz operator is the pair"):
        fem.Operator(space, Q, b.B1d, b.G1d, qfunc="helmholtz")
    with pytest.raises(ValueError, match=r"qfunc must be"):
        fem.Operator(space, Q, b.B1d, b.G1d, qfunc="stokes")
    with pytest.raises(TypeError, match=r"alpha must be a real number"):
        fem.helmholtz_operator(space, "1")
    with pytest.raises(ValueError, match=r"kappa\(x\) returned shape"):
        fem.diffusion_data(space.mesh, 4, kappa=lambda x: x[:, :1, :1])


def test_diffusion_data_is_the_inverse_metric():
    """Q of an affine (scaled) box: w |J| J^-1 J^-T with J = diag(h/2)."""
    mesh = box_mesh(3, (2, 4, 5))
    Q = fem.diffusion_data(mesh, 3)
    w = fem.quadrature_rule(3, "gauss")[1]
    W = np.einsum("i,j,k->ijk", w, w, w)
    J = np.array([1 / 4, 1 / 8, 1 / 10])
    det = J.prod()
    for c, (a, b) in enumerate([(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]):
        want = W * det / J[a] ** 2 if a == b else 0 * W
        assert np.abs(Q[:, c] - want).max() <= 1e-13
