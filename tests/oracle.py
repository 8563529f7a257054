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


# --- the generalised operators (docs/math.md section 7): dense Kronecker matrices ----------

def sym_pairs(dim):
    """``[(a, b), ...]`` in the packed order of Q: upper triangle, row by row."""
    return [(a, b) for a in range(dim) for b in range(a, dim)]


def kron_all(mats):
    out = np.ones((1, 1))
    for m in mats:
        out = np.kron(out, m)
    return out


def gradients(B1d, G1d, dim):
    """The reference gradients as dense ``(nq**dim, nd**dim)`` matrices, C-order
    multi-indices: ``G_a = kron(..., G1d on axis a, B1d on the others)``; ``B1d=None``
    is the identity (collocated)."""
    G1d = np.asarray(G1d, dtype=np.float64)
    B = np.eye(G1d.shape[1]) if B1d is None else np.asarray(B1d, dtype=np.float64)
    return [kron_all([G1d if d == a else B for d in range(dim)]) for a in range(dim)], \
        kron_all([B] * dim)


def operator_matrices(qfunc, B1d, G1d, D, Q, dim):
    """Element matrices ``(E, nd**dim, nd**dim)`` straight from the definition:
    ``sum_ab G_a^T diag(Q^ab) G_b`` (+ ``B^T diag(D) B`` for Helmholtz, or alone for mass)."""
    if qfunc == "mass":
        Bk = kron_all([np.asarray(B1d, dtype=np.float64)] * dim)
        Gs = None
    else:
        Gs, Bk = gradients(B1d, G1d, dim)
    E = (Q if Q is not None else D).shape[0]
    n = Bk.shape[1]
    K = np.zeros((E, n, n))
    if qfunc in ("diffusion", "helmholtz"):
        Qf = np.asarray(Q, dtype=np.float64).reshape(E, Q.shape[1], -1)
        for c, (a, b) in enumerate(sym_pairs(dim)):
            K += np.einsum("ki,ek,kj->eij", Gs[a], Qf[:, c], Gs[b])
            if a != b:
                K += np.einsum("ki,ek,kj->eij", Gs[b], Qf[:, c], Gs[a])
    if qfunc in ("mass", "helmholtz"):
        Df = np.asarray(D, dtype=np.float64).reshape(E, -1)
        K += np.einsum("ki,ek,kj->eij", Bk, Df, Bk)
    return K


def operator_action(qfunc, B1d, G1d, D, Q, V, dim):
    """``U_e = K_e V_e`` (per component when V has a component axis)."""
    K = operator_matrices(qfunc, B1d, G1d, D, Q, dim)
    V = np.asarray(V, dtype=np.float64)
    E = V.shape[0]
    Vf = V.reshape(E, -1, K.shape[1])
    return np.einsum("eij,ecj->eci", K, Vf).reshape(V.shape)


def operator_apply(qfunc, B1d, G1d, D, Q, x, elem_dofs, dim):
    """``y = sum_e R_e^T K_e R_e x`` by ``np.add.at``."""
    K = operator_matrices(qfunc, B1d, G1d, D, Q, dim)
    x = np.asarray(x, dtype=np.float64)
    xc = x.reshape(-1, x.shape[-1])
    m = np.asarray(elem_dofs).reshape(elem_dofs.shape[0], -1)
    y = np.zeros_like(xc)
    for c in range(xc.shape[0]):
        np.add.at(y[c], m, np.einsum("eij,ej->ei", K, xc[c][m]))
    return y.reshape(x.shape)


def operator_diagonal(qfunc, B1d, G1d, D, Q, elem_dofs, ndofs, dim):
    K = operator_matrices(qfunc, B1d, G1d, D, Q, dim)
    m = np.asarray(elem_dofs).reshape(elem_dofs.shape[0], -1)
    y = np.zeros(ndofs)
    np.add.at(y, m, np.einsum("eii->ei", K))
    return y


def basis_matrices(B, G, what, dim):
    """The dense evaluation matrices (nq^d x nd^d) of the basis application, in slot order:
    the value (``what`` "values" or "both"), then the derivative along each axis
    ("gradients" or "both"); Kronecker products of the 1D matrices."""
    from functools import reduce
    B, G = np.asarray(B, np.float64), np.asarray(G, np.float64)
    mats = [reduce(np.kron, [B] * dim)] if what != "gradients" else []
    if what != "values":
        mats += [reduce(np.kron, [G if d == a else B for d in range(dim)]) for a in range(dim)]
    return mats
