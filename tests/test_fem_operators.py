"""Global mass operators: element matrices, matrix-free vs assembled, diagonals."""
import numpy as np
import pytest

import smalltc
from smalltc.fem import (
    AssembledMassOperator,
    H1Space,
    MassOperator,
    basis_1d,
    box_mesh,
    mass_data,
    mass_operator,
)

# (dim, n, p, nq, geom_order, distortion)
OPERATOR_CASES = [
    (1, 4, 1, 2, 1, 0.1),
    (1, 3, 4, 6, 2, 0.2),
    (2, 3, 1, 3, 1, 0.1),
    (2, (2, 3), 2, 3, 2, 0.15),
    (2, 2, 4, 6, 3, 0.1),
    (3, 2, 1, 2, 1, 0.05),
    (3, (2, 1, 2), 2, 4, 2, 0.08),
    (3, 2, 3, 5, 1, 0.05),
]


def _ids(cases):
    return ["-".join(str(c) for c in case) for case in cases]


def _setup(dim, n, p, nq, geom_order, distortion, rho=None):
    mesh = box_mesh(dim, n, geom_order=geom_order, distortion=distortion)
    V = H1Space(mesh, p)
    D = mass_data(mesh, nq, rho)
    B1d = basis_1d(p, nq).B1d
    return V, D, B1d


@pytest.mark.parametrize("dim, n, p, nq, geom_order, distortion", OPERATOR_CASES, ids=_ids(OPERATOR_CASES))
def test_element_matrices_spd_and_sum_to_volume(dim, n, p, nq, geom_order, distortion):
    V, D, B1d = _setup(dim, n, p, nq, geom_order, distortion, rho=lambda x: 1.0 + x[0] ** 2)
    M = smalltc.assemble_mass(B1d, D)
    E, nloc = V.nelements, (p + 1) ** dim
    assert M.shape == (E, nloc, nloc)
    np.testing.assert_allclose(M, np.swapaxes(M, 1, 2), rtol=0, atol=1e-16)
    # positive definite: nq >= p + 1 Gauss points and D > 0
    assert np.min(np.linalg.eigvalsh(M)) > 0
    # the basis sums to 1, so the entries of M_e sum to int_e rho = sum(D_e)
    np.testing.assert_allclose(M.sum(axis=(1, 2)), D.reshape(E, -1).sum(axis=1), rtol=1e-13)


@pytest.mark.parametrize("dim, n, p, nq, geom_order, distortion", OPERATOR_CASES, ids=_ids(OPERATOR_CASES))
def test_matrix_free_equals_assembled(dim, n, p, nq, geom_order, distortion):
    V, D, B1d = _setup(dim, n, p, nq, geom_order, distortion)
    mf = MassOperator(V, D, B1d)
    asm = AssembledMassOperator(V, D, B1d)
    dense = asm.to_dense()
    x = np.random.default_rng(dim + 10 * p).standard_normal(V.ndofs)
    y = mf(x)
    scale = np.linalg.norm(dense @ x)
    assert np.linalg.norm(y - asm(x)) <= 1e-13 * scale
    assert np.linalg.norm(y - dense @ x) <= 1e-13 * scale
    np.testing.assert_allclose(dense, dense.T, rtol=0, atol=1e-16)
    # 1^T M 1 is the volume of the unit box
    assert np.ones(V.ndofs) @ mf(np.ones(V.ndofs)) == pytest.approx(1.0, rel=1e-13)


@pytest.mark.parametrize("dim, n, p, nq, geom_order, distortion", OPERATOR_CASES, ids=_ids(OPERATOR_CASES))
def test_diagonals_agree(dim, n, p, nq, geom_order, distortion):
    V, D, B1d = _setup(dim, n, p, nq, geom_order, distortion)
    asm = AssembledMassOperator(V, D, B1d)
    d_mf = MassOperator(V, D, B1d).diagonal()
    np.testing.assert_allclose(d_mf, asm.diagonal(), rtol=1e-13)
    np.testing.assert_allclose(d_mf, np.diag(asm.to_dense()), rtol=1e-13)
    assert np.all(d_mf > 0)


@pytest.mark.parametrize("assembled", [False, True])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_components(dim, assembled):
    V = H1Space(box_mesh(dim, 2, distortion=0.05), 2)
    M = mass_operator(V, assembled=assembled)
    X = np.random.default_rng(dim).standard_normal((3, V.ndofs))
    Y = M(X)
    assert Y.shape == X.shape
    for c in range(3):
        np.testing.assert_allclose(Y[c], M(X[c]), rtol=1e-14, atol=1e-16)


def test_csr_structure():
    V, D, B1d = _setup(2, (2, 3), 2, 3, 1, 0.1)
    indptr, indices, data = AssembledMassOperator(V, D, B1d).to_csr()
    assert indptr.shape == (V.ndofs + 1,) and indptr[0] == 0 and indptr[-1] == indices.size == data.size
    for i in range(V.ndofs):
        row = indices[indptr[i]:indptr[i + 1]]
        assert np.all(np.diff(row) > 0)
    # a corner node couples with its own element's 9 nodes only; an interior
    # vertex node with 25 nodes of its 4 elements
    assert np.diff(indptr)[0] == 9
    assert np.diff(indptr).max() == 25


@pytest.mark.parametrize("assembled", [False, True])
def test_float32_operator(assembled):
    mesh = box_mesh(3, 2, distortion=0.05)
    V = H1Space(mesh, 3)
    M64 = mass_operator(V, assembled=assembled)
    M32 = mass_operator(V, assembled=assembled, dtype=np.float32)
    assert M32.dtype == np.float32 and M32.D.dtype == np.float32
    x = np.random.default_rng(0).standard_normal(V.ndofs)
    y32 = M32(x)
    assert y32.dtype == np.float32
    y64 = M64(x)
    assert np.linalg.norm(y32 - y64) <= 1e-5 * np.linalg.norm(y64)


def test_repr_names_sizes():
    V = H1Space(box_mesh(2, 2), 2)
    assert repr(mass_operator(V)) == (
        "MassOperator(dim=2, p=2, nq=4, E=4, ndofs=25, dtype=float64, backend='auto')"
    )
    assert mass_operator(V, assembled=True).shape == (25, 25)


_V, _D, _B = _setup(2, 2, 2, 3, 1, 0.0)

ERROR_CASES = [
    (lambda: MassOperator(_V, _D[:, :2], _B), r"D has shape \(4, 2, 3\), expected \(4, 3, 3\) for E=4, nq=3, dim=2"),
    (lambda: MassOperator(_V, _D[None], _B), r"D has shape \(1, 4, 3, 3\), expected \(4, 3, 3\)"),
    (lambda: MassOperator(_V, _D, _B[:, :2]), r"B1d has shape \(3, 2\), expected \(nq, 3\) for p=2"),
    (lambda: AssembledMassOperator(_V, _D.astype(np.int64), _B), r"D has dtype int64, expected float64 or float32"),
    (lambda: MassOperator(_V, _D, _B)(np.zeros(7)), r"x has shape \(7,\), expected \(25,\)"),
]


@pytest.mark.parametrize("call, match", ERROR_CASES)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
