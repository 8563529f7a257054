"""A float64 einsum oracle of the diffusion and helmholtz operators (issue 27), for the CUDA
tests: ``U = sum_{a,b} G_a^T (Q^{ab} * G_b V) [+ B^T (D * B V)]``, G_a: G1d on tensor axis
a, B1d on the others (B1d None: collocated, the identity), Q packed (E, nsym, nq, ...)
over the upper triangle row by row; a leading component axis of V shares D and Q."""
import numpy as np


def _apply(mats, X, dim, transpose=False):
    """X (E, [ncomp,] n, ..., n): matrix ``mats[a]`` (None: identity) along tensor axis a."""
    for a, M in enumerate(mats):
        if M is None:
            continue
        M = M.T if transpose else M
        X = np.moveaxis(np.tensordot(M, X, axes=([1], [X.ndim - dim + a])), 0, X.ndim - dim + a)
    return X


def sym_index(dim):
    """(a, b) -> packed component c of Q."""
    idx, c = {}, 0
    for a in range(dim):
        for b in range(a, dim):
            idx[a, b] = idx[b, a] = c
            c += 1
    return idx


def operator(qfunc, B1d, G1d, D, Q, V, dim):
    """The element-level action of ``qfunc`` ("diffusion" or "helmholtz") in float64."""
    V = np.asarray(V, dtype=np.float64)
    ncomp_axis = V.ndim == dim + 2
    grads = []
    for a in range(dim):
        mats = [G1d if b == a else B1d for b in range(dim)]
        grads.append(_apply(mats, V, dim))
    idx = sym_index(dim)
    U = 0
    for a in range(dim):
        h = 0
        for b in range(dim):
            q = np.asarray(Q, dtype=np.float64)[:, idx[a, b]]
            h = h + (q[:, None] if ncomp_axis else q) * grads[b]
        U = U + _apply([G1d if b == a else B1d for b in range(dim)], h, dim, transpose=True)
    if qfunc == "helmholtz":
        d = np.asarray(D, dtype=np.float64)
        u = _apply([B1d] * dim, V, dim)
        U = U + _apply([B1d] * dim, (d[:, None] if ncomp_axis else d) * u, dim, transpose=True)
    return U
