"""smalltc.fem's operators and Jacobi preconditioner in SciPy's solvers (LinearOperator).

SciPy is optional (the ``test`` extra has it): skipped without it. The CuPy side
(``cupyx.scipy.sparse.linalg.cg`` with GPU operators) is in test_interop_gpu.py.
"""
import numpy as np
import pytest

from smalltc.fem import (AssembledMassOperator, H1Space, MassOperator, basis_1d, box_mesh, cg,
                         jacobi, mass_data, mass_operator)

sla = pytest.importorskip("scipy.sparse.linalg")

# (dim, p, nq, elements per direction, quadrature, matrix-free)
CASES = [
    (1, 3, 5, 6, "gauss", True),
    (2, 2, 4, 4, "gauss", True),
    (3, 2, 4, 3, "gauss", True),
    (3, 3, 4, 2, "lobatto", True),
    (2, 2, 4, 3, "gauss", False),
]


def _problem(dim, p, nq, n, quad, matrix_free):
    mesh = box_mesh(dim, n, distortion=0.05 if dim > 1 else 0.0)
    space = H1Space(mesh, p)
    D, B1d = mass_data(mesh, nq, quadrature=quad), basis_1d(p, nq, quad).B1d
    M = MassOperator(space, D, B1d) if matrix_free else AssembledMassOperator(space, D, B1d)
    b = M(np.random.default_rng(dim + p).random(space.ndofs) + 0.5)
    return M, b


@pytest.mark.parametrize("dim,p,nq,n,quad,matrix_free", CASES)
def test_scipy_cg_equals_smalltc_cg(dim, p, nq, n, quad, matrix_free):
    """SciPy's CG on the operator itself, on its LinearOperator, with the Jacobi
    preconditioner as ``M=``: the same solution as smalltc's CG to 1e-10."""
    M, b = _problem(dim, p, nq, n, quad, matrix_free)
    P = jacobi(M.diagonal())
    ours = cg(M, b, tol=1e-14, precond=P, maxiter=2000).x
    for A in (M, M.aslinearoperator()):
        x, info = sla.cg(A, b, rtol=1e-14, atol=0.0, maxiter=2000, M=P.aslinearoperator())
        assert info == 0
        assert np.linalg.norm(x - ours) <= 1e-10 * np.linalg.norm(ours)
    x, info = sla.cg(M, b, rtol=1e-14, atol=0.0, maxiter=2000, M=P)   # P's own protocol
    assert info == 0 and np.linalg.norm(x - ours) <= 1e-10 * np.linalg.norm(ours)


def test_scipy_minres_and_gmres():
    M, b = _problem(2, 3, 5, 3, "gauss", True)
    ours = cg(M, b, tol=1e-14, maxiter=2000).x
    x, info = sla.minres(M, b, rtol=1e-14, maxiter=2000)
    assert info == 0 and np.linalg.norm(x - ours) <= 1e-9 * np.linalg.norm(ours)
    x, info = sla.gmres(M.aslinearoperator(), b, rtol=1e-13, restart=200, maxiter=20)
    assert info == 0 and np.linalg.norm(x - ours) <= 1e-9 * np.linalg.norm(ours)


@pytest.mark.parametrize("matrix_free", [True, False])
def test_linear_operator_protocol(matrix_free):
    """matvec on (n,) and (n, 1), matmat = columns of matvec, the adjoint = itself, the
    dense matrix = AssembledMassOperator.to_dense()."""
    M, _ = _problem(2, 2, 4, 3, "gauss", matrix_free)
    n = M.shape[0]
    A = M.aslinearoperator()
    assert isinstance(A, sla.LinearOperator) and A.shape == (n, n) and A.dtype == M.dtype
    X = np.random.default_rng(0).random((n, 3))
    cols = np.stack([A.matvec(X[:, j]) for j in range(3)], axis=1)
    assert np.allclose(A.matmat(X), cols, rtol=1e-13, atol=0)
    assert np.allclose(A.rmatmat(X), cols, rtol=1e-13, atol=0)
    assert A.matvec(X[:, :1]).shape == (n, 1)
    assert np.allclose(A.rmatvec(X[:, 0]), cols[:, 0], rtol=1e-13, atol=0)
    dense = AssembledMassOperator(M.space, M.D, M.B1d).to_dense()
    assert np.allclose(A @ np.eye(n), dense, rtol=1e-12, atol=1e-15)
    assert np.allclose(A.H @ np.eye(n), dense, rtol=1e-12, atol=1e-15)


def test_jacobi_linear_operator():
    d = np.array([2.0, 4.0, 8.0])
    P = jacobi(d)
    L = P.aslinearoperator()
    assert L.shape == (3, 3) and L.dtype == np.float64
    assert np.allclose(L @ np.eye(3), np.diag(1 / d))
    assert P.matvec(np.ones((3, 1))).shape == (3, 1)


def test_float32_operator_and_mass_operator_helper():
    M = mass_operator(H1Space(box_mesh(2, 3), p=2), dtype=np.float32)
    A = M.aslinearoperator()
    assert A.dtype == np.float32
    b = M(np.ones(M.shape[0], dtype=np.float32))
    x, info = sla.cg(A, b, rtol=1e-6, M=jacobi(M.diagonal()))
    assert info == 0 and np.allclose(x, 1.0, rtol=1e-4)
