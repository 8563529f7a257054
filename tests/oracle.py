"""Float64 NumPy einsum oracles, written straight from docs/math.md sections 2-3.

Deliberately independent of smalltc's own reference backend (which is
sum-factorised): here each operation is one einsum of the defining formula.
"""
import numpy as np

_K, _I, _J = "klm", "abc", "xyz"


def _interp(Bm, X, dim, transpose):
    """Apply ``Bm`` (or its transpose) along each of the last ``dim`` axes."""
    for ax in range(X.ndim - dim, X.ndim):
        X = np.moveaxis(np.tensordot(Bm.T if transpose else Bm, X, axes=([1], [ax])), 0, ax)
    return X


def action(B1d, D, V):
    """``U = B^T D B V`` (tensordot per axis: B along every axis, D, B^T)."""
    B1d, D, V = (np.asarray(a, dtype=np.float64) for a in (B1d, D, V))
    dim = D.ndim - 1
    Q = _interp(B1d, V, dim, transpose=False)
    Q = Q * (D[:, None] if V.ndim == dim + 2 else D)
    return _interp(B1d, Q, dim, transpose=True)


def assembly(B1d, D):
    """``M[e, i, j] = sum_k prod_d B[k_d, i_d] B[k_d, j_d] D[e, k]``, C-order flattening."""
    B1d, D = np.asarray(B1d, dtype=np.float64), np.asarray(D, dtype=np.float64)
    dim, E, nd = D.ndim - 1, D.shape[0], B1d.shape[1]
    BB = np.einsum("ka,kx->kax", B1d, B1d)
    k, i, j = _K[:dim], _I[:dim], _J[:dim]
    terms = [f"{kk}{ii}{jj}" for kk, ii, jj in zip(k, i, j)]
    M = np.einsum(",".join(terms) + f",e{k}->e{i}{j}", *([BB] * dim), D, optimize="optimal")
    return M.reshape(E, nd ** dim, nd ** dim)


def gemm(A, B, C, alpha, beta, trans_a, trans_b):
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    a = np.swapaxes(A, -1, -2) if trans_a else A
    b = np.swapaxes(B, -1, -2) if trans_b else B
    r = alpha * np.matmul(a, b)
    if beta != 0:
        r = r + beta * np.asarray(C, dtype=np.float64)
    return r


def contract(kind, X, Y):
    X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
    if kind == "9":
        return np.einsum("si,sj,...ksl->...kilj", X, X, Y)
    out = "...ijkl" if kind == "8a" else "...iklj"
    return np.einsum(f"...isj,...ksl->{out}", X, Y)
